#include "core/ledger_requests.h"

#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/link_authority.h"

namespace tally {
namespace {

// The reply is constructed in the outcome itself: a receipt is moved once on its way out.
template <typename Reply>
LedgerOutcome answer(Reply&& reply) {
  return LedgerOutcome{
      .reply = LedgerReply(std::in_place_type<std::decay_t<Reply>>, std::forward<Reply>(reply))};
}

// Settle and operation receipts: a breach is reported once, when it is applied.
LedgerOutcome receiptAnswer(ReservationReply&& reply) {
  std::vector<LedgerEvent> events;
  if (reply.code == ReplyCode::kOk && !reply.duplicate && reply.receipt.overdraft_breach) {
    events.emplace_back(OverdraftBreached{.receipt = reply.receipt});
  }
  return LedgerOutcome{.reply = LedgerReply(std::in_place_type<ReservationReply>, std::move(reply)),
                       .events = std::move(events)};
}

bool firstSuccess(ReplyCode code, bool duplicate) { return code == ReplyCode::kOk && !duplicate; }

LedgerOutcome publishPolicy(Ledger* ledger, const PublishPolicyRequest& request, uint64_t now_ms) {
  PolicyReply reply = ledger->publishPolicy(Policy{.budgets = request.budgets}, now_ms);
  LedgerOutcome outcome;
  if (reply.code == ReplyCode::kOk) {
    outcome.events.emplace_back(PolicyPublished{.generation = reply.generation,
                                                .budgets = uint64_t{request.budgets.size()}});
  }
  outcome.reply = PolicyAnswer{.reply = std::move(reply)};
  return outcome;
}

LedgerOutcome rollbackPolicy(Ledger* ledger, uint64_t now_ms) {
  PolicyReply reply = ledger->rollbackPolicy(now_ms);
  LedgerOutcome outcome;
  if (reply.code == ReplyCode::kOk) {
    outcome.events.emplace_back(PolicyRolledBack{.generation = reply.generation});
  }
  outcome.reply = PolicyAnswer{.reply = std::move(reply)};
  return outcome;
}

LedgerOutcome enrollGateway(Ledger* ledger, const EnrollGatewayRequest& request, uint64_t now_ms) {
  if (request.rotate) {
    GatewayReply reply = ledger->rotateGatewayKey(request.gateway_name, request.public_key,
                                                  request.rotate_overlap_ms, now_ms);
    LedgerOutcome outcome;
    if (firstSuccess(reply.code, reply.duplicate) && !reply.gateways.empty()) {
      const GatewayRecord& record = reply.gateways.front();
      outcome.events.emplace_back(
          GatewayEnrolled{.gateway_name = request.gateway_name,
                          .public_key = record.public_key,
                          .rotated = true,
                          .previous_public_key = record.previous_public_key,
                          .previous_key_until_ms = record.previous_key_until_ms});
    }
    outcome.reply = std::move(reply);
    return outcome;
  }
  GatewayReply reply = ledger->enrollGateway(request.gateway_name, request.public_key, now_ms);
  LedgerOutcome outcome;
  if (firstSuccess(reply.code, reply.duplicate)) {
    outcome.events.emplace_back(
        GatewayEnrolled{.gateway_name = request.gateway_name, .public_key = request.public_key});
  }
  outcome.reply = std::move(reply);
  return outcome;
}

LedgerOutcome setGatewayEnabled(Ledger* ledger, const SetGatewayEnabledRequest& request,
                                uint64_t now_ms) {
  GatewayReply reply = ledger->setGatewayEnabled(request.gateway_name, request.enabled, now_ms);
  LedgerOutcome outcome;
  if (firstSuccess(reply.code, reply.duplicate)) {
    outcome.events.emplace_back(
        GatewayEnabledSet{.gateway_name = request.gateway_name, .enabled = request.enabled});
  }
  outcome.reply = std::move(reply);
  return outcome;
}

LedgerOutcome revokeShards(Ledger* ledger, const RevokeShardsRequest& request, uint64_t now_ms) {
  ShardReply reply = ledger->revokeShards(request.shard_id, request.gateway_name, now_ms);
  LedgerOutcome outcome;
  if (firstSuccess(reply.code, reply.duplicate)) {
    for (const ShardLedgerView& view : reply.shards) {
      outcome.events.emplace_back(ShardRevoked{.shard_id = view.grant.shard_id,
                                               .gateway_name = view.grant.gateway_name,
                                               .fence = view.current_fence});
    }
  }
  outcome.reply = std::move(reply);
  return outcome;
}

LedgerOutcome writeOffShard(Ledger* ledger, const WriteOffShardRequest& request, uint64_t now_ms) {
  ShardReply reply = ledger->writeOffShard(request.shard_id, now_ms);
  LedgerOutcome outcome;
  if (firstSuccess(reply.code, reply.duplicate) && !reply.shards.empty()) {
    const ShardLedgerView& view = reply.shards.front();
    outcome.events.emplace_back(
        ShardWrittenOff{.shard_id = view.grant.shard_id, .retired_units = view.retired_units});
  }
  outcome.reply = std::move(reply);
  return outcome;
}

}  // namespace

LedgerRequests::LedgerRequests(Ledger* ledger, std::string version)
    : ledger_(ledger), version_(std::move(version)) {}

LedgerOutcome LedgerRequests::apply(const LedgerRequest& request, uint64_t now_ms,
                                    const std::string& gateway_name) {
  Ledger* ledger = ledger_;
  if (const std::string* id = gateway_name.empty() ? nullptr : reservationNamed(request)) {
    if (const Reservation* named = ledger->findReservation(*id)) {
      if (std::optional<std::string> refusal = reservationRefusal(gateway_name, *named, request)) {
        LedgerOutcome outcome = answer(
            ErrorReply{.code = ErrorCode::kPermissionDenied, .message = *std::move(refusal)});
        outcome.events.emplace_back(ReservationRefused{.gateway_name = gateway_name,
                                                       .reservation_id = *id,
                                                       .bound_gateway_name = named->gateway_name});
        return outcome;
      }
    }
  }
  return std::visit(
      [&](const auto& r) -> LedgerOutcome {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, UnknownMessage>) {
          return answer(ErrorReply{.code = ErrorCode::kUnknownMessage,
                                   .message = "unknown request kind " + std::to_string(r.which)});
        } else if constexpr (std::is_same_v<T, ReserveRequest>) {
          return answer(ledger->reserve(r, now_ms, gateway_name));
        } else if constexpr (std::is_same_v<T, StartRequest>) {
          return answer(ledger->start(r, now_ms));
        } else if constexpr (std::is_same_v<T, SettleRequest>) {
          return receiptAnswer(ledger->settle(r, now_ms));
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          return answer(ledger->release(r, now_ms));
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          return answer(ledger->query(r));
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          return answer(ledger->markUnknown(r, now_ms));
        } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
          return receiptAnswer(ledger->reportOperation(r, now_ms));
        } else if constexpr (std::is_same_v<T, ExtendRequest>) {
          return answer(ledger->extend(r, now_ms));
        } else if constexpr (std::is_same_v<T, AuditRequest>) {
          return audit(r, now_ms);
        } else if constexpr (std::is_same_v<T, HealthRequest>) {
          return answer(HealthReply{
              .status = failed_ ? "failed" : "ok", .version = version_, .now_ms = now_ms});
        } else if constexpr (std::is_same_v<T, PublishPolicyRequest>) {
          return publishPolicy(ledger, r, now_ms);
        } else if constexpr (std::is_same_v<T, RollbackPolicyRequest>) {
          return rollbackPolicy(ledger, now_ms);
        } else if constexpr (std::is_same_v<T, ShowPolicyRequest>) {
          return showPolicy(r);
        } else if constexpr (std::is_same_v<T, EnrollGatewayRequest>) {
          return enrollGateway(ledger, r, now_ms);
        } else if constexpr (std::is_same_v<T, ListGatewaysRequest>) {
          return answer(ledger->listGateways());
        } else if constexpr (std::is_same_v<T, SetGatewayEnabledRequest>) {
          return setGatewayEnabled(ledger, r, now_ms);
        } else if constexpr (std::is_same_v<T, ShardIssueRequest>) {
          return issueShard(r, now_ms);
        } else if constexpr (std::is_same_v<T, ShardReport>) {
          return reportShard(r, now_ms);
        } else if constexpr (std::is_same_v<T, ShardStatusRequest>) {
          return answer(ledger->shardStatus(r.gateway_name, r.shard_ids));
        } else if constexpr (std::is_same_v<T, ListShardsRequest>) {
          return answer(ledger->listShards(r.gateway_name, r.state));
        } else if constexpr (std::is_same_v<T, RevokeShardsRequest>) {
          return revokeShards(ledger, r, now_ms);
        } else if constexpr (std::is_same_v<T, EnrollOperatorRequest>) {
          OperatorReply reply =
              ledger->enrollOperator(r.operator_name, r.public_key, r.role, now_ms);
          LedgerOutcome outcome;
          if (firstSuccess(reply.code, reply.duplicate)) {
            outcome.events.push_back(OperatorEnrolled{
                .operator_name = r.operator_name, .public_key = r.public_key, .role = r.role});
          }
          outcome.reply = std::move(reply);
          return outcome;
        } else if constexpr (std::is_same_v<T, SetOperatorEnabledRequest>) {
          OperatorReply reply = ledger->setOperatorEnabled(r.operator_name, r.enabled, now_ms);
          LedgerOutcome outcome;
          if (firstSuccess(reply.code, reply.duplicate)) {
            outcome.events.push_back(
                OperatorEnabledSet{.operator_name = r.operator_name, .enabled = r.enabled});
          }
          outcome.reply = std::move(reply);
          return outcome;
        } else if constexpr (std::is_same_v<T, ListOperatorsRequest>) {
          return answer(ledger->listOperators());
        } else if constexpr (std::is_same_v<T, AuditLogRequest>) {
          return answer(ledger->auditLog(r.after_sequence, r.entries_max));
        } else {
          static_assert(std::is_same_v<T, WriteOffShardRequest>, "every request is answered");
          return writeOffShard(ledger, r, now_ms);
        }
      },
      request);
}

LedgerOutcome LedgerRequests::audit(const AuditRequest& request, uint64_t now_ms) const {
  LedgerOutcome outcome;
  if (request.period || request.list_periods) {  // closed accounting periods
    PeriodAudit periods = ledger_->auditPeriods(
        {request.period, request.list_periods, request.subject, request.route}, now_ms);
    if (periods.found) {
      outcome.reply = std::move(periods.report);
    } else {
      outcome.reply = ErrorReply{.code = ErrorCode::kNotFound, .message = periods.message};
    }
    return outcome;
  }
  AuditReport report = ledger_->audit(now_ms, AccountFilter{.subject = request.subject,
                                                            .route = request.route,
                                                            .after_subject = request.after_subject,
                                                            .after_route = request.after_route,
                                                            .routes_max = request.routes_max});
  outcome.events.emplace_back(
      Audited{.conserved = report.conserved, .violations = uint64_t{report.violations.size()}});
  outcome.reply = std::move(report);
  return outcome;
}

LedgerOutcome LedgerRequests::showPolicy(const ShowPolicyRequest& request) const {
  const Generation generation =
      request.generation == 0 ? ledger_->accounts().activeGeneration() : request.generation;
  const Policy* policy = ledger_->accounts().policy(generation);
  if (policy == nullptr) {
    return answer(
        PolicyAnswer{.reply = {.code = ReplyCode::kNotFound,
                               .generation = generation,
                               .message = "no policy generation " + std::to_string(generation)}});
  }
  if (request.unless_generation == generation) {  // generations are immutable: nothing new
    return answer(PolicyAnswer{.reply = {.code = ReplyCode::kOk, .generation = generation}});
  }
  return answer(
      PolicyAnswer{.reply = {.code = ReplyCode::kOk, .generation = generation}, .policy = *policy});
}

LedgerOutcome LedgerRequests::issueShard(const ShardIssueRequest& request, uint64_t now_ms) {
  ShardReply reply = ledger_->issueShard(request, now_ms);
  LedgerOutcome outcome;
  if (firstSuccess(reply.code, reply.duplicate) && !reply.shards.empty()) {
    outcome.events.emplace_back(ShardIssued{.grant = reply.shards.front().grant});
  } else if (reply.permission_denied) {
    outcome.events.emplace_back(
        ShardIssueDenied{.gateway_name = request.gateway_name, .reason = reply.message});
  }
  outcome.reply = std::move(reply);
  return outcome;
}

LedgerOutcome LedgerRequests::reportShard(const ShardReport& report, uint64_t now_ms) {
  ShardReply reply = ledger_->reportShard(report, now_ms);
  LedgerOutcome outcome;
  if (!firstSuccess(reply.code, reply.duplicate) || reply.shards.empty()) {
    if (reply.permission_denied || reply.code == ReplyCode::kInvalidArgument ||
        reply.code == ReplyCode::kNotFound) {  // notFound: no record (compacted)
      outcome.events.emplace_back(ShardReportRefused{.shard_id = report.shard.shard_id,
                                                     .gateway_name = report.shard.gateway_name,
                                                     .code = reply.code,
                                                     .reason = reply.message});
    }
  } else if (const ShardLedgerView& view = reply.shards.front();
             view.state == ShardState::kConflict) {
    outcome.events.emplace_back(ShardConflicted{.view = view,
                                                .report_boot_epoch = report.gateway_boot_epoch,
                                                .reason = reply.message,
                                                .spent_units = reply.spent_units,
                                                .debt_units = reply.debt_units,
                                                .overspent_units = report.balances.overspent});
  } else {
    outcome.events.emplace_back(ShardReconciled{.view = view,
                                                .report_boot_epoch = report.gateway_boot_epoch,
                                                .spent_units = reply.spent_units,
                                                .reminted_units = reply.reminted_units});
  }
  outcome.reply = std::move(reply);
  return outcome;
}

}  // namespace tally
