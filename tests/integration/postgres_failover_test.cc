// Ledger failover on the PostgreSQL store (docs/scale-out.md): a standby waits for the writer's
// lease, answering NOT_PRIMARY (naming the primary) meanwhile, and takes over when it lapses;
// agents and tallyctl given several addresses find the primary; a deposed primary (SIGSTOPped
// past its lease, then SIGCONT) commits nothing more and exits 75 saying so. Every wait is
// bounded and polls observable state (the ready pipe, the log, the exit status, answers).

#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/ledger_protocol.h"
#include "tests/integration/cycle_load.h"
#include "tests/integration/ledger_harness.h"
#include "tests/integration/postgres_environment.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

using std::chrono::steady_clock;

constexpr int kExitDeposed = 75;
constexpr int kCtlExitUnavailable = 6;  // tallyctl: no address is the primary

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
      for (size_t i = 0; i < agents_.size(); ++i) {
        std::cout << "---- tally-agent " << i << " log ----\n"
                  << agents_[i]->log() << "---- end of log ----" << std::endl;
      }
    }
  }

  // A tally-ledger on its own data dir and the shared database, with `lease_ms`.
  // With Link::kTls, `signing_key_file` (when given) is the key it presents and signs with: a
  // standby shares the primary's.
  Process* spawn(uint64_t lease_ms, bool standby, Link link = Link::kPlaintext,
                 const std::string& signing_key_file = "") {
    const std::string name = "ledger" + std::to_string(ledgers_.size());
    std::vector<std::string> args{"--data-dir",  dir_.file(name), "--listen",
                                  "127.0.0.1:0", "--metrics",     "",
                                  "--store",     "postgres",      "--postgres",
                                  conninfo_,     "--lease-ms",    std::to_string(lease_ms)};
    if (standby) args.emplace_back("--standby");
    if (!signing_key_file.empty()) {
      args.insert(args.end(), {"--signing-key-file", signing_key_file});
    }
    ledgers_.push_back(std::make_unique<Process>(binaryPath("tally-ledger"), std::move(args),
                                                 dir_.file(name + ".log"), /*ready_fd=*/true,
                                                 link));
    return ledgers_.back().get();
  }
  std::string ledgerDir(size_t index) const { return dir_.file("ledger" + std::to_string(index)); }

  // A tally-agent on its own data dir and socket, given `ledgers` ("H:P" or "H:P,H:P"), with
  // `extra` arguments (Link::kTls: its ledger key and gateway name).
  Process* spawnAgent(const std::string& ledgers, Link link = Link::kPlaintext,
                      const std::vector<std::string>& extra = {}) {
    const std::string name = agentName(agents_.size());
    agent_sockets_.push_back(dir_.file(name + ".sock"));
    std::vector<std::string> args{
        "--data-dir",          dir_.file(name), "--ledger",    ledgers,         "--socket",
        agent_sockets_.back(), "--metrics",     "127.0.0.1:0", "--http-socket", ""};
    args.insert(args.end(), extra.begin(), extra.end());
    agents_.push_back(std::make_unique<Process>(binaryPath("tally-agent"), std::move(args),
                                                dir_.file(name + ".log"), /*ready_fd=*/true, link));
    return agents_.back().get();
  }
  static std::string agentName(size_t index) { return "agent" + std::to_string(index); }

  // `BINARY ARGS... identity --json`'s "publicKey" (tally-ledger: the signing key; tally-agent:
  // its gateway key), creating the key if absent.
  std::string publicKeyOf(const std::string& binary, std::vector<std::string> args) {
    args.insert(args.end(), {"identity", "--json"});
    const std::string log = dir_.file("identity" + std::to_string(++tallyctl_calls_) + ".log");
    Process identity(binaryPath(binary), args, log, /*ready_fd=*/false);
    EXPECT_EQ(identity.waitExit(kExitTimeoutMs), 0) << identity.log();
    const std::string out = identity.log();
    const std::string needle = "\"publicKey\":\"";
    const size_t at = out.find(needle);
    if (at == std::string::npos) return "";
    const size_t begin = at + needle.size();
    return out.substr(begin, out.find('"', begin) - begin);
  }

  // Reserves `id` through agent `index` until the ledger's grant comes back, within
  // `timeout_ms`: the same id every time (a retry is never a second reservation), polling the
  // agent's answer (it is unavailable or refuses while it looks for the primary).
  bool reserveThroughAgent(size_t index, const std::string& id, uint64_t timeout_ms,
                           const std::string& subject = "tenant-1") {
    const steady_clock::time_point deadline =
        steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string last = "no answer";
    while (steady_clock::now() < deadline) {
      Result<client::Endpoint> endpoint = client::unixEndpoint(agent_sockets_[index]);
      if (!endpoint.isOk()) return false;
      Result<std::unique_ptr<client::BlockingClient>> connected =
          client::BlockingClient::connect(endpoint.value(), kCallTimeoutMs);
      if (connected.isOk()) {
        Result<wire::Response> answer =
            connected.value()->call(makeReserve({.id = id, .subject = subject}), kCallTimeoutMs);
        if (answer.isOk()) {
          if (const auto* reply = std::get_if<ReservationReply>(&answer.value().body);
              reply != nullptr && reply->code == ReplyCode::kOk) {
            return true;
          }
          last = wire::describe(answer.value().body);
        } else {
          last = answer.status().toString();
        }
      } else {
        last = connected.status().toString();
      }
      pauseMs(20);  // polling the agent's answer, not synchronising
    }
    ADD_FAILURE() << "reserve " << id << " through agent " << index << ": " << last;
    return false;
  }

  // tallyctl `args`: its exit code, its output (stdout and stderr) in *output.
  // tallyctl with `args`; plaintext (--insecure) unless they give the operator's --key.
  int tallyctl(std::vector<std::string> args, std::string* output) {
    const std::string log = dir_.file("tallyctl" + std::to_string(++tallyctl_calls_) + ".log");
    if (std::find(args.begin(), args.end(), "--key") == args.end()) {
      args.insert(args.begin(), "--insecure");
    }
    Process ctl(binaryPath("tallyctl"), args, log, /*ready_fd=*/false);
    const int code = ctl.waitExit(kExitTimeoutMs);
    *output = ctl.log();
    return code;
  }

  // One connection to agent `index` that reserves ids one at a time, retrying each (same id)
  // until the agent grants it: every id it returns from reserve() was acknowledged.
  class AgentReserver {
   public:
    explicit AgentReserver(std::string socket) : socket_(std::move(socket)) {}
    // True once `id` is granted (ReplyCode::kOk), within `timeout_ms`.
    bool reserve(const std::string& id, uint64_t timeout_ms) {
      const uint64_t deadline = monotonicNowMs() + timeout_ms;
      while (monotonicNowMs() < deadline) {
        if (client_ == nullptr) {
          Result<client::Endpoint> endpoint = client::unixEndpoint(socket_);
          Result<std::unique_ptr<client::BlockingClient>> connected =
              endpoint.isOk() ? client::BlockingClient::connect(endpoint.value(), kCallTimeoutMs)
                              : Result<std::unique_ptr<client::BlockingClient>>(endpoint.status());
          if (connected.isOk()) client_ = std::move(connected).value();
        }
        if (client_ != nullptr) {
          Result<wire::Response> answer =
              client_->call(makeReserve({.id = id, .subject = "tenant-1"}), kCallTimeoutMs);
          if (!answer.isOk()) {
            client_.reset();
          } else if (const auto* reply = std::get_if<ReservationReply>(&answer.value().body);
                     reply != nullptr && reply->code == ReplyCode::kOk) {
            return true;
          }
        }
        pauseMs(10);  // the agent is unavailable while its link moves: poll its answer again
      }
      return false;
    }

   private:
    std::string socket_;
    std::unique_ptr<client::BlockingClient> client_;
  };

  // The port a standby answers on: its event=standby line's listen=HOST:PORT.
  static int standbyPortOf(const Process& standby) {
    const std::string log = standby.log();
    const size_t line = log.find("event=standby");
    const size_t listen = log.find(" listen=", line == std::string::npos ? 0 : line);
    if (line == std::string::npos || listen == std::string::npos) return -1;
    const size_t colon = log.find(':', listen);
    return std::atoi(log.c_str() + colon + 1);
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

  // `answer` is NOT_PRIMARY naming `primary_address`.
  static void expectNotPrimary(const Result<wire::Response>& answer,
                               const std::string& primary_address) {
    ASSERT_TRUE(answer.isOk()) << answer.status().toString();
    const auto* error = std::get_if<wire::ErrorReply>(&answer.value().body);
    ASSERT_NE(error, nullptr) << wire::describe(answer.value().body);
    EXPECT_EQ(error->code, wire::ErrorCode::kNotPrimary) << error->message;
    EXPECT_EQ(error->message, "not the primary; the primary is " + primary_address);
  }

  // The ids in tally.reservations, one a line, in order.
  std::string storedReservations() const {
    const std::string db = conninfo_.substr(conninfo_.rfind("dbname=") + 7);
    Result<std::string> rows =
        sharedPostgres().psql(db, "SELECT id FROM tally.reservations ORDER BY id");
    EXPECT_TRUE(rows.isOk()) << rows.status().toString();
    return rows.isOk() ? rows.value() : "";
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
  std::vector<std::unique_ptr<Process>> agents_;
  std::vector<std::string> agent_sockets_;
  int tallyctl_calls_ = 0;
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
  // The lease names the port the primary bound (it listens on port 0).
  EXPECT_NE(standby->log().find("primary=127.0.0.1:" + std::to_string(primary_port)),
            std::string::npos)
      << standby->log();
  const int standby_port = standbyPortOf(*standby);
  ASSERT_GT(standby_port, 0) << standby->log();
  {
    std::unique_ptr<client::BlockingClient> client = connectTo(primary_port);
    ASSERT_NE(client, nullptr);
    // The agent's own subject, so that the load's sums stay the load's.
    TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                         publishPolicy(*client, {makeBudget({.burst = kBurst}),
                                                 makeBudget({.subject = "tenant-agent"})}));
    ASSERT_EQ(published.code, ReplyCode::kOk);
  }
  // An agent that knows both addresses, the primary first: its grants before the kill must be
  // on the new primary, and it must find the new primary by itself.
  Process* agent = spawnAgent("127.0.0.1:" + std::to_string(primary_port) +
                              ",127.0.0.1:" + std::to_string(standby_port));
  ASSERT_GE(agent->waitReady(kReadyTimeoutMs), 0) << agent->log();
  constexpr int kAgentReserves = 10;
  for (int i = 0; i < kAgentReserves; ++i) {
    ASSERT_TRUE(
        reserveThroughAgent(0, "agent-before-" + std::to_string(i), 30'000, "tenant-agent"));
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

  ASSERT_EQ(standby->waitReady(kLeaseMs + kReadyTimeoutMs), standby_port)
      << "the new primary serves on the socket it answered NOT_PRIMARY on\n"
      << standby->log();
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
  expectAuditMatches(*client, summary, kBurst);
  EXPECT_NE(standby->log().find("event=lease_taken epoch=2"), std::string::npos) << standby->log();

  // The agent's grants from before the kill are there; it moved to the new primary by itself.
  for (int i = 0; i < kAgentReserves; ++i) {
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply found,
        callReservation(*client,
                        QueryRequest{.reservation_id = "agent-before-" + std::to_string(i)}));
    EXPECT_EQ(found.code, ReplyCode::kOk) << describe(found);
  }
  const steady_clock::time_point moved_from = steady_clock::now();
  ASSERT_TRUE(reserveThroughAgent(0, "agent-after", 30'000, "tenant-agent"));
  std::cout << "[ failover ] the agent's reserve was granted by the new primary "
            << msSince(moved_from) << " ms after the takeover" << std::endl;
  EXPECT_NE(agent->log().find("event=ledger_link_connected ledger=127.0.0.1:" +
                              std::to_string(standby_port)),
            std::string::npos)
      << agent->log();
}

// A standby listens while it waits and answers every request NOT_PRIMARY, naming the primary:
// it applies nothing. tallyctl pointed at it alone prints that and exits 6; given the standby
// first and the primary second, tallyctl and an agent find the primary and are served.
TEST_F(PostgresFailoverTest, AStandbyAnswersNotPrimaryNamingThePrimaryAndClientsMoveOn) {
  constexpr uint64_t kLeaseMs = 1'000;
  Process* primary = spawn(kLeaseMs, /*standby=*/false);
  const int primary_port = primary->waitReady(kReadyTimeoutMs);
  ASSERT_GT(primary_port, 0) << primary->log();
  Process* standby = spawn(kLeaseMs, /*standby=*/true);
  ASSERT_TRUE(waitForLog(*standby, "event=standby", kReadyTimeoutMs)) << standby->log();
  const int standby_port = standbyPortOf(*standby);
  ASSERT_GT(standby_port, 0) << standby->log();
  const std::string primary_address = "127.0.0.1:" + std::to_string(primary_port);
  const std::string standby_address = "127.0.0.1:" + std::to_string(standby_port);
  {
    std::unique_ptr<client::BlockingClient> client = connectTo(primary_port);
    ASSERT_NE(client, nullptr);
    TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                         publishPolicy(*client, {makeBudget({.burst = 1000})}));
    ASSERT_EQ(published.code, ReplyCode::kOk);
  }

  // Every request, a reserve too, is answered NOT_PRIMARY under its own id, naming the primary.
  std::unique_ptr<client::BlockingClient> to_standby = connectTo(standby_port);
  ASSERT_NE(to_standby, nullptr);
  for (const wire::RequestBody& body :
       {wire::RequestBody{HealthRequest{}}, wire::RequestBody{makeReserve({.id = "r-standby"})}}) {
    TALLY_ASSIGN_OR_FAIL(wire::Response answer, to_standby->call(body, kCallTimeoutMs));
    const auto* error = std::get_if<wire::ErrorReply>(&answer.body);
    ASSERT_NE(error, nullptr) << wire::describe(answer.body);
    EXPECT_EQ(error->code, wire::ErrorCode::kNotPrimary);
    EXPECT_EQ(error->message, "not the primary; the primary is " + primary_address);
  }

  std::string output;
  EXPECT_EQ(tallyctl({"--ledger", standby_address, "health"}, &output), kCtlExitUnavailable)
      << output;
  EXPECT_NE(output.find("NOT_PRIMARY"), std::string::npos) << output;
  EXPECT_NE(output.find("the primary is " + primary_address), std::string::npos) << output;
  EXPECT_EQ(tallyctl({"--ledger", standby_address + "," + primary_address, "health"}, &output), 0)
      << output;

  Process* agent = spawnAgent(standby_address + "," + primary_address);
  ASSERT_GE(agent->waitReady(kReadyTimeoutMs), 0) << agent->log();
  ASSERT_TRUE(reserveThroughAgent(0, "r-agent", 30'000));
  EXPECT_NE(agent->log().find("event=ledger_link_not_primary"), std::string::npos) << agent->log();

  // The reserve the standby answered was applied nowhere; the agent's is on the primary.
  const std::string db = conninfo_.substr(conninfo_.rfind("dbname=") + 7);
  Result<std::string> rows =
      sharedPostgres().psql(db, "SELECT id FROM tally.reservations ORDER BY id");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "r-agent\n");
}

// Over TLS (production's link), a standby is the ledger too: it presents the signing key it
// shares with the primary, so a client that pins that key is told NOT_PRIMARY and where the
// primary is, rather than failing the handshake.
TEST_F(PostgresFailoverTest, AStandbyOverTlsTellsAClientPinningTheLedgerKeyWhereThePrimaryIs) {
  constexpr uint64_t kLeaseMs = 1'000;
  Process* primary = spawn(kLeaseMs, /*standby=*/false, Link::kTls);
  const int primary_port = primary->waitReady(kReadyTimeoutMs);
  ASSERT_GT(primary_port, 0) << primary->log();
  const std::string ledger_key = ledgerDir(0) + "/ledger.key";
  Process* standby = spawn(kLeaseMs, /*standby=*/true, Link::kTls, ledger_key);
  ASSERT_TRUE(waitForLog(*standby, "event=standby", kReadyTimeoutMs)) << standby->log();
  const int standby_port = standbyPortOf(*standby);
  ASSERT_GT(standby_port, 0) << standby->log();
  const std::string primary_address = "127.0.0.1:" + std::to_string(primary_port);
  const std::string standby_address = "127.0.0.1:" + std::to_string(standby_port);
  // tallyctl pins ledger.key beside its --key: the primary's operator key, in ledger0/.
  const std::string operator_key = ledgerDir(0) + "/operator.key";

  std::string output;
  EXPECT_EQ(tallyctl({"--ledger", standby_address, "--key", operator_key, "health"}, &output),
            kCtlExitUnavailable)
      << output;
  EXPECT_NE(output.find("NOT_PRIMARY"), std::string::npos) << output;
  EXPECT_NE(output.find("the primary is " + primary_address), std::string::npos) << output;
  EXPECT_EQ(tallyctl({"--ledger", standby_address + "," + primary_address, "--key", operator_key,
                      "health"},
                     &output),
            0)
      << output;
  // Plaintext to the TLS standby is refused and said so, not answered.
  EXPECT_NE(tallyctl({"--ledger", standby_address, "health"}, &output), 0) << output;
  EXPECT_EQ(output.find("the primary is"), std::string::npos) << output;
}

// The zombie: the primary is frozen past its lease, the standby takes over, and a request sent
// to the frozen primary is waiting in its socket when it wakes. It commits nothing more: the
// request is answered NOT_PRIMARY naming the new primary and is not in the database; the
// deposed primary logs event=deposed and exits 75 (it was not started as a standby).
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

  expectNotPrimary(zombie_client->receive(kCallTimeoutMs),
                   "127.0.0.1:" + std::to_string(standby_port));
  EXPECT_EQ(primary->waitExit(kExitTimeoutMs), kExitDeposed) << primary->log();
  const std::string log = primary->log();
  const size_t deposed_at = log.find("event=deposed");
  ASSERT_NE(deposed_at, std::string::npos) << log;
  const size_t line_at = log.rfind('\n', deposed_at);
  std::cout << "[ failover ] " << log.substr(line_at + 1, log.find('\n', deposed_at) - line_at - 1)
            << std::endl;

  // The new primary has r-before and not r-zombie, and conserves.
  EXPECT_EQ(storedReservations(), "r-before\n");
  std::unique_ptr<client::BlockingClient> client = connectTo(standby_port);
  ASSERT_NE(client, nullptr);
  TALLY_ASSIGN_OR_FAIL(ReservationReply retried,
                       callReservation(*client, makeReserve({.id = "r-before"})));
  EXPECT_EQ(retried.code, ReplyCode::kOk) << describe(retried);
  EXPECT_TRUE(retried.duplicate) << describe(retried);
  TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(*client));
  EXPECT_TRUE(audit.conserved) << describe(audit);
}

// The zombie again, started as a standby (how every ledger of a failover group is configured):
// deposed, it does not exit but becomes a standby on the same port. The request waiting in its
// socket when it wakes is answered NOT_PRIMARY naming the new primary and committed nowhere;
// new connections, tallyctl and an agent given it first are told the same and move on to the
// new primary; and when the new primary dies, the deposed one takes the lease back and serves
// on its port with everything the other committed.
TEST_F(PostgresFailoverTest, ADeposedPrimaryAnswersNotPrimaryAndWaitsAsAStandby) {
  constexpr uint64_t kLeaseMs = 300;
  Process* first = spawn(kLeaseMs, /*standby=*/true);  // the lease is free: it serves at once
  const int first_port = first->waitReady(kReadyTimeoutMs);
  ASSERT_GT(first_port, 0) << first->log();
  Process* second = spawn(kLeaseMs, /*standby=*/true);
  ASSERT_TRUE(waitForLog(*second, "event=standby", kReadyTimeoutMs)) << second->log();
  const std::string first_address = "127.0.0.1:" + std::to_string(first_port);

  std::unique_ptr<client::BlockingClient> zombie_client = connectTo(first_port);
  ASSERT_NE(zombie_client, nullptr);
  TALLY_ASSIGN_OR_FAIL(PolicyReply published,
                       publishPolicy(*zombie_client, {makeBudget({.burst = 1000})}));
  ASSERT_EQ(published.code, ReplyCode::kOk);
  TALLY_ASSIGN_OR_FAIL(ReservationReply before,
                       callReservation(*zombie_client, makeReserve({.id = "r-before"})));
  ASSERT_EQ(before.code, ReplyCode::kOk) << describe(before);

  ASSERT_TRUE(first->signal(SIGSTOP));
  const int second_port = second->waitReady(kLeaseMs + kReadyTimeoutMs);
  ASSERT_GT(second_port, 0) << second->log();
  const std::string second_address = "127.0.0.1:" + std::to_string(second_port);
  TALLY_ASSIGN_OR_FAIL(
      uint64_t sent,
      zombie_client->send(makeReserve({.id = "r-zombie", .units = 5}), kCallTimeoutMs));
  (void)sent;
  const steady_clock::time_point woken_at = steady_clock::now();
  ASSERT_TRUE(first->signal(SIGCONT));
  expectNotPrimary(zombie_client->receive(kCallTimeoutMs), second_address);
  std::cout << "[ failover ] the deposed primary answered NOT_PRIMARY " << msSince(woken_at)
            << " ms after SIGCONT" << std::endl;

  // It stays up as a standby on its port: every request is told where the primary is.
  ASSERT_TRUE(waitForLog(*first, "event=standby", kReadyTimeoutMs)) << first->log();
  EXPECT_TRUE(first->running() && !first->exited()) << first->log();
  EXPECT_NE(first->log().find("event=deposed"), std::string::npos) << first->log();
  EXPECT_EQ(standbyPortOf(*first), first_port) << first->log();
  {
    std::unique_ptr<client::BlockingClient> again = connectTo(first_port);
    ASSERT_NE(again, nullptr);
    expectNotPrimary(again->call(HealthRequest{}, kCallTimeoutMs), second_address);
    expectNotPrimary(again->call(makeReserve({.id = "r-zombie-2"}), kCallTimeoutMs),
                     second_address);
  }
  std::string output;
  EXPECT_EQ(tallyctl({"--ledger", first_address, "health"}, &output), kCtlExitUnavailable)
      << output;
  EXPECT_NE(output.find("the primary is " + second_address), std::string::npos) << output;
  EXPECT_EQ(tallyctl({"--ledger", first_address + "," + second_address, "health"}, &output), 0)
      << output;
  Process* agent = spawnAgent(first_address + "," + second_address);
  ASSERT_GE(agent->waitReady(kReadyTimeoutMs), 0) << agent->log();
  ASSERT_TRUE(reserveThroughAgent(0, "r-agent", 30'000));
  EXPECT_NE(agent->log().find("event=ledger_link_not_primary"), std::string::npos) << agent->log();
  // Nothing the deposed primary was sent after it woke is anywhere.
  EXPECT_EQ(storedReservations(), "r-agent\nr-before\n");

  // The new primary dies: the deposed one takes the lease back and serves on its own port.
  second->kill9();
  const steady_clock::time_point killed_at = steady_clock::now();
  std::unique_ptr<client::BlockingClient> client;
  std::string last = "not served";
  while (client == nullptr && msSince(killed_at) < static_cast<int64_t>(kReadyTimeoutMs)) {
    Result<std::unique_ptr<client::BlockingClient>> connected =
        client::BlockingClient::connect(endpointOf(first_port), kCallTimeoutMs);
    if (connected.isOk()) {
      Result<wire::Response> health = connected.value()->call(HealthRequest{}, kCallTimeoutMs);
      if (health.isOk() && std::holds_alternative<HealthReply>(health.value().body)) {
        client = std::move(connected).value();
        break;
      }
      last = health.isOk() ? wire::describe(health.value().body) : health.status().toString();
    }
    pauseMs(20);  // polling the ledger's answer, not synchronising
  }
  ASSERT_NE(client, nullptr) << last << "\n" << first->log();
  std::cout << "[ failover ] the deposed primary served again " << msSince(killed_at)
            << " ms after kill -9 of the new one" << std::endl;
  EXPECT_NE(first->log().find("event=lease_taken epoch=3"), std::string::npos) << first->log();
  for (const char* id : {"r-before", "r-agent"}) {
    TALLY_ASSIGN_OR_FAIL(ReservationReply found,
                         callReservation(*client, QueryRequest{.reservation_id = id}));
    EXPECT_EQ(found.code, ReplyCode::kOk) << id << ": " << describe(found);
  }
  TALLY_ASSIGN_OR_FAIL(ReservationReply zombie,
                       callReservation(*client, QueryRequest{.reservation_id = "r-zombie"}));
  EXPECT_NE(zombie.code, ReplyCode::kOk) << describe(zombie);
  TALLY_ASSIGN_OR_FAIL(AuditReport audit, auditLedger(*client));
  EXPECT_TRUE(audit.conserved) << describe(audit);
}

// Production's link under failover: the ledgers speak TLS (the standby presents the signing key
// it shares with the primary), the agent pins that key and presents its enrolled gateway key,
// and knows both addresses. Four clients reserve through the agent; the primary is killed with
// kill -9 under that load; the agent finds the new primary by itself and the clients' reserves
// are granted by it. Every reserve the agent acknowledged, before and after the kill, is in the
// database, the account holds exactly what they reserve, and the new primary's audit conserves.
TEST_F(PostgresFailoverTest, ATlsAgentFailsOverToTheNewPrimaryUnderLoadLosingNothing) {
  constexpr uint64_t kLeaseMs = 1'000;
  constexpr int kClients = 4;
  constexpr uint64_t kAcksBeforeKill = 200;
  constexpr uint64_t kAcksAfterKill = 200;
  Process* primary = spawn(kLeaseMs, /*standby=*/false, Link::kTls);
  const int primary_port = primary->waitReady(kReadyTimeoutMs);
  ASSERT_GT(primary_port, 0) << primary->log();
  const std::string ledger_key_file = ledgerDir(0) + "/ledger.key";
  Process* standby = spawn(kLeaseMs, /*standby=*/true, Link::kTls, ledger_key_file);
  ASSERT_TRUE(waitForLog(*standby, "event=standby", kReadyTimeoutMs)) << standby->log();
  const int standby_port = standbyPortOf(*standby);
  ASSERT_GT(standby_port, 0) << standby->log();
  const std::string primary_address = "127.0.0.1:" + std::to_string(primary_port);
  const std::string standby_address = "127.0.0.1:" + std::to_string(standby_port);
  const std::string ledger_key = publicKeyOf(
      "tally-ledger", {"--data-dir", ledgerDir(0), "--signing-key-file", ledger_key_file});
  ASSERT_FALSE(ledger_key.empty());

  // The operator publishes the policy and enrolls the agent's gateway key, over TLS.
  const std::string operator_key = ledgerDir(0) + "/operator.key";
  const std::string policy = dir_.file("policy.toml");
  std::ofstream(policy) << "[[budget]]\nsubject = \"tenant-1\"\nroute = \"chat\"\n"
                           "unit = \"tokens\"\nrefill_per_second = 0\nburst = 1000000000\n"
                           "max_single_reservation = 1000\nhold_ttl_ms = 600000\n"
                           "hard_execution_limit_ms = 600000\n";
  std::string output;
  ASSERT_EQ(
      tallyctl({"--ledger", primary_address, "--key", operator_key, "policy", "publish", policy},
               &output),
      0)
      << output;
  const std::string gateway_key =
      publicKeyOf("tally-agent", {"--data-dir", dir_.file(agentName(0)), "--gateway-name", "gw-1"});
  ASSERT_FALSE(gateway_key.empty());
  ASSERT_EQ(tallyctl({"--ledger", primary_address, "--key", operator_key, "gateway", "enroll",
                      "--id", "gw-1", "--public-key", gateway_key},
                     &output),
            0)
      << output;
  Process* agent = spawnAgent(primary_address + "," + standby_address, Link::kTls,
                              {"--ledger-public-key", ledger_key, "--gateway-name", "gw-1"});
  ASSERT_GE(agent->waitReady(kReadyTimeoutMs), 0) << agent->log();

  // The load: each client reserves its own ids one after another through the agent.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acks{0};
  std::atomic<uint64_t> acks_after_kill{0};
  std::atomic<bool> killed{false};
  std::mutex mutex;
  std::vector<std::string> acked;
  std::vector<std::string> lost;  // not granted within the bound: fails the test
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      AgentReserver reserver(agent_sockets_[0]);
      for (int n = 0; !stop; ++n) {
        const std::string id = "tls-c" + std::to_string(c) + "-" + std::to_string(n);
        const bool after_kill = killed;
        const bool granted = reserver.reserve(id, 20'000);
        std::lock_guard<std::mutex> lock(mutex);
        (granted ? acked : lost).push_back(id);
        if (!granted) return;
        ++acks;
        if (after_kill) ++acks_after_kill;
      }
    });
  }
  const uint64_t deadline = monotonicNowMs() + 30'000;
  while (acks < kAcksBeforeKill && monotonicNowMs() < deadline) pauseMs(5);  // polling progress
  ASSERT_GE(acks.load(), kAcksBeforeKill) << agent->log();
  primary->kill9();
  killed = true;
  const steady_clock::time_point killed_at = steady_clock::now();
  while (acks_after_kill < kAcksAfterKill && monotonicNowMs() < deadline + 30'000) pauseMs(5);
  const int64_t served_ms = msSince(killed_at);
  stop = true;
  for (std::thread& client : clients) client.join();
  EXPECT_TRUE(lost.empty()) << lost.size() << " reserves never granted, e.g. " << lost.front();
  ASSERT_GE(acks_after_kill.load(), kAcksAfterKill) << agent->log();
  EXPECT_EQ(standby->waitReady(kLeaseMs + kReadyTimeoutMs), standby_port) << standby->log();
  std::cout << "[ failover ] over TLS: " << acks.load() << " reserves granted through the agent, "
            << acks_after_kill.load() << " begun after kill -9 of the primary; the "
            << kAcksAfterKill << "th of those " << served_ms << " ms after the kill" << std::endl;
  EXPECT_NE(agent->log().find("event=ledger_link_connected ledger=" + standby_address),
            std::string::npos)
      << agent->log();

  // Every acknowledged reserve is in the database; the account holds exactly what the stored
  // reservations hold (one unit each); the new primary's audit conserves.
  const std::string stored = storedReservations();
  std::set<std::string> ids;
  for (size_t at = 0, end; (end = stored.find('\n', at)) != std::string::npos; at = end + 1) {
    ids.insert(stored.substr(at, end - at));
  }
  uint64_t missing = 0;
  for (const std::string& id : acked) {
    if (ids.count(id) == 0 && ++missing <= 5) ADD_FAILURE() << "acknowledged " << id << " is lost";
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_GE(ids.size(), acked.size());
  const std::string db = conninfo_.substr(conninfo_.rfind("dbname=") + 7);
  Result<std::string> reserved = sharedPostgres().psql(
      db, "SELECT sum(reserved) FROM tally.accounts WHERE subject = 'tenant-1' AND route = 'chat'");
  ASSERT_TRUE(reserved.isOk()) << reserved.status().toString();
  EXPECT_EQ(reserved.value(), std::to_string(ids.size()) + "\n");
  // The new primary's operator key is its own (created at the takeover); it presents the shared
  // signing key, which tallyctl pins.
  ASSERT_EQ(tallyctl({"--ledger", standby_address, "--key", ledgerDir(1) + "/operator.key",
                      "--ledger-key", ledger_key, "--json", "audit"},
                     &output),
            0)
      << output;
  EXPECT_NE(output.find("\"conserved\":true"), std::string::npos) << output;
  EXPECT_EQ(output.find("\"conserved\":false"), std::string::npos) << output;
}

}  // namespace
}  // namespace tally::testing
