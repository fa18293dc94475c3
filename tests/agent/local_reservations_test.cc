#include "agent/local_reservations.h"

#include <gtest/gtest.h>

namespace tally::agent {
namespace {

ReserveRequest reserveOf(const std::string& id, Units units = 600) {
  ReserveRequest request{.reservation_id = id, .subject = "t", .route = "r", .units = units};
  request.request_digest[0] = 7;
  return request;
}

TEST(LocalReservations, AdmitsAndAnswersDuplicatesWithTheSameReceipt) {
  LocalReservations table;
  const ReservationReply first = table.admit(reserveOf("a"), kOriginOff, 100);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_EQ(first.receipt.state, ReservationState::kReserved);
  EXPECT_EQ(first.receipt.origin, "off");
  EXPECT_EQ(first.receipt.reserved_units, 600u);
  const ReservationReply again = table.admit(reserveOf("a"), kOriginShadow, 200);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.receipt, first.receipt);
}

TEST(LocalReservations, DifferentDigestIsAConflict) {
  LocalReservations table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ReserveRequest other = reserveOf("a");
  other.request_digest[0] = 8;
  EXPECT_EQ(table.admit(other, kOriginOff, 2).code, ReplyCode::kIdempotencyConflict);
}

TEST(LocalReservations, LifecycleStartSettleExactlyOnce) {
  LocalReservations table;
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

TEST(LocalReservations, UsageUnknownIsResolvedOnlyByAReceipt) {
  LocalReservations table;
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

TEST(LocalReservations, ReleaseOnlyFromReserved) {
  LocalReservations table;
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  const ReservationReply released = table.release({.reservation_id = "a"}, 2);
  ASSERT_EQ(released.code, ReplyCode::kOk);
  EXPECT_EQ(released.refunded_units, 600u);
  EXPECT_TRUE(table.release({.reservation_id = "a"}, 3).duplicate);
  EXPECT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 3).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(table.query({.reservation_id = "zz"}).code, ReplyCode::kNotFound);
}

TEST(LocalReservations, BoundedEvictsTerminalFirstThenRefuses) {
  LocalReservations table({.entries_max = 2});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1).code, ReplyCode::kOk);
  ASSERT_EQ(table.admit(reserveOf("b"), kOriginOff, 1).code, ReplyCode::kOk);
  EXPECT_EQ(table.admit(reserveOf("c"), kOriginOff, 1).code, ReplyCode::kResourceExhausted);
  ASSERT_EQ(table.release({.reservation_id = "a"}, 2).code, ReplyCode::kOk);
  ASSERT_EQ(table.admit(reserveOf("c"), kOriginOff, 3).code, ReplyCode::kOk);
  EXPECT_FALSE(table.contains("a"));
  EXPECT_TRUE(table.contains("b"));
  EXPECT_EQ(table.size(), 2u);
}

}  // namespace
}  // namespace tally::agent
