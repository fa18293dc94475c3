#include "core/shard_account.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace tally {
namespace {

// allocated = localAvailable + localReserved + localSpent + localRetired, after every step.
void expectConserved(const ShardAccount& shard) {
  const ShardBalances& b = shard.balances();
  EXPECT_TRUE(isConserved(b)) << "allocated " << b.allocated << " available " << b.local_available
                              << " reserved " << b.local_reserved << " spent " << b.local_spent
                              << " retired " << b.local_retired;
}

TEST(ShardAccountTest, AllocateMakesEverythingAvailable) {
  const ShardAccount shard = ShardAccount::allocate(100);
  const ShardBalances& b = shard.balances();
  EXPECT_EQ(b.allocated, 100u);
  EXPECT_EQ(b.local_available, 100u);
  EXPECT_EQ(b.local_reserved, 0u);
  EXPECT_EQ(b.local_spent, 0u);
  EXPECT_EQ(b.local_retired, 0u);
  EXPECT_EQ(b.overspent, 0u);
  EXPECT_FALSE(shard.closed());
  expectConserved(shard);
}

TEST(ShardAccountTest, ReserveThenRelease) {
  ShardAccount shard = ShardAccount::allocate(100);
  EXPECT_EQ(shard.reserve(30), ShardCode::kOk);
  EXPECT_EQ(shard.balances().local_available, 70u);
  EXPECT_EQ(shard.balances().local_reserved, 30u);
  expectConserved(shard);
  EXPECT_EQ(shard.release(30), ShardCode::kOk);
  EXPECT_EQ(shard.balances().local_available, 100u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  expectConserved(shard);
}

TEST(ShardAccountTest, RefusedReservesChangeNothing) {
  ShardAccount shard = ShardAccount::allocate(100);
  const ShardBalances before = shard.balances();
  EXPECT_EQ(shard.reserve(0), ShardCode::kZeroUnits);
  EXPECT_EQ(shard.reserve(101), ShardCode::kInsufficientAvailable);
  EXPECT_EQ(shard.balances(), before);
  EXPECT_EQ(shard.reserve(100), ShardCode::kOk);  // exactly everything
  EXPECT_EQ(shard.reserve(1), ShardCode::kInsufficientAvailable);
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_reserved, 100u);
  expectConserved(shard);
}

TEST(ShardAccountTest, ReleaseOrSettleMoreThanReservedIsRefused) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  const ShardBalances before = shard.balances();
  EXPECT_EQ(shard.release(31), ShardCode::kInsufficientReserved);
  EXPECT_EQ(shard.settle(31, 10).code, ShardCode::kInsufficientReserved);
  EXPECT_EQ(shard.balances(), before);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleBelowReservationRefundsTheDifference) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  const ShardSettleOutcome outcome = shard.settle(30, 10);
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.refunded, 20u);
  EXPECT_EQ(outcome.taken_from_available, 0u);
  EXPECT_EQ(outcome.overspent, 0u);
  EXPECT_EQ(shard.balances().local_available, 90u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_spent, 10u);
  EXPECT_EQ(shard.balances().local_retired, 0u);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleExactlyEqualRefundsNothing) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  const ShardSettleOutcome outcome = shard.settle(30, 30);
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 0u);
  EXPECT_EQ(outcome.overspent, 0u);
  EXPECT_EQ(shard.balances().local_available, 70u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_spent, 30u);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleAboveTakesFromAvailable) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  const ShardSettleOutcome outcome = shard.settle(30, 50);
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 20u);
  EXPECT_EQ(outcome.overspent, 0u);
  EXPECT_EQ(shard.balances().local_available, 50u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_spent, 50u);
  EXPECT_EQ(shard.balances().overspent, 0u);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleAboveBeyondAvailableRecordsOverspentOutsideTheEquation) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(80), ShardCode::kOk);
  const ShardSettleOutcome outcome = shard.settle(80, 130);  // 50 extra, only 20 available
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 20u);
  EXPECT_EQ(outcome.overspent, 30u);
  EXPECT_EQ(shard.balances().allocated, 100u);
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_spent, 100u);  // never more than allocated
  EXPECT_EQ(shard.balances().local_retired, 0u);
  EXPECT_EQ(shard.balances().overspent, 30u);
  expectConserved(shard);

  EXPECT_EQ(shard.reserve(1), ShardCode::kInsufficientAvailable);

  // A second overspend accumulates.
  bool ok = false;
  ShardAccount more = ShardAccount::restore({.allocated = 100,
                                             .local_available = 0,
                                             .local_reserved = 10,
                                             .local_spent = 90,
                                             .local_retired = 0,
                                             .overspent = 30},
                                            false, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(more.settle(10, 15).overspent, 5u);
  EXPECT_EQ(more.balances().overspent, 35u);
  EXPECT_EQ(more.balances().local_spent, 100u);
  expectConserved(more);
}

TEST(ShardAccountTest, CloseRetiresAvailableAndIsIdempotent) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  shard.close();
  EXPECT_TRUE(shard.closed());
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_reserved, 30u);  // held units stay reserved
  EXPECT_EQ(shard.balances().local_retired, 70u);
  expectConserved(shard);
  const ShardBalances after_first = shard.balances();
  shard.close();
  EXPECT_TRUE(shard.closed());
  EXPECT_EQ(shard.balances(), after_first);
  expectConserved(shard);
}

TEST(ShardAccountTest, ReserveAfterCloseIsRefused) {
  ShardAccount shard = ShardAccount::allocate(100);
  shard.close();
  EXPECT_EQ(shard.reserve(1), ShardCode::kClosed);
  EXPECT_EQ(shard.reserve(0), ShardCode::kZeroUnits);
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_retired, 100u);
  expectConserved(shard);
}

TEST(ShardAccountTest, ReleaseAfterCloseRetiresTheUnits) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  shard.close();
  EXPECT_EQ(shard.release(30), ShardCode::kOk);
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_retired, 100u);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleAfterCloseRetiresTheRefund) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  shard.close();
  const ShardSettleOutcome outcome = shard.settle(30, 10);
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.refunded, 20u);
  EXPECT_EQ(shard.balances().local_available, 0u);
  EXPECT_EQ(shard.balances().local_reserved, 0u);
  EXPECT_EQ(shard.balances().local_spent, 10u);
  EXPECT_EQ(shard.balances().local_retired, 90u);
  expectConserved(shard);
}

TEST(ShardAccountTest, SettleAboveAfterCloseIsAllOverspent) {
  ShardAccount shard = ShardAccount::allocate(100);
  ASSERT_EQ(shard.reserve(30), ShardCode::kOk);
  shard.close();
  const ShardSettleOutcome outcome = shard.settle(30, 45);
  EXPECT_EQ(outcome.code, ShardCode::kOk);
  EXPECT_EQ(outcome.taken_from_available, 0u);  // retired units are never spent
  EXPECT_EQ(outcome.overspent, 15u);
  EXPECT_EQ(shard.balances().local_spent, 30u);
  EXPECT_EQ(shard.balances().local_retired, 70u);
  EXPECT_EQ(shard.balances().overspent, 15u);
  expectConserved(shard);
}

TEST(ShardAccountTest, RestoreValidatesTheRecord) {
  bool ok = false;
  const ShardBalances good{.allocated = 100,
                           .local_available = 40,
                           .local_reserved = 30,
                           .local_spent = 20,
                           .local_retired = 10,
                           .overspent = 7};
  ShardAccount shard = ShardAccount::restore(good, false, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(shard.balances(), good);
  EXPECT_FALSE(shard.closed());

  ShardBalances not_conserving = good;
  not_conserving.local_spent = 21;
  (void)ShardAccount::restore(not_conserving, false, &ok);
  EXPECT_FALSE(ok);

  // Closed with units still available is not a state close() can produce.
  (void)ShardAccount::restore(good, true, &ok);
  EXPECT_FALSE(ok);

  const ShardBalances closed{.allocated = 100,
                             .local_available = 0,
                             .local_reserved = 30,
                             .local_spent = 20,
                             .local_retired = 50};
  shard = ShardAccount::restore(closed, true, &ok);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(shard.closed());
  EXPECT_EQ(shard.reserve(1), ShardCode::kClosed);

  // Parts summing past 64 bits do not wrap into a false "conserved".
  const ShardBalances wraps{.allocated = 1, .local_available = UINT64_MAX, .local_reserved = 2};
  (void)ShardAccount::restore(wraps, false, &ok);
  EXPECT_FALSE(ok);
}

TEST(ShardAccountTest, OverspentOverflowIsTypedAndChangesNothing) {
  bool ok = false;
  ShardAccount shard = ShardAccount::restore(
      {.allocated = 100, .local_available = 0, .local_reserved = 100, .overspent = UINT64_MAX},
      false, &ok);
  ASSERT_TRUE(ok);
  const ShardBalances before = shard.balances();
  EXPECT_EQ(shard.settle(100, 101).code, ShardCode::kOverflow);
  EXPECT_EQ(shard.balances(), before);
  expectConserved(shard);
}

TEST(ShardAccountTest, CodeNames) {
  EXPECT_STREQ(shardCodeName(ShardCode::kOk), "ok");
  EXPECT_STREQ(shardCodeName(ShardCode::kZeroUnits), "zero-units");
  EXPECT_STREQ(shardCodeName(ShardCode::kClosed), "closed");
  EXPECT_STREQ(shardCodeName(ShardCode::kInsufficientAvailable), "insufficient-available");
  EXPECT_STREQ(shardCodeName(ShardCode::kInsufficientReserved), "insufficient-reserved");
  EXPECT_STREQ(shardCodeName(ShardCode::kOverflow), "overflow");
}

}  // namespace
}  // namespace tally
