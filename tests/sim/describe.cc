#include "tests/sim/describe.h"

#include <type_traits>
#include <variant>

namespace tally::sim {
namespace {

std::string clip(const std::string& text) {
  return text.size() <= 24 ? text : text.substr(0, 20) + "…(" + std::to_string(text.size()) + ")";
}

}  // namespace

std::string describe(const Reservation& r) {
  std::string line = clip(r.reservation_id) + " " + reservationStateName(r.state) +
                     " reserved=" + std::to_string(r.reserved_units);
  if (r.actual_units != 0) line += " actual=" + std::to_string(r.actual_units);
  if (r.refunded_units != 0) line += " refunded=" + std::to_string(r.refunded_units);
  if (r.debt_units != 0) line += " debt=" + std::to_string(r.debt_units);
  if (r.closed_by_hard_limit) line += " closed_by_hard_limit";
  return line;
}

std::string describe(const wire::RequestBody& request) {
  return std::visit(
      [](const auto& r) -> std::string {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, ReserveRequest>) {
          return "reserve " + clip(r.reservation_id) + " " + clip(r.subject) + "/" + r.route +
                 " units=" + std::to_string(r.units) +
                 (r.policy_generation != 0 ? " gen=" + std::to_string(r.policy_generation) : "");
        } else if constexpr (std::is_same_v<T, StartRequest>) {
          return "start " + clip(r.reservation_id);
        } else if constexpr (std::is_same_v<T, SettleRequest>) {
          return "settle " + clip(r.reservation_id) + " actual=" + std::to_string(r.actual_units);
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          return "release " + clip(r.reservation_id);
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          return "markUnknown " + clip(r.reservation_id);
        } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
          return "report " + clip(r.reservation_id) + " actual=" + std::to_string(r.actual_units);
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          return "query " + clip(r.reservation_id);
        } else if constexpr (std::is_same_v<T, wire::PublishPolicyRequest>) {
          return "publishPolicy budgets=" + std::to_string(r.budgets.size());
        } else if constexpr (std::is_same_v<T, wire::RollbackPolicyRequest>) {
          return "rollbackPolicy";
        } else if constexpr (std::is_same_v<T, ShardIssueRequest>) {
          return "shardIssue " + r.gateway_name + " epoch " + std::to_string(r.gateway_boot_epoch) +
                 " " + clip(r.subject) + "/" + r.route;
        } else if constexpr (std::is_same_v<T, ShardReport>) {
          const ShardBalances& b = r.balances;
          return "shardReport " + r.shard.shard_id + " epoch " +
                 std::to_string(r.gateway_boot_epoch) + " spent=" + std::to_string(b.local_spent) +
                 " reserved=" + std::to_string(b.local_reserved) +
                 " available=" + std::to_string(b.local_available) +
                 " overspent=" + std::to_string(b.overspent) +
                 " receipts=" + std::to_string(r.receipts.size());
        } else if constexpr (std::is_same_v<T, wire::ShardStatusRequest>) {
          return "shardStatus " + r.gateway_name + " shards=" + std::to_string(r.shard_ids.size());
        } else if constexpr (std::is_same_v<T, wire::RevokeShardsRequest>) {
          return "revokeShards " + r.shard_id + r.gateway_name;
        } else if constexpr (std::is_same_v<T, wire::WriteOffShardRequest>) {
          return "writeOffShard " + r.shard_id;
        } else {
          return "request kind " + std::to_string(wire::RequestBody(r).index());
        }
      },
      request);
}

std::string describe(const wire::ResponseBody& response) {
  return std::visit(
      [](const auto& r) -> std::string {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, ReservationReply>) {
          std::string line = std::string(replyCodeName(r.code)) + (r.duplicate ? " duplicate" : "");
          if (r.refunded_units != 0) line += " refunded=" + std::to_string(r.refunded_units);
          if (!r.receipt.reservation_id.empty()) line += " [" + describe(r.receipt) + "]";
          return line;
        } else if constexpr (std::is_same_v<T, wire::PolicyAnswer>) {
          return std::string("policy ") + replyCodeName(r.reply.code) +
                 " generation=" + std::to_string(r.reply.generation);
        } else if constexpr (std::is_same_v<T, wire::ErrorReply>) {
          return std::string("error ") + wire::errorCodeName(r.code) + ": " + r.message;
        } else if constexpr (std::is_same_v<T, ShardReply>) {
          std::string line = std::string("shards ") + replyCodeName(r.code) +
                             (r.duplicate ? " duplicate" : "") +
                             (r.message.empty() ? "" : " (" + r.message + ")");
          for (const ShardLedgerView& v : r.shards) {
            line += " [" + v.grant.shard_id + " " + shardStateName(v.state) +
                    " allocated=" + std::to_string(v.grant.allocated_units) +
                    " spent=" + std::to_string(v.spent_units) +
                    " reminted=" + std::to_string(v.reminted_units) +
                    " retired=" + std::to_string(v.retired_units) +
                    " debt=" + std::to_string(v.debt_units) + "]";
          }
          return line;
        } else {
          return "reply kind " + std::to_string(wire::ResponseBody(r).index());
        }
      },
      response);
}

}  // namespace tally::sim
