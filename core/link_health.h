#pragma once

#include <cstdint>

// The agent's view of its link to the central ledger (SPEC §7): HEALTHY → DEGRADED →
// PARTITIONED and back. Pure: fed with request outcomes and ticks, time as an argument.
//
//  * HEALTHY: recent requests succeed within `slow_request_us`.
//  * DEGRADED: a failure, or a slow success. Still forwarding; operators are warned.
//  * PARTITIONED: `failures_to_partition` consecutive failures, or failures and no success for
//    `partition_after_ms` since the first failure of the streak. The agent stops forwarding
//    admissions (shards or rejection with Retry-After), keeps its outbox waiting.
//  * Only silence partitions: a failure is a connection loss, a failed connect, or a request
//    timeout during which no answer at all arrived. A timeout while answers are still arriving
//    (on time or late) is slowness under load: DEGRADED at most, never a step towards
//    PARTITIONED.
//  * Recovery: `successes_to_recover` consecutive fast successes return to HEALTHY (a
//    partitioned link goes through DEGRADED first, so one lucky answer does not end a partition).

namespace tally {

enum class LinkHealth : uint8_t { kHealthy = 0, kDegraded, kPartitioned };
const char* linkHealthName(LinkHealth health);

struct LinkHealthThresholds {
  uint32_t failures_to_degrade = 1;
  uint32_t failures_to_partition = 3;
  uint64_t slow_request_us = 100'000;
  uint64_t partition_after_ms = 3'000;
  uint32_t successes_to_recover = 3;
};

class LinkHealthMonitor {
 public:
  explicit LinkHealthMonitor(LinkHealthThresholds thresholds, uint64_t now_ms);

  void onSuccess(uint64_t latency_us, uint64_t now_ms);
  // A connection loss or a failed connect.
  void onFailure(uint64_t now_ms);
  // A request sent at `sent_ms` timed out: a failure only if no answer arrived since it was sent
  // (silence); otherwise the ledger is busy, which degrades and no more.
  void onTimeout(uint64_t sent_ms, uint64_t now_ms);
  // An answer that came after its request had timed out: the ledger is alive, only slow.
  void onLateAnswer(uint64_t now_ms);
  // Time alone can partition a link whose requests keep failing or never come back.
  void tick(uint64_t now_ms);

  LinkHealth state() const { return state_; }
  uint64_t lastSuccessMs() const { return last_success_ms_; }
  uint64_t lastAnswerMs() const { return last_answer_ms_; }
  uint64_t stateSinceMs() const { return state_since_ms_; }
  uint32_t consecutiveFailures() const { return consecutive_failures_; }
  uint64_t transitions() const { return transitions_; }

 private:
  void moveTo(LinkHealth next, uint64_t now_ms);

  LinkHealthThresholds thresholds_;
  LinkHealth state_ = LinkHealth::kHealthy;
  uint64_t state_since_ms_;
  uint64_t last_success_ms_;
  uint64_t last_answer_ms_ = 0;    // any answer, late ones included
  bool answered_ = false;          // last_answer_ms_ is set
  uint64_t first_failure_ms_ = 0;  // of the current streak of consecutive failures
  uint32_t consecutive_failures_ = 0;
  uint32_t consecutive_fast_successes_ = 0;
  uint64_t transitions_ = 0;
};

}  // namespace tally
