#include "core/link_health.h"

#include "core/assert.h"

namespace tally {

const char* linkHealthName(LinkHealth health) {
  switch (health) {
    case LinkHealth::kHealthy: return "HEALTHY";
    case LinkHealth::kDegraded: return "DEGRADED";
    case LinkHealth::kPartitioned: return "PARTITIONED";
  }
  return "UNKNOWN";
}

LinkHealthMonitor::LinkHealthMonitor(LinkHealthThresholds thresholds, uint64_t now_ms)
    : thresholds_(thresholds), state_since_ms_(now_ms), last_success_ms_(now_ms) {
  TALLY_ASSERT(thresholds_.failures_to_degrade >= 1);
  TALLY_ASSERT(thresholds_.failures_to_partition >= thresholds_.failures_to_degrade);
  TALLY_ASSERT(thresholds_.successes_to_recover >= 1);
}

void LinkHealthMonitor::moveTo(LinkHealth next, uint64_t now_ms) {
  if (next == state_) return;
  state_ = next;
  state_since_ms_ = now_ms;
  ++transitions_;
}

void LinkHealthMonitor::onSuccess(uint64_t latency_us, uint64_t now_ms) {
  last_success_ms_ = now_ms > last_success_ms_ ? now_ms : last_success_ms_;
  last_answer_ms_ = now_ms > last_answer_ms_ ? now_ms : last_answer_ms_;
  answered_ = true;
  consecutive_failures_ = 0;
  if (latency_us > thresholds_.slow_request_us) {
    consecutive_fast_successes_ = 0;
    moveTo(LinkHealth::kDegraded, now_ms);
    return;
  }
  ++consecutive_fast_successes_;
  if (state_ == LinkHealth::kPartitioned) {
    moveTo(LinkHealth::kDegraded, now_ms);
  } else if (state_ == LinkHealth::kDegraded &&
             consecutive_fast_successes_ >= thresholds_.successes_to_recover) {
    moveTo(LinkHealth::kHealthy, now_ms);
  }
}

void LinkHealthMonitor::onFailure(uint64_t now_ms) {
  // The clock of a failing streak starts at its first failure, not at the last success: an idle
  // agent's last success can be long ago, and one timeout must not partition it at once.
  if (consecutive_failures_ == 0) first_failure_ms_ = now_ms;
  ++consecutive_failures_;
  consecutive_fast_successes_ = 0;
  if (consecutive_failures_ >= thresholds_.failures_to_partition) {
    moveTo(LinkHealth::kPartitioned, now_ms);
  } else if (consecutive_failures_ >= thresholds_.failures_to_degrade &&
             state_ == LinkHealth::kHealthy) {
    moveTo(LinkHealth::kDegraded, now_ms);
  }
  tick(now_ms);
}

void LinkHealthMonitor::onTimeout(uint64_t sent_ms, uint64_t now_ms) {
  if (!answered_ || last_answer_ms_ < sent_ms) {
    onFailure(now_ms);  // nothing came back while it waited: silence
    return;
  }
  consecutive_fast_successes_ = 0;
  if (state_ == LinkHealth::kHealthy) moveTo(LinkHealth::kDegraded, now_ms);
}

void LinkHealthMonitor::onLateAnswer(uint64_t now_ms) {
  // Slow, not silent: it ends a failing streak the way a slow success does.
  onSuccess(UINT64_MAX, now_ms);
}

void LinkHealthMonitor::tick(uint64_t now_ms) {
  if (consecutive_failures_ == 0 || state_ == LinkHealth::kPartitioned) return;
  if (now_ms >= first_failure_ms_ + thresholds_.partition_after_ms) {
    moveTo(LinkHealth::kPartitioned, now_ms);
  }
}

}  // namespace tally
