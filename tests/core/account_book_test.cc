#include "core/account_book.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/ledger.h"

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;

// 100 units/s into a bucket of 1000.
Budget budget100PerSecond() {
  return Budget{
      .subject_pattern = "tenant-7",
      .route = "/v1/chat",
      .unit = "tokens",
      .refill_per_second = 100,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 500,
  };
}

Policy policy100PerSecond() { return Policy{.budgets = {budget100PerSecond()}}; }

AccountEntry* admitted(AccountBook* book, uint64_t now_ms) {
  bool table_full = false;
  const Admission admission = book->admit("tenant-7", "/v1/chat", 0, now_ms, &table_full);
  EXPECT_FALSE(table_full);
  return admission.entry;
}

// Leaves 1 unit available at kT0: 999 reserved and settled at exactly 999.
AccountEntry* drainedToOneUnit(AccountBook* book) {
  AccountEntry* entry = admitted(book, kT0);
  EXPECT_NE(entry, nullptr);
  EXPECT_EQ(entry->account.reserve(999, 1000), AccountCode::kOk);
  EXPECT_EQ(entry->account.settle(999, 999, 500).code, AccountCode::kOk);
  EXPECT_EQ(entry->account.balances().available, 1u);
  return entry;
}

// Defect: after 3.2 s idle at 100 units/s, the handover to the new generation carried 1 unit
// instead of 321 (1 + 320 earned): the outgoing generation stopped refilling at the publish
// without minting what it had earned.
TEST(AccountBookPublishTest, HandoverCarriesTheRefillEarnedUpToThePublish) {
  AccountBook book;
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  AccountEntry* first = drainedToOneUnit(&book);
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0 + 3'200).generation, 2u);
  AccountEntry* second = admitted(&book, kT0 + 3'200);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->key.generation, 2u);
  EXPECT_EQ(second->account.balances().available, 321u);
  EXPECT_EQ(second->account.balances().minted, 321u);  // all of it by transfer
  EXPECT_EQ(first->account.balances().minted, 320u);
  EXPECT_EQ(first->account.balances().transferred_out, 321u);
  EXPECT_EQ(first->account.balances().available, 0u);
  EXPECT_TRUE(isConserved(first->account.balances()));
  EXPECT_TRUE(isConserved(second->account.balances()));
}

TEST(AccountBookPublishTest, RollbackAlsoRefillsTheOutgoingGenerationFirst) {
  AccountBook book;
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  AccountEntry* second = drainedToOneUnit(&book);
  ASSERT_EQ(second->key.generation, 2u);
  ASSERT_EQ(book.rollback(kT0 + 3'200).generation, 3u);
  AccountEntry* third = admitted(&book, kT0 + 3'200);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->key.generation, 3u);
  EXPECT_EQ(third->account.balances().available, 321u);
}

// Defect: the audit showed balances as of each account's last touch, so debt that refill had
// already repaid was still reported.
TEST(AccountBookViewTest, BalancesAreAsOfNowWithoutChangingTheBook) {
  AccountBook book;
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  AccountEntry* entry = admitted(&book, kT0);
  ASSERT_EQ(entry->account.reserve(1000, 1000), AccountCode::kOk);
  ASSERT_EQ(entry->account.settle(1000, 1200, 500).debt_issued, 200u);
  const Balances at_settle = entry->account.balances();

  // 3 s at 100/s = 300 minted: 200 repay the debt, 100 become available.
  const std::vector<AccountView> views = book.view(kT0 + 3'000);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].debt, 0u);
  EXPECT_EQ(views[0].balances.minted, 300u);
  EXPECT_EQ(views[0].balances.overdraft_repaid, 200u);
  EXPECT_EQ(views[0].balances.available, 100u);
  EXPECT_TRUE(views[0].conserved);
  // 1 s: 100 of the 200 repaid, debt 100 still owed.
  EXPECT_EQ(book.view(kT0 + 1'000)[0].debt, 100u);
  // Projected only: the account itself is as it was at the settle.
  EXPECT_EQ(entry->account.balances(), at_settle);
  EXPECT_EQ(entry->account.debt(), 200u);
}

TEST(AccountBookViewTest, DrainingDebtRepaidByTheActiveGenerationIsProjectedToo) {
  AccountBook book;
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  AccountEntry* first = admitted(&book, kT0);
  ASSERT_EQ(first->account.reserve(1000, 1000), AccountCode::kOk);
  ASSERT_EQ(first->account.settle(1000, 1200, 500).debt_issued, 200u);
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).generation, 2u);
  (void)admitted(&book, kT0);  // opens generation 2 empty; it refills from now on
  const std::vector<AccountView> views = book.view(kT0 + 5'000);
  ASSERT_EQ(views.size(), 2u);
  // Generation 2 earned 500 in 5 s and paid the 200 that generation 1 owed.
  EXPECT_EQ(views[0].key.generation, 1u);
  EXPECT_EQ(views[0].debt, 0u);
  EXPECT_EQ(views[1].key.generation, 2u);
  EXPECT_EQ(views[1].balances.available, 300u);
  EXPECT_EQ(views[1].balances.transferred_out, 200u);
  EXPECT_EQ(first->account.debt(), 200u);  // the book itself is unchanged
}

TEST(AccountBookViewTest, OverdraftBreachesArePerAccount) {
  AccountBook book;
  ASSERT_EQ(book.publish(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  AccountEntry* entry = admitted(&book, kT0);
  ASSERT_EQ(entry->account.reserve(600, 1000), AccountCode::kOk);
  ASSERT_EQ(entry->account.reserve(400, 1000), AccountCode::kOk);
  // Debt 700 > 500: breach by 200. Then debt 700 + 400 = 1100: breach by 600.
  ASSERT_TRUE(entry->account.settle(600, 1300, 500).overdraft_breach);
  ASSERT_TRUE(entry->account.settle(400, 800, 500).overdraft_breach);
  const std::vector<AccountView> views = book.view(kT0);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].overdraft_breaches.count, 2u);
  EXPECT_EQ(views[0].overdraft_breaches.units, 800u);
}

TEST(LedgerAuditTest, SaysWhichTimeItsBalancesAreAsOf) {
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(policy100PerSecond(), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledger.audit(kT0 + 3'200).as_of_ms, kT0 + 3'200);
  // Never earlier than the ledger's own clock.
  EXPECT_EQ(ledger.audit(kT0 - 1).as_of_ms, kT0);
}

}  // namespace
}  // namespace tally
