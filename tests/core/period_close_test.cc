#include "core/period_close.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/limits.h"

namespace tally {
namespace {

constexpr uint64_t kHourMs = 3'600'000;
constexpr uint64_t kDayMs = 86'400'000;
// An arbitrary Unix time inside hourly epoch kE0; kBoundary is where kE0 ends.
constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kE0 = kT0 / kHourMs;
constexpr uint64_t kBoundary = (kE0 + 1) * kHourMs;
const std::string kRoute = "/v1/chat";

Budget budgetFor(const std::string& subject, EpochPeriod period = EpochPeriod::kHour) {
  return Budget{
      .subject_pattern = subject,
      .route = kRoute,
      .unit = "tokens",
      .refill_per_second = 10,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 5000,
      .accounting_epoch = period,
  };
}

Digest digestOf(uint8_t seed) {
  Digest digest{};
  digest.fill(seed);
  return digest;
}

ReserveRequest reserveOf(const std::string& id, const std::string& subject, Units units) {
  return ReserveRequest{.reservation_id = id,
                        .request_digest = digestOf(static_cast<uint8_t>(id.size())),
                        .subject = subject,
                        .route = kRoute,
                        .units = units};
}

// Reserves, starts and settles `actual` of `units` for `subject`.
void spend(Ledger* ledger, const std::string& id, const std::string& subject, Units units,
           Units actual, uint64_t now_ms) {
  ASSERT_EQ(ledger->reserve(reserveOf(id, subject, units), now_ms).code, ReplyCode::kOk);
  ASSERT_EQ(ledger->start({.reservation_id = id, .operation_id = "op-" + id}, now_ms).code,
            ReplyCode::kOk);
  ASSERT_EQ(ledger
                ->settle({.reservation_id = id, .operation_id = "op-" + id, .actual_units = actual},
                         now_ms)
                .code,
            ReplyCode::kOk);
}

// A STARTED reservation of 100 units (never expires by itself).
void hold(Ledger* ledger, uint64_t now_ms) {
  ASSERT_EQ(ledger->reserve(reserveOf("held", "tenant-1", 100), now_ms).code, ReplyCode::kOk);
  ASSERT_EQ(ledger->start({.reservation_id = "held", .operation_id = "op-held"}, now_ms).code,
            ReplyCode::kOk);
}

const AccountView* viewOf(const AuditReport& report, const AccountKey& key) {
  for (const AccountView& view : report.accounts) {
    if (view.key == key) return &view;
  }
  return nullptr;
}

std::vector<PeriodSnapshot> snapshotsOf(const Ledger& ledger, uint64_t epoch) {
  PeriodAudit audit = ledger.auditPeriods({.epoch = epoch}, 0);
  return audit.report.period_snapshots;
}

TEST(PeriodEpochTest, EpochIsUnixMillisecondsOverThePeriodUtc) {
  EXPECT_EQ(accountingEpochOf(0, EpochPeriod::kHour), 0u);
  EXPECT_EQ(accountingEpochOf(kHourMs - 1, EpochPeriod::kHour), 0u);
  EXPECT_EQ(accountingEpochOf(kHourMs, EpochPeriod::kHour), 1u);
  // 2023-11-14T22:13:20Z is in day 19675 (2023-11-14 UTC) and hour 472222.
  EXPECT_EQ(accountingEpochOf(kT0, EpochPeriod::kDay), 19675u);
  EXPECT_EQ(accountingEpochOf(kT0, EpochPeriod::kHour), 472222u);
  EXPECT_EQ(epochStartMs(19675, EpochPeriod::kDay), 19675 * kDayMs);
  EXPECT_EQ(epochStartMs(kE0 + 1, EpochPeriod::kHour), kBoundary);
}

TEST(PeriodCheckTest, HoldsOnlyWhenTheEquationAndMonotonyHold) {
  const Balances opening{.opening = 1000, .available = 1000};
  Balances closing = opening;
  closing.minted = 50;
  closing.spent = 300;
  closing.available = 750;
  EXPECT_TRUE(checkPeriod(opening, closing));
  EXPECT_TRUE(checkPeriod(Balances{}, closing));  // opened in the period
  const std::optional<PeriodActivity> activity = periodActivity(Balances{}, closing);
  ASSERT_TRUE(activity);
  EXPECT_EQ(*activity, (PeriodActivity{.opened = 1000, .minted = 50, .spent = 300}));
  // A cumulative balance that went down is no period at all.
  EXPECT_FALSE(checkPeriod(closing, opening));
  EXPECT_FALSE(periodActivity(closing, opening));
  // An end that does not conserve fails the check.
  Balances broken = closing;
  broken.available += 1;
  EXPECT_FALSE(checkPeriod(opening, broken));
}

class PeriodCloseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {budgetFor("tenant-*")}}, kT0).code,
              ReplyCode::kOk);
  }
  Ledger ledger_;
  const AccountKey key_{"tenant-1", kRoute, 1};
};

TEST_F(PeriodCloseTest, BoundaryClosesWithBalancesAsAuditShowsThemAndChangesNoOther) {
  spend(&ledger_, "a", "tenant-1", 600, 400, kT0);
  hold(&ledger_, kT0 + 1000);
  // Before the boundary: nothing closes.
  EXPECT_EQ(ledger_.tick(kBoundary - 1).periods_closed, 0u);
  EXPECT_EQ(ledger_.periods().size(), 0u);

  const uint64_t t = kBoundary + 5;
  const AuditReport before = ledger_.audit(t);  // projected as of t, changes nothing
  const AccountView* projected = viewOf(before, key_);
  ASSERT_NE(projected, nullptr);
  // A twin that never ticks: the same history, audited at the same time.
  Ledger twin;
  ASSERT_EQ(twin.publishPolicy(Policy{.budgets = {budgetFor("tenant-*")}}, kT0).code,
            ReplyCode::kOk);
  spend(&twin, "a", "tenant-1", 600, 400, kT0);
  hold(&twin, kT0 + 1000);

  (void)ledger_.takeChangedRows();
  const TickOutcome outcome = ledger_.tick(t);
  EXPECT_EQ(outcome.periods_closed, 1u);
  const Balances& after = ledger_.accounts().find(key_)->account.balances();
  // The close applied exactly the refill earned by t (what audit already reported): no reset,
  // no fresh bucket, nothing dropped.
  EXPECT_EQ(after, projected->balances);
  EXPECT_EQ(after.opening, 1000u);
  EXPECT_EQ(after.reserved, 100u);
  for (uint64_t when : {t, t + kHourMs / 2}) {
    const AuditReport ours = ledger_.audit(when);
    const AuditReport theirs = twin.audit(when);
    ASSERT_EQ(ours.accounts.size(), 1u);
    ASSERT_EQ(theirs.accounts.size(), 1u);
    EXPECT_EQ(ours.accounts[0].balances, theirs.accounts[0].balances) << when;
  }

  const std::vector<PeriodSnapshot> closed = snapshotsOf(ledger_, kE0);
  ASSERT_EQ(closed.size(), 1u);
  const PeriodSnapshot& snapshot = closed[0];
  EXPECT_EQ(snapshot.key, key_);
  EXPECT_EQ(snapshot.epoch_first, kE0);
  EXPECT_EQ(snapshot.epoch_last, kE0);
  EXPECT_EQ(snapshot.opened_at_ms, kT0);
  EXPECT_EQ(snapshot.closed_at_ms, t);
  EXPECT_EQ(snapshot.opening, Balances{});  // opened in this period
  EXPECT_EQ(snapshot.closing, after);
  EXPECT_TRUE(snapshot.conserved);
  const std::optional<PeriodActivity> activity = periodActivity(snapshot.opening, snapshot.closing);
  ASSERT_TRUE(activity);
  EXPECT_EQ(activity->opened, 1000u);
  EXPECT_EQ(activity->spent, 400u);
  EXPECT_EQ(activity->minted, after.minted);
  EXPECT_GT(activity->minted, 0u);  // ~47 min at 10/s filled the bucket back

  // The snapshot and the account's new open period are in the same batch.
  const LedgerChangedRows rows = ledger_.takeChangedRows();
  ASSERT_EQ(rows.period_snapshots.size(), 1u);
  EXPECT_EQ(*rows.period_snapshots[0], snapshot);
  ASSERT_EQ(rows.accounts.size(), 1u);
  EXPECT_EQ(rows.accounts[0]->period.epoch_first, kE0 + 1);
  EXPECT_EQ(rows.accounts[0]->period.opening, after);

  // Ticking again in the same epoch closes nothing.
  EXPECT_EQ(ledger_.tick(t + 1000).periods_closed, 0u);
  EXPECT_TRUE(ledger_.takeChangedRows().period_snapshots.empty());
}

TEST_F(PeriodCloseTest, ConsecutivePeriodsChainAndTheirActivitySumsToTheWhole) {
  spend(&ledger_, "a", "tenant-1", 600, 600, kT0);
  (void)ledger_.tick(kBoundary + 10);
  spend(&ledger_, "b", "tenant-1", 900, 1200, kBoundary + 20);  // 300 over: debt
  spend(&ledger_, "c", "tenant-2", 10, 10, kBoundary + 30);     // opens in the second period
  (void)ledger_.tick(kBoundary + kHourMs + 10);

  const std::vector<PeriodSnapshot> first = snapshotsOf(ledger_, kE0);
  const std::vector<PeriodSnapshot> second = snapshotsOf(ledger_, kE0 + 1);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 2u);  // tenant-1 and tenant-2
  EXPECT_EQ(second[0].key, key_);
  EXPECT_EQ(second[0].opening, first[0].closing);  // closing(n) = opening(n+1)
  EXPECT_EQ(second[0].opened_at_ms, first[0].closed_at_ms);
  for (const PeriodSnapshot& snapshot : second) EXPECT_TRUE(snapshot.conserved);
  const PeriodActivity a = *periodActivity(first[0].opening, first[0].closing);
  const PeriodActivity b = *periodActivity(second[0].opening, second[0].closing);
  const PeriodActivity whole = *periodActivity(Balances{}, second[0].closing);
  EXPECT_EQ(a.minted + b.minted, whole.minted);
  EXPECT_EQ(a.spent + b.spent, whole.spent);
  EXPECT_EQ(b.spent, 1200u);
  EXPECT_EQ(a.debt_issued + b.debt_issued, whole.debt_issued);
  EXPECT_EQ(a.debt_repaid + b.debt_repaid, whole.debt_repaid);
  EXPECT_GT(b.debt_issued, 0u);
  // tenant-2 opened in the second period: its opening is nothing, its first epoch kE0 + 1.
  EXPECT_EQ(second[1].opening, Balances{});
  EXPECT_EQ(second[1].epoch_first, kE0 + 1);
}

TEST_F(PeriodCloseTest, AGapOfSeveralEpochsClosesAsOnePeriodCoveringThemAll) {
  spend(&ledger_, "a", "tenant-1", 600, 600, kT0);
  const uint64_t later = kBoundary + 4 * kHourMs + 7;  // down across 5 boundaries
  EXPECT_EQ(ledger_.tick(later).periods_closed, 1u);
  for (uint64_t epoch = kE0; epoch <= kE0 + 4; ++epoch) {
    const std::vector<PeriodSnapshot> snapshots = snapshotsOf(ledger_, epoch);
    ASSERT_EQ(snapshots.size(), 1u) << epoch;
    EXPECT_EQ(snapshots[0].epoch_first, kE0);
    EXPECT_EQ(snapshots[0].epoch_last, kE0 + 4);
    EXPECT_EQ(snapshots[0].closed_at_ms, later);
  }
  EXPECT_EQ(ledger_.periods().size(), 1u);
  const PeriodAudit list = ledger_.auditPeriods({.list = true}, later);
  ASSERT_EQ(list.report.closed_periods.size(), 1u);
  EXPECT_EQ(list.report.closed_periods[0],
            (PeriodSpan{.epoch_first = kE0, .epoch_last = kE0 + 4, .accounts = 1}));
  // The open period (kE0 + 5) and an epoch before anything was kept are typed refusals.
  for (uint64_t epoch : {kE0 + 5, kE0 - 1}) {
    const PeriodAudit missing = ledger_.auditPeriods({.epoch = epoch}, later);
    EXPECT_FALSE(missing.found);
    EXPECT_NE(missing.message.find("no closed accounting period covers epoch"), std::string::npos);
    EXPECT_NE(missing.message.find(std::to_string(kE0) + ".." + std::to_string(kE0 + 4)),
              std::string::npos)
        << missing.message;
  }
}

TEST_F(PeriodCloseTest, DailyAccountsCloseOnlyAtUtcMidnight) {
  Ledger ledger;
  ASSERT_EQ(
      ledger.publishPolicy(Policy{.budgets = {budgetFor("tenant-1", EpochPeriod::kDay)}}, kT0).code,
      ReplyCode::kOk);
  spend(&ledger, "a", "tenant-1", 10, 10, kT0);
  const uint64_t day = kT0 / kDayMs;
  EXPECT_EQ(ledger.tick(kBoundary + 1).periods_closed, 0u);  // an hour boundary only
  EXPECT_EQ(ledger.tick((day + 1) * kDayMs - 1).periods_closed, 0u);
  EXPECT_EQ(ledger.tick((day + 1) * kDayMs).periods_closed, 1u);
  const std::vector<PeriodSnapshot> closed = snapshotsOf(ledger, day);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].epoch_period, EpochPeriod::kDay);
  EXPECT_EQ(closed[0].epoch_first, day);
}

TEST_F(PeriodCloseTest, EveryGenerationIsClosedIncludingADrainingOne) {
  ASSERT_EQ(ledger_.reserve(reserveOf("held", "tenant-1", 300), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.start({.reservation_id = "held", .operation_id = "op"}, kT0).code,
            ReplyCode::kOk);
  ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {budgetFor("tenant-*")}}, kT0 + 10).code,
            ReplyCode::kOk);  // generation 1 drains, holding 300
  ASSERT_EQ(ledger_.reserve(reserveOf("new", "tenant-1", 50), kT0 + 20).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.tick(kBoundary + 1).periods_closed, 2u);
  const std::vector<PeriodSnapshot> closed = snapshotsOf(ledger_, kE0);
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].key.generation, 1u);
  EXPECT_EQ(closed[1].key.generation, 2u);
  EXPECT_EQ(closed[0].closing.reserved, 300u);
  EXPECT_GT(closed[0].closing.transferred_out, 0u);  // handed over to generation 2
  for (const PeriodSnapshot& snapshot : closed) EXPECT_TRUE(snapshot.conserved);
  // Over the route, the paired transfer cancels: generation 2's minted includes it.
  const PeriodActivity g1 = *periodActivity(closed[0].opening, closed[0].closing);
  const PeriodActivity g2 = *periodActivity(closed[1].opening, closed[1].closing);
  EXPECT_GE(g2.minted, g1.transferred_out);
}

TEST_F(PeriodCloseTest, TheSweepIsBoundedPerTickAndClosesEachAccountOnce) {
  for (int i = 0; i < 5; ++i) {
    const std::string subject = "tenant-" + std::to_string(i);
    spend(&ledger_, "r" + std::to_string(i), subject, 10, 10, kT0);
  }
  uint64_t closed = 0;
  for (int tick = 0; tick < 5; ++tick) {
    const uint64_t now = kBoundary + static_cast<uint64_t>(tick);
    const uint64_t this_tick = ledger_.tick(now, 2).periods_closed;
    EXPECT_LE(this_tick, 2u);
    closed += this_tick;
  }
  EXPECT_EQ(closed, 5u);
  EXPECT_EQ(ledger_.periods().size(), 5u);
  EXPECT_EQ(snapshotsOf(ledger_, kE0).size(), 5u);
}

TEST_F(PeriodCloseTest, RetentionKeepsTheLastSnapshotsAndDeletesTheOlderInTheSameBatch) {
  spend(&ledger_, "a", "tenant-1", 10, 10, kT0);
  (void)ledger_.takeChangedRows();
  const uint64_t closes = limits::kPeriodSnapshotsKept + 2;
  std::vector<PeriodKey> deleted;
  for (uint64_t i = 0; i < closes; ++i) {
    (void)ledger_.tick(kBoundary + i * kHourMs);
    LedgerChanges changes = ledger_.takeChanges();
    EXPECT_EQ(changes.period_snapshots.size(), 1u);
    deleted.insert(deleted.end(), changes.period_snapshots_deleted.begin(),
                   changes.period_snapshots_deleted.end());
  }
  EXPECT_EQ(ledger_.periods().size(), limits::kPeriodSnapshotsKept);
  ASSERT_EQ(deleted.size(), 2u);
  EXPECT_EQ(deleted[0], (PeriodKey{.key = key_, .epoch_first = kE0}));
  EXPECT_EQ(deleted[1], (PeriodKey{.key = key_, .epoch_first = kE0 + 1}));
  EXPECT_FALSE(ledger_.auditPeriods({.epoch = kE0}, 0).found);
  EXPECT_TRUE(ledger_.auditPeriods({.epoch = kE0 + 2}, 0).found);
}

// Rebuilds a ledger from `source`'s durable images, as the store's restore does.
void restoreInto(const Ledger& source, Ledger* target, uint64_t now_ms) {
  for (Generation generation : source.accounts().generations()) {
    ASSERT_TRUE(target->accounts()
                    .restorePolicy(*source.accounts().policy(generation),
                                   source.accounts().republishedFrom(generation))
                    .isOk());
  }
  for (const AccountView& view : source.audit(0).accounts) {
    const AccountEntry* entry = source.accounts().find(view.key);
    ASSERT_TRUE(target->accounts()
                    .restoreAccount(entry->key, entry->account.balances(),
                                    entry->account.refillClockMs(), entry->account.refillCarry(),
                                    entry->account.breaches(), entry->period)
                    .isOk());
  }
  for (const PeriodSpan& span : source.auditPeriods({.list = true}, 0).report.closed_periods) {
    for (const PeriodSnapshot& snapshot : snapshotsOf(source, span.epoch_first)) {
      if (snapshot.epoch_first != span.epoch_first) continue;
      ASSERT_TRUE(target->restorePeriodSnapshot(snapshot).isOk());
    }
  }
  source.forEachReservation([&](const Reservation& reservation) {
    ASSERT_TRUE(target->restoreReservation(reservation).isOk());
  });
  ASSERT_TRUE(target->finishRestore(now_ms).isOk());
}

TEST_F(PeriodCloseTest, ARestartMidPeriodKeepsItsOpeningAndClosesItTheSame) {
  spend(&ledger_, "a", "tenant-1", 600, 600, kT0);
  (void)ledger_.tick(kBoundary + 10);  // closes kE0
  spend(&ledger_, "b", "tenant-1", 100, 100, kBoundary + 1000);

  Ledger restarted;
  restoreInto(ledger_, &restarted, kBoundary + 2000);
  EXPECT_EQ(restarted.accounts().find(key_)->period, ledger_.accounts().find(key_)->period);
  EXPECT_EQ(snapshotsOf(restarted, kE0), snapshotsOf(ledger_, kE0));
  // The restored ledger neither re-closes kE0 nor loses the activity since.
  EXPECT_EQ(restarted.tick(kBoundary + 3000).periods_closed, 0u);
  const uint64_t next = kBoundary + kHourMs + 10;
  EXPECT_EQ(restarted.tick(next).periods_closed, 1u);
  EXPECT_EQ(ledger_.tick(next).periods_closed, 1u);
  ASSERT_EQ(snapshotsOf(restarted, kE0 + 1).size(), 1u);
  EXPECT_EQ(snapshotsOf(restarted, kE0 + 1), snapshotsOf(ledger_, kE0 + 1));
  const PeriodSnapshot second = snapshotsOf(restarted, kE0 + 1)[0];
  EXPECT_EQ(periodActivity(second.opening, second.closing)->spent, 100u);
}

TEST_F(PeriodCloseTest, ALegacyAccountWithoutAPeriodClosesItsWholeHistoryOnce) {
  spend(&ledger_, "a", "tenant-1", 600, 600, kT0);
  Ledger restarted;
  for (Generation generation : ledger_.accounts().generations()) {
    ASSERT_TRUE(
        restarted.accounts().restorePolicy(*ledger_.accounts().policy(generation), 0).isOk());
  }
  const AccountEntry* entry = ledger_.accounts().find(key_);
  ASSERT_TRUE(restarted.accounts()
                  .restoreAccount(key_, entry->account.balances(), entry->account.refillClockMs(),
                                  entry->account.refillCarry(), {}, PeriodState{})
                  .isOk());
  ASSERT_TRUE(restarted.finishRestore(kT0 + 10).isOk());
  EXPECT_EQ(restarted.tick(kT0 + 20).periods_closed, 1u);  // stored before periods existed
  const std::vector<PeriodSnapshot> closed = snapshotsOf(restarted, kE0 - 1);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].epoch_first, 0u);
  EXPECT_EQ(closed[0].epoch_last, kE0 - 1);
  EXPECT_EQ(closed[0].opening, Balances{});
  EXPECT_TRUE(closed[0].conserved);
  EXPECT_EQ(restarted.tick(kT0 + 30).periods_closed, 0u);
}

TEST_F(PeriodCloseTest, RestoreRefusesAnOpeningThatIsNotAnEarlierImage) {
  Ledger restarted;
  ASSERT_TRUE(restarted.accounts().restorePolicy(*ledger_.accounts().policy(1), 0).isOk());
  const Balances balances{.opening = 1000, .available = 1000};
  PeriodState period{.epoch_first = kE0, .opened_at_ms = kT0};
  period.opening = Balances{.opening = 1000, .available = 950, .spent = 50};  // spent went down
  const Status status = restarted.accounts().restoreAccount(key_, balances, kT0, 0, {}, period);
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  // A snapshot of an account that does not exist is corruption too.
  EXPECT_EQ(restarted.restorePeriodSnapshot(PeriodSnapshot{.key = key_}).code(),
            StatusCode::kCorruption);
}

}  // namespace
}  // namespace tally
