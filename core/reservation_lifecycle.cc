#include "core/reservation_lifecycle.h"

#include <utility>

#include "core/assert.h"
#include "core/limits.h"
#include "core/reservation_replies.h"

namespace tally {

HolderGrow CapacityHolder::grow(const Reservation& /*reservation*/, Units /*more_units*/,
                                Units /*total_units*/, uint64_t /*now_ms*/) {
  return {.refused = LimitingDimension::kNoBudget,
          .retry_after_ms = kRetryNever,
          .message = "this reservation's holder cannot extend it"};
}

}  // namespace tally

namespace tally::lifecycle {
namespace {

using replies::answer;
using replies::checkIds;
using replies::invalidArgument;
using replies::notFound;
using S = ReservationState;

std::optional<ReservationReply> checkUnits(Units units, const char* what) {
  if (units > limits::kUnitsPerRequestMax) {
    return invalidArgument(std::string(what) + " must be at most " +
                           std::to_string(limits::kUnitsPerRequestMax));
  }
  return std::nullopt;
}

ReservationReply overflow(const Reservation& reservation) {
  return {.code = ReplyCode::kArithmeticOverflow,
          .receipt = reservation,
          .message = "settled units overflow"};
}

// A start of a reservation that is no longer RESERVED: a repeat of the winning start is a
// duplicate, another operation id lost the CAS, an expiry that won is EXPIRED, anything else is
// INVALID_STATE.
ReservationReply startOfUnreserved(const Reservation& reservation,
                                   const std::string& operation_id) {
  switch (reservation.state) {
    case S::kStarted:
    case S::kUsageUnknown:
    case S::kSettled:
    case S::kSettledWithDebt:
      if (reservation.operation_id == operation_id) {
        return answer(ReplyCode::kOk, reservation, /*duplicate=*/true);
      }
      return answer(ReplyCode::kOperationConflict, reservation);
    case S::kExpiring:
    case S::kExpired: return answer(ReplyCode::kExpired, reservation);
    default: return answer(ReplyCode::kInvalidState, reservation);
  }
}

// The units of a repeated reserve: those it reserved, or fewer once an extend (only ever of a
// started reservation) has grown it.
bool sameUnits(const Reservation& existing, Units units) {
  return existing.reserved_units == units ||
         (!existing.operation_id.empty() && units < existing.reserved_units);
}

bool sameRequest(const Reservation& existing, const ReserveRequest& request) {
  if (existing.request_digest != request.request_digest || existing.subject != request.subject ||
      existing.route != request.route || !sameUnits(existing, request.units) ||
      existing.region != request.region) {
    return false;
  }
  return !existing.request_fields_known ||
         (existing.priority == request.priority &&
          existing.requested_generation == request.policy_generation);
}

// STARTED or USAGE_UNKNOWN → SETTLED | SETTLED_WITH_DEBT with the receipt's actual units.
ReservationReply closeWithReceipt(Reservation* reservation, Units actual_units,
                                  CapacityHolder* holder, uint64_t now_ms) {
  const HolderSettle outcome = holder->settle(*reservation, actual_units, now_ms);
  if (outcome.code == HolderCode::kOverflow) return overflow(*reservation);
  // Point of no return: the holder has moved the units; the record follows.
  reservation->actual_units = actual_units;
  reservation->refunded_units = outcome.refunded_units;
  reservation->debt_units = outcome.debt_units;
  reservation->overdraft_breach = outcome.overdraft_breach;
  // SPEC §4: any settle above the reservation is SETTLED_WITH_DEBT, whether available covered
  // the excess or overdraft did (debt_units says how much became debt).
  transition(reservation,
             actual_units > reservation->reserved_units ? S::kSettledWithDebt : S::kSettled, holder,
             now_ms);
  return answer(ReplyCode::kOk, *reservation, false, outcome.refunded_units);
}

// Closed as fully consumed at the hard limit: a smaller actual refunds nothing (the units were
// treated as spent), a larger one is charged like a settle above the reservation. Only the
// first late receipt counts.
ReservationReply lateReceipt(Reservation* reservation, Units actual_units, CapacityHolder* holder,
                             uint64_t now_ms) {
  if (actual_units > reservation->reserved_units) {
    const HolderSettle outcome =
        holder->chargeExtra(*reservation, actual_units - reservation->reserved_units, now_ms);
    if (outcome.code == HolderCode::kOverflow) return overflow(*reservation);
    reservation->late_receipt_applied = true;
    reservation->actual_units = actual_units;
    reservation->debt_units = outcome.debt_units;
    reservation->overdraft_breach = outcome.overdraft_breach;
    transition(reservation, S::kSettledWithDebt, holder, now_ms);
  } else {
    reservation->late_receipt_applied = true;
    holder->changed(*reservation, reservation->state, now_ms);
  }
  return answer(ReplyCode::kOk, *reservation);
}

// An extend the reservation already covers, or one its state does not allow.
ReservationReply extendOfCovered(const Reservation& reservation, const ExtendRequest& request) {
  switch (reservation.state) {
    case S::kStarted:
    case S::kUsageUnknown:
    case S::kSettled:
    case S::kSettledWithDebt:
      if (reservation.operation_id != request.operation_id) {
        return answer(ReplyCode::kOperationConflict, reservation);
      }
      if (request.reserved_units_total <= reservation.reserved_units) {
        return answer(ReplyCode::kOk, reservation, /*duplicate=*/true);
      }
      break;
    case S::kExpiring:
    case S::kExpired: return answer(ReplyCode::kExpired, reservation);
    default: break;
  }
  ReservationReply reply = answer(ReplyCode::kInvalidState, reservation);
  reply.message = std::string("only a STARTED reservation can be extended; this one is ") +
                  reservationStateName(reservation.state);
  return reply;
}

}  // namespace

ReservationState nextState(ReservationState from, ReservationState to) {
  TALLY_ASSERT(canTransition(from, to));
  return to;
}

void transition(Reservation* reservation, ReservationState to, CapacityHolder* holder,
                uint64_t now_ms) {
  const ReservationState from = reservation->state;
  reservation->state = nextState(from, to);
  if (isTerminal(to) && !isTerminal(from)) reservation->closed_at_ms = now_ms;
  holder->changed(*reservation, from, now_ms);
}

std::optional<ReservationReply> checkReserve(const ReserveRequest& request) {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (request.units == 0) return invalidArgument("units must be positive");
  if (auto error = checkUnits(request.units, "units")) return error;
  if (request.subject.empty() || request.subject.size() > limits::kSubjectBytesMax) {
    return invalidArgument("subject must be 1.." + std::to_string(limits::kSubjectBytesMax) +
                           " bytes");
  }
  if (request.route.empty() || request.route.size() > limits::kRouteBytesMax) {
    return invalidArgument("route must be 1.." + std::to_string(limits::kRouteBytesMax) + " bytes");
  }
  if (request.region.size() > limits::kRegionBytesMax) {
    return invalidArgument("region must be at most " + std::to_string(limits::kRegionBytesMax) +
                           " bytes");
  }
  return std::nullopt;
}

ReservationReply repeatedReserve(const Reservation& existing, const ReserveRequest& request) {
  if (!sameRequest(existing, request)) {
    ReservationReply reply = answer(ReplyCode::kIdempotencyConflict, existing);
    reply.message = "reservation id already used by a different request";
    return reply;
  }
  const ReplyCode code = existing.state == S::kRejected ? ReplyCode::kRejected : ReplyCode::kOk;
  return answer(code, existing, /*duplicate=*/true);
}

Reservation newRecord(const ReserveRequest& request, uint64_t now_ms) {
  return Reservation{
      .reservation_id = request.reservation_id,
      .request_digest = request.request_digest,
      .subject = request.subject,
      .route = request.route,
      .reserved_units = request.units,
      .created_at_ms = now_ms,
      .priority = request.priority,
      .requested_generation = request.policy_generation,
      .request_fields_known = true,
      .region = request.region,
  };
}

ReservationReply admitted(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  transition(reservation, S::kReserved, holder, now_ms);
  return answer(ReplyCode::kOk, *reservation);
}

ReservationReply rejected(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  transition(reservation, S::kRejected, holder, now_ms);
  return answer(ReplyCode::kRejected, *reservation);
}

ReservationReply start(Reservation* reservation, const StartRequest& request,
                       CapacityHolder* holder, uint64_t now_ms, const char* what) {
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (reservation == nullptr) return notFound(request.reservation_id, what);
  if (reservation->state != S::kReserved) {
    return startOfUnreserved(*reservation, request.operation_id);
  }
  if (beginExpiry(reservation, holder, now_ms)) {
    // The hold ran out before the start arrived: the expiry wins the CAS.
    const bool completed = completeExpiry(reservation, holder, now_ms);
    TALLY_ASSERT(completed);
    return answer(ReplyCode::kExpired, *reservation, false, reservation->refunded_units);
  }
  reservation->operation_id = request.operation_id;
  reservation->started_at_ms = now_ms;
  transition(reservation, S::kStarted, holder, now_ms);
  return answer(ReplyCode::kOk, *reservation);
}

ReservationReply release(Reservation* reservation, const ReleaseRequest& request,
                         CapacityHolder* holder, uint64_t now_ms, const char* what) {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (reservation == nullptr) return notFound(request.reservation_id, what);
  switch (reservation->state) {
    case S::kReserved:
      holder->returnUnits(*reservation, now_ms);
      reservation->refunded_units = reservation->reserved_units;
      transition(reservation, S::kReleased, holder, now_ms);
      return answer(ReplyCode::kOk, *reservation, false, reservation->refunded_units);
    case S::kReleased: return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
    case S::kExpiring:
    case S::kExpired: return answer(ReplyCode::kExpired, *reservation);
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
}

ReservationReply markUnknown(Reservation* reservation, const MarkUnknownRequest& request,
                             CapacityHolder* holder, uint64_t now_ms, const char* what) {
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (reservation == nullptr) return notFound(request.reservation_id, what);
  switch (reservation->state) {
    case S::kStarted:
    case S::kUsageUnknown:
    case S::kSettled:
    case S::kSettledWithDebt:
      if (reservation->operation_id != request.operation_id) {
        return answer(ReplyCode::kOperationConflict, *reservation);
      }
      if (reservation->state != S::kStarted) {
        return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
      }
      // A timeout is not a refund: the units stay held until a receipt or the hard limit.
      transition(reservation, S::kUsageUnknown, holder, now_ms);
      return answer(ReplyCode::kOk, *reservation);
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
}

ReservationReply receipt(Reservation* reservation, const std::string& reservation_id,
                         const std::string& operation_id, Units actual_units,
                         CapacityHolder* holder, uint64_t now_ms, const char* what) {
  if (std::string error = checkIds(reservation_id, &operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (auto error = checkUnits(actual_units, "actual units")) return *error;
  if (reservation == nullptr) return notFound(reservation_id, what);
  switch (reservation->state) {
    case S::kStarted:
    case S::kUsageUnknown:
    case S::kSettled:
    case S::kSettledWithDebt: break;
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
  if (reservation->operation_id != operation_id) {
    return answer(ReplyCode::kOperationConflict, *reservation);
  }
  if (holdsUnits(reservation->state)) {
    return closeWithReceipt(reservation, actual_units, holder, now_ms);
  }
  if (reservation->closed_by_hard_limit && !reservation->late_receipt_applied) {
    return lateReceipt(reservation, actual_units, holder, now_ms);
  }
  return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
}

ReservationReply query(const Reservation* reservation, const QueryRequest& request,
                       const char* what) {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (reservation == nullptr) return notFound(request.reservation_id, what);
  return answer(ReplyCode::kOk, *reservation);
}

ReservationReply extend(Reservation* reservation, const ExtendRequest& request,
                        CapacityHolder* holder, uint64_t now_ms, const char* what) {
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (request.reserved_units_total == 0) {
    return invalidArgument("reserved units total must be positive");
  }
  if (auto error = checkUnits(request.reserved_units_total, "reserved units total")) return *error;
  if (reservation == nullptr) return notFound(request.reservation_id, what);
  if (reservation->state != S::kStarted || reservation->operation_id != request.operation_id ||
      request.reserved_units_total <= reservation->reserved_units) {
    return extendOfCovered(*reservation, request);
  }
  const Units more_units = request.reserved_units_total - reservation->reserved_units;
  HolderGrow grown = holder->grow(*reservation, more_units, request.reserved_units_total, now_ms);
  if (grown.code == HolderCode::kOverflow) {
    return {.code = ReplyCode::kArithmeticOverflow,
            .receipt = *reservation,
            .message = "reserved units overflow"};
  }
  if (grown.refused != LimitingDimension::kNone) {
    // Nothing changed: the record keeps its units and its state; the refusal is this reply's.
    ReservationReply reply = answer(ReplyCode::kRejected, *reservation);
    reply.receipt.limiting_dimension = grown.refused;
    reply.receipt.retry_after_ms = grown.retry_after_ms;
    reply.message = std::move(grown.message);
    return reply;
  }
  // Point of no return: the holder holds the new total; the record follows.
  reservation->reserved_units = request.reserved_units_total;
  holder->changed(*reservation, reservation->state, now_ms);
  return answer(ReplyCode::kOk, *reservation);
}

bool beginExpiry(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  if (reservation->state != S::kReserved || now_ms < reservation->expires_at_ms) return false;
  transition(reservation, S::kExpiring, holder, now_ms);
  return true;
}

bool completeExpiry(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  if (reservation->state != S::kExpiring) return false;
  holder->returnUnits(*reservation, now_ms);
  reservation->refunded_units = reservation->reserved_units;
  transition(reservation, S::kExpired, holder, now_ms);
  return true;
}

bool expire(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  const bool claimed =
      reservation->state == S::kExpiring || beginExpiry(reservation, holder, now_ms);
  return claimed && completeExpiry(reservation, holder, now_ms);
}

bool closeByHardLimit(Reservation* reservation, CapacityHolder* holder, uint64_t now_ms) {
  if (reservation->state != S::kUsageUnknown) return false;
  // Moving the reservation's units from reserved to spent leaves the holder's total unchanged,
  // so it cannot overflow while the holder conserves (every admitted amount is at most
  // kUnitsPerRequestMax). Handled, not asserted, all the same: a record restored from a store
  // written before that bound must not abort the tick.
  const HolderSettle outcome = holder->consumeAll(*reservation, now_ms);
  if (outcome.code == HolderCode::kOverflow) return false;
  TALLY_ASSERT(outcome.refunded_units == 0);
  reservation->actual_units = reservation->reserved_units;
  reservation->closed_by_hard_limit = true;
  transition(reservation, S::kSettled, holder, now_ms);
  return true;
}

}  // namespace tally::lifecycle
