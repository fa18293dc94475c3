#include "core/reservation.h"

namespace tally {

const char* reservationStateName(ReservationState state) {
  switch (state) {
    case ReservationState::kRequested: return "REQUESTED";
    case ReservationState::kReserved: return "RESERVED";
    case ReservationState::kStarted: return "STARTED";
    case ReservationState::kSettled: return "SETTLED";
    case ReservationState::kSettledWithDebt: return "SETTLED_WITH_DEBT";
    case ReservationState::kRejected: return "REJECTED";
    case ReservationState::kReleased: return "RELEASED";
    case ReservationState::kExpiring: return "EXPIRING";
    case ReservationState::kExpired: return "EXPIRED";
    case ReservationState::kUsageUnknown: return "USAGE_UNKNOWN";
    case ReservationState::kReservationUnknown: return "RESERVATION_UNKNOWN";
  }
  return "INVALID";
}

bool canTransition(ReservationState from, ReservationState to) {
  using S = ReservationState;
  switch (from) {
    case S::kRequested:
      return to == S::kReserved || to == S::kRejected || to == S::kReservationUnknown;
    case S::kReservationUnknown: return to == S::kReserved || to == S::kRejected;
    case S::kReserved: return to == S::kStarted || to == S::kReleased || to == S::kExpiring;
    case S::kExpiring: return to == S::kExpired;
    case S::kStarted:
      return to == S::kSettled || to == S::kSettledWithDebt || to == S::kUsageUnknown;
    case S::kUsageUnknown: return to == S::kSettled || to == S::kSettledWithDebt;
    case S::kSettled:
      // A receipt larger than the reservation after a hard-limit close records debt.
      return to == S::kSettledWithDebt;
    case S::kSettledWithDebt:
    case S::kRejected:
    case S::kReleased:
    case S::kExpired: return false;
  }
  return false;
}

bool isTerminal(ReservationState state) {
  using S = ReservationState;
  return state == S::kSettled || state == S::kSettledWithDebt || state == S::kRejected ||
         state == S::kReleased || state == S::kExpired;
}

bool holdsUnits(ReservationState state) {
  using S = ReservationState;
  return state == S::kReserved || state == S::kExpiring || state == S::kStarted ||
         state == S::kUsageUnknown;
}

}  // namespace tally
