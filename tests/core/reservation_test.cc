#include "core/reservation.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace tally {
namespace {

using S = ReservationState;

constexpr S kAllStates[] = {
    S::kRequested,          S::kReserved, S::kStarted,  S::kSettled, S::kSettledWithDebt,
    S::kRejected,           S::kReleased, S::kExpiring, S::kExpired, S::kUsageUnknown,
    S::kReservationUnknown,
};

TEST(ReservationStateTest, EnumHasElevenStates) {
  EXPECT_EQ(std::size(kAllStates), static_cast<size_t>(kReservationStateCount));
  std::set<S> distinct(std::begin(kAllStates), std::end(kAllStates));
  EXPECT_EQ(distinct.size(), 11u);
}

// The allowed transitions, spelled out from the diagram in core/reservation.h (SPEC §5).
const std::set<std::pair<S, S>>& allowedTransitions() {
  static const std::set<std::pair<S, S>> allowed = {
      // REQUESTED → RESERVED → STARTED → SETTLED | SETTLED_WITH_DEBT
      {S::kRequested, S::kReserved},
      {S::kReserved, S::kStarted},
      {S::kStarted, S::kSettled},
      {S::kStarted, S::kSettledWithDebt},
      // REQUESTED → REJECTED
      {S::kRequested, S::kRejected},
      // RESERVED → RELEASED (only if never started)
      {S::kReserved, S::kReleased},
      // RESERVED → EXPIRING → EXPIRED
      {S::kReserved, S::kExpiring},
      {S::kExpiring, S::kExpired},
      // STARTED → USAGE_UNKNOWN → SETTLED…
      {S::kStarted, S::kUsageUnknown},
      {S::kUsageUnknown, S::kSettled},
      {S::kUsageUnknown, S::kSettledWithDebt},
      // REQUESTED → RESERVATION_UNKNOWN → RESERVED | REJECTED (agent side)
      {S::kRequested, S::kReservationUnknown},
      {S::kReservationUnknown, S::kReserved},
      {S::kReservationUnknown, S::kRejected},
      // Not drawn in the diagram; the documented exception under isTerminal() (SPEC §5: after a
      // hard-limit close "a later receipt with a larger actual still records debt").
      {S::kSettled, S::kSettledWithDebt},
  };
  return allowed;
}

TEST(ReservationStateTest, AllowedListHasFifteenEdges) {
  EXPECT_EQ(allowedTransitions().size(), 15u);
}

TEST(ReservationStateTest, CanTransitionMatchesTheFullMatrix) {
  int allowed_count = 0;
  for (S from : kAllStates) {
    for (S to : kAllStates) {
      const bool expected = allowedTransitions().contains({from, to});
      EXPECT_EQ(canTransition(from, to), expected)
          << reservationStateName(from) << " -> " << reservationStateName(to);
      if (canTransition(from, to)) ++allowed_count;
    }
  }
  EXPECT_EQ(allowed_count, 15);
}

TEST(ReservationStateTest, SpecificRefusedTransitions) {
  // The ones a bug would most likely let through.
  EXPECT_FALSE(canTransition(S::kStarted, S::kReleased));  // started work is never released
  EXPECT_FALSE(canTransition(S::kStarted, S::kExpiring));  // expiry only from RESERVED
  EXPECT_FALSE(canTransition(S::kStarted, S::kExpired));
  EXPECT_FALSE(canTransition(S::kUsageUnknown, S::kReleased));  // timeout is not a refund
  EXPECT_FALSE(canTransition(S::kUsageUnknown, S::kExpired));
  EXPECT_FALSE(canTransition(S::kExpiring, S::kStarted));  // the expiry won the CAS
  EXPECT_FALSE(canTransition(S::kExpiring, S::kReserved));
  EXPECT_FALSE(canTransition(S::kReserved, S::kExpired));  // always through EXPIRING
  EXPECT_FALSE(canTransition(S::kReserved, S::kSettled));  // always through STARTED
  EXPECT_FALSE(canTransition(S::kReserved, S::kUsageUnknown));
  EXPECT_FALSE(canTransition(S::kRequested, S::kStarted));
  EXPECT_FALSE(canTransition(S::kSettledWithDebt, S::kSettled));
  EXPECT_FALSE(canTransition(S::kReleased, S::kReserved));
  EXPECT_FALSE(canTransition(S::kExpired, S::kReserved));
  EXPECT_FALSE(canTransition(S::kRejected, S::kReserved));
  for (S state : kAllStates) {
    EXPECT_FALSE(canTransition(state, state)) << reservationStateName(state);
    EXPECT_FALSE(canTransition(state, S::kRequested)) << reservationStateName(state);
  }
}

TEST(ReservationStateTest, TerminalStatesHaveNoWayOutExceptTheLateReceipt) {
  for (S from : {S::kSettledWithDebt, S::kRejected, S::kReleased, S::kExpired}) {
    for (S to : kAllStates) {
      EXPECT_FALSE(canTransition(from, to))
          << reservationStateName(from) << " -> " << reservationStateName(to);
    }
  }
  for (S to : kAllStates) {
    EXPECT_EQ(canTransition(S::kSettled, to), to == S::kSettledWithDebt)
        << reservationStateName(to);
  }
}

TEST(ReservationStateTest, IsTerminalTable) {
  EXPECT_FALSE(isTerminal(S::kRequested));
  EXPECT_FALSE(isTerminal(S::kReserved));
  EXPECT_FALSE(isTerminal(S::kStarted));
  EXPECT_TRUE(isTerminal(S::kSettled));
  EXPECT_TRUE(isTerminal(S::kSettledWithDebt));
  EXPECT_TRUE(isTerminal(S::kRejected));
  EXPECT_TRUE(isTerminal(S::kReleased));
  EXPECT_FALSE(isTerminal(S::kExpiring));
  EXPECT_TRUE(isTerminal(S::kExpired));
  EXPECT_FALSE(isTerminal(S::kUsageUnknown));
  EXPECT_FALSE(isTerminal(S::kReservationUnknown));
}

TEST(ReservationStateTest, HoldsUnitsTable) {
  EXPECT_FALSE(holdsUnits(S::kRequested));
  EXPECT_TRUE(holdsUnits(S::kReserved));
  EXPECT_TRUE(holdsUnits(S::kStarted));
  EXPECT_FALSE(holdsUnits(S::kSettled));
  EXPECT_FALSE(holdsUnits(S::kSettledWithDebt));
  EXPECT_FALSE(holdsUnits(S::kRejected));
  EXPECT_FALSE(holdsUnits(S::kReleased));
  EXPECT_TRUE(holdsUnits(S::kExpiring));
  EXPECT_FALSE(holdsUnits(S::kExpired));
  EXPECT_TRUE(holdsUnits(S::kUsageUnknown));  // a timeout is not a refund
  EXPECT_FALSE(holdsUnits(S::kReservationUnknown));
}

TEST(ReservationStateTest, NoStateIsBothTerminalAndHolding) {
  for (S state : kAllStates) {
    EXPECT_FALSE(isTerminal(state) && holdsUnits(state)) << reservationStateName(state);
  }
}

TEST(ReservationStateTest, StateNames) {
  EXPECT_STREQ(reservationStateName(S::kRequested), "REQUESTED");
  EXPECT_STREQ(reservationStateName(S::kReserved), "RESERVED");
  EXPECT_STREQ(reservationStateName(S::kStarted), "STARTED");
  EXPECT_STREQ(reservationStateName(S::kSettled), "SETTLED");
  EXPECT_STREQ(reservationStateName(S::kSettledWithDebt), "SETTLED_WITH_DEBT");
  EXPECT_STREQ(reservationStateName(S::kRejected), "REJECTED");
  EXPECT_STREQ(reservationStateName(S::kReleased), "RELEASED");
  EXPECT_STREQ(reservationStateName(S::kExpiring), "EXPIRING");
  EXPECT_STREQ(reservationStateName(S::kExpired), "EXPIRED");
  EXPECT_STREQ(reservationStateName(S::kUsageUnknown), "USAGE_UNKNOWN");
  EXPECT_STREQ(reservationStateName(S::kReservationUnknown), "RESERVATION_UNKNOWN");
  EXPECT_STREQ(reservationStateName(static_cast<S>(200)), "INVALID");
}

TEST(ReservationStateTest, OutOfRangeStateTransitionsNowhere) {
  const S bogus = static_cast<S>(200);
  for (S state : kAllStates) {
    EXPECT_FALSE(canTransition(bogus, state));
  }
  EXPECT_FALSE(isTerminal(bogus));
  EXPECT_FALSE(holdsUnits(bogus));
}

TEST(ReservationTest, DefaultRecordIsRequestedAndEmpty) {
  const Reservation reservation;
  EXPECT_EQ(reservation.state, S::kRequested);
  EXPECT_EQ(reservation.reserved_units, 0u);
  EXPECT_EQ(reservation.actual_units, 0u);
  EXPECT_EQ(reservation.refunded_units, 0u);
  EXPECT_EQ(reservation.debt_units, 0u);
  EXPECT_EQ(reservation.limiting_dimension, LimitingDimension::kNone);
  EXPECT_EQ(reservation.retry_after_ms, 0);
  EXPECT_TRUE(reservation.origin.empty());  // central
  EXPECT_FALSE(reservation.closed_by_hard_limit);
}

TEST(LimitingDimensionTest, Names) {
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kNone), "none");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kCapacity), "capacity");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kDebt), "debt");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kFrozenRoute), "frozen-route");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kMaxSingleReservation),
               "max-single-reservation");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kGenerationDraining),
               "generation-draining");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kNoBudget), "no-budget");
  EXPECT_STREQ(limitingDimensionName(static_cast<LimitingDimension>(200)), "unknown");
}

}  // namespace
}  // namespace tally
