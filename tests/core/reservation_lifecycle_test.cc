#include "core/reservation_lifecycle.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "core/limits.h"

namespace tally {
namespace {

using S = ReservationState;

// A holder that records what the lifecycle asked of it and can be told to overflow.
class RecordingHolder final : public CapacityHolder {
 public:
  void returnUnits(const Reservation&, uint64_t) override { ++returned; }
  HolderSettle settle(const Reservation& r, Units actual, uint64_t) override {
    ++settled;
    if (overflow) return {.code = HolderCode::kOverflow};
    return {.refunded_units = actual < r.reserved_units ? r.reserved_units - actual : 0,
            .debt_units = actual > r.reserved_units ? actual - r.reserved_units : 0};
  }
  HolderSettle consumeAll(const Reservation&, uint64_t) override {
    ++settled;
    if (overflow) return {.code = HolderCode::kOverflow};
    return {};
  }
  HolderSettle chargeExtra(const Reservation&, Units extra, uint64_t) override {
    ++settled;
    if (overflow) return {.code = HolderCode::kOverflow};
    return {.debt_units = extra};
  }
  HolderGrow grow(const Reservation&, Units more, Units total, uint64_t) override {
    grown.push_back({more, total});
    if (overflow) return {.code = HolderCode::kOverflow};
    return {.refused = refuse_grow,
            .retry_after_ms = refuse_grow == LimitingDimension::kNone ? 0 : 250};
  }
  void changed(const Reservation& r, ReservationState from, uint64_t) override {
    moves.push_back({from, r.state});
  }

  LimitingDimension refuse_grow = LimitingDimension::kNone;
  std::vector<std::pair<Units, Units>> grown;
  bool overflow = false;
  int returned = 0;
  int settled = 0;
  std::vector<std::pair<ReservationState, ReservationState>> moves;
};

ReserveRequest requestOf(Units units = 5) {
  ReserveRequest request{
      .reservation_id = "q", .subject = "t", .route = "r", .units = units, .priority = 1};
  request.request_digest.fill(7);
  return request;
}

Reservation reservedRecord(RecordingHolder* holder) {
  Reservation record = lifecycle::newRecord(requestOf(), 1'000);
  record.expires_at_ms = 2'000;
  (void)lifecycle::admitted(&record, holder, 1'000);
  return record;
}

TEST(ReservationLifecycle, TheDuplicateCheckComparesEveryFieldOfTheRequest) {
  RecordingHolder holder;
  const Reservation stored = reservedRecord(&holder);
  EXPECT_TRUE(lifecycle::repeatedReserve(stored, requestOf()).duplicate);
  std::vector<ReserveRequest> others(7, requestOf());
  others[0].request_digest[3] ^= 1;
  others[1].subject = "u";
  others[2].route = "s";
  others[3].units = 600;
  others[4].priority = 2;
  others[5].policy_generation = 4;
  others[6].region = "eu-west-1";
  for (const ReserveRequest& other : others) {
    const ReservationReply reply = lifecycle::repeatedReserve(stored, other);
    EXPECT_EQ(reply.code, ReplyCode::kIdempotencyConflict);
    EXPECT_FALSE(reply.duplicate);
    EXPECT_EQ(reply.receipt, stored);
  }
}

TEST(ReservationLifecycle, ARecordWithoutTheNewFieldsIgnoresOnlyThem) {
  RecordingHolder holder;
  Reservation stored = reservedRecord(&holder);
  stored.request_fields_known = false;
  ReserveRequest other_priority = requestOf();
  other_priority.priority = 9;
  other_priority.policy_generation = 3;
  EXPECT_TRUE(lifecycle::repeatedReserve(stored, other_priority).duplicate);
  EXPECT_EQ(lifecycle::repeatedReserve(stored, requestOf(6)).code, ReplyCode::kIdempotencyConflict);
  // Such a record was written for a request without a region: a region still conflicts.
  ReserveRequest from_region = requestOf();
  from_region.region = "eu-west-1";
  EXPECT_EQ(lifecycle::repeatedReserve(stored, from_region).code, ReplyCode::kIdempotencyConflict);
}

TEST(ReservationLifecycle, UnitsAboveTheMaximumAreRefusedBeforeAnythingChanges) {
  EXPECT_EQ(lifecycle::checkReserve(requestOf(limits::kUnitsPerRequestMax + 1))->code,
            ReplyCode::kInvalidArgument);
  EXPECT_FALSE(lifecycle::checkReserve(requestOf(limits::kUnitsPerRequestMax)).has_value());
  RecordingHolder holder;
  Reservation record = reservedRecord(&holder);
  ASSERT_EQ(lifecycle::start(&record, {"q", "op"}, &holder, 1'500).code, ReplyCode::kOk);
  const Reservation before = record;
  const ReservationReply reply =
      lifecycle::receipt(&record, "q", "op", std::numeric_limits<Units>::max(), &holder, 1'600);
  EXPECT_EQ(reply.code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(record, before);
  EXPECT_EQ(holder.settled, 0);
}

TEST(ReservationLifecycle, AnOverflowingHolderIsATypedOutcomeNeverAnAbort) {
  RecordingHolder holder;
  Reservation record = reservedRecord(&holder);
  ASSERT_EQ(lifecycle::start(&record, {"q", "op"}, &holder, 1'500).code, ReplyCode::kOk);
  ASSERT_EQ(lifecycle::markUnknown(&record, {"q", "op"}, &holder, 1'600).code, ReplyCode::kOk);
  holder.overflow = true;
  EXPECT_FALSE(lifecycle::closeByHardLimit(&record, &holder, 9'000));
  EXPECT_EQ(record.state, S::kUsageUnknown);
  EXPECT_EQ(lifecycle::receipt(&record, "q", "op", 5, &holder, 9'001).code,
            ReplyCode::kArithmeticOverflow);
  EXPECT_EQ(record.state, S::kUsageUnknown);
  holder.overflow = false;
  EXPECT_TRUE(lifecycle::closeByHardLimit(&record, &holder, 9'002));
  EXPECT_EQ(record.state, S::kSettled);
  EXPECT_TRUE(record.closed_by_hard_limit);
  // The late receipt above the reservation is charged once; an overflow leaves it unapplied.
  holder.overflow = true;
  EXPECT_EQ(lifecycle::receipt(&record, "q", "op", 9, &holder, 9'003).code,
            ReplyCode::kArithmeticOverflow);
  EXPECT_FALSE(record.late_receipt_applied);
  holder.overflow = false;
  const ReservationReply late = lifecycle::receipt(&record, "q", "op", 9, &holder, 9'004);
  EXPECT_EQ(late.code, ReplyCode::kOk);
  EXPECT_EQ(record.state, S::kSettledWithDebt);
  EXPECT_EQ(record.debt_units, 4u);
  EXPECT_TRUE(lifecycle::receipt(&record, "q", "op", 9, &holder, 9'005).duplicate);
}

TEST(ReservationLifecycle, EveryMoveIsAnEdgeOfTheOneTable) {
  RecordingHolder holder;
  Reservation record = reservedRecord(&holder);
  EXPECT_EQ(lifecycle::start(&record, {"q", "op"}, &holder, 2'000).code, ReplyCode::kExpired);
  EXPECT_EQ(holder.returned, 1);
  EXPECT_EQ(record.closed_at_ms, 2'000u);
  ASSERT_FALSE(holder.moves.empty());
  for (const auto& [from, to] : holder.moves) {
    EXPECT_TRUE(canTransition(from, to))
        << reservationStateName(from) << "→" << reservationStateName(to);
  }
  EXPECT_EQ(lifecycle::release(&record, {"q"}, &holder, 2'001).code, ReplyCode::kExpired);
  EXPECT_EQ(holder.returned, 1);  // returned once
}

TEST(ReservationLifecycle, TheAgentsReservationUnknownMovesAreCheckedToo) {
  const S unknown = lifecycle::nextState(S::kRequested, S::kReservationUnknown);
  EXPECT_EQ(lifecycle::nextState(unknown, S::kReserved), S::kReserved);
  EXPECT_EQ(lifecycle::nextState(unknown, S::kRejected), S::kRejected);
  EXPECT_DEATH((void)lifecycle::nextState(unknown, S::kStarted), "");
  RecordingHolder holder;
  Reservation record = reservedRecord(&holder);
  EXPECT_DEATH(lifecycle::transition(&record, S::kSettled, &holder, 1'001), "");
}

// A holder that does not say how it grows: CapacityHolder's default.
class FixedHolder final : public CapacityHolder {
 public:
  void returnUnits(const Reservation&, uint64_t) override {}
  HolderSettle settle(const Reservation&, Units, uint64_t) override { return {}; }
  HolderSettle consumeAll(const Reservation&, uint64_t) override { return {}; }
  HolderSettle chargeExtra(const Reservation&, Units, uint64_t) override { return {}; }
  void changed(const Reservation&, ReservationState, uint64_t) override { ++changes; }
  int changes = 0;
};

Reservation startedRecord(RecordingHolder* holder) {
  Reservation record = reservedRecord(holder);
  EXPECT_EQ(
      lifecycle::start(&record, {.reservation_id = "q", .operation_id = "op"}, holder, 1'100).code,
      ReplyCode::kOk);
  return record;
}

ExtendRequest extendTo(Units total, const std::string& op = "op") {
  return {.reservation_id = "q", .operation_id = op, .reserved_units_total = total};
}

TEST(ReservationLifecycle, ExtendAsksTheHolderForTheDifferenceOnly) {
  RecordingHolder holder;
  Reservation record = startedRecord(&holder);
  holder.moves.clear();
  const ReservationReply reply = lifecycle::extend(&record, extendTo(12), &holder, 1'200);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_FALSE(reply.duplicate);
  EXPECT_EQ(record.reserved_units, 12u);
  EXPECT_EQ(record.state, S::kStarted);
  EXPECT_EQ(record.expires_at_ms, 2'000u);  // units, not time
  ASSERT_EQ(holder.grown.size(), 1u);
  EXPECT_EQ(holder.grown[0], (std::pair<Units, Units>{7, 12}));
  ASSERT_EQ(holder.moves.size(), 1u);  // persisted: the holder heard of the change
  EXPECT_EQ(holder.moves[0], (std::pair<S, S>{S::kStarted, S::kStarted}));
  // Covered totals ask nothing of the holder.
  EXPECT_TRUE(lifecycle::extend(&record, extendTo(12), &holder, 1'300).duplicate);
  EXPECT_TRUE(lifecycle::extend(&record, extendTo(3), &holder, 1'300).duplicate);
  EXPECT_EQ(holder.grown.size(), 1u);
  EXPECT_EQ(holder.moves.size(), 1u);
}

TEST(ReservationLifecycle, ARefusedOrOverflowingExtendLeavesTheRecordAsItWas) {
  RecordingHolder holder;
  Reservation record = startedRecord(&holder);
  const Reservation before = record;
  holder.moves.clear();
  holder.refuse_grow = LimitingDimension::kCapacity;
  const ReservationReply refused = lifecycle::extend(&record, extendTo(12), &holder, 1'200);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kCapacity);
  EXPECT_EQ(refused.receipt.retry_after_ms, 250);
  EXPECT_EQ(refused.receipt.reserved_units, 5u);
  EXPECT_EQ(record, before);
  holder.refuse_grow = LimitingDimension::kNone;
  holder.overflow = true;
  EXPECT_EQ(lifecycle::extend(&record, extendTo(12), &holder, 1'200).code,
            ReplyCode::kArithmeticOverflow);
  EXPECT_EQ(record, before);
  EXPECT_TRUE(holder.moves.empty());
  // A holder that cannot grow refuses rather than guessing.
  FixedHolder fixed;
  const ReservationReply cannot = lifecycle::extend(&record, extendTo(12), &fixed, 1'200);
  EXPECT_EQ(cannot.code, ReplyCode::kRejected);
  EXPECT_EQ(cannot.receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(record, before);
  EXPECT_EQ(fixed.changes, 0);
}

TEST(ReservationLifecycle, OnlyAStartedReservationOfTheSameOperationExtends) {
  RecordingHolder holder;
  Reservation reserved = reservedRecord(&holder);
  EXPECT_EQ(lifecycle::extend(&reserved, extendTo(12), &holder, 1'200).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(lifecycle::extend(nullptr, extendTo(12), &holder, 1'200).code, ReplyCode::kNotFound);
  Reservation started = startedRecord(&holder);
  EXPECT_EQ(lifecycle::extend(&started, extendTo(12, "other"), &holder, 1'200).code,
            ReplyCode::kOperationConflict);
  EXPECT_EQ(lifecycle::extend(&started, extendTo(0), &holder, 1'200).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(
      lifecycle::extend(&started, extendTo(limits::kUnitsPerRequestMax + 1), &holder, 1'200).code,
      ReplyCode::kInvalidArgument);
  ASSERT_EQ(lifecycle::markUnknown(&started, {.reservation_id = "q", .operation_id = "op"}, &holder,
                                   1'300)
                .code,
            ReplyCode::kOk);
  EXPECT_EQ(lifecycle::extend(&started, extendTo(12), &holder, 1'400).code,
            ReplyCode::kInvalidState);
  EXPECT_TRUE(lifecycle::extend(&started, extendTo(5), &holder, 1'400).duplicate);
  EXPECT_TRUE(holder.grown.empty());
  EXPECT_EQ(started.reserved_units, 5u);
}

}  // namespace
}  // namespace tally
