#include "core/audit_entry.h"

#include <type_traits>
#include <variant>

#include "core/limits.h"

namespace tally {
namespace {

std::string clipped(std::string text) {
  if (text.size() > limits::kAuditLogTextBytesMax) text.resize(limits::kAuditLogTextBytesMax);
  return text;
}

// The action's name and what it names, by kind; rotate and enable/disable are told apart.
void describe(const LedgerRequest& request, std::string* action, std::string* target) {
  *action = linkRequestName(request);
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, EnrollGatewayRequest>) {
          if (r.rotate) *action = "gateway rotate";
          *target = "gateway '" + r.gateway_name + "'";
        } else if constexpr (std::is_same_v<T, SetGatewayEnabledRequest>) {
          *action = r.enabled ? "gateway enable" : "gateway disable";
          *target = "gateway '" + r.gateway_name + "'";
        } else if constexpr (std::is_same_v<T, EnrollOperatorRequest>) {
          *target = "operator '" + r.operator_name + "' role " + operatorRoleName(r.role);
        } else if constexpr (std::is_same_v<T, SetOperatorEnabledRequest>) {
          *action = r.enabled ? "operator enable" : "operator disable";
          *target = "operator '" + r.operator_name + "'";
        } else if constexpr (std::is_same_v<T, RevokeShardsRequest>) {
          *target = r.shard_id.empty() ? "every live shard of gateway '" + r.gateway_name + "'"
                                       : "shard '" + r.shard_id + "'";
        } else if constexpr (std::is_same_v<T, WriteOffShardRequest>) {
          *target = "shard '" + r.shard_id + "'";
        } else if constexpr (std::is_same_v<T, PublishPolicyRequest>) {
          *target = std::to_string(r.budgets.size()) + " budgets";
        }
      },
      request);
}

// The reply's outcome ("ok", "ok duplicate", or its code's name) and message.
void outcomeOf(const LedgerReply& reply, std::string* outcome, std::string* detail) {
  auto coded = [&](ReplyCode code, bool duplicate, const std::string& message) {
    *outcome = code == ReplyCode::kOk ? (duplicate ? "ok duplicate" : "ok") : replyCodeName(code);
    *detail = message;
  };
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, PolicyAnswer>) {
          coded(r.reply.code, false, r.reply.message);
          if (r.reply.code == ReplyCode::kOk && r.reply.generation != 0) {
            *detail = "generation " + std::to_string(r.reply.generation) +
                      (r.reply.message.empty() ? "" : ": " + r.reply.message);
          }
        } else if constexpr (std::is_same_v<T, GatewayReply> || std::is_same_v<T, ShardReply> ||
                             std::is_same_v<T, OperatorReply>) {
          coded(r.code, r.duplicate, r.message);
        } else if constexpr (std::is_same_v<T, ErrorReply>) {
          *outcome = errorCodeName(r.code);
          *detail = r.message;
        } else {
          *outcome = "answered";
        }
      },
      reply);
}

}  // namespace

AuditLogEntry auditLogEntryOf(const LinkPeer& peer, const LedgerRequest& request,
                              const std::optional<std::string>& refusal, const LedgerReply* reply,
                              const RequestDigest& digest) {
  AuditLogEntry entry;
  entry.actor_kind = linkRoleName(peer.role);
  if (peer.role == LinkRole::kOperator) {
    entry.actor = peer.operator_name;
    entry.actor_role = operatorRoleName(peer.operator_role);
  } else if (!peer.operator_name.empty()) {
    entry.actor = peer.operator_name;  // a disabled operator's key
  } else {
    entry.actor = peer.gateway_name;
  }
  describe(request, &entry.action, &entry.target);
  if (refusal.has_value()) {
    entry.outcome = "refused";
    entry.detail = *refusal;
  } else if (reply != nullptr) {
    outcomeOf(*reply, &entry.outcome, &entry.detail);
  }
  entry.actor = clipped(std::move(entry.actor));
  entry.target = clipped(std::move(entry.target));
  entry.detail = clipped(std::move(entry.detail));
  entry.request_digest = digest;
  return entry;
}

}  // namespace tally
