// tally-agent on a data dir written by an older build: agent.db schema_version 1, whose boot epoch
// was a row of the outbox's meta table. The real binary must keep counting from it.

#include <sqlite3.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/agent_harness.h"

namespace tally::testing {
namespace {

// agent.db exactly as a schema_version 1 agent left it after `boot_epoch` starts.
void writeVersion1AgentDb(const std::string& dir, int64_t boot_epoch) {
  ASSERT_EQ(::mkdir(dir.c_str(), 0750), 0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/agent.db").c_str(), &db), SQLITE_OK);
  const std::string sql =
      "PRAGMA journal_mode=WAL;"
      "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT;"
      "CREATE TABLE outbox (seq INTEGER PRIMARY KEY NOT NULL, kind INTEGER NOT NULL,"
      " reservation_id TEXT NOT NULL, operation_id TEXT NOT NULL, actual_units INTEGER NOT NULL,"
      " enqueued_at_ms INTEGER NOT NULL, attempts INTEGER NOT NULL,"
      " next_attempt_ms INTEGER NOT NULL) STRICT;"
      "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT;"
      "INSERT INTO meta(key, value) VALUES('schema_version', 1), ('boot_epoch', " +
      std::to_string(boot_epoch) + ");";
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error != nullptr ? error : "");
  sqlite3_free(error);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
}

double bootEpoch(AgentInstance& agent) {
  Result<std::string> body = httpGet(agent.metricsPort(), "/metrics", 5'000);
  EXPECT_TRUE(body.isOk()) << body.status().toString();
  return body.isOk() ? metricSum(body.value(), "tally_agent_boot_epoch") : -1;
}

TEST_F(AgentFleetTest, ADataDirOfTheOlderLayoutBootsWithItsEpochPlusOneNeverLower) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(writeVersion1AgentDb(dir_.file("agent0"), 41));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  EXPECT_EQ(bootEpoch(*agents_[0]), 42.0) << agents_[0]->log();
  EXPECT_EQ(agents_[0]->terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  EXPECT_EQ(bootEpoch(*agents_[0]), 43.0) << agents_[0]->log();
}

}  // namespace
}  // namespace tally::testing
