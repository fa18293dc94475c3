#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/ledger_types.h"
#include "core/reservation.h"

// The reservation lifecycle of SPEC §5, written once: idempotency of a repeated reserve, the
// start-vs-expiry CAS, release, settle, mark-unknown, operation receipts (with the late receipt
// after a hard-limit close) and the hard-limit close itself. The central Ledger, the agent's
// ShardBook and its local admission (LocalBook) each keep their own table of records and their
// own admission rule, and perform every later step through these functions, which take the
// record, the request and `now_ms` and change the units through a CapacityHolder.
//
// Every state change goes through transition(), which asserts canTransition() (the one table,
// core/reservation.h). Pure: no allocation beyond the reply's receipt copy.

namespace tally {

// A holder's answer to a settle or an extra charge.
enum class HolderCode : uint8_t {
  kOk = 0,
  kOverflow,  // a balance would leave 64 bits; the holder changed nothing
};

// A holder's answer to an extend (a STARTED reservation growing to a new total).
struct HolderGrow {
  HolderCode code = HolderCode::kOk;
  // kNone: the units moved from available to reserved. Else the holder refused and changed
  // nothing: the dimension and retry-after a reserve of the same units would be answered with.
  LimitingDimension refused = LimitingDimension::kNone;
  int64_t retry_after_ms = 0;
  std::string message;
};

struct HolderSettle {
  HolderCode code = HolderCode::kOk;
  Units refunded_units = 0;  // returned to available
  Units debt_units = 0;      // usage the holder could not cover (debt, a shard's overspent)
  bool overdraft_breach = false;
};

// What holds one reservation's units: a central Account, a ShardAccount, or nothing (local
// admission). A holder is bound to the one reservation a call is about and lives on the caller's
// stack for that call; the lifecycle calls it only while that reservation holds units (for
// settle, returnUnits and consumeAll) or has just changed (changed).
class CapacityHolder {
 public:
  // Release and expiry: the reservation's units go back to available. Cannot fail: the
  // holder's reserved covers every holding reservation (its invariant).
  virtual void returnUnits(const Reservation& reservation, uint64_t now_ms) = 0;
  // A receipt for a holding reservation: reserved_units leave reserved, `actual_units` are
  // spent, the difference is refunded or charged (debt).
  virtual HolderSettle settle(const Reservation& reservation, Units actual_units,
                              uint64_t now_ms) = 0;
  // The hard-limit close: every reserved unit is treated as spent.
  virtual HolderSettle consumeAll(const Reservation& reservation, uint64_t now_ms) = 0;
  // A late receipt above a reservation closed as consumed: `extra_units` more are spent.
  virtual HolderSettle chargeExtra(const Reservation& reservation, Units extra_units,
                                   uint64_t now_ms) = 0;
  // An extend: `more_units` move from available to reserved so that the reservation holds
  // `total_units` (its reserved_units is still the old amount), admitted exactly like a reserve
  // of `more_units` against the same account, with the policy's max single reservation applied
  // to `total_units`; or refused, changing nothing. The default refuses (kNoBudget, never
  // retried): a holder that cannot take more units says so rather than guessing.
  virtual HolderGrow grow(const Reservation& reservation, Units more_units, Units total_units,
                          uint64_t now_ms);
  // After every change to the record (`from` is its state before; equal to the current one
  // when only fields changed): the holder's persistence marks, deadline queues and checks.
  virtual void changed(const Reservation& reservation, ReservationState from, uint64_t now_ms) = 0;

 protected:
  ~CapacityHolder() = default;
};

namespace lifecycle {

// Asserts canTransition(from, to) and returns `to`: for a state kept outside a Reservation
// record (the agent's RESERVATION_UNKNOWN ids: REQUESTED → RESERVATION_UNKNOWN → RESERVED |
// REJECTED).
ReservationState nextState(ReservationState from, ReservationState to);

// The one state change of a record: asserts canTransition, stamps closed_at_ms on the first
// terminal state, then tells the holder.
void transition(Reservation* reservation, ReservationState to, CapacityHolder* holder,
                uint64_t now_ms);

// Argument checks every reserve passes before anything else: ids, subject, route, and units in
// 1..kUnitsPerRequestMax. nullopt when the request is well formed.
std::optional<ReservationReply> checkReserve(const ReserveRequest& request);

// The one idempotency check: a reserve whose id is already known. The same request again is a
// duplicate (REJECTED stays REJECTED), answered with the stored receipt; a request that differs
// in digest, subject, route, units, priority or generation pin is kIdempotencyConflict.
ReservationReply repeatedReserve(const Reservation& existing, const ReserveRequest& request);

// A new record for `request` (state REQUESTED) carrying the request's own fields; the caller
// adds generation, epoch, expiry and origin, stores it, then calls admitted() or rejected().
Reservation newRecord(const ReserveRequest& request, uint64_t now_ms);
// REQUESTED → RESERVED (the holder already holds the units) or REQUESTED → REJECTED.
ReservationReply admitted(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);
ReservationReply rejected(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);

// Each takes the record the caller found for the request's id, or null (kNotFound naming
// `what`, e.g. "shard reservation"). Ids are checked first.
ReservationReply start(Reservation* reservation, const StartRequest& request,
                       CapacityHolder* holder, uint64_t now_ms, const char* what = "reservation");
ReservationReply release(Reservation* reservation, const ReleaseRequest& request,
                         CapacityHolder* holder, uint64_t now_ms, const char* what = "reservation");
ReservationReply markUnknown(Reservation* reservation, const MarkUnknownRequest& request,
                             CapacityHolder* holder, uint64_t now_ms,
                             const char* what = "reservation");
// A settle or an operation receipt (the same step: the executor's word on actual units).
ReservationReply receipt(Reservation* reservation, const std::string& reservation_id,
                         const std::string& operation_id, Units actual_units,
                         CapacityHolder* holder, uint64_t now_ms, const char* what = "reservation");
ReservationReply query(const Reservation* reservation, const QueryRequest& request,
                       const char* what = "reservation");
// Streaming top-up (docs/protocol.md "extend"). A STARTED reservation bound to the request's
// operation id grows to reserved_units_total: the difference through holder->grow(), OK on
// success; kRejected (receipt unchanged, with the refusal's limiting dimension and retry-after
// stamped on the reply's copy only) when the holder refuses. A total the reservation already
// holds (equal or below) is OK duplicate, for every state bound to the same operation (a retry
// after a lost answer, or one overtaken by a larger extend or by the settle). Otherwise:
// RESERVED, USAGE_UNKNOWN and terminal states are kInvalidState (EXPIRING/EXPIRED kExpired),
// another operation id kOperationConflict, a total of 0 or above kUnitsPerRequestMax
// kInvalidArgument. The hold's expiry and the hard limit are unchanged (extend adds units,
// never time).
ReservationReply extend(Reservation* reservation, const ExtendRequest& request,
                        CapacityHolder* holder, uint64_t now_ms, const char* what = "reservation");

// The two halves of expiry. beginExpiry is the CAS RESERVED → EXPIRING, only once expiresAt has
// passed; completeExpiry is EXPIRING → EXPIRED, returning the units. Each returns whether it
// acted.
bool beginExpiry(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);
bool completeExpiry(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);
// Both halves, or only the second for a record restored EXPIRING: what a tick does.
bool expire(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);
// USAGE_UNKNOWN past the hard execution limit (the caller decides when) → SETTLED as fully
// consumed. False if the record is not USAGE_UNKNOWN or the holder overflowed (it stays
// USAGE_UNKNOWN; a receipt still resolves it).
bool closeByHardLimit(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms);

}  // namespace lifecycle
}  // namespace tally
