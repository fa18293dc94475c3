#include "core/agent_decisions.h"

#include <utility>
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

Reservation agentReceiptOf(const ReserveRequest& request, ReservationState state, uint64_t now_ms) {
  return Reservation{.reservation_id = request.reservation_id,
                     .request_digest = request.request_digest,
                     .subject = request.subject,
                     .route = request.route,
                     .policy_generation = request.policy_generation,
                     .reserved_units = request.units,
                     .created_at_ms = now_ms,
                     .state = state};
}

ReservationReply ledgerUnavailableRejection(const ReserveRequest& request, int64_t retry_after_ms,
                                            uint64_t now_ms) {
  Reservation receipt = agentReceiptOf(request, ReservationState::kRejected, now_ms);
  receipt.closed_at_ms = now_ms;
  receipt.limiting_dimension = LimitingDimension::kLedgerUnavailable;
  receipt.retry_after_ms = retry_after_ms;
  return ReservationReply{.code = ReplyCode::kRejected,
                          .receipt = std::move(receipt),
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

AgedIds::AgedIds(const AgedIds& other) : entries_max_(other.entries_max_), since_(other.since_) {
  for (const auto& [id, since_ms] : since_) by_age_.emplace(since_ms, std::string_view(id));
}

AgedIds& AgedIds::operator=(const AgedIds& other) {
  if (this != &other) *this = AgedIds(other);
  return *this;
}

AgedIds::Since::iterator AgedIds::insert(const std::string& id, uint64_t now_ms) {
  auto it = since_.emplace(id, now_ms).first;
  by_age_.emplace(now_ms, std::string_view(it->first));
  return it;
}

void AgedIds::erase(Since::iterator it) {
  by_age_.erase({it->second, std::string_view(it->first)});
  since_.erase(it);
}

bool AgedIds::add(const std::string& id, uint64_t now_ms) {
  if (since_.contains(id)) return true;
  if (since_.size() >= entries_max_) return false;
  insert(id, now_ms);
  return true;
}

void AgedIds::addEvictingOldest(const std::string& id, uint64_t now_ms) {
  if (entries_max_ == 0) return;
  const auto [it, inserted] = since_.try_emplace(id, now_ms);
  if (!inserted) return;
  // The oldest of the others makes room (the new id is not in the age index yet, so it stays
  // even when older than every other).
  if (since_.size() > entries_max_) erase(since_.find(by_age_.begin()->second));
  by_age_.emplace(now_ms, std::string_view(it->first));
}

bool AgedIds::remove(const std::string& id) {
  auto it = since_.find(id);
  if (it == since_.end()) return false;
  erase(it);
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
    ids.emplace_back(it->second);
  }
  return ids;
}

bool outboxAnswerDelivers(const ReservationReply* reply) {
  return reply != nullptr && reply->code != ReplyCode::kResourceExhausted &&
         reply->code != ReplyCode::kArithmeticOverflow;
}

ReserveAnswerPlan planReserveAnswer(RolloutMode mode, LinkOutcome outcome,
                                    const ReservationReply* reply, bool shards_wanted) {
  if (mode == RolloutMode::kShadow) {
    // Shadow learns the ledger's decision and never refuses on it: what the ledger did not
    // reserve (refused, or unreachable) the agent admits itself.
    const ShadowDecision decision = classifyShadow(
        outcome == LinkOutcome::kAnswered ? reply : nullptr, outcome != LinkOutcome::kAnswered);
    return {.action = decision.admit_locally ? ReserveAnswer::kAdmitShadow : ReserveAnswer::kPassOn,
            .shadow = decision};
  }
  switch (outcome) {
    case LinkOutcome::kAnswered:
      return {.action = ReserveAnswer::kPassOn,
              .learn_shard_account =
                  shards_wanted && reply != nullptr && reply->code == ReplyCode::kOk};
    case LinkOutcome::kNotSent: return {.action = ReserveAnswer::kNotSent};
    case LinkOutcome::kLost: return {.action = ReserveAnswer::kUnknown};
  }
  return {.action = ReserveAnswer::kUnknown};
}

void trackUsageUnknown(AgedIds* usage_unknown, OutboxKind kind, const std::string& id,
                       const ReservationReply* reply, uint64_t now_ms) {
  if (reply == nullptr || reply->code != ReplyCode::kOk) return;
  if (kind == OutboxKind::kMarkUnknown) {
    if (reply->receipt.state == ReservationState::kUsageUnknown) {
      (void)usage_unknown->add(id, now_ms);
    }
  } else if (kind != OutboxKind::kRelease) {
    usage_unknown->remove(id);
  }
}

bool AgentDeadlines::beginShutdown(uint64_t now_ms, uint64_t timeout_ms) {
  shutting_down_ = true;
  shutdown_deadline_ms_ = now_ms + timeout_ms;
  return timeout_ms == 0;
}

void AgentDeadlines::beginDrain(uint64_t now_ms, uint64_t timeout_ms) {
  draining_ = true;
  drain_deadline_ms_ = now_ms + timeout_ms;
}

bool AgentDeadlines::answerPendingNow(uint64_t now_ms) {
  return shutting_down_ && now_ms >= shutdown_deadline_ms_ && !answered_;
}

bool AgentDeadlines::drainEnds(uint64_t now_ms, bool outbox_empty, bool connected) {
  if (!draining_ || !(outbox_empty || !connected || now_ms >= drain_deadline_ms_)) return false;
  draining_ = false;
  return true;
}

bool AgentDeadlines::answerAll() { return !std::exchange(answered_, true); }

}  // namespace tally
