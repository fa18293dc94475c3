// The checks that no injected core bug reaches yet, shown to fail on a ledger whose durable
// rows were tampered with (and to pass on the same rows untampered).

#include <gtest/gtest.h>

#include "ledger/restore.h"
#include "tests/sim/checks.h"
#include "wire/digest.h"

namespace tally::sim {
namespace {

constexpr uint64_t kNowMs = 1'700'000'000'000;

// One settled reservation (10 reserved, 4 actual) and one settled above it (5 reserved, 9
// actual: 4 units of debt), through the real Ledger; returns its rows as a store would hold them.
ledger::StoreContents settledRows() {
  Ledger ledger;
  Budget budget{.subject_pattern = "t", .route = "r", .unit = "tokens"};
  budget.burst = 10;
  budget.max_single_reservation = 10;
  budget.hold_ttl_ms = 1'000;
  budget.hard_execution_limit_ms = 1'000;
  budget.max_overdraft = 10;
  EXPECT_EQ(ReplyCode::kOk, ledger.publishPolicy(Policy{.budgets = {budget}}, kNowMs).code);
  auto run = [&](const std::string& id, Units units, Units actual) {
    ReserveRequest reserve{.reservation_id = id, .subject = "t", .route = "r", .units = units};
    reserve.request_digest = wire::canonicalRequestDigest(reserve);
    EXPECT_EQ(ReplyCode::kOk, ledger.reserve(reserve, kNowMs).code);
    EXPECT_EQ(ReplyCode::kOk, ledger.start({id, "op-" + id}, kNowMs).code);
    EXPECT_EQ(ReplyCode::kOk, ledger.settle({id, "op-" + id, actual}, kNowMs).code);
  };
  run("a", 10, 4);
  run("b", 5, 9);
  ledger::StoreContents rows;
  for (Generation g : ledger.accounts().generations()) {
    rows.policies.push_back({.policy = *ledger.accounts().policy(g)});
  }
  for (const AccountView& view : ledger.audit(kNowMs).accounts) {
    const AccountEntry* entry = ledger.accounts().find(view.key);
    rows.accounts.push_back({.key = view.key,
                             .balances = entry->account.balances(),
                             .refill_clock_ms = entry->account.refillClockMs(),
                             .refill_carry = entry->account.refillCarry()});
  }
  ledger.forEachReservation([&](const Reservation& r) { rows.reservations.push_back(r); });
  rows.ledger_clock_ms = kNowMs;
  return rows;
}

std::array<bool, kCheckCount> checkRows(ledger::StoreContents rows) {
  Ledger ledger;
  const Result<ledger::RestoreSummary> restored =
      ledger::restoreLedger(std::move(rows), &ledger, kNowMs);
  EXPECT_TRUE(restored.isOk()) << restored.status().toString();
  Trace trace(false, kNowMs);
  Checker checker(&trace);
  checker.afterStep(ledger, kNowMs);
  return checker.failedChecks();
}

TEST(SimChecks, UntamperedRowsPass) {
  const std::array<bool, kCheckCount> failed = checkRows(settledRows());
  for (size_t i = 0; i < kCheckCount; ++i) EXPECT_FALSE(failed[i]) << checkName(Check(i));
}

TEST(SimChecks, SpentThatNoReceiptAccountsForIsUnrecorded) {
  ledger::StoreContents rows = settledRows();
  ASSERT_EQ(1u, rows.accounts.size());
  // Still conserved (the audit passes): 2 units minted and spent that no receipt consumed.
  rows.accounts[0].balances.minted += 2;
  rows.accounts[0].balances.spent += 2;
  const std::array<bool, kCheckCount> failed = checkRows(rows);
  EXPECT_TRUE(failed[static_cast<size_t>(Check::kUnrecordedDebt)]);
  EXPECT_FALSE(failed[static_cast<size_t>(Check::kConservation)]);
}

TEST(SimChecks, DebtThatNoReceiptRecordsIsUnrecorded) {
  ledger::StoreContents rows = settledRows();
  // The settle above its reservation lost its record of the debt it issued.
  for (Reservation& r : rows.reservations) {
    if (r.reservation_id == "b") {
      ASSERT_GT(r.debt_units, 0u);
      r.debt_units = 0;
    }
  }
  EXPECT_TRUE(checkRows(rows)[static_cast<size_t>(Check::kUnrecordedDebt)]);
}

TEST(SimChecks, AnAdmissionInDebtIsOverspend) {
  Trace trace(false, kNowMs);
  Checker checker(&trace);
  CommittedReply reply{.request = ReserveRequest{.reservation_id = "x"}};
  reply.response.body = ReservationReply{.code = ReplyCode::kOk};
  checker.onCommitted(reply, kNowMs);
  EXPECT_FALSE(checker.failed());
  reply.admitted_in_debt = true;
  checker.onCommitted(reply, kNowMs);
  EXPECT_TRUE(checker.failedChecks()[static_cast<size_t>(Check::kOverspend)]);
}

}  // namespace
}  // namespace tally::sim
