#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"

// limitReservation.v1: the record of one admission and its lifecycle (SPEC §5).
//
//   REQUESTED → RESERVED → STARTED → SETTLED | SETTLED_WITH_DEBT
//   REQUESTED → REJECTED
//   RESERVED  → RELEASED                      (only if never started)
//   RESERVED  → EXPIRING → EXPIRED            (expiry task; only from RESERVED)
//   STARTED   → USAGE_UNKNOWN → SETTLED…      (only an operation receipt resolves it)
//   REQUESTED → RESERVATION_UNKNOWN → RESERVED | REJECTED   (agent side: answer lost)
//
// canTransition() is the single source of truth for that diagram. Every state change goes
// through core/reservation_lifecycle.h, which asserts it: lifecycle::transition() for the
// records of the ledger, the shard book and local admission, lifecycle::nextState() for the
// agent's RESERVATION_UNKNOWN moves.

namespace tally {

enum class ReservationState : uint8_t {
  kRequested = 0,
  kReserved,
  kStarted,
  kSettled,
  kSettledWithDebt,
  kRejected,
  kReleased,
  kExpiring,
  kExpired,
  kUsageUnknown,
  kReservationUnknown,
};

inline constexpr int kReservationStateCount = 11;

const char* reservationStateName(ReservationState state);
bool canTransition(ReservationState from, ReservationState to);
// A terminal reservation holds no units and its receipt never changes, with one exception: a
// receipt larger than the reservation, arriving after a hard-limit close, turns SETTLED into
// SETTLED_WITH_DEBT.
bool isTerminal(ReservationState state);
// States in which the reservation's units are still counted in the account's `reserved`.
bool holdsUnits(ReservationState state);

struct Reservation {
  std::string reservation_id;
  Digest request_digest{};
  std::string subject;
  std::string route;
  Generation policy_generation = 0;
  uint64_t accounting_epoch_ms = 0;  // start of the accounting period it was admitted in
  Units reserved_units = 0;          // requested units (0 held when REJECTED)
  Units actual_units = 0;
  Units refunded_units = 0;  // what the first settle/release/expiry returned to available
  Units debt_units = 0;      // overdraft recorded by settling above the reservation
  std::string operation_id;
  uint64_t created_at_ms = 0;
  uint64_t expires_at_ms = 0;
  uint64_t started_at_ms = 0;
  uint64_t closed_at_ms = 0;  // when it reached a terminal state
  ReservationState state = ReservationState::kRequested;
  std::string origin;                 // empty: central; otherwise the emergency shard id
  bool closed_by_hard_limit = false;  // USAGE_UNKNOWN closed as fully consumed
  bool late_receipt_applied = false;  // the receipt that arrived after that close was charged
  bool overdraft_breach = false;
  // Rejections only.
  LimitingDimension limiting_dimension = LimitingDimension::kNone;
  int64_t retry_after_ms = 0;
  // The request's own fields the idempotency check compares beyond subject, route and units
  // (lifecycle::repeatedReserve). A record restored from a row written before they were stored
  // has request_fields_known = false: its repeats are checked on digest, subject, route and
  // units only.
  uint32_t priority = 0;
  Generation requested_generation = 0;  // the request's generation pin; 0: the active one
  bool request_fields_known = false;
  // The request's region ("" = none), compared by every repeat whatever request_fields_known
  // says: a row written before regions existed was written for a request without one.
  std::string region;
  // The enrolled gateway whose TLS connection reserved it ("" = none: reserved by an operator or
  // over an --insecure link, or a record from before reservations were bound). Only that gateway
  // may act on it (core/link_authority.h reservationRefusal).
  std::string gateway_name;

  bool operator==(const Reservation&) const = default;
};

}  // namespace tally
