// PostgreSQL failover under the ledger (docs/scale-out.md "PostgreSQL failover"): a primary with a
// synchronous streaming-replication standby; the primary's host dies (kill -9 of its postmaster)
// under load, the standby is promoted (pg_ctl promote, what Patroni does), and the ledger,
// restarted as systemd would restart it, finds the new primary through its multi-host
// connection string and has every operation it acknowledged. Its own servers, not the shared one
// of this binary: they are killed.

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/cycle_load.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/postgres_server.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr int kExitStoreFailed = 74;
constexpr const char* kStandbyName = "standby1";
constexpr uint64_t kReplicationTimeoutMs = 30'000;

client::Endpoint loopback(int port) {
  return client::Endpoint{.kind = client::Endpoint::Kind::kTcp,
                          .host = "127.0.0.1",
                          .port = static_cast<uint16_t>(port)};
}

// Polls the primary until `standby` streams to it as its synchronous standby.
bool waitForSynchronousStandby(PostgresServer& primary, const std::string& standby) {
  const uint64_t deadline = monotonicNowMs() + kReplicationTimeoutMs;
  while (monotonicNowMs() < deadline) {
    Result<std::string> state = primary.psql(
        "postgres", "SELECT sync_state FROM pg_stat_replication WHERE application_name = '" +
                        standby + "' AND state = 'streaming'");
    if (state.isOk() && state.value() == "sync\n") return true;
    pauseMs(20);  // polling the server's view, not synchronising
  }
  return false;
}

TEST(PostgresPromoteTest, PrimaryKilledAndStandbyPromotedUnderLoadLosesNoAcknowledgedOperation) {
  Result<std::unique_ptr<PostgresServer>> started_primary = PostgresServer::start(
      PostgresServerOptions{.fsync = true, .synchronous_standby_names = kStandbyName});
  ASSERT_TRUE(started_primary.isOk()) << started_primary.status().toString();
  std::unique_ptr<PostgresServer> primary = std::move(started_primary).value();
  ASSERT_TRUE(primary->createDatabase("tally").isOk());
  Result<std::unique_ptr<PostgresServer>> started_standby =
      PostgresServer::startStandby(*primary, kStandbyName);
  ASSERT_TRUE(started_standby.isOk()) << started_standby.status().toString();
  std::unique_ptr<PostgresServer> standby = std::move(started_standby).value();
  ASSERT_TRUE(waitForSynchronousStandby(*primary, kStandbyName)) << primary->log();

  // Both servers, the writable one first found: what an operator writes for a Patroni pair.
  const std::string conninfo = "host=" + primary->socketDir() + "," + standby->socketDir() +
                               " port=5432,5432 user=postgres dbname=tally"
                               " target_session_attrs=read-write";
  TempDir dir;
  const std::vector<std::string> args{
      "--data-dir", dir.file("ledger"), "--listen", "127.0.0.1:0", "--metrics",
      "",           "--store",          "postgres", "--postgres",  conninfo};
  constexpr Units kBurst = 1'000'000'000;
  std::vector<CycleRecord> records;
  {
    Process ledger(binaryPath("tally-ledger"), args, dir.file("ledger-1.log"));
    const int port = ledger.waitReady(kReadyTimeoutMs);
    ASSERT_GT(port, 0) << ledger.log();
    {
      TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> client,
                           client::BlockingClient::connect(loopback(port), kCallTimeoutMs));
      TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                           publishPolicy(*client, {makeBudget({.burst = kBurst})}));
      ASSERT_EQ(published.code, ReplyCode::kOk);
    }
    CycleLoad load(loopback(port), {.id_prefix = "promote", .clients = 4, .window = 8, .seed = 15});
    load.start();
    ASSERT_TRUE(load.waitForAcks(500, 30'000)) << "load stalled at " << load.acks();
    primary->kill9();
    // The commit in flight (or the next) fails: the ledger sends none of its replies and exits.
    EXPECT_EQ(ledger.waitExit(kExitTimeoutMs), kExitStoreFailed) << ledger.log();
    load.stop();
    load.join();
    EXPECT_TRUE(load.unexpected().empty());
    records = load.records();
  }

  ASSERT_TRUE(standby->promote().isOk()) << standby->log();
  Process ledger(binaryPath("tally-ledger"), args, dir.file("ledger-2.log"));
  const int port = ledger.waitReady(kReadyTimeoutMs);
  ASSERT_GT(port, 0) << ledger.log();
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> client,
                       client::BlockingClient::connect(loopback(port), kCallTimeoutMs));
  const DurabilitySummary summary = verifyDurable(*client, records);
  std::cout << "[ promote ] " << records.size() << " cycles begun, " << summary.acked
            << " acknowledged, " << summary.found << " known after the promotion" << std::endl;
  EXPECT_GT(summary.acked, 0u);
  EXPECT_GE(summary.found, summary.acked);
  expectAuditMatches(*client, summary, kBurst);
}

}  // namespace
}  // namespace tally::testing
