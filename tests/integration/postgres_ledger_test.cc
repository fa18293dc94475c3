// tally-ledger with --store postgres, beyond the shared ledger suite (ledger_test.cc and
// ledger_shard_test.cc run in this binary against PostgreSQL too): what only the PostgreSQL
// store does.

#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/ledger_fixture.h"
#include "tests/integration/postgres_environment.h"
#include "tests/support/postgres_server.h"
#include "tests/support/process.h"

namespace tally::testing {
namespace {

using PostgresLedgerTest = LedgerServiceTest;

std::string readLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(PostgresLedgerTest, ASecondLedgerOnTheSameDatabaseExitsAtStartNamingTheWriterLock) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  LedgerInstance second(dir_.file("second"), dir_.file("second.log"));
  assignConninfo(dir_.file("second"), conninfoFor(ledger_.dataDir()));
  const Status started = second.start();
  ASSERT_FALSE(started.isOk());
  EXPECT_NE(second.log().find("another tally-ledger holds its writer lock"), std::string::npos)
      << second.log();
  // The first one serves on.
  TALLY_ASSIGN_OR_FAIL(wire::HealthReply reply, health(*client_));
  (void)reply;
}

TEST_F(PostgresLedgerTest, AReservationIsReadableWithPsqlOnceAcknowledged) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 100})}));
  TALLY_ASSIGN_OR_FAIL(ReservationReply reply,
                       callReservation(*client_, makeReserve({.id = "r-psql", .units = 30})));
  ASSERT_EQ(reply.code, ReplyCode::kOk) << describe(reply);
  const std::string conninfo = conninfoFor(ledger_.dataDir());
  const std::string db = conninfo.substr(conninfo.rfind("dbname=") + 7);
  Result<std::string> rows = sharedPostgres().psql(
      db, "SELECT subject, route, state FROM tally.reservations WHERE id = 'r-psql'");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(),
            std::string("tenant-1|chat|") + reservationStateName(reply.receipt.state) + "\n");
  rows = sharedPostgres().psql(
      db, "SELECT sum(available), sum(reserved) FROM tally.accounts WHERE subject = 'tenant-1'");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "70|30\n");
}

// The server goes away under the ledger: the next commit fails, durability unknown, and the
// ledger stops with 74 (EX_IOERR) without acknowledging the operation.
TEST_F(PostgresLedgerTest, LosingPostgresStopsTheLedgerWithExit74) {
  Result<std::unique_ptr<PostgresServer>> own = PostgresServer::start({.fsync = false});
  ASSERT_TRUE(own.isOk()) << own.status().toString();
  ASSERT_TRUE(own.value()->createDatabase("lost").isOk());
  assignConninfo(ledger_.dataDir(), own.value()->conninfo("lost"));
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 100})}));
  ASSERT_TRUE(own.value()->stop().isOk());
  Result<ReservationReply> reply =
      callReservation(*client_, makeReserve({.id = "r-unacknowledged", .units = 1}));
  EXPECT_FALSE(reply.isOk() && reply.value().code == ReplyCode::kOk)
      << "acknowledged without a store: " << describe(reply.value());
  EXPECT_EQ(ledger_.waitExit(), 74) << ledger_.log();
}

// A data dir whose record is in PostgreSQL is never started on an empty SQLite store, nor
// checked, repaired or backed up as one (which would create one beside it).
TEST_F(PostgresLedgerTest, ADataDirOfThePostgresStoreIsRefusedBySqliteAndItsCommands) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_EQ(ledger_.terminate(), 0);
  // Exit 1 (startup failure) for the daemon, 2 (usage) for the commands.
  const std::vector<std::pair<std::vector<std::string>, int>> runs = {
      {{"--data-dir", ledger_.dataDir(), "--listen", "127.0.0.1:0", "--metrics", ""}, 1},
      {{"--data-dir", ledger_.dataDir(), "check"}, 2},
      {{"--data-dir", ledger_.dataDir(), "backup", dir_.file("copy")}, 2}};
  for (const auto& [args, exit_code] : runs) {
    Process sqlite(binaryPath("tally-ledger"), args, dir_.file("sqlite.log"), /*ready_fd=*/false);
    EXPECT_EQ(sqlite.waitExit(kExitTimeoutMs), exit_code) << args.back();
  }
  EXPECT_NE(readLog(dir_.file("sqlite.log")).find("postgres-store exists"), std::string::npos)
      << readLog(dir_.file("sqlite.log"));
  EXPECT_FALSE(std::filesystem::exists(ledger_.dataDir() + "/ledger.db"));
  // And the PostgreSQL store still starts on it.
  ASSERT_NO_FATAL_FAILURE(startLedger());
}

}  // namespace
}  // namespace tally::testing
