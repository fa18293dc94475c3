// Ledger failover on the PostgreSQL store (docs/scale-out.md): a standby waits for the writer's
// lease and takes over when it lapses; a deposed primary (SIGSTOPped past its lease, then
// SIGCONT) commits nothing more and exits 75 saying so. Every wait is bounded and polls
// observable state (the ready pipe, the log, the exit status).

#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/cycle_load.h"
#include "tests/integration/ledger_harness.h"
#include "tests/integration/postgres_environment.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

using std::chrono::steady_clock;

constexpr int kExitDeposed = 75;

int64_t msSince(steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::now() - start).count();
}

class PostgresFailoverTest : public ::testing::Test {
 protected:
  PostgresFailoverTest() : conninfo_(conninfoFor(dir_.path())) {}

  ~PostgresFailoverTest() override {
    if (HasFailure()) {
      for (size_t i = 0; i < ledgers_.size(); ++i) {
        std::cout << "---- tally-ledger " << i << " log ----\n"
                  << ledgers_[i]->log() << "---- end of log ----" << std::endl;
      }
    }
  }

  // A tally-ledger on its own data dir and the shared database, with `lease_ms`.
  Process* spawn(uint64_t lease_ms, bool standby) {
    const std::string name = "ledger" + std::to_string(ledgers_.size());
    std::vector<std::string> args{"--data-dir",  dir_.file(name), "--listen",
                                  "127.0.0.1:0", "--metrics",     "",
                                  "--store",     "postgres",      "--postgres",
                                  conninfo_,     "--lease-ms",    std::to_string(lease_ms)};
    if (standby) args.emplace_back("--standby");
    ledgers_.push_back(std::make_unique<Process>(binaryPath("tally-ledger"), std::move(args),
                                                 dir_.file(name + ".log")));
    return ledgers_.back().get();
  }

  static client::Endpoint endpointOf(int port) {
    return client::Endpoint{.kind = client::Endpoint::Kind::kTcp,
                            .host = "127.0.0.1",
                            .port = static_cast<uint16_t>(port)};
  }

  // Polls `process`'s log for `text` until `timeout_ms`.
  static bool waitForLog(const Process& process, const std::string& text, uint64_t timeout_ms) {
    const steady_clock::time_point deadline =
        steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (steady_clock::now() < deadline) {
      if (process.log().find(text) != std::string::npos) return true;
      pauseMs(5);  // polling the log, not synchronising
    }
    return process.log().find(text) != std::string::npos;
  }

  std::unique_ptr<client::BlockingClient> connectTo(int port) {
    Result<std::unique_ptr<client::BlockingClient>> connected =
        client::BlockingClient::connect(endpointOf(port), kCallTimeoutMs);
    if (!connected.isOk()) {
      ADD_FAILURE() << "connect: " << connected.status().toString();
      return nullptr;
    }
    return std::move(connected).value();
  }

  TempDir dir_;
  std::string conninfo_;
  std::vector<std::unique_ptr<Process>> ledgers_;
};

// kill -9 of the primary under load: the standby takes over within a bounded time and serves
// every acknowledged operation; the audit conserves.
TEST_F(PostgresFailoverTest, KillNineOfThePrimaryUnderLoadTheStandbyTakesOverLosingNothing) {
  constexpr uint64_t kLeaseMs = 1'000;
  constexpr Units kBurst = 1'000'000'000;
  Process* primary = spawn(kLeaseMs, /*standby=*/false);
  const int primary_port = primary->waitReady(kReadyTimeoutMs);
  ASSERT_GT(primary_port, 0) << primary->log();
  Process* standby = spawn(kLeaseMs, /*standby=*/true);
  ASSERT_TRUE(waitForLog(*standby, "event=standby", kReadyTimeoutMs)) << standby->log();
  EXPECT_NE(standby->log().find("primary=127.0.0.1:0"), std::string::npos) << standby->log();
  {
    std::unique_ptr<client::BlockingClient> client = connectTo(primary_port);
    ASSERT_NE(client, nullptr);
    TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                         publishPolicy(*client, {makeBudget({.burst = kBurst})}));
    ASSERT_EQ(published.code, ReplyCode::kOk);
  }

  CycleLoad load(endpointOf(primary_port),
                 {.id_prefix = "failover", .clients = 4, .window = 8, .seed = 14});
  load.start();
  ASSERT_TRUE(load.waitForAcks(500, 30'000)) << "load stalled at " << load.acks();
  primary->kill9();
  const steady_clock::time_point killed_at = steady_clock::now();
  load.stop();
  load.join();
  EXPECT_TRUE(load.unexpected().empty());

  const int standby_port = standby->waitReady(kLeaseMs + kReadyTimeoutMs);
  ASSERT_GT(standby_port, 0) << standby->log();
  const int64_t takeover_ms = msSince(killed_at);
  std::cout << "[ failover ] the standby served " << takeover_ms
            << " ms after kill -9 of the primary (lease " << kLeaseMs << " ms)" << std::endl;
  // The primary's session ended with it: no need to wait for the lease to lapse.
  EXPECT_LT(takeover_ms, static_cast<int64_t>(kLeaseMs + 2'000));

  std::unique_ptr<client::BlockingClient> client = connectTo(standby_port);
  ASSERT_NE(client, nullptr);
  const std::vector<CycleRecord> records = load.records();
  const DurabilitySummary summary = verifyDurable(*client, records);
  std::cout << "[ failover ] " << records.size() << " cycles begun, " << summary.acked
            << " acknowledged, " << summary.found << " known to the new primary" << std::endl;
  EXPECT_GE(summary.found, summary.acked);
  TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(*client));
  EXPECT_TRUE(audit.conserved) << describe(audit);
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, summary.held) << describe(audit);
  EXPECT_EQ(sum.spent, summary.spent) << describe(audit);
  EXPECT_EQ(sum.available + sum.reserved + sum.spent, kBurst) << describe(audit);
  EXPECT_NE(standby->log().find("event=lease_taken epoch=2"), std::string::npos) << standby->log();
}

// The zombie: the primary is frozen past its lease, the standby takes over, and a request sent
// to the frozen primary is waiting in its socket when it wakes. It commits nothing more (the
// request is never acknowledged, and is not in the database), logs event=deposed and exits 75.
TEST_F(PostgresFailoverTest, APrimaryFrozenPastItsLeaseCommitsNothingAndExitsDeposed) {
  constexpr uint64_t kLeaseMs = 300;
  Process* primary = spawn(kLeaseMs, /*standby=*/false);
  const int primary_port = primary->waitReady(kReadyTimeoutMs);
  ASSERT_GT(primary_port, 0) << primary->log();
  Process* standby = spawn(kLeaseMs, /*standby=*/true);
  ASSERT_TRUE(waitForLog(*standby, "event=standby", kReadyTimeoutMs)) << standby->log();

  std::unique_ptr<client::BlockingClient> zombie_client = connectTo(primary_port);
  ASSERT_NE(zombie_client, nullptr);
  TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                       publishPolicy(*zombie_client, {makeBudget({.burst = 1000})}));
  ASSERT_EQ(published.code, ReplyCode::kOk);
  TALLY_ASSIGN_OR_FAIL(ReservationReply before,
                       callReservation(*zombie_client, makeReserve({.id = "r-before"})));
  ASSERT_EQ(before.code, ReplyCode::kOk) << describe(before);

  ASSERT_TRUE(primary->signal(SIGSTOP));
  const steady_clock::time_point stopped_at = steady_clock::now();
  const int standby_port = standby->waitReady(kLeaseMs + kReadyTimeoutMs);
  ASSERT_GT(standby_port, 0) << standby->log();
  std::cout << "[ failover ] the standby served " << msSince(stopped_at)
            << " ms after SIGSTOP of the primary (lease " << kLeaseMs << " ms)" << std::endl;
  // Sent while the primary is frozen: it waits in the socket for the primary to wake.
  TALLY_ASSIGN_OR_FAIL(
      uint64_t sent,
      zombie_client->send(makeReserve({.id = "r-zombie", .units = 5}), kCallTimeoutMs));
  (void)sent;
  ASSERT_TRUE(primary->signal(SIGCONT));

  Result<ReservationReply> zombie_reply = reservationOf(zombie_client->receive(kCallTimeoutMs));
  EXPECT_FALSE(zombie_reply.isOk() && zombie_reply.value().code == ReplyCode::kOk)
      << "the deposed primary acknowledged: " << describe(zombie_reply.value());
  EXPECT_EQ(primary->waitExit(kExitTimeoutMs), kExitDeposed) << primary->log();
  const std::string log = primary->log();
  const size_t deposed_at = log.find("event=deposed");
  ASSERT_NE(deposed_at, std::string::npos) << log;
  const size_t line_at = log.rfind('\n', deposed_at);
  std::cout << "[ failover ] " << log.substr(line_at + 1, log.find('\n', deposed_at) - line_at - 1)
            << std::endl;

  // The new primary has r-before and not r-zombie, and conserves.
  const std::string db = conninfo_.substr(conninfo_.rfind("dbname=") + 7);
  Result<std::string> rows =
      sharedPostgres().psql(db, "SELECT id FROM tally.reservations ORDER BY id");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "r-before\n");
  std::unique_ptr<client::BlockingClient> client = connectTo(standby_port);
  ASSERT_NE(client, nullptr);
  TALLY_ASSIGN_OR_FAIL(ReservationReply retried,
                       callReservation(*client, makeReserve({.id = "r-before"})));
  EXPECT_EQ(retried.code, ReplyCode::kOk) << describe(retried);
  EXPECT_TRUE(retried.duplicate) << describe(retried);
  TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(*client));
  EXPECT_TRUE(audit.conserved) << describe(audit);
}

}  // namespace
}  // namespace tally::testing
