#include "core/local_book.h"

#include <gtest/gtest.h>

namespace tally {
namespace {

ReserveRequest reserveOf(const std::string& id, Units units = 600) {
  ReserveRequest request{.reservation_id = id, .subject = "t", .route = "r", .units = units};
  request.request_digest[0] = 7;
  return request;
}

TEST(LocalBook, AdmitsAndAnswersDuplicatesWithTheSameReceipt) {
  LocalBook table;
  const ReservationReply first = table.admit(reserveOf("a"), kOriginOff, 100);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_EQ(first.receipt.state, ReservationState::kReserved);
  EXPECT_EQ(first.receipt.origin, "off");
  EXPECT_EQ(first.receipt.reserved_units, 600u);
  const ReservationReply again = table.admit(reserveOf("a"), kOriginShadow, 200);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.receipt, first.receipt);
}

TEST(LocalBook, DifferentDigestIsAConflict) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ReserveRequest other = reserveOf("a");
  other.request_digest[0] = 8;
  EXPECT_EQ(table.admit(other, kOriginOff, 2).code, ReplyCode::kIdempotencyConflict);
}

TEST(LocalBook, LifecycleStartSettleExactlyOnce) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginShadow, 1).code, ReplyCode::kOk);
  EXPECT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2).code, ReplyCode::kOk);
  EXPECT_TRUE(table.start({.reservation_id = "a", .operation_id = "op"}, 3).duplicate);
  EXPECT_EQ(table.start({.reservation_id = "a", .operation_id = "other"}, 3).code,
            ReplyCode::kOperationConflict);
  EXPECT_EQ(table.release({.reservation_id = "a"}, 3).code, ReplyCode::kInvalidState);
  const ReservationReply settled =
      table.settle({.reservation_id = "a", .operation_id = "op", .actual_units = 200}, 4);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 400u);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled);
  const ReservationReply duplicate =
      table.settle({.reservation_id = "a", .operation_id = "op", .actual_units = 200}, 5);
  EXPECT_TRUE(duplicate.duplicate);
  EXPECT_EQ(duplicate.refunded_units, 0u);
}

TEST(LocalBook, UsageUnknownIsResolvedOnlyByAReceipt) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  EXPECT_EQ(table.markUnknown({.reservation_id = "a", .operation_id = "op"}, 2).code,
            ReplyCode::kInvalidState);  // not started
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2).code, ReplyCode::kOk);
  ASSERT_EQ(table.markUnknown({.reservation_id = "a", .operation_id = "op"}, 3).code,
            ReplyCode::kOk);
  EXPECT_EQ(table.query({.reservation_id = "a"}).receipt.state, ReservationState::kUsageUnknown);
  const ReservationReply receipt =
      table.reportOperation({.reservation_id = "a", .operation_id = "op", .actual_units = 700}, 4);
  ASSERT_EQ(receipt.code, ReplyCode::kOk);
  EXPECT_EQ(receipt.receipt.state, ReservationState::kSettledWithDebt);
  EXPECT_EQ(receipt.receipt.debt_units, 100u);
}

TEST(LocalBook, ReleaseOnlyFromReserved) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  const ReservationReply released = table.release({.reservation_id = "a"}, 2);
  ASSERT_EQ(released.code, ReplyCode::kOk);
  EXPECT_EQ(released.refunded_units, 600u);
  EXPECT_TRUE(table.release({.reservation_id = "a"}, 3).duplicate);
  EXPECT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 3).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(table.query({.reservation_id = "zz"}).code, ReplyCode::kNotFound);
}

TEST(LocalBook, BoundedEvictsTerminalFirstThenRefuses) {
  LocalBook table({.entries_max = 2});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ASSERT_EQ(table.admit(reserveOf("b"), kOriginOff, 1).code, ReplyCode::kOk);
  EXPECT_EQ(table.admit(reserveOf("c"), kOriginOff, 1).code, ReplyCode::kResourceExhausted);
  ASSERT_EQ(table.release({.reservation_id = "a"}, 2).code, ReplyCode::kOk);
  ASSERT_EQ(table.admit(reserveOf("c"), kOriginOff, 3).code, ReplyCode::kOk);
  EXPECT_FALSE(table.contains("a"));
  EXPECT_TRUE(table.contains("b"));
  EXPECT_EQ(table.size(), 2u);
}

// Issue 9: a gateway that reserves and walks away must not fill the agent.
TEST(LocalBook, AReservationNeverSettledExpiresAndFreesItsSlot) {
  LocalBook table({.entries_max = 1, .hold_ttl_ms = 30'000});
  const ReservationReply first = table.admit(reserveOf("a"), kOriginOff, 1'000);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_EQ(first.receipt.expires_at_ms, 31'000u);
  EXPECT_EQ(table.admit(reserveOf("b"), kOriginOff, 2'000).code, ReplyCode::kResourceExhausted);
  EXPECT_EQ(table.tick(30'999), 0u);
  EXPECT_EQ(table.query({.reservation_id = "a"}).receipt.state, ReservationState::kReserved);
  EXPECT_EQ(table.tick(31'000), 1u);
  const ReservationReply expired = table.query({.reservation_id = "a"});
  EXPECT_EQ(expired.receipt.state, ReservationState::kExpired);
  EXPECT_EQ(expired.receipt.refunded_units, 600u);
  EXPECT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 31'001).code,
            ReplyCode::kExpired);
  ASSERT_EQ(table.admit(reserveOf("b"), kOriginOff, 31'002).code, ReplyCode::kOk);
  EXPECT_FALSE(table.contains("a"));
  EXPECT_EQ(table.size(), 1u);
}

TEST(LocalBook, AStartAfterTheHoldRanOutLosesToTheExpiry) {
  LocalBook table({.hold_ttl_ms = 100});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginShadow, 1'000).code, ReplyCode::kOk);
  const ReservationReply late = table.start({.reservation_id = "a", .operation_id = "op"}, 1'100);
  EXPECT_EQ(late.code, ReplyCode::kExpired);
  EXPECT_EQ(late.receipt.state, ReservationState::kExpired);
  EXPECT_EQ(late.refunded_units, 600u);
  EXPECT_EQ(table.tick(5'000), 0u);  // already expired: not twice
}

// Issue 9: the ledger answers this with a duplicate OK; the local table used to say INVALID_STATE.
TEST(LocalBook, MarkingASettledReservationUnknownIsADuplicateAsInTheLedger) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2).code, ReplyCode::kOk);
  ASSERT_EQ(table.settle({.reservation_id = "a", .operation_id = "op", .actual_units = 10}, 3).code,
            ReplyCode::kOk);
  const ReservationReply again =
      table.markUnknown({.reservation_id = "a", .operation_id = "op"}, 4);
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.refunded_units, 0u);
  EXPECT_EQ(again.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(table.markUnknown({.reservation_id = "a", .operation_id = "other"}, 4).code,
            ReplyCode::kOperationConflict);
}

TEST(LocalBook, SameIdWithOtherUnitsOrPriorityIsAConflict) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a", 5), kOriginOff, 1).code, ReplyCode::kOk);
  EXPECT_EQ(table.admit(reserveOf("a", 600), kOriginOff, 2).code, ReplyCode::kIdempotencyConflict);
  ReserveRequest urgent = reserveOf("a", 5);
  urgent.priority = 2;
  EXPECT_EQ(table.admit(urgent, kOriginOff, 2).code, ReplyCode::kIdempotencyConflict);
  EXPECT_TRUE(table.admit(reserveOf("a", 5), kOriginOff, 3).duplicate);
}

TEST(LocalBook, AnAbsurdActualIsInvalidAndChangesNothing) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2).code, ReplyCode::kOk);
  const ReservationReply absurd = table.settle(
      {.reservation_id = "a", .operation_id = "op", .actual_units = 18446744073709551615u}, 3);
  EXPECT_EQ(absurd.code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(table.query({.reservation_id = "a"}).receipt.state, ReservationState::kStarted);
}

}  // namespace
}  // namespace tally
