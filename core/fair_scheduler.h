#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/fairness_meter.h"
#include "core/limits.h"

// Fair scheduling of already-RESERVED work by tenant weight (SPEC §7; docs/AGENT.md "Fair
// scheduling"). When a route's executors are the bottleneck — at most `started_max` starts of
// the route admitted and not finished at once — a `start` waits here, and each freed slot goes
// to the next waiting start by:
//
//   1. priority class, highest first (strict);
//   2. within a class, tenant weight, by stride scheduling (virtual time): each backlogged
//      tenant has a pass; the smallest pass is served and advances by S / weight (S: exact
//      for weights 1..16, fair_scheduler.cc); a tenant that becomes backlogged starts at max(the
//      class's virtual time, its own last pass) so idling banks no credit; ties go to the tenant
//      backlogged first;
//   3. within a tenant and class, arrival order (FIFO): a tenant's own starts are reordered only
//      by priority.
//
// It only knows reservations the ledger answered RESERVED (onReserved): a start of any other
// id is kNotScheduled (the caller forwards it; the ledger decides, as without a scheduler). A
// waiting start still expires at the reservation's expiresAt (tick(): it is then handed out
// over the limit, so that the ledger answers EXPIRED, and its slot is freed by that answer). A
// slot is held from admission until the ledger says the start did not happen, or the work
// finishes (settle, release, mark-unknown, report: onFinished), or its slot deadline passes
// (the policy's hard execution limit after admission: tick()).
//
// Pure and deterministic: events and `now_ms` in, admissions out (takeAdmitted()); no clock,
// no I/O. Bounded: reservations_max remembered reservations, waiting_max waiting starts (kFull
// past it). Single-threaded; owned by AgentCore.

namespace tally {

#ifdef TALLY_TEST_FAULTS
// Test-only faults, off by default, compiled only into tally_core_testing (never into a shipped
// binary): they let the simulator prove its fairness checks fail when the scheduler is wrong.
struct FairSchedulerFaults {
  bool fifo_across_tenants = false;  // a free slot goes to the earliest waiting start of the
                                     // class, whatever its tenant's weight
  bool newest_first = false;         // within a tenant, the newest waiting start goes first
};
#endif

struct FairSchedulerOptions {
  // Admitted, unfinished starts allowed at once, by route (>= 1). Routes not listed are not
  // scheduled at all.
  std::map<std::string, uint64_t> started_max;
  uint64_t waiting_max = limits::kFairWaitingMax;
  uint64_t reservations_max = limits::kFairReservationsMax;
  uint64_t fairness_window_admissions = limits::kFairnessWindowAdmissionsDefault;
#ifdef TALLY_TEST_FAULTS
  FairSchedulerFaults faults;  // set by the constructor (setFaultsForTesting)
#endif
};

// A reservation the ledger answered RESERVED.
struct FairReserved {
  std::string reservation_id;
  std::string subject;  // the tenant
  std::string route;
  uint32_t priority = 0;  // the reserve request's priority (see FairStartTerms)
  uint64_t expires_at_ms = 0;
};

// What the policy says about a start, when it arrives.
struct FairStartTerms {
  uint32_t weight = 1;       // the budget's weight (>= 1)
  uint32_t priority = 0;     // the class (fairPriorityClass)
  uint64_t slot_ttl_ms = 0;  // the budget's hard execution limit (0: the largest allowed)
};

// The class of a start: the budget's priority, or the request's when it asks for a lower one
// (a request's priority 0 means "the budget's"; no request rises above its budget's).
uint32_t fairPriorityClass(uint32_t request_priority, uint32_t budget_priority);

enum class FairStart : uint8_t {
  kNotScheduled,    // not a reservation this scheduler holds: forward it as without one
  kAdmitted,        // a slot is taken: forward it now
  kWaiting,         // waits: takeAdmitted() hands it out when its turn comes
  kAlreadyWaiting,  // a start of this reservation waits already: answer this one "retry"
  kHoldsSlot,       // a start of it was admitted already (a retry): forward it, no new slot
  kFull,            // waiting_max starts wait already: answer "retry later"
};
const char* fairStartName(FairStart start);

struct FairAdmission {
  uint64_t token = 0;  // the start request's token, given to requestStart
  std::string reservation_id;
};

// One route's state, for metrics and tests.
struct FairRouteView {
  std::string route;
  uint64_t started_max = 0;
  uint64_t started = 0;  // slots held
  uint64_t waiting = 0;
  const FairnessMeter* meter = nullptr;
};

class FairScheduler {
 public:
  explicit FairScheduler(FairSchedulerOptions options);
  FairScheduler(const FairScheduler&) = delete;
  FairScheduler& operator=(const FairScheduler&) = delete;

  bool schedules(const std::string& route) const { return routes_.contains(route); }

  // The ledger answered RESERVED: remembered (for a scheduled route) until it expires, starts
  // and finishes. False if the table is full (its start will not be scheduled). A repeat is a
  // no-op (true).
  bool onReserved(const FairReserved& reserved);
  // The reservation `id` if this scheduler holds it.
  const FairReserved* reservation(const std::string& id) const;
  // The priority class a start of `id` waits in, if one waits.
  std::optional<uint32_t> waitingClass(const std::string& id) const;

  // A start of `id` under `token`.
  FairStart requestStart(uint64_t token, const std::string& id, const FairStartTerms& terms,
                         uint64_t now_ms);
  // The ledger's answer to an admitted start: `started` false (refused, expired, not sent, the
  // requester gone) frees the slot; true keeps it. An unknown outcome is `started` true: the
  // slot stays held until the work finishes or its deadline.
  void onStartAnswered(const std::string& id, bool started, uint64_t now_ms);
  // A start forwarded unscheduled (kNotScheduled) that the ledger answered STARTED on a
  // scheduled route: it holds a slot from now (over the limit if need be), so that the limit
  // counts work this agent did not see reserved.
  void onStartedOutside(const FairReserved& reserved, uint64_t slot_ttl_ms, uint64_t now_ms);
  // The gateway settled, released, marked unknown or reported `id`: its slot is freed. If its
  // start was still waiting, it leaves the queue unstarted and its token is returned (answer it).
  std::optional<uint64_t> onFinished(const std::string& id, uint64_t now_ms);
  // Expiry: remembered reservations past expiresAt are forgotten, waiting starts past it are
  // handed out (takeAdmitted(), over the limit), slots past their deadline are freed. Returns the
  // number of slots freed by their deadline.
  uint64_t tick(uint64_t now_ms);
  // Every waiting start leaves the queue unstarted (shutdown): their tokens.
  std::vector<uint64_t> takeAllWaiting();

  // Starts admitted since the last call, in admission order: forward each.
  std::vector<FairAdmission> takeAdmitted() { return std::exchange(admitted_, {}); }

  std::vector<FairRouteView> routes() const;
  const FairnessMeter* meter(const std::string& route) const;
  uint64_t waiting() const { return waiting_; }
  size_t reservations() const { return records_.size(); }
#ifdef TALLY_TEST_FAULTS
  // Out of line, so that a binary linking the testing core shows it (no_test_faults_shipped).
  void setFaultsForTesting(FairSchedulerFaults faults);
#endif

 private:
  enum class State : uint8_t { kReserved, kWaiting, kHoldsSlot };
  struct Record {
    FairReserved reserved;
    State state = State::kReserved;
    uint64_t token = 0;        // kWaiting
    uint32_t weight = 1;       // kWaiting
    uint32_t priority = 0;     // the class, kWaiting
    uint64_t slot_ttl_ms = 0;  // kWaiting
    uint64_t deadline_ms = 0;  // expiresAt (kReserved, kWaiting) or the slot's deadline
    uint64_t arrival = 0;      // kWaiting: order of arrival among every waiting start
  };
  struct Tenant {
    std::deque<std::string> waiting;  // reservation ids, in arrival order
    uint32_t weight = 1;
    uint64_t pass = 0;
    uint64_t since = 0;  // tie-break: order in which it became backlogged
  };
  struct Class {
    uint64_t virtual_time = 0;
    std::map<std::string, Tenant> tenants;                        // backlogged
    std::set<std::tuple<uint64_t, uint64_t, std::string>> ready;  // (pass, since, tenant)
    std::unordered_map<std::string, uint64_t> idle_pass;          // passes ahead of time
  };
  struct Route {
    uint64_t started_max = 1;
    uint64_t started = 0;
    uint64_t waiting = 0;
    std::map<uint32_t, Class, std::greater<>> classes;  // highest first
    FairnessMeter meter;
  };

  void enqueue(Route& route, Record& record);
  void dequeue(Route& route, Record& record, bool admitted);
  void admitReady(Route& route, uint64_t now_ms);
  void takeSlot(Route& route, Record& record, uint64_t slot_ttl_ms, uint64_t now_ms);
  void setDeadline(Record& record, uint64_t deadline_ms);
  void forget(const std::string& id);

  FairSchedulerOptions options_;
  std::map<std::string, Route> routes_;
  std::unordered_map<std::string, Record> records_;
  std::set<std::pair<uint64_t, std::string>> deadlines_;  // (deadline_ms, id)
  std::vector<FairAdmission> admitted_;
  uint64_t waiting_ = 0;
  uint64_t backlog_seq_ = 0;
  uint64_t arrival_seq_ = 0;
#ifdef TALLY_TEST_FAULTS
  FairSchedulerFaults faults_;
#endif
};

}  // namespace tally
