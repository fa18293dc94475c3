// `tally-ledger --data-dir D backup DEST` against real ledger processes: taken while the ledger
// serves (it keeps answering meanwhile), restored by using a copy of DEST as a new data dir, the
// restored ledger's audit equals the audit at backup time. Under a stream of commits with the
// fold thread folding and trimming after every row, every backup is a committed prefix of the
// stream (the ordering argument of ledger/backup.h).

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "central-client/blocking_client.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr uint64_t kBackupTimeoutMs = 60'000;

// `tally-ledger --data-dir DATA backup DEST`; its exit code (-1: it did not finish in time).
int runBackup(const TempDir& dir, const std::string& data_dir, const std::string& dest) {
  Process backup(binaryPath("tally-ledger"), {"--data-dir", data_dir, "backup", dest},
                 dir.file("backup.log"), /*ready_fd=*/false);
  return backup.waitExit(kBackupTimeoutMs);
}

std::string readLog(const TempDir& dir) {
  std::ifstream in(dir.file("backup.log"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A restore as docs/operations.md gives it: a copy of the backup becomes the new data dir.
void restoreInto(const std::string& backup, const std::string& data_dir) {
  std::filesystem::copy(backup, data_dir, std::filesystem::copy_options::recursive);
}

void reserveAll(client::BlockingClient& client, const std::string& prefix, int count) {
  for (int i = 0; i < count; ++i) {
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply reply,
        callReservation(client, makeReserve({.id = prefix + std::to_string(i),
                                             .units = static_cast<Units>(i + 1)})));
    ASSERT_EQ(reply.code, ReplyCode::kOk) << describe(reply);
  }
}

TEST(LedgerBackup, OnlineBackupRestoresTheAuditAtBackupTime) {
  TempDir dir;
  LedgerInstance ledger(dir.file("data"), dir.file("ledger.log"));
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  TALLY_ASSIGN_OR_FAIL(auto client, ledger.connect());
  TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                       publishPolicy(*client, {makeBudget({.burst = 100'000})}));
  ASSERT_EQ(published.code, ReplyCode::kOk);
  ASSERT_NO_FATAL_FAILURE(reserveAll(*client, "before-", 40));
  TALLY_ASSIGN_OR_FAIL(AuditReport at_backup, auditLedger(*client));
  ASSERT_TRUE(at_backup.conserved) << describe(at_backup);

  // The ledger answers throughout the backup: a second client keeps asking for its health.
  std::atomic<bool> backing_up{true};
  std::atomic<int> answered{0}, failed{0};
  TALLY_ASSIGN_OR_FAIL(auto prober, ledger.connect());
  std::thread probe([&] {
    while (backing_up.load()) {
      (health(*prober).isOk() ? answered : failed).fetch_add(1);
    }
  });
  const int code = runBackup(dir, ledger.dataDir(), dir.file("backup"));
  backing_up.store(false);
  probe.join();
  ASSERT_EQ(code, 0) << readLog(dir);
  EXPECT_GT(answered.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_NE(readLog(dir).find("40 reservations"), std::string::npos) << readLog(dir);
  EXPECT_TRUE(std::filesystem::exists(dir.file("backup/ledger.key")));

  // Later work is not in the backup.
  ASSERT_NO_FATAL_FAILURE(reserveAll(*client, "after-", 10));
  TALLY_ASSIGN_OR_FAIL(AuditReport later, auditLedger(*client));
  ASSERT_NE(later.accounts, at_backup.accounts);
  client.reset();
  prober.reset();
  ASSERT_EQ(ledger.terminate(), 0) << ledger.log();

  restoreInto(dir.file("backup"), dir.file("restored"));
  LedgerInstance restored(dir.file("restored"), dir.file("restored.log"));
  ASSERT_TRUE(restored.start().isOk()) << restored.log();
  TALLY_ASSIGN_OR_FAIL(auto restored_client, restored.connect());
  TALLY_ASSIGN_OR_FAIL(AuditReport after_restore, auditLedger(*restored_client));
  EXPECT_TRUE(after_restore.conserved) << describe(after_restore);
  EXPECT_EQ(after_restore.accounts, at_backup.accounts) << "at backup:\n"
                                                        << describe(at_backup) << "after restore:\n"
                                                        << describe(after_restore);
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply gone,
      callReservation(*restored_client, QueryRequest{.reservation_id = "after-0"}));
  EXPECT_EQ(gone.code, ReplyCode::kNotFound);
  EXPECT_EQ(restored.terminate(), 0) << restored.log();
}

TEST(LedgerBackup, RefusesANonEmptyDestinationAndLeavesNothingOnFailure) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("full"));
  std::ofstream(dir.file("full/keep")) << "operator's file";
  EXPECT_EQ(runBackup(dir, dir.file("no-such-ledger"), dir.file("full")), 1);
  EXPECT_TRUE(std::filesystem::exists(dir.file("full/keep")));  // untouched
  EXPECT_EQ(runBackup(dir, dir.file("no-such-ledger"), dir.file("new")), 1) << readLog(dir);
  EXPECT_FALSE(std::filesystem::exists(dir.file("new")));  // nothing that passes for a backup
}

TEST(LedgerBackup, BackupsDuringCommitsAndFoldsAreCommittedPrefixes) {
  TempDir dir;
  // Fold (and trim) after every log row: the fold/trim interleaving the copy order guards.
  std::ofstream(dir.file("ledger.toml")) << "checkpoint_log_rows = 1\n";
  Process ledger(binaryPath("tally-ledger"),
                 {"--data-dir", dir.file("data"), "--listen", "127.0.0.1:0", "--metrics", "",
                  "--config", dir.file("ledger.toml")},
                 dir.file("ledger.log"));
  const int port = ledger.waitReady(kReadyTimeoutMs);
  ASSERT_GT(port, 0) << ledger.log();
  const client::Endpoint endpoint{.kind = client::Endpoint::Kind::kTcp,
                                  .host = "127.0.0.1",
                                  .port = static_cast<uint16_t>(port)};
  TALLY_ASSIGN_OR_FAIL(auto client, client::BlockingClient::connect(endpoint, kCallTimeoutMs));
  TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                       publishPolicy(*client, {makeBudget({.burst = 1'000'000})}));
  ASSERT_EQ(published.code, ReplyCode::kOk);

  // One writer, one reserve of 1 unit at a time: reservation "w-K" exists iff K < reserved.
  std::atomic<bool> writing{true};
  std::atomic<int> written{0}, write_failures{0};
  std::thread writer([&] {
    for (int i = 0; writing.load() && i < 1'000'000; ++i) {
      Result<ReservationReply> reply =
          callReservation(*client, makeReserve({.id = "w-" + std::to_string(i), .units = 1}));
      if (!reply.isOk() || reply.value().code != ReplyCode::kOk) {
        write_failures.fetch_add(1);
        return;
      }
      written.fetch_add(1);
    }
  });
  // Pacing only: the backups start once the stream is under way (an account exists).
  for (int polls = 0; written.load() < 50 && write_failures.load() == 0 && polls < 10'000;
       ++polls) {
    pauseMs(1);
  }
  ASSERT_GE(written.load(), 50) << ledger.log();
  constexpr int kBackups = 3;
  std::vector<int> written_before(kBackups), written_after(kBackups), codes(kBackups);
  for (int b = 0; b < kBackups; ++b) {
    written_before[b] = written.load();
    codes[b] = runBackup(dir, dir.file("data"), dir.file("b" + std::to_string(b)));
    written_after[b] = written.load();
  }
  writing.store(false);
  writer.join();
  EXPECT_EQ(write_failures.load(), 0) << ledger.log();
  ASSERT_TRUE(ledger.signal(SIGTERM));
  EXPECT_EQ(ledger.waitExit(kExitTimeoutMs), 0) << ledger.log();

  for (int b = 0; b < kBackups; ++b) {
    SCOPED_TRACE("backup " + std::to_string(b));
    ASSERT_EQ(codes[b], 0) << readLog(dir);
    const std::string data = dir.file("r" + std::to_string(b));
    restoreInto(dir.file("b" + std::to_string(b)), data);
    LedgerInstance restored(data, dir.file("r" + std::to_string(b) + ".log"));
    ASSERT_TRUE(restored.start().isOk()) << restored.log();
    TALLY_ASSIGN_OR_FAIL(auto restored_client, restored.connect());
    TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(*restored_client));
    ASSERT_TRUE(audit.conserved) << describe(audit);
    ASSERT_EQ(audit.accounts.size(), 1u) << describe(audit);
    const int64_t reserved = static_cast<int64_t>(audit.accounts[0].balances.reserved);
    // Acknowledged before the backup started: in it. Sent after it ended: not.
    EXPECT_GE(reserved, written_before[b]);
    EXPECT_LE(reserved, written_after[b] + 1);
    // A prefix: the last reservation in it is there, the next one is not.
    if (reserved > 0) {
      TALLY_ASSIGN_OR_FAIL(
          ReservationReply last,
          callReservation(*restored_client,
                          QueryRequest{.reservation_id = "w-" + std::to_string(reserved - 1)}));
      EXPECT_EQ(last.code, ReplyCode::kOk);
    }
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply next,
        callReservation(*restored_client,
                        QueryRequest{.reservation_id = "w-" + std::to_string(reserved)}));
    EXPECT_EQ(next.code, ReplyCode::kNotFound);
    EXPECT_EQ(restored.terminate(), 0) << restored.log();
  }
}

}  // namespace
}  // namespace tally::testing
