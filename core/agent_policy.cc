#include "core/agent_policy.h"

#include <utility>

#include "core/agent_decisions.h"

namespace tally {

AgentPolicy::AgentPolicy(AgentPolicyOptions options, uint64_t now_ms)
    : options_(options), next_fetch_ms_(now_ms + options.refresh_ms) {}

bool AgentPolicy::beginFetch(bool connected, uint64_t now_ms) {
  if (!connected || in_flight_ || now_ms < next_fetch_ms_) return false;
  in_flight_ = true;
  next_fetch_ms_ = now_ms + options_.refresh_ms;
  return true;
}

void AgentPolicy::onFetchFailed() { in_flight_ = false; }

PolicyFetchOutcome AgentPolicy::onFetchAnswer(const PolicyReply& reply,
                                              std::optional<Policy> policy) {
  in_flight_ = false;
  const Generation before = policy_.has_value() ? policy_->generation : 0;
  if (reply.code == ReplyCode::kOk && policy.has_value()) {
    policy_ = std::move(policy);
    if (policy_->generation == 0) policy_->generation = reply.generation;
  } else if (reply.code == ReplyCode::kOk && before != 0 && reply.generation == before) {
    // Unchanged (the fetch named the generation held): keep it.
  } else if (reply.code == ReplyCode::kNotFound) {
    policy_.reset();
  } else {
    return {.generation = before, .budgets = policy_.has_value() ? policy_->budgets.size() : 0};
  }
  answered_on_connection_ = true;
  const Generation after = policy_.has_value() ? policy_->generation : 0;
  return {.applied = true,
          .changed = after != before,
          .generation = after,
          .budgets = policy_.has_value() ? policy_->budgets.size() : 0};
}

RolloutMode AgentPolicy::mode(const std::string& subject, const std::string& route) const {
  return rolloutModeFor(policy_, subject, route);
}

bool AgentPolicy::wantsShards(const std::string& subject, const std::string& route) const {
  if (!policy_.has_value()) return false;
  const Budget* budget = matchBudget(*policy_, subject, route);
  return budget != nullptr && budget->emergency.enabled && budget->emergency.shard_units > 0;
}

}  // namespace tally
