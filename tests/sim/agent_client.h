#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/ledger_types.h"
#include "tests/sim/rng.h"
#include "tests/sim/trace.h"
#include "tests/sim/workload.h"
#include "wire/codec.h"

// The gateway in front of one simulated agent: it runs jobs through the agent's local socket
// (reserve → start → settle, above the reservation sometimes; release; abandon to expiry; an
// executor that reports late after markUnknown), retrying a request with the same ids after
// UNAVAILABLE, an error or a lost connection, as a real gateway must. Every job ends in a
// terminal receipt (a late report closes a USAGE_UNKNOWN), so that at the end of a run every
// shard can be reconciled. It gives up on a reserve after a few attempts (a client timing out);
// never on a follow-up.
//
// In a seed with fair scheduling (Workload::fair), each action also keeps the fair route busy:
// it tops every fair tenant up to kFairPendingPerTenant jobs not yet started (reserved, or
// their start sent and waiting in the agent's scheduler), sends each start as soon as its
// reserve is answered RESERVED, and holds each STARTED job for a while (simulated time) before
// settling it, so that the agent's execution slots, not the ledger, are the bottleneck. Now and
// then it starts an id nobody reserved (the scheduler must not hold it). It makes
// kFairJobsInSteps fair jobs during the steps, and kFairJobsAtEnd more at the end of the run
// (settleDown: on a healed network, with no more faults), so that each agent's meter completes
// at least one fairness window.

namespace tally::sim {

class AgentClient {
 public:
  using Request = std::pair<uint64_t, wire::RequestBody>;  // (tag, request)

  AgentClient(uint32_t index, Rng rng, const Workload* workload, Trace* trace);

  // One action: a new job or the next step of one that is due; the requests to send.
  std::vector<Request> act(uint64_t now_ms);
  // Only the remaining steps of unfinished jobs (the end of a run).
  std::vector<Request> settleDown(uint64_t now_ms);
  void onReply(uint64_t tag, const wire::ResponseBody& body, uint64_t now_ms);
  bool idle() const;
  std::optional<uint64_t> nextWakeMs() const;

 private:
  enum class Plan : uint8_t { kSettle, kSettleAbove, kRelease, kAbandon, kUnknownReport };
  enum class Phase : uint8_t { kReserve, kStart, kSettle, kRelease, kUnknown, kReport, kDone };
  static constexpr uint64_t kFairPendingPerTenant = 6;
  // Fair jobs made during the steps, and then at the end (after the agents' restart, which
  // starts their schedulers and meters afresh): enough for at least one window.
  static constexpr uint64_t kFairJobsInSteps = 8;
  static constexpr uint64_t kFairJobsAtEnd = 32;
  // The fair jobs wait this long at the end, while the restarted agents fetch the policy
  // (before it, every start weighs 1 in class 0: docs/AGENT.md "Fair scheduling").
  static constexpr uint64_t kFairResumeAfterMs = 1'000;
  struct Job {
    ReserveRequest reserve;
    std::string operation_id;
    Units actual_units = 0;
    Plan plan = Plan::kSettle;
    Phase phase = Phase::kReserve;
    bool waiting = false;  // a request is out
    uint64_t next_at_ms = 0;
    uint64_t attempts = 0;  // of the current phase
    bool fair = false;      // one of the fair route's jobs (fairWork)
  };

  void newJob(uint64_t now_ms, std::vector<Request>* out);
  bool fairAtEndPending() const;
  void fairWork(uint64_t now_ms, std::vector<Request>* out);
  void newFairJob(const std::string& tenant, bool reserved, uint64_t now_ms,
                  std::vector<Request>* out);
  void sendStep(size_t index, uint64_t now_ms, std::vector<Request>* out);
  void next(Job* job, Phase phase, uint64_t now_ms);
  void retry(Job* job, uint64_t now_ms);

  uint32_t index_;
  Rng rng_;
  const Workload* workload_;
  Trace* trace_;
  std::vector<Job> jobs_;
  std::vector<size_t> fair_jobs_;  // unfinished fair jobs
  uint64_t fair_jobs_made_ = 0;
  uint64_t fair_jobs_max_ = kFairJobsInSteps;
  uint64_t fair_resume_at_ms_ = 0;  // settleDown(): the fair jobs go on from then
  bool fair_resumed_ = false;
  bool settling_ = false;                   // settleDown() was called: the end of the run
  std::map<uint64_t, size_t> outstanding_;  // tag → job
  uint64_t next_tag_ = 1;
};

}  // namespace tally::sim
