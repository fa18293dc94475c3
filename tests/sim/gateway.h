#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/ledger_types.h"
#include "tests/sim/checks.h"
#include "tests/sim/network.h"
#include "tests/sim/rng.h"
#include "tests/sim/trace.h"
#include "tests/sim/workload.h"
#include "wire/codec.h"

// One simulated gateway: a client of the ledger that runs jobs (reserve → start → settle, or
// release, or abandon to expiry, or an executor that never reports: markUnknown, perhaps a late
// report) over the simulated network. It retries a request with the same ids after a timeout
// or a lost reply, as a real client must, and sends requests at and beyond the limits of every
// field. Every reply it accepts is reported to the Checker as acknowledged.

namespace tally::sim {

#ifdef TALLY_TEST_FAULTS
struct GatewayFaults {
  bool retry_reserve_under_new_id = false;  // a timed-out reserve is retried under a new id
};
#endif

class Gateway {
 public:
  Gateway(NodeId id, Rng rng, const Workload* workload, Network* network, Checker* checker,
          Trace* trace);

  // One action: a new job, the next step or a retry of a job, or a query.
  void act(uint64_t now_ms);
  // Only retries and the remaining steps of started jobs (the end of a run).
  void settleDown(uint64_t now_ms);
  void onFrame(const std::vector<uint8_t>& frame, uint64_t now_ms);
  // Every job has finished (nothing outstanding).
  bool idle() const;
  // When the earliest unfinished job next sends (a step or a retry), if any is unfinished.
  std::optional<uint64_t> nextWakeMs() const;
  // The largest policy generation worth pinning (the operator's count).
  void setGenerationHint(Generation generation) { generation_hint_ = generation; }
#ifdef TALLY_TEST_FAULTS
  void setFaults(GatewayFaults faults) { faults_ = faults; }
#endif

 private:
  enum class Plan : uint8_t { kSettle, kSettleAbove, kRelease, kAbandon, kUnknown, kUnknownReport };
  enum class Phase : uint8_t { kReserve, kStart, kSettle, kRelease, kUnknown, kReport, kDone };
  struct Job {
    std::string name;  // the gateway's own name for the work (one per job, across ids)
    ReserveRequest reserve;
    std::string operation_id;
    Units actual_units = 0;
    Plan plan = Plan::kSettle;
    Phase phase = Phase::kReserve;
    bool beyond_limits = false;  // the ledger must refuse it
    bool sent = false;           // the current phase's request is out
    uint64_t next_at_ms = 0;     // when to send (or resend) the current phase's request
    uint64_t timeout_ms = 0;
    uint64_t errors = 0;  // error replies (not domain answers) so far
    ReservationState acknowledged = ReservationState::kRequested;
    std::vector<std::string> reserved_ids;  // every id a reservation was acknowledged under
  };
  struct Pending {
    size_t job = 0;
    Phase phase = Phase::kDone;  // kDone: a query
    ReservationState known = ReservationState::kRequested;
  };

  void newJob(uint64_t now_ms);
  void send(size_t job_index, uint64_t now_ms);
  void sendQuery(size_t job_index, uint64_t now_ms);
  void sendConflict(size_t job_index, uint64_t now_ms);
  uint64_t transmit(wire::RequestBody body, uint64_t now_ms);
  void onReply(const Pending& pending, const wire::Response& response, uint64_t now_ms);
  void advance(Job* job, const ReservationReply& reply, uint64_t now_ms);
  void finish(Job* job, const std::string& why, uint64_t now_ms);
  void trace(uint64_t now_ms, const std::string& line);

  NodeId id_;
  Rng rng_;
  const Workload* workload_;
  Network* network_;
  Checker* checker_;
  Trace* trace_;
  std::vector<Job> jobs_;
  std::map<uint64_t, Pending> pending_;  // by request id
  std::set<uint64_t> conflicts_;         // request ids of deliberate id reuse
  uint64_t next_request_id_ = 1;
  uint64_t next_job_ = 0;
  Generation generation_hint_ = 1;
#ifdef TALLY_TEST_FAULTS
  GatewayFaults faults_;
#endif
};

}  // namespace tally::sim
