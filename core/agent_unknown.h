#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/agent_decisions.h"
#include "core/ledger_types.h"
#include "core/reservation.h"

// The agent's RESERVATION_UNKNOWN reservations (SPEC §5, §7), pure: reserves sent to the ledger
// whose answer was lost, so the debit may or may not have happened. Each is resolved only by
// asking the ledger about the same id (Query) and, if the ledger never saw it, by sending the
// same reserve again (same id, same digest): never by inventing an id. Every transition is
// checked against canTransition(): REQUESTED → RESERVATION_UNKNOWN → RESERVED | REJECTED.
//
// At most one resolution step per id is in flight. Bounded by `entries_max`. Time is an
// argument; the shell sends what resolve() and onQueryAnswer() return and reports back.

namespace tally {

#ifdef TALLY_TEST_FAULTS
// Test-only faults, off by default, compiled only into tally_core_testing (never into a shipped
// binary): they let the simulator prove its checks fail when the agent resolves wrongly.
struct UnknownReservationsFaults {
  // Whatever the query answers, the lost reserve is sent again under a new id (its id + "-r1"):
  // a debit that did happen is made a second time.
  bool resend_under_new_id = false;
  // A reserve whose answer was lost is answered RESERVED to its gateway at once (applied by
  // AgentCore): an acknowledgement the ledger may never have made.
  bool answer_lost_as_reserved = false;
};
#endif

// What the ledger's answer to a resolving query means.
struct UnknownQueryOutcome {
  // Set: resolved, into this state (RESERVED or REJECTED).
  std::optional<ReservationState> resolved;
  // Set: the ledger never saw it: send exactly this reserve again, then onResendAnswer().
  std::optional<ReserveRequest> resend;
  // Neither: not settled yet (an unexpected answer); tried again later.
};

// What a gateway that retried an unknown reserve hears once a query resolved it: the ledger's
// receipt as a duplicate, refunding nothing (the first answer was the one that was lost).
ReservationReply resolvedAnswer(ReservationReply reply);

class UnknownReservations {
 public:
  explicit UnknownReservations(uint64_t entries_max) : ages_(entries_max) {}

  // A sent reserve's answer was lost. False (nothing changed) when the table is full.
  bool onAnswerLost(const ReserveRequest& request, uint64_t now_ms);
  bool contains(const std::string& id) const { return entries_.contains(id); }
  // A resolution step for `id` is in flight.
  bool resolving(const std::string& id) const {
    auto it = entries_.find(id);
    return it != entries_.end() && it->second.resolving;
  }
  size_t size() const { return entries_.size(); }
  uint64_t oldestAgeMs(uint64_t now_ms) const { return ages_.oldestAgeMs(now_ms); }
  // Up to `max` ids, oldest first (the background resolution pass).
  std::vector<std::string> oldest(size_t max) const { return ages_.oldest(max); }

  // Begins resolving `id`: the query to send (always the same id), or nothing if `id` is not
  // unknown or a step is already in flight.
  std::optional<QueryRequest> resolve(const std::string& id);
  // The ledger's answer to that query (null: not a ReservationReply).
  UnknownQueryOutcome onQueryAnswer(const std::string& id, const ReservationReply* reply);
  // The ledger's answer to the re-sent reserve (null: not a ReservationReply): resolved.
  ReservationState onResendAnswer(const std::string& id, const ReservationReply* reply);
  // The step failed in transport: stays unknown, tried again later.
  void onStepFailed(const std::string& id);
  // A query the gateway itself sent answered OK about it.
  void onFoundElsewhere(const std::string& id, const ReservationReply& reply);
  // The ledger's answer to a query a gateway sent through the agent: if it resolves an unknown
  // `id` (an OK reply), the answer its waiting retries hear (resolvedAnswer()).
  std::optional<ReservationReply> onGatewayQueryAnswer(const std::string& id,
                                                       const ReservationReply* reply);
#ifdef TALLY_TEST_FAULTS
  // Out of line, so that a binary linking the testing core shows it (no_test_faults_shipped).
  void setFaultsForTesting(UnknownReservationsFaults faults);
#endif

 private:
  struct Entry {
    ReserveRequest request;
    bool resolving = false;
  };
  void resolveInto(const std::string& id, ReservationState state);

  std::unordered_map<std::string, Entry> entries_;
  AgedIds ages_;
#ifdef TALLY_TEST_FAULTS
  UnknownReservationsFaults faults_;
#endif
};

}  // namespace tally
