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

// Issue 9: a gateway that reserves, starts, marks unknown and walks away must not fill the
// agent. The close is the Ledger's (LedgerTest.HardLimitClosesAsFullyConsumedAndALateReceipt…):
// from startedAt, at exactly the limit, fully consumed; a later, larger receipt is charged once.
TEST(LocalBook, UsageUnknownClosesAtTheHardLimitAndFreesItsSlot) {
  LocalBook table({.entries_max = 1, .hold_ttl_ms = 30'000, .hard_execution_limit_ms = 60'000});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 1'000).code, ReplyCode::kOk);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2'000).code, ReplyCode::kOk);
  ASSERT_EQ(table.markUnknown({.reservation_id = "a", .operation_id = "op"}, 5'000).code,
            ReplyCode::kOk);
  EXPECT_EQ(table.admit(reserveOf("b"), kOriginOff, 6'000).code, ReplyCode::kResourceExhausted);

  // The limit runs from startedAt (2 000), not from the mark or the admission.
  EXPECT_EQ(table.tick(61'999), 0u);
  EXPECT_EQ(table.query({.reservation_id = "a"}).receipt.state, ReservationState::kUsageUnknown);
  EXPECT_EQ(table.admit(reserveOf("b"), kOriginOff, 61'999).code, ReplyCode::kResourceExhausted);
  EXPECT_EQ(table.tick(62'000), 1u);
  const Reservation closed = table.query({.reservation_id = "a"}).receipt;
  EXPECT_EQ(closed.state, ReservationState::kSettled);
  EXPECT_TRUE(closed.closed_by_hard_limit);
  EXPECT_EQ(closed.actual_units, 600u);
  EXPECT_EQ(closed.refunded_units, 0u);
  EXPECT_EQ(closed.closed_at_ms, 62'000u);
  EXPECT_EQ(table.tick(62'000), 0u);  // not twice

  // The receipt finally arrives: 1100 used, 500 more than was held, charged once.
  const ReservationReply late = table.reportOperation(
      {.reservation_id = "a", .operation_id = "op", .actual_units = 1'100}, 62'001);
  ASSERT_EQ(late.code, ReplyCode::kOk);
  EXPECT_FALSE(late.duplicate);
  EXPECT_EQ(late.refunded_units, 0u);
  EXPECT_EQ(late.receipt.state, ReservationState::kSettledWithDebt);
  EXPECT_EQ(late.receipt.actual_units, 1'100u);
  EXPECT_EQ(late.receipt.debt_units, 500u);  // nothing holds local units: all of the excess
  EXPECT_TRUE(late.receipt.late_receipt_applied);
  const ReservationReply second =
      table.settle({.reservation_id = "a", .operation_id = "op", .actual_units = 2'000}, 62'002);
  EXPECT_EQ(second.code, ReplyCode::kOk);
  EXPECT_TRUE(second.duplicate);
  EXPECT_EQ(second.receipt.actual_units, 1'100u);
  EXPECT_EQ(second.receipt.debt_units, 500u);

  // Closed, it is the eviction candidate that makes room.
  ASSERT_EQ(table.admit(reserveOf("b"), kOriginOff, 62'003).code, ReplyCode::kOk);
  EXPECT_FALSE(table.contains("a"));
  EXPECT_EQ(table.size(), 1u);
}

TEST(LocalBook, ASmallerLateReceiptRefundsNothing) {
  LocalBook table({.hard_execution_limit_ms = 1'000});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginShadow, 0).code, ReplyCode::kOk);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 10).code, ReplyCode::kOk);
  ASSERT_EQ(table.markUnknown({.reservation_id = "a", .operation_id = "op"}, 20).code,
            ReplyCode::kOk);
  EXPECT_EQ(table.tick(1'010), 1u);
  const ReservationReply late = table.reportOperation(
      {.reservation_id = "a", .operation_id = "op", .actual_units = 100}, 1'011);
  ASSERT_EQ(late.code, ReplyCode::kOk);
  EXPECT_EQ(late.refunded_units, 0u);
  EXPECT_EQ(late.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(late.receipt.actual_units, 600u);
  EXPECT_TRUE(late.receipt.late_receipt_applied);
}

// SPEC §5: a STARTED reservation stays until an operation receipt or a mark-unknown; time alone
// never closes it. When such ones fill the table, the refusal says why.
TEST(LocalBook, AStartedReservationIsNeverClosedByTimeAndAFullTableSaysWhy) {
  LocalBook table({.entries_max = 1, .hold_ttl_ms = 100, .hard_execution_limit_ms = 1'000});
  ASSERT_EQ(table.admit(reserveOf("a"), kOriginOff, 0).code, ReplyCode::kOk);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 50).code, ReplyCode::kOk);
  EXPECT_EQ(table.tick(uint64_t{1} << 50), 0u);
  EXPECT_EQ(table.query({.reservation_id = "a"}).receipt.state, ReservationState::kStarted);
  const ReservationReply refused = table.admit(reserveOf("b"), kOriginOff, uint64_t{1} << 50);
  EXPECT_EQ(refused.code, ReplyCode::kResourceExhausted);
  EXPECT_NE(refused.message.find("local reservation table is full: 1 "), std::string::npos)
      << refused.message;
  EXPECT_NE(refused.message.find("started"), std::string::npos) << refused.message;
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

TEST(LocalBook, ExtendGrowsAStartedReservationAndSettleCoversTheTotal) {
  LocalBook table;
  ASSERT_EQ(table.admit(reserveOf("a", 300), kOriginOff, 1).code, ReplyCode::kOk);
  const ExtendRequest to_500{
      .reservation_id = "a", .operation_id = "op", .reserved_units_total = 500};
  // Before start: the gateway reserves the right amount or starts first.
  EXPECT_EQ(table.extend(to_500, 2).code, ReplyCode::kInvalidState);
  ASSERT_EQ(table.start({.reservation_id = "a", .operation_id = "op"}, 2).code, ReplyCode::kOk);
  EXPECT_EQ(
      table.extend({.reservation_id = "a", .operation_id = "other", .reserved_units_total = 500}, 3)
          .code,
      ReplyCode::kOperationConflict);
  const ReservationReply extended = table.extend(to_500, 3);
  ASSERT_EQ(extended.code, ReplyCode::kOk);
  EXPECT_FALSE(extended.duplicate);
  EXPECT_EQ(extended.receipt.reserved_units, 500u);
  const ReservationReply again = table.extend(to_500, 4);
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(
      table.extend({.reservation_id = "b", .operation_id = "op", .reserved_units_total = 5}, 4)
          .code,
      ReplyCode::kNotFound);
  const ReservationReply settled =
      table.settle({.reservation_id = "a", .operation_id = "op", .actual_units = 450}, 5);
  EXPECT_EQ(settled.refunded_units, 50u);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled);
  // A repeat of the reserve that began it is still a duplicate.
  EXPECT_TRUE(table.admit(reserveOf("a", 300), kOriginOff, 6).duplicate);
}

}  // namespace
}  // namespace tally
