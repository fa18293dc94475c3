// tally-ledger on a data dir written by the previous release (store schema version 3, commit
// 7b55feb; tests/integration/fixtures/ledger-schema-v3/README.md says what it holds). Today's
// binary migrates it and keeps every reservation and balance; the time-driven transitions that
// came due while it was stopped (an expired hold, a hard-limit close) happen after the upgrade.

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/integration/ledger_fixture.h"

namespace tally::testing {
namespace {

constexpr uint64_t kPollRounds = 500;
constexpr uint64_t kPollMs = 20;

const AccountKey kAccount{.subject = "tenant-old", .route = "chat", .generation = 1};

class LedgerUpgradeTest : public LedgerServiceTest {
 protected:
  void copyFixture() {
    // The fixture's receipts closed when it was recorded: keep them for the longest window the
    // config allows (the default, 15 min, would compact them at the first tick).
    std::ofstream(ledger_.dataDir() + ".toml") << "retention_ms = 31536000000\n";
    const std::filesystem::path from =
        std::filesystem::path(TALLY_SOURCE_DIR) / "tests/integration/fixtures/ledger-schema-v3";
    const std::filesystem::path to = ledger_.dataDir();
    std::filesystem::create_directories(to);
    for (const char* name : {"ledger.db", "tables.db", "ledger.key"}) {
      std::filesystem::copy_file(from / name, to / name);
    }
    // A checkout does not keep the key's mode; the ledger insists on 0600.
    ASSERT_EQ(::chmod((to / "ledger.key").c_str(), 0600), 0);
  }

  ReservationReply query(const std::string& id) {
    Result<ReservationReply> reply = callReservation(*client_, QueryRequest{.reservation_id = id});
    EXPECT_TRUE(reply.isOk()) << reply.status().toString();
    return reply.isOk() ? reply.value() : ReservationReply{};
  }

  // Polls until `id` is in `state` (the ledger ticks every 100 ms).
  void waitForState(const std::string& id, ReservationState state) {
    for (uint64_t round = 0; round < kPollRounds; ++round) {
      if (query(id).receipt.state == state) return;
      pauseMs(kPollMs);  // pacing between polls
    }
    ADD_FAILURE() << id << " never became " << reservationStateName(state) << ": "
                  << describe(query(id));
  }
};

TEST_F(LedgerUpgradeTest, ADataDirOfTheSchemaVersion3ReleaseMigratesAndKeepsEverything) {
  ASSERT_NO_FATAL_FAILURE(copyFixture());
  ASSERT_NO_FATAL_FAILURE(startLedger());
  // The old release's log (a table of ledger.db) now lives in the log directory.
  EXPECT_FALSE(std::filesystem::exists(ledger_.dataDir() + "/ledger.db"));
  EXPECT_TRUE(std::filesystem::is_directory(ledger_.dataDir() + "/log"));

  // What the old release settled or released is there, as it was.
  ReservationReply a = query("a");
  EXPECT_EQ(a.receipt.state, ReservationState::kSettled) << describe(a);
  EXPECT_EQ(a.receipt.reserved_units, 100u);
  EXPECT_EQ(a.receipt.actual_units, 40u);
  EXPECT_EQ(a.receipt.refunded_units, 60u);
  EXPECT_EQ(query("b").receipt.state, ReservationState::kReleased);
  ReservationReply f = query("f");
  EXPECT_EQ(f.receipt.state, ReservationState::kSettledWithDebt) << describe(f);
  EXPECT_EQ(f.receipt.actual_units, 90u);
  EXPECT_EQ(query("c").receipt.state, ReservationState::kStarted);

  // The hold of d lapsed and e's hard limit passed while no ledger ran: both happen now.
  waitForState("d", ReservationState::kExpired);
  waitForState("e", ReservationState::kSettled);

  // A retried settle of a is a duplicate with the original receipt, not a second debit.
  TALLY_ASSIGN_OR_FAIL(ReservationReply again,
                       callReservation(*client_, SettleRequest{.reservation_id = "a",
                                                               .operation_id = "op-a",
                                                               .actual_units = 40}));
  EXPECT_EQ(again.code, ReplyCode::kOk) << describe(again);
  EXPECT_TRUE(again.duplicate) << describe(again);
  EXPECT_EQ(again.receipt, a.receipt);

  // 1000 opened; spent a 40 + f 90 + e 80 (closed as consumed); only c's 70 still held.
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
  const AccountView* account = findAccount(report, kAccount);
  ASSERT_NE(account, nullptr) << describe(report);
  EXPECT_EQ(account->balances.opening, 1000u);
  EXPECT_EQ(account->balances.spent, 210u);
  EXPECT_EQ(account->balances.reserved, 70u);
  EXPECT_EQ(account->balances.available, 720u);
  EXPECT_EQ(account->debt, 0u);

  // The store was migrated in place: a restart opens it as today's version, unchanged.
  ASSERT_EQ(ledger_.terminate(), 0) << ledger_.log();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  AuditReport after;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&after));
  const AccountView* restarted = findAccount(after, kAccount);
  ASSERT_NE(restarted, nullptr) << describe(after);
  EXPECT_EQ(restarted->balances, account->balances);
  EXPECT_EQ(query("c").receipt.state, ReservationState::kStarted);
}

}  // namespace
}  // namespace tally::testing
