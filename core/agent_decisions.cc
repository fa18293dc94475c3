#include "core/agent_decisions.h"

#include <vector>

#include "core/rollout.h"

namespace tally {

RolloutMode rolloutModeFor(const std::optional<Policy>& policy, const std::string& subject,
                           const std::string& route) {
  if (!policy.has_value()) return RolloutMode::kEnforce;
  const Budget* budget = matchBudget(*policy, subject, route);
  if (budget == nullptr) return RolloutMode::kEnforce;
  return effectiveRolloutMode(budget->rollout, route);
}

ReserveRoute reserveRoute(const ReserveFacts& facts) {
  if (facts.shard_owned) return ReserveRoute::kShards;
  if (facts.local) return ReserveRoute::kLocalDuplicate;
  if (facts.unknown) return ReserveRoute::kResolveUnknown;
  if (facts.mode == RolloutMode::kOff) return ReserveRoute::kLocalOff;
  if (facts.link_usable) return ReserveRoute::kForward;
  if (facts.mode == RolloutMode::kShadow) return ReserveRoute::kShadowUnreachable;
  if (!facts.shards_enabled) return ReserveRoute::kRejectUnavailable;
  return facts.sent_to_ledger ? ReserveRoute::kSentToLedgerBefore : ReserveRoute::kTryShard;
}

bool linkUsable(bool connected, LinkHealth health) {
  return connected && health != LinkHealth::kPartitioned;
}

FollowUp followUpRoute(bool local, bool outbox_nonempty, bool link_usable) {
  if (local) return FollowUp::kLocal;
  if (outbox_nonempty || !link_usable) return FollowUp::kOutbox;
  return FollowUp::kForward;
}

StartRoute startRoute(bool local, bool link_usable) {
  if (local) return StartRoute::kLocal;
  return link_usable ? StartRoute::kForward : StartRoute::kUnavailable;
}

ReservationReply ledgerUnavailableRejection(const ReserveRequest& request, int64_t retry_after_ms,
                                            uint64_t now_ms) {
  return ReservationReply{
      .code = ReplyCode::kRejected,
      .receipt = Reservation{.reservation_id = request.reservation_id,
                             .request_digest = request.request_digest,
                             .subject = request.subject,
                             .route = request.route,
                             .policy_generation = request.policy_generation,
                             .reserved_units = request.units,
                             .created_at_ms = now_ms,
                             .closed_at_ms = now_ms,
                             .state = ReservationState::kRejected,
                             .limiting_dimension = LimitingDimension::kLedgerUnavailable,
                             .retry_after_ms = retry_after_ms},
      .message = "the ledger is unreachable from this agent; retry later"};
}

ShadowDecision classifyShadow(const ReservationReply* reply, bool transport_failed) {
  if (transport_failed) {
    return {.outcome = "unavailable",
            .dimension = LimitingDimension::kLedgerUnavailable,
            .admit_locally = true};
  }
  if (reply == nullptr) return {.outcome = "error", .admit_locally = false};
  if (reply->code == ReplyCode::kRejected || reply->receipt.state == ReservationState::kRejected) {
    return {.outcome = "rejected",
            .dimension = reply->receipt.limiting_dimension,
            .admit_locally = true};
  }
  if (reply->code == ReplyCode::kOk) return {.outcome = "admitted"};
  return {.outcome = "error", .admit_locally = false};
}

bool AgedIds::add(const std::string& id, uint64_t now_ms) {
  if (since_.contains(id)) return true;
  if (since_.size() >= entries_max_) return false;
  since_.emplace(id, now_ms);
  by_age_.emplace(now_ms, id);
  return true;
}

bool AgedIds::remove(const std::string& id) {
  auto it = since_.find(id);
  if (it == since_.end()) return false;
  by_age_.erase({it->second, id});
  since_.erase(it);
  return true;
}

uint64_t AgedIds::oldestAgeMs(uint64_t now_ms) const {
  if (by_age_.empty()) return 0;
  const uint64_t since = by_age_.begin()->first;
  return now_ms > since ? now_ms - since : 0;
}

std::vector<std::string> AgedIds::oldest(size_t max) const {
  std::vector<std::string> ids;
  for (auto it = by_age_.begin(); it != by_age_.end() && ids.size() < max; ++it) {
    ids.push_back(it->second);
  }
  return ids;
}

bool outboxAnswerDelivers(const ReservationReply* reply) {
  return reply != nullptr && reply->code != ReplyCode::kResourceExhausted &&
         reply->code != ReplyCode::kArithmeticOverflow;
}

}  // namespace tally
