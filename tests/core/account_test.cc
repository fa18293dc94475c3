#include "core/account.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <sstream>
#include <vector>

#include "core/limits.h"

namespace tally {

// Readable failures for EXPECT_EQ on whole balance sets (internal linkage: other test files may
// print Balances their own way).
static void PrintTo(const Balances& b, std::ostream* os) {
  *os << "{opening " << b.opening << ", minted " << b.minted << ", overdraftIssued "
      << b.overdraft_issued << ", available " << b.available << ", reserved " << b.reserved
      << ", spent " << b.spent << ", retired " << b.retired_for_emergency << ", overdraftRepaid "
      << b.overdraft_repaid << ", transferredOut " << b.transferred_out << "}";
}

namespace {

constexpr uint64_t kMax = UINT64_MAX;
constexpr BucketParams kBucket{.refill_per_second = 10, .burst = 1000};
constexpr Units kMaxSingle = 1000;
constexpr Units kMaxOverdraft = 500;

// The conservation equation of SPEC §4, checked after every step.
::testing::AssertionResult conserved(const Account& account) {
  if (isConserved(account.balances())) return ::testing::AssertionSuccess();
  std::ostringstream os;
  PrintTo(account.balances(), &os);
  return ::testing::AssertionFailure() << "equation broken: " << os.str();
}

Account restored(BucketParams bucket, const Balances& balances, uint64_t clock_ms = 0) {
  bool ok = false;
  Account account = Account::restore(bucket, balances, clock_ms, 0, &ok);
  EXPECT_TRUE(ok) << ::testing::PrintToString(balances);
  return account;
}

// A full bucket of 1000 at 10/s, 600 reserved, opened at t = 0.
Account withReservationOf600() {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.reserve(600, kMaxSingle), AccountCode::kOk);
  return account;
}

// 600 reserved and settled at 1200: 400 taken from available, 200 of debt.
Account withDebtOf200() {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 1200, kMaxOverdraft);
  EXPECT_EQ(outcome.debt_issued, 200u);
  return account;
}

// ---- open -------------------------------------------------------------------------------------

TEST(AccountOpenTest, OpeningStartsAvailable) {
  const Account account = Account::open(kBucket, 1000, 5'000);
  const Balances& b = account.balances();
  EXPECT_EQ(b.opening, 1000u);
  EXPECT_EQ(b.available, 1000u);
  EXPECT_EQ(b.minted, 0u);
  EXPECT_EQ(b.overdraft_issued, 0u);
  EXPECT_EQ(b.reserved, 0u);
  EXPECT_EQ(b.spent, 0u);
  EXPECT_EQ(b.retired_for_emergency, 0u);
  EXPECT_EQ(b.overdraft_repaid, 0u);
  EXPECT_EQ(b.transferred_out, 0u);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_EQ(account.refillClockMs(), 5'000u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_EQ(account.bucket(), kBucket);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOpenTest, LaterGenerationOpensEmpty) {
  const Account account = Account::open(kBucket, 0, 0);
  EXPECT_EQ(account.balances(), Balances{});
  EXPECT_EQ(account.mintRoom(), 1000u);
  EXPECT_TRUE(conserved(account));
}

// ---- refill -----------------------------------------------------------------------------------

TEST(AccountRefillTest, MintsRateTimesElapsed) {
  Account account = Account::open(kBucket, 0, 0);
  const RefillOutcome outcome = account.refill(30'000);
  EXPECT_EQ(outcome.minted, 300u);
  EXPECT_EQ(outcome.repaid, 0u);
  EXPECT_EQ(account.balances().minted, 300u);
  EXPECT_EQ(account.balances().available, 300u);
  EXPECT_EQ(account.refillClockMs(), 30'000u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, FractionalUnitsCarryAcrossCalls) {
  Account account = Account::open({.refill_per_second = 3, .burst = 100}, 0, 0);
  // 333 ms at 3/s = 0.999 units: nothing yet, 999 unit·ms carried.
  RefillOutcome outcome = account.refill(333);
  EXPECT_EQ(outcome.minted, 0u);
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.refillCarry(), 999u);
  EXPECT_EQ(account.refillClockMs(), 333u);
  EXPECT_TRUE(conserved(account));
  // 1 more ms: 3 + 999 = 1002 unit·ms = 1 unit, 2 carried.
  outcome = account.refill(334);
  EXPECT_EQ(outcome.minted, 1u);
  EXPECT_EQ(account.balances().available, 1u);
  EXPECT_EQ(account.balances().minted, 1u);
  EXPECT_EQ(account.refillCarry(), 2u);
  EXPECT_TRUE(conserved(account));
  // Up to t = 1000: 666·3 + 2 = 2000 → 2 more, nothing carried: exactly 3 units in 1 s.
  outcome = account.refill(1000);
  EXPECT_EQ(outcome.minted, 2u);
  EXPECT_EQ(account.balances().available, 3u);
  EXPECT_EQ(account.balances().minted, 3u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, ManySmallStepsMintAsMuchAsOneBigStep) {
  Account account = Account::open({.refill_per_second = 7, .burst = 1000}, 0, 0);
  for (uint64_t t = 1; t <= 10'000; ++t) (void)account.refill(t);
  EXPECT_EQ(account.balances().available, 70u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, NeverAboveBurst) {
  Account account = Account::open(kBucket, 950, 0);
  const RefillOutcome outcome = account.refill(10'000);  // 100 mintable, 50 room
  EXPECT_EQ(outcome.minted, 50u);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.balances().minted, 50u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, FullBucketBanksNoTime) {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.refill(100'000).minted, 0u);
  EXPECT_EQ(account.refillClockMs(), 100'000u);
  EXPECT_EQ(account.balances().minted, 0u);
  ASSERT_EQ(account.reserve(30, kMaxSingle), AccountCode::kOk);
  // 100 s passed while full; only the 100 ms since count: 1 unit, not 30.
  EXPECT_EQ(account.refill(100'100).minted, 1u);
  EXPECT_EQ(account.balances().available, 971u);
  EXPECT_EQ(account.balances().minted, 1u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, CarryIsDroppedWhenTheBucketFills) {
  Account account = Account::open({.refill_per_second = 3, .burst = 10}, 9, 0);
  EXPECT_EQ(account.refill(333).minted, 0u);
  EXPECT_EQ(account.refillCarry(), 999u);
  EXPECT_EQ(account.refill(1333).minted, 1u);  // 3 mintable, room 1
  EXPECT_EQ(account.balances().available, 10u);
  EXPECT_EQ(account.refillCarry(), 0u);
  ASSERT_EQ(account.reserve(10, 10), AccountCode::kOk);
  EXPECT_EQ(account.refill(1334).minted, 0u);  // 3 unit·ms, not 999 + 3
  EXPECT_EQ(account.refillCarry(), 3u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, RepaysDebtFirstThenAvailable) {
  Account account = withDebtOf200();
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.debt(), 200u);
  EXPECT_EQ(account.mintRoom(), 1200u);
  // 10 s: 100 minted, all of it repays debt.
  RefillOutcome outcome = account.refill(10'000);
  EXPECT_EQ(outcome.minted, 100u);
  EXPECT_EQ(outcome.repaid, 100u);
  EXPECT_EQ(account.balances().overdraft_repaid, 100u);
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.debt(), 100u);
  EXPECT_TRUE(conserved(account));
  // 20 s more: 200 minted, 100 repays the rest of the debt, 100 becomes available.
  outcome = account.refill(30'000);
  EXPECT_EQ(outcome.minted, 200u);
  EXPECT_EQ(outcome.repaid, 100u);
  EXPECT_EQ(account.balances().overdraft_issued, 200u);
  EXPECT_EQ(account.balances().overdraft_repaid, 200u);
  EXPECT_EQ(account.balances().available, 100u);
  EXPECT_EQ(account.balances().minted, 300u);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, DebtPlusBurstCapsOneLongRefill) {
  Account account = withDebtOf200();
  const RefillOutcome outcome = account.refill(1'000'000);  // 10'000 mintable
  EXPECT_EQ(outcome.minted, 1200u);
  EXPECT_EQ(outcome.repaid, 200u);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, TimeGoingBackwardsIsIgnored) {
  Account account = Account::open(kBucket, 0, 10'000);
  const Balances before = account.balances();
  EXPECT_EQ(account.refill(5'000).minted, 0u);
  EXPECT_EQ(account.refillClockMs(), 10'000u);
  EXPECT_EQ(account.refill(10'000).minted, 0u);
  EXPECT_EQ(account.balances(), before);
  // The clock did not move back: 1 s after 10'000 mints 10, not 60.
  EXPECT_EQ(account.refill(11'000).minted, 10u);
  EXPECT_EQ(account.balances().available, 10u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, RateZeroNeverMints) {
  Account account = Account::open({.refill_per_second = 0, .burst = 1000}, 0, 0);
  EXPECT_EQ(account.refill(1'000'000'000).minted, 0u);
  EXPECT_EQ(account.refillClockMs(), 1'000'000'000u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_EQ(account.balances(), Balances{});
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRefillTest, HoldRefillClockMovesTheClockWithoutMinting) {
  Account account = Account::open({.refill_per_second = 3, .burst = 100}, 0, 0);
  (void)account.refill(333);
  EXPECT_EQ(account.refillCarry(), 999u);
  account.holdRefillClock(60'000);
  EXPECT_EQ(account.refillClockMs(), 60'000u);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_EQ(account.balances().available, 0u);
  account.holdRefillClock(1'000);  // backwards: ignored
  EXPECT_EQ(account.refillClockMs(), 60'000u);
  EXPECT_EQ(account.refill(61'000).minted, 3u);
  EXPECT_TRUE(conserved(account));
}

// ---- reserve ----------------------------------------------------------------------------------

TEST(AccountReserveTest, MovesAvailableToReserved) {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.reserve(600, kMaxSingle), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 400u);
  EXPECT_EQ(account.balances().reserved, 600u);
  EXPECT_TRUE(conserved(account));
  EXPECT_EQ(account.reserve(400, kMaxSingle), AccountCode::kOk);  // exactly what is left
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.balances().reserved, 1000u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReserveTest, ZeroUnitsIsRefused) {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.reserve(0, kMaxSingle), AccountCode::kZeroUnits);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReserveTest, AboveMaxSingleIsRefused) {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.reserve(501, 500), AccountCode::kAboveMaxSingle);
  EXPECT_EQ(account.reserve(500, 500), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 500u);
  EXPECT_EQ(account.balances().reserved, 500u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReserveTest, DebtOutstandingRefusesEvenWithAvailable) {
  // 100 of debt and 1100 available (e.g. a transfer arrived): admission stays frozen.
  Account account =
      restored(kBucket, {.opening = 1000, .overdraft_issued = 100, .available = 1100});
  EXPECT_EQ(account.debt(), 100u);
  const Balances before = account.balances();
  EXPECT_EQ(account.reserve(10, kMaxSingle), AccountCode::kDebtOutstanding);
  EXPECT_EQ(account.balances(), before);
  // Order of checks: zero units and max single come before debt.
  EXPECT_EQ(account.reserve(0, kMaxSingle), AccountCode::kZeroUnits);
  EXPECT_EQ(account.reserve(1001, kMaxSingle), AccountCode::kAboveMaxSingle);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReserveTest, InsufficientAvailableIsRefused) {
  Account account = withReservationOf600();
  const Balances before = account.balances();
  EXPECT_EQ(account.reserve(401, kMaxSingle), AccountCode::kInsufficientAvailable);
  EXPECT_EQ(account.balances(), before);
  EXPECT_EQ(account.balances().available, 400u);
  EXPECT_TRUE(conserved(account));
}

// ---- release / expire -------------------------------------------------------------------------

TEST(AccountReleaseTest, ReturnsUnitsToAvailable) {
  Account account = withReservationOf600();
  EXPECT_EQ(account.release(600), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_EQ(account.balances().spent, 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReleaseTest, MoreThanReservedIsRefused) {
  Account account = withReservationOf600();
  const Balances before = account.balances();
  EXPECT_EQ(account.release(601), AccountCode::kInsufficientReserved);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountReleaseTest, ReleaseIsNotCappedByBurst) {
  // Refill runs while units are reserved; a release then returns them in full.
  Account account = withReservationOf600();
  (void)account.refill(60'000);  // 600 room → available 1000
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.release(600), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 1600u);
  EXPECT_EQ(account.mintRoom(), 0u);
  EXPECT_TRUE(conserved(account));
}

// ---- settle -----------------------------------------------------------------------------------

TEST(AccountSettleTest, BelowReservationRefundsTheDifference) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 200, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.refunded, 400u);
  EXPECT_EQ(outcome.taken_from_available, 0u);
  EXPECT_EQ(outcome.debt_issued, 0u);
  EXPECT_FALSE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().available, 800u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_EQ(account.balances().spent, 200u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, ZeroActualRefundsEverything) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 0, kMaxOverdraft);
  EXPECT_EQ(outcome.refunded, 600u);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.balances().spent, 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, ExactlyEqualRefundsNothing) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 600, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 0u);
  EXPECT_EQ(outcome.debt_issued, 0u);
  EXPECT_EQ(account.balances().available, 400u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_EQ(account.balances().spent, 600u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, AboveReservationTakesFromAvailableFirst) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 900, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 300u);
  EXPECT_EQ(outcome.debt_issued, 0u);
  EXPECT_FALSE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().available, 100u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_EQ(account.balances().spent, 900u);
  EXPECT_EQ(account.balances().overdraft_issued, 0u);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, AboveReservationAndAvailableIssuesOverdraft) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 1200, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 400u);
  EXPECT_EQ(outcome.debt_issued, 200u);
  EXPECT_FALSE(outcome.overdraft_breach);  // 200 ≤ 500
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.balances().reserved, 0u);
  EXPECT_EQ(account.balances().spent, 1200u);
  EXPECT_EQ(account.balances().overdraft_issued, 200u);
  EXPECT_EQ(account.balances().overdraft_repaid, 0u);
  EXPECT_EQ(account.debt(), 200u);
  EXPECT_TRUE(conserved(account));
  // SETTLED_WITH_DEBT semantics: admission is frozen until refill repays it.
  EXPECT_EQ(account.reserve(1, kMaxSingle), AccountCode::kDebtOutstanding);
}

TEST(AccountSettleTest, DebtAtExactlyMaxOverdraftIsNoBreach) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 1500, kMaxOverdraft);
  EXPECT_EQ(outcome.debt_issued, 500u);
  EXPECT_FALSE(outcome.overdraft_breach);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, BeyondMaxOverdraftIsFlaggedAndStillRecordedInFull) {
  Account account = withReservationOf600();
  const SettleOutcome outcome = account.settle(600, 1600, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.taken_from_available, 400u);
  EXPECT_EQ(outcome.debt_issued, 600u);
  EXPECT_TRUE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().overdraft_issued, 600u);
  EXPECT_EQ(account.balances().spent, 1600u);
  EXPECT_EQ(account.debt(), 600u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, BreachCountsDebtAlreadyOwed) {
  // 300 owed, 100 still reserved; settling it at 400 adds 300 more: 600 > 500.
  Account account =
      restored(kBucket, {.opening = 1000, .overdraft_issued = 300, .reserved = 100, .spent = 1200});
  const SettleOutcome outcome = account.settle(100, 400, kMaxOverdraft);
  EXPECT_EQ(outcome.taken_from_available, 0u);
  EXPECT_EQ(outcome.debt_issued, 300u);
  EXPECT_TRUE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().overdraft_issued, 600u);
  EXPECT_EQ(account.balances().spent, 1600u);
  EXPECT_EQ(account.debt(), 600u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountSettleTest, MoreThanReservedIsRefused) {
  Account account = withReservationOf600();
  const Balances before = account.balances();
  const SettleOutcome outcome = account.settle(601, 100, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kInsufficientReserved);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

// ---- chargeExtra ------------------------------------------------------------------------------

TEST(AccountChargeExtraTest, TakesFromAvailableThenDebt) {
  Account account = withReservationOf600();
  ASSERT_EQ(account.settle(600, 600, kMaxOverdraft).code, AccountCode::kOk);
  // A late receipt reports 500 more than was reserved.
  const SettleOutcome outcome = account.chargeExtra(500, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOk);
  EXPECT_EQ(outcome.refunded, 0u);
  EXPECT_EQ(outcome.taken_from_available, 400u);
  EXPECT_EQ(outcome.debt_issued, 100u);
  EXPECT_FALSE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.balances().spent, 1100u);
  EXPECT_EQ(account.balances().overdraft_issued, 100u);
  EXPECT_EQ(account.debt(), 100u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountChargeExtraTest, CoveredByAvailableIssuesNoDebt) {
  Account account = Account::open(kBucket, 1000, 0);
  const SettleOutcome outcome = account.chargeExtra(250, kMaxOverdraft);
  EXPECT_EQ(outcome.taken_from_available, 250u);
  EXPECT_EQ(outcome.debt_issued, 0u);
  EXPECT_EQ(account.balances().available, 750u);
  EXPECT_EQ(account.balances().spent, 250u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountChargeExtraTest, BeyondMaxOverdraftIsFlagged) {
  Account account = Account::open(kBucket, 100, 0);
  const SettleOutcome outcome = account.chargeExtra(700, kMaxOverdraft);
  EXPECT_EQ(outcome.taken_from_available, 100u);
  EXPECT_EQ(outcome.debt_issued, 600u);
  EXPECT_TRUE(outcome.overdraft_breach);
  EXPECT_EQ(account.balances().overdraft_issued, 600u);
  EXPECT_EQ(account.balances().spent, 700u);
  EXPECT_TRUE(conserved(account));
}

// ---- carve and the transfer halves ------------------------------------------------------------

TEST(AccountCarveTest, MovesAvailableToRetired) {
  Account account = Account::open(kBucket, 1000, 0);
  EXPECT_EQ(account.carve(100), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 900u);
  EXPECT_EQ(account.balances().retired_for_emergency, 100u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountCarveTest, ZeroOrMoreThanAvailableIsRefused) {
  Account account = withReservationOf600();
  const Balances before = account.balances();
  EXPECT_EQ(account.carve(0), AccountCode::kZeroUnits);
  EXPECT_EQ(account.carve(401), AccountCode::kInsufficientAvailable);
  EXPECT_EQ(account.balances(), before);
  EXPECT_EQ(account.carve(400), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 0u);
  EXPECT_EQ(account.balances().retired_for_emergency, 400u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountTransferTest, TransferOutRetired) {
  Account account = Account::open(kBucket, 1000, 0);
  ASSERT_EQ(account.carve(100), AccountCode::kOk);
  EXPECT_EQ(account.transferOutRetired(60), AccountCode::kOk);
  EXPECT_EQ(account.balances().retired_for_emergency, 40u);
  EXPECT_EQ(account.balances().transferred_out, 60u);
  EXPECT_EQ(account.balances().available, 900u);
  EXPECT_TRUE(conserved(account));
  const Balances before = account.balances();
  EXPECT_EQ(account.transferOutRetired(41), AccountCode::kInsufficientRetired);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

// ---- shard reconciliation ---------------------------------------------------------------------

TEST(AccountShardTest, RecordShardSpentMovesRetiredToSpent) {
  Account account = Account::open(kBucket, 1000, 0);
  ASSERT_EQ(account.carve(100), AccountCode::kOk);
  EXPECT_EQ(account.recordShardSpent(70), AccountCode::kOk);
  EXPECT_EQ(
      account.balances(),
      (Balances{.opening = 1000, .available = 900, .spent = 70, .retired_for_emergency = 30}));
  EXPECT_TRUE(conserved(account));
  const Balances before = account.balances();
  EXPECT_EQ(account.recordShardSpent(31), AccountCode::kInsufficientRetired);
  EXPECT_EQ(account.balances(), before);
  EXPECT_EQ(account.recordShardSpent(30), AccountCode::kOk);
  EXPECT_EQ(account.balances().retired_for_emergency, 0u);
  EXPECT_EQ(account.balances().spent, 100u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountShardTest, RecordShardDebtIssuesOverdraftAndFreezesAdmission) {
  Account account = Account::open(kBucket, 1000, 0);
  ASSERT_EQ(account.carve(100), AccountCode::kOk);
  ASSERT_EQ(account.recordShardSpent(100), AccountCode::kOk);
  EXPECT_EQ(account.recordShardDebt(40), AccountCode::kOk);
  EXPECT_EQ(account.balances(),
            (Balances{.opening = 1000, .overdraft_issued = 40, .available = 900, .spent = 140}));
  EXPECT_EQ(account.debt(), 40u);
  EXPECT_TRUE(conserved(account));
  const Balances before = account.balances();
  EXPECT_EQ(account.reserve(1, kMaxSingle), AccountCode::kDebtOutstanding);
  EXPECT_EQ(account.balances(), before);
  // A full bucket still mints the debt's worth: refill repays it first (4 s at 10/s).
  (void)account.refill(4'000);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_EQ(account.balances().overdraft_repaid, 40u);
  EXPECT_EQ(account.balances().available, 900u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountShardTest, RecordShardOverflowChangesNothing) {
  Account spent_full = restored(
      kBucket, {.opening = kMax, .minted = 10, .spent = kMax, .retired_for_emergency = 10});
  Balances before = spent_full.balances();
  EXPECT_EQ(spent_full.recordShardSpent(10), AccountCode::kOverflow);
  EXPECT_EQ(spent_full.recordShardDebt(1), AccountCode::kOverflow);
  EXPECT_EQ(spent_full.balances(), before);
  Account issued_full = restored(
      kBucket,
      {.opening = 10, .overdraft_issued = kMax, .available = 10, .overdraft_repaid = kMax});
  before = issued_full.balances();
  EXPECT_EQ(issued_full.recordShardDebt(1), AccountCode::kOverflow);
  EXPECT_EQ(issued_full.balances(), before);
  EXPECT_TRUE(conserved(issued_full));
}

TEST(AccountTransferTest, TransferOutAvailable) {
  Account account = withReservationOf600();
  EXPECT_EQ(account.transferOutAvailable(300), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 100u);
  EXPECT_EQ(account.balances().reserved, 600u);
  EXPECT_EQ(account.balances().transferred_out, 300u);
  EXPECT_TRUE(conserved(account));
  const Balances before = account.balances();
  EXPECT_EQ(account.transferOutAvailable(101), AccountCode::kInsufficientAvailable);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountTransferTest, ReceiveTransferMintsUpToMintRoom) {
  Account account = Account::open(kBucket, 0, 0);
  EXPECT_EQ(account.receiveTransfer(400), AccountCode::kOk);
  EXPECT_EQ(account.balances().minted, 400u);
  EXPECT_EQ(account.balances().available, 400u);
  EXPECT_EQ(account.mintRoom(), 600u);
  EXPECT_TRUE(conserved(account));
  const Balances before = account.balances();
  EXPECT_EQ(account.receiveTransfer(601), AccountCode::kAboveMintRoom);
  EXPECT_EQ(account.balances(), before);
  EXPECT_EQ(account.receiveTransfer(600), AccountCode::kOk);
  EXPECT_EQ(account.balances().available, 1000u);
  EXPECT_EQ(account.balances().minted, 1000u);
  EXPECT_EQ(account.receiveTransfer(1), AccountCode::kAboveMintRoom);
  EXPECT_EQ(account.receiveTransfer(0), AccountCode::kOk);
  EXPECT_EQ(account.balances().minted, 1000u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountTransferTest, ReceiveTransferRepaysDebtFirst) {
  Account account = withDebtOf200();
  EXPECT_EQ(account.receiveTransfer(300), AccountCode::kOk);
  EXPECT_EQ(account.balances().minted, 300u);
  EXPECT_EQ(account.balances().overdraft_repaid, 200u);
  EXPECT_EQ(account.balances().available, 100u);
  EXPECT_EQ(account.debt(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountTransferTest, PairedHalvesConserveTheSum) {
  Account from = withReservationOf600();
  Account to = Account::open(kBucket, 0, 0);
  ASSERT_EQ(from.transferOutAvailable(400), AccountCode::kOk);
  ASSERT_EQ(to.receiveTransfer(400), AccountCode::kOk);
  EXPECT_EQ(from.balances().transferred_out, to.balances().minted);
  const Units sources = from.balances().opening + from.balances().minted + to.balances().opening +
                        to.balances().minted - from.balances().transferred_out -
                        to.balances().transferred_out;
  const Units uses = from.balances().available + from.balances().reserved +
                     to.balances().available + to.balances().reserved;
  EXPECT_EQ(sources, 1000u);
  EXPECT_EQ(uses, 1000u);
  EXPECT_TRUE(conserved(from));
  EXPECT_TRUE(conserved(to));
}

// ---- mintRoom ---------------------------------------------------------------------------------

TEST(AccountMintRoomTest, DebtPlusHeadroomUnderBurst) {
  EXPECT_EQ(Account::open(kBucket, 1000, 0).mintRoom(), 0u);
  EXPECT_EQ(Account::open(kBucket, 0, 0).mintRoom(), 1000u);
  EXPECT_EQ(withReservationOf600().mintRoom(), 600u);  // reserved units do not count
  EXPECT_EQ(withDebtOf200().mintRoom(), 1200u);
  // Available above burst (after a release): headroom 0, only debt.
  const Account above = restored(
      kBucket, {.opening = 1000, .minted = 600, .overdraft_issued = 50, .available = 1650});
  EXPECT_EQ(above.mintRoom(), 50u);
  // Saturates instead of wrapping.
  const Account huge = restored(kBucket, {.overdraft_issued = kMax, .spent = kMax});
  EXPECT_EQ(huge.mintRoom(), kMax);
}

// ---- restore ----------------------------------------------------------------------------------

TEST(AccountRestoreTest, AcceptsAConservingRecord) {
  bool ok = false;
  const Balances balances{.opening = 1000,
                          .minted = 300,
                          .overdraft_issued = 200,
                          .available = 100,
                          .reserved = 100,
                          .spent = 1100,
                          .retired_for_emergency = 50,
                          .overdraft_repaid = 100,
                          .transferred_out = 50};
  const Account account = Account::restore(kBucket, balances, 42'000, 999, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(account.balances(), balances);
  EXPECT_EQ(account.refillClockMs(), 42'000u);
  EXPECT_EQ(account.refillCarry(), 999u);
  EXPECT_EQ(account.debt(), 100u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountRestoreTest, RejectsNonConservingRecords) {
  bool ok = true;
  (void)Account::restore(kBucket, {.opening = 1000, .available = 999}, 0, 0, &ok);
  EXPECT_FALSE(ok);
  ok = true;
  (void)Account::restore(kBucket, {.opening = 1000, .available = 1001}, 0, 0, &ok);
  EXPECT_FALSE(ok);
  // Repaid more than issued: sums balance, but debt would be negative.
  ok = true;
  (void)Account::restore(
      kBucket, {.opening = 1000, .overdraft_issued = 10, .available = 990, .overdraft_repaid = 20},
      0, 0, &ok);
  EXPECT_FALSE(ok);
  // Sums that only match modulo 2^64 do not conserve.
  ok = true;
  (void)Account::restore(kBucket, {.opening = 1, .available = kMax, .reserved = 2}, 0, 0, &ok);
  EXPECT_FALSE(ok);
  // A carry of a whole unit·s or more is corrupt.
  ok = true;
  (void)Account::restore(kBucket, {.opening = 1000, .available = 1000}, 0, 1000, &ok);
  EXPECT_FALSE(ok);
}

TEST(AccountRestoreTest, IsConservedUsesTheFullEquation) {
  EXPECT_TRUE(isConserved(Balances{}));
  EXPECT_TRUE(isConserved({.opening = 10, .transferred_out = 10}));
  EXPECT_FALSE(isConserved({.opening = 10}));
  EXPECT_FALSE(isConserved({.available = 10}));
  // Each side may exceed 64 bits as long as both are equal.
  EXPECT_TRUE(isConserved({.opening = kMax, .minted = kMax, .available = kMax, .spent = kMax}));
}

// ---- 64-bit overflow: a typed error that changes nothing ------------------------------------

TEST(AccountOverflowTest, ReserveOverflowingReserved) {
  Account account = restored(
      kBucket,
      {.opening = kMax, .minted = kMax, .available = 10, .reserved = kMax - 5, .spent = kMax - 5});
  const Balances before = account.balances();
  EXPECT_EQ(account.reserve(10, kMax), AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, ReleaseOverflowingAvailable) {
  Account account =
      restored(kBucket, {.opening = kMax, .minted = 10, .available = kMax, .reserved = 10});
  const Balances before = account.balances();
  EXPECT_EQ(account.release(10), AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, SettleOverflowingSpent) {
  Account account =
      restored(kBucket, {.opening = kMax, .minted = 5, .reserved = 10, .spent = kMax - 5});
  const Balances before = account.balances();
  EXPECT_EQ(account.settle(10, 10, kMaxOverdraft).code, AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, SettleRefundOverflowingAvailable) {
  Account account =
      restored(kBucket, {.opening = kMax, .minted = 10, .available = kMax, .reserved = 10});
  const Balances before = account.balances();
  EXPECT_EQ(account.settle(10, 0, kMaxOverdraft).code, AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, SettleAboveOverflowingOverdraftIssued) {
  Account account = restored(
      kBucket, {.opening = 10, .overdraft_issued = kMax, .reserved = 10, .overdraft_repaid = kMax});
  const Balances before = account.balances();
  const SettleOutcome outcome = account.settle(10, 20, kMaxOverdraft);
  EXPECT_EQ(outcome.code, AccountCode::kOverflow);
  EXPECT_EQ(outcome.debt_issued, 0u);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, ChargeExtraOverflowingSpentOrOverdraft) {
  Account spent_full = restored(kBucket, {.opening = kMax, .spent = kMax});
  Balances before = spent_full.balances();
  EXPECT_EQ(spent_full.chargeExtra(1, kMaxOverdraft).code, AccountCode::kOverflow);
  EXPECT_EQ(spent_full.balances(), before);
  EXPECT_TRUE(conserved(spent_full));

  Account issued_full = restored(kBucket, {.overdraft_issued = kMax, .overdraft_repaid = kMax});
  before = issued_full.balances();
  EXPECT_EQ(issued_full.chargeExtra(1, kMaxOverdraft).code, AccountCode::kOverflow);
  EXPECT_EQ(issued_full.balances(), before);
  EXPECT_TRUE(conserved(issued_full));
}

TEST(AccountOverflowTest, CarveOverflowingRetired) {
  Account account = restored(
      kBucket, {.opening = kMax, .minted = 10, .available = 10, .retired_for_emergency = kMax});
  const Balances before = account.balances();
  EXPECT_EQ(account.carve(10), AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, TransfersOutOverflowingTransferredOut) {
  Account account = restored(kBucket, {.opening = kMax,
                                       .minted = 20,
                                       .available = 10,
                                       .retired_for_emergency = 10,
                                       .transferred_out = kMax});
  const Balances before = account.balances();
  EXPECT_EQ(account.transferOutRetired(10), AccountCode::kOverflow);
  EXPECT_EQ(account.transferOutAvailable(10), AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, ReceiveTransferOverflowingMinted) {
  Account account = restored(kBucket, {.minted = kMax, .spent = kMax});
  ASSERT_EQ(account.mintRoom(), 1000u);
  const Balances before = account.balances();
  EXPECT_EQ(account.receiveTransfer(10), AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, RefillOverflowingMintedStopsMintingAndLosesNothing) {
  Account account = restored(kBucket, {.minted = kMax, .spent = kMax}, /*clock_ms=*/0);
  const Balances before = account.balances();
  const RefillOutcome outcome = account.refill(10'000);
  EXPECT_EQ(outcome.minted, 0u);
  EXPECT_EQ(outcome.repaid, 0u);
  EXPECT_EQ(account.balances(), before);
  EXPECT_EQ(account.refillCarry(), 0u);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountOverflowTest, HugeElapsedTimeAndRateDoNotWrap) {
  // 2^40 units/s for ~584 million years: the product needs 128 bits; the cap still applies.
  Account account =
      Account::open({.refill_per_second = uint64_t{1} << 40, .burst = uint64_t{1} << 50}, 0, 0);
  const RefillOutcome outcome = account.refill(kMax);
  EXPECT_EQ(outcome.minted, uint64_t{1} << 50);
  EXPECT_EQ(account.balances().available, uint64_t{1} << 50);
  EXPECT_TRUE(conserved(account));
}

// The balance bound, far below 2^64: an operation whose result would pass it is refused like an
// overflow, so the ledger never writes a record that its restore (which refuses balances above
// the bound) would not apply.
TEST(AccountOverflowTest, ResultsAboveTheBalanceBoundAreRefusedAndChangeNothing) {
  const Units bound = limits::kBalanceUnitsMax;
  Account account = restored(kBucket, {.opening = bound, .reserved = 100, .spent = bound - 100});
  const Balances before = account.balances();
  EXPECT_EQ(account.settle(100, 101, kMaxOverdraft).code, AccountCode::kOverflow);
  EXPECT_EQ(account.balances(), before);
  const SettleOutcome at_bound = account.settle(100, 100, kMaxOverdraft);
  EXPECT_EQ(at_bound.code, AccountCode::kOk);  // spent exactly at the bound is fine
  EXPECT_EQ(account.balances().spent, bound);
  EXPECT_TRUE(conserved(account));
}

TEST(AccountBoundsTest, BalancesAboveTheBoundAreNamed) {
  EXPECT_TRUE(balancesAboveBound({.opening = limits::kBalanceUnitsMax}).empty());
  const std::vector<BalanceField> above =
      balancesAboveBound({.overdraft_issued = kMax - 900, .spent = kMax});
  ASSERT_EQ(above.size(), 2u);
  EXPECT_STREQ(above[0].name, "overdraftIssued");
  EXPECT_EQ(above[0].value, kMax - 900);
  EXPECT_STREQ(above[1].name, "spent");
  EXPECT_EQ(above[1].value, kMax);
}

TEST(AccountBreachTest, EveryBreachingSettleIsCountedWithTheDebtBeyondTheMaximum) {
  Account account = Account::open(kBucket, 1000, 0);
  ASSERT_EQ(account.reserve(500, kMaxSingle), AccountCode::kOk);
  ASSERT_EQ(account.reserve(500, kMaxSingle), AccountCode::kOk);
  // Debt 400 ≤ 500: no breach. Then 400 + 300 = 700: a breach by 200.
  EXPECT_FALSE(account.settle(500, 900, kMaxOverdraft).overdraft_breach);
  EXPECT_EQ(account.breaches(), OverdraftBreaches{});
  EXPECT_TRUE(account.settle(500, 800, kMaxOverdraft).overdraft_breach);
  EXPECT_EQ(account.breaches(), (OverdraftBreaches{.count = 1, .units = 200}));
  // A late receipt charging 50 more: debt 750, a breach by 250.
  EXPECT_TRUE(account.chargeExtra(50, kMaxOverdraft).overdraft_breach);
  EXPECT_EQ(account.breaches(), (OverdraftBreaches{.count = 2, .units = 450}));
}

TEST(AccountCodeTest, Names) {
  EXPECT_STREQ(accountCodeName(AccountCode::kOk), "ok");
  EXPECT_STREQ(accountCodeName(AccountCode::kZeroUnits), "zero-units");
  EXPECT_STREQ(accountCodeName(AccountCode::kAboveMaxSingle), "above-max-single");
  EXPECT_STREQ(accountCodeName(AccountCode::kDebtOutstanding), "debt-outstanding");
  EXPECT_STREQ(accountCodeName(AccountCode::kInsufficientAvailable), "insufficient-available");
  EXPECT_STREQ(accountCodeName(AccountCode::kInsufficientReserved), "insufficient-reserved");
  EXPECT_STREQ(accountCodeName(AccountCode::kInsufficientRetired), "insufficient-retired");
  EXPECT_STREQ(accountCodeName(AccountCode::kAboveMintRoom), "above-mint-room");
  EXPECT_STREQ(accountCodeName(AccountCode::kOverflow), "overflow");
}

}  // namespace
}  // namespace tally
