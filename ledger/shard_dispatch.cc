#include "ledger/shard_dispatch.h"

#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "shard/identity.h"

namespace tally::ledger {
namespace {

std::string shardIdOf(const ShardReply& reply) {
  return reply.shards.empty() ? std::string() : reply.shards.front().grant.shard_id;
}

ShardReply issue(Ledger* ledger, Logger* logger, const ShardIssueRequest& request,
                 uint64_t now_ms) {
  ShardReply reply = ledger->issueShard(request, now_ms);
  if (reply.code == ReplyCode::kOk && !reply.duplicate && !reply.shards.empty()) {
    const ShardGrant& grant = reply.shards.front().grant;
    logger->info("shard_issued", {{"shard", grant.shard_id},
                                  {"gateway", grant.gateway_name},
                                  {"subject", grant.subject},
                                  {"route", grant.route},
                                  {"generation", grant.policy_generation},
                                  {"units", grant.allocated_units},
                                  {"fence", grant.fence},
                                  {"expires_at_ms", grant.expires_at_ms}});
  } else if (reply.permission_denied) {
    logger->warn("shard_issue_denied",
                 {{"gateway", request.gateway_name}, {"reason", reply.message}});
  }
  return reply;
}

ShardReply report(Ledger* ledger, Logger* logger, const ShardReport& report, uint64_t now_ms) {
  ShardReply reply = ledger->reportShard(report, now_ms);
  if (reply.code != ReplyCode::kOk || reply.duplicate || reply.shards.empty()) {
    if (reply.permission_denied || reply.code == ReplyCode::kInvalidArgument) {
      logger->warn("shard_report_refused", {{"shard", report.shard.shard_id},
                                            {"gateway", report.shard.gateway_name},
                                            {"code", replyCodeName(reply.code)},
                                            {"reason", reply.message}});
    }
    return reply;
  }
  const ShardLedgerView& view = reply.shards.front();
  if (view.state == ShardState::kConflict) {
    logger->error("shard_conflict", {{"shard", view.grant.shard_id},
                                     {"gateway", view.grant.gateway_name},
                                     {"subject", view.grant.subject},
                                     {"route", view.grant.route},
                                     {"grant_boot_epoch", view.grant.gateway_boot_epoch},
                                     {"report_boot_epoch", report.gateway_boot_epoch},
                                     {"reason", reply.message},
                                     {"spent", reply.spent_units},
                                     {"debt", reply.debt_units},
                                     {"total_spent", view.spent_units},
                                     {"total_debt", view.debt_units},
                                     {"overspent", report.balances.overspent}});
    return reply;
  }
  logger->info("shard_reconciled", {{"shard", view.grant.shard_id},
                                    {"gateway", view.grant.gateway_name},
                                    {"state", shardStateName(view.state)},
                                    {"spent", reply.spent_units},
                                    {"reminted", reply.reminted_units},
                                    {"retired", view.retired_units},
                                    {"report_boot_epoch", report.gateway_boot_epoch}});
  return reply;
}

}  // namespace

std::optional<wire::ResponseBody> dispatchShardRequest(Ledger* ledger, Logger* logger,
                                                       const wire::RequestBody& body,
                                                       uint64_t now_ms) {
  return std::visit(
      [&](const auto& request) -> std::optional<wire::ResponseBody> {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, wire::EnrollGatewayRequest>) {
          GatewayReply reply =
              ledger->enrollGateway(request.gateway_name, request.public_key, now_ms);
          if (reply.code == ReplyCode::kOk && !reply.duplicate) {
            logger->info("gateway_enrolled",
                         {{"gateway", request.gateway_name},
                          {"public_key", identity::encodePublicKey(request.public_key)}});
          }
          return reply;
        } else if constexpr (std::is_same_v<T, wire::ListGatewaysRequest>) {
          return ledger->listGateways();
        } else if constexpr (std::is_same_v<T, wire::SetGatewayEnabledRequest>) {
          GatewayReply reply =
              ledger->setGatewayEnabled(request.gateway_name, request.enabled, now_ms);
          if (reply.code == ReplyCode::kOk && !reply.duplicate) {
            logger->info(request.enabled ? "gateway_enabled" : "gateway_disabled",
                         {{"gateway", request.gateway_name}});
          }
          return reply;
        } else if constexpr (std::is_same_v<T, ShardIssueRequest>) {
          return issue(ledger, logger, request, now_ms);
        } else if constexpr (std::is_same_v<T, ShardReport>) {
          return report(ledger, logger, request, now_ms);
        } else if constexpr (std::is_same_v<T, wire::ShardStatusRequest>) {
          return ledger->shardStatus(request.gateway_name, request.shard_ids);
        } else if constexpr (std::is_same_v<T, wire::ListShardsRequest>) {
          return ledger->listShards(request.gateway_name, request.state);
        } else if constexpr (std::is_same_v<T, wire::RevokeShardsRequest>) {
          ShardReply reply = ledger->revokeShards(request.shard_id, request.gateway_name, now_ms);
          if (reply.code == ReplyCode::kOk && !reply.duplicate) {
            for (const ShardLedgerView& view : reply.shards) {
              logger->info("shard_revoked", {{"shard", view.grant.shard_id},
                                             {"gateway", view.grant.gateway_name},
                                             {"fence", view.current_fence}});
            }
          }
          return reply;
        } else if constexpr (std::is_same_v<T, wire::WriteOffShardRequest>) {
          ShardReply reply = ledger->writeOffShard(request.shard_id, now_ms);
          if (reply.code == ReplyCode::kOk && !reply.duplicate) {
            logger->warn("shard_written_off", {{"shard", shardIdOf(reply)},
                                               {"retired", reply.shards.front().retired_units}});
          }
          return reply;
        } else {
          return std::nullopt;
        }
      },
      body);
}

}  // namespace tally::ledger
