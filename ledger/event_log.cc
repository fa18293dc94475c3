#include "ledger/event_log.h"

#include <type_traits>
#include <variant>

#include "shard/identity.h"

namespace tally::ledger {
namespace {

void logBreach(Logger* logger, const Reservation& r) {
  logger->warn("overdraft_breach", {{"reservation", r.reservation_id},
                                    {"subject", r.subject},
                                    {"route", r.route},
                                    {"generation", r.policy_generation},
                                    {"reserved_units", r.reserved_units},
                                    {"actual_units", r.actual_units},
                                    {"debt_units", r.debt_units}});
}

void logIssued(Logger* logger, const ShardGrant& grant) {
  logger->info("shard_issued", {{"shard", grant.shard_id},
                                {"gateway", grant.gateway_name},
                                {"subject", grant.subject},
                                {"route", grant.route},
                                {"generation", grant.policy_generation},
                                {"units", grant.allocated_units},
                                {"fence", grant.fence},
                                {"expires_at_ms", grant.expires_at_ms}});
}

void logConflict(Logger* logger, const ShardConflicted& e) {
  const ShardLedgerView& view = e.view;
  logger->error("shard_conflict", {{"shard", view.grant.shard_id},
                                   {"gateway", view.grant.gateway_name},
                                   {"subject", view.grant.subject},
                                   {"route", view.grant.route},
                                   {"grant_boot_epoch", view.grant.gateway_boot_epoch},
                                   {"report_boot_epoch", e.report_boot_epoch},
                                   {"reason", e.reason},
                                   {"spent", e.spent_units},
                                   {"debt", e.debt_units},
                                   {"total_spent", view.spent_units},
                                   {"total_debt", view.debt_units},
                                   {"overspent", e.overspent_units}});
}

void logReconciled(Logger* logger, const ShardReconciled& e) {
  const ShardLedgerView& view = e.view;
  logger->info("shard_reconciled", {{"shard", view.grant.shard_id},
                                    {"gateway", view.grant.gateway_name},
                                    {"state", shardStateName(view.state)},
                                    {"spent", e.spent_units},
                                    {"reminted", e.reminted_units},
                                    {"retired", view.retired_units},
                                    {"report_boot_epoch", e.report_boot_epoch}});
}

}  // namespace

void logLedgerEvent(Logger* logger, const LedgerEvent& event) {
  std::visit(
      [logger](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, OverdraftBreached>) {
          logBreach(logger, e.receipt);
        } else if constexpr (std::is_same_v<T, PolicyPublished>) {
          logger->info("policy_published", {{"generation", e.generation}, {"budgets", e.budgets}});
        } else if constexpr (std::is_same_v<T, PolicyRolledBack>) {
          logger->info("policy_rolled_back", {{"generation", e.generation}});
        } else if constexpr (std::is_same_v<T, Audited>) {
          // a metric (LedgerMetrics::observeAudit), not a line
        } else if constexpr (std::is_same_v<T, GatewayEnrolled>) {
          if (e.rotated) {
            logger->info(
                "gateway_key_rotated",
                {{"gateway", e.gateway_name},
                 {"public_key", identity::encodePublicKey(e.public_key)},
                 {"previous_public_key", e.previous_public_key == PublicKey{}
                                             ? std::string()
                                             : identity::encodePublicKey(e.previous_public_key)},
                 {"previous_key_until_ms", e.previous_key_until_ms}});
          } else {
            logger->info("gateway_enrolled",
                         {{"gateway", e.gateway_name},
                          {"public_key", identity::encodePublicKey(e.public_key)}});
          }
        } else if constexpr (std::is_same_v<T, OperatorEnrolled>) {
          logger->info("operator_enrolled",
                       {{"operator", e.operator_name},
                        {"operator_role", operatorRoleName(e.role)},
                        {"public_key", identity::encodePublicKey(e.public_key)}});
        } else if constexpr (std::is_same_v<T, OperatorEnabledSet>) {
          logger->info(e.enabled ? "operator_enabled" : "operator_disabled",
                       {{"operator", e.operator_name}});
        } else if constexpr (std::is_same_v<T, GatewayEnabledSet>) {
          logger->info(e.enabled ? "gateway_enabled" : "gateway_disabled",
                       {{"gateway", e.gateway_name}});
        } else if constexpr (std::is_same_v<T, ShardIssued>) {
          logIssued(logger, e.grant);
        } else if constexpr (std::is_same_v<T, ShardIssueDenied>) {
          logger->warn("shard_issue_denied", {{"gateway", e.gateway_name}, {"reason", e.reason}});
        } else if constexpr (std::is_same_v<T, ShardReportRefused>) {
          logger->warn("shard_report_refused", {{"shard", e.shard_id},
                                                {"gateway", e.gateway_name},
                                                {"code", replyCodeName(e.code)},
                                                {"reason", e.reason}});
        } else if constexpr (std::is_same_v<T, ReservationRefused>) {
          logger->warn("reservation_refused", {{"gateway", e.gateway_name},
                                               {"reservation_id", e.reservation_id},
                                               {"bound_gateway", e.bound_gateway_name}});
        } else if constexpr (std::is_same_v<T, ShardConflicted>) {
          logConflict(logger, e);
        } else if constexpr (std::is_same_v<T, ShardReconciled>) {
          logReconciled(logger, e);
        } else if constexpr (std::is_same_v<T, ShardRevoked>) {
          logger->info("shard_revoked",
                       {{"shard", e.shard_id}, {"gateway", e.gateway_name}, {"fence", e.fence}});
        } else {
          static_assert(std::is_same_v<T, ShardWrittenOff>, "every event is reported");
          logger->warn("shard_written_off", {{"shard", e.shard_id}, {"retired", e.retired_units}});
        }
      },
      event);
}

}  // namespace tally::ledger
