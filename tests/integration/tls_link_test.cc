// TLS on the agent-ledger and tallyctl-ledger link (docs/security.md "The link"), with the real
// binaries: tally-ledger serving TLS with ledger.key and admitting enrolled gateway keys and its
// operator key, tally-agent pinning the ledger's key, tallyctl with --key. Every other
// integration test runs the daemons with --insecure (tests/support/process.h, Link).

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/agent_harness.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr uint64_t kReadyTimeoutMs = 20'000;
constexpr uint64_t kExitWaitMs = 20'000;

struct CtlRun {
  int code = -1;
  std::string output;
};

class TlsLinkTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) {
      for (Process* process : {ledger_.get(), agent_.get()}) {
        if (process != nullptr) std::fprintf(stderr, "--- log:\n%s\n", process->log().c_str());
      }
    }
  }

  void startLedger() {
    ledger_ =
        std::make_unique<Process>(binaryPath("tally-ledger"),
                                  std::vector<std::string>{"--data-dir", ledgerDir(), "--listen",
                                                           "127.0.0.1:0", "--metrics", ""},
                                  dir_.file("ledger.log"), /*ready_fd=*/true, Link::kTls);
    const int port = ledger_->waitReady(kReadyTimeoutMs);
    ASSERT_GT(port, 0) << ledger_->log();
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  std::string ledgerDir() const { return dir_.file("ledger"); }
  std::string operatorKey() const { return ledgerDir() + "/operator.key"; }

  // tallyctl with `args`, its exit code and what it printed.
  CtlRun tallyctl(const std::vector<std::string>& args) {
    const std::string log = dir_.file("tallyctl-" + std::to_string(++calls_) + ".log");
    Process process(binaryPath("tallyctl"), args, log, /*ready_fd=*/false);
    CtlRun run;
    run.code = process.waitExit(kExitWaitMs);
    run.output = process.log();
    return run;
  }

  // tallyctl against the ledger as its operator.
  CtlRun asOperator(std::vector<std::string> args) {
    args.insert(args.begin(), {"--ledger", address_, "--key", operatorKey(), "--json"});
    return tallyctl(args);
  }

  // `tally-agent identity` in DIR: the gateway's public key (base64).
  std::string agentIdentity(const std::string& data_dir, const std::string& name) {
    Result<std::string> out =
        runForOutput(binaryPath("tally-agent"),
                     {"--data-dir", data_dir, "--gateway-name", name, "identity", "--json"},
                     dir_.file("identity-" + name + ".log"));
    EXPECT_TRUE(out.isOk()) << out.status().toString();
    return out.isOk() ? jsonString(out.value(), "publicKey") : std::string();
  }

  std::string ledgerPublicKey() {
    Result<std::string> out =
        runForOutput(binaryPath("tally-ledger"), {"--data-dir", ledgerDir(), "identity", "--json"},
                     dir_.file("ledger-identity.log"));
    EXPECT_TRUE(out.isOk()) << out.status().toString();
    return out.isOk() ? jsonString(out.value(), "publicKey") : std::string();
  }

  void startAgent(const std::string& data_dir, const std::string& ledger_key) {
    const std::string config = dir_.file("agent.toml");
    std::ofstream(config) << "policy_refresh_ms = 50\nrequest_timeout_ms = 1000\n";
    agent_socket_ = dir_.file("agent.sock");
    agent_ = std::make_unique<Process>(
        binaryPath("tally-agent"),
        std::vector<std::string>{"--data-dir", data_dir, "--ledger", address_, "--socket",
                                 agent_socket_, "--http-socket", "", "--metrics", "", "--config",
                                 config, "--ledger-public-key", ledger_key},
        dir_.file("agent.log"), /*ready_fd=*/true, Link::kTls);
    ASSERT_GE(agent_->waitReady(kReadyTimeoutMs), 0) << agent_->log();
  }

  void publishPolicy() {
    const std::string policy = dir_.file("policy.toml");
    std::ofstream(policy) << "[[budget]]\nsubject = \"tenant-1\"\nroute = \"chat\"\n"
                             "unit = \"tokens\"\nrefill_per_second = 0\nburst = 1000\n"
                             "max_single_reservation = 1000\nhold_ttl_ms = 600000\n"
                             "hard_execution_limit_ms = 600000\n";
    const CtlRun published = asOperator({"policy", "publish", policy});
    ASSERT_EQ(published.code, 0) << published.output;
  }

  // Polls `done` (a process's log, an answer) for at most 10 s.
  static bool eventually(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }

  TempDir dir_;
  std::unique_ptr<Process> ledger_;
  std::unique_ptr<Process> agent_;
  std::string address_;
  std::string agent_socket_;
  int calls_ = 0;
};

TEST_F(TlsLinkTest, AnEnrolledAgentServesReserveStartSettleThroughTheLedgerOverTls) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());
  const std::string agent_dir = dir_.file("agent");
  const std::string gateway_key = agentIdentity(agent_dir, "gw-1");
  const CtlRun enrolled =
      asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", gateway_key});
  ASSERT_EQ(enrolled.code, 0) << enrolled.output;
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_dir, ledgerPublicKey()));

  // The agent fetches the policy over TLS on its own schedule: the first reserve may wait.
  CtlRun reserved;
  ASSERT_TRUE(eventually([&] {
    reserved = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r1", "--subject",
                         "tenant-1", "--route", "chat", "--units", "100"});
    return reserved.code == 0;
  })) << reserved.output;
  const CtlRun started =
      tallyctl({"--agent", agent_socket_, "--json", "start", "--id", "r1", "--operation", "op"});
  ASSERT_EQ(started.code, 0) << started.output;
  const CtlRun settled = tallyctl({"--agent", agent_socket_, "--json", "settle", "--id", "r1",
                                   "--operation", "op", "--actual", "40"});
  ASSERT_EQ(settled.code, 0) << settled.output;
  EXPECT_NE(settled.output.find("\"state\":\"SETTLED\""), std::string::npos) << settled.output;
  // The ledger has it (answered through the agent, not queued).
  const CtlRun queried = asOperator({"query", "--id", "r1"});
  ASSERT_EQ(queried.code, 0) << queried.output;
  EXPECT_NE(queried.output.find("\"state\":\"SETTLED\""), std::string::npos) << queried.output;
  EXPECT_EQ(ledger_->log().find("event=tls_refused"), std::string::npos) << ledger_->log();
}

TEST_F(TlsLinkTest, AnUnenrolledGatewayKeyIsRefusedAndTheAgentLogsWhy) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  const std::string agent_dir = dir_.file("agent");
  (void)agentIdentity(agent_dir, "stranger");
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_dir, ledgerPublicKey()));
  EXPECT_TRUE(eventually([&] {
    return ledger_->log().find("event=tls_refused") != std::string::npos &&
           agent_->log().find("TLS: the peer ended the session") != std::string::npos;
  })) << "ledger:\n"
      << ledger_->log() << "\nagent:\n"
      << agent_->log();
  EXPECT_NE(ledger_->log().find("the peer's key is not accepted"), std::string::npos);
  // Nothing the stranger asked for was served: the agent's link is down.
  const CtlRun reserved = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r1",
                                    "--subject", "tenant-1", "--route", "chat", "--units", "1"});
  EXPECT_NE(reserved.code, 0) << reserved.output;
}

TEST_F(TlsLinkTest, TheLedgerRefusesInsecureOnANonLoopbackAddress) {
  Process refused(binaryPath("tally-ledger"),
                  {"--data-dir", ledgerDir(), "--listen", "0.0.0.0:0", "--insecure"},
                  dir_.file("refused.log"), /*ready_fd=*/false, Link::kTls);
  EXPECT_EQ(refused.waitExit(kExitWaitMs), 2);
  EXPECT_NE(refused.log().find("insecure (plaintext, no authentication) is refused on the "
                               "non-loopback address 0.0.0.0"),
            std::string::npos)
      << refused.log();

  // On loopback it starts, and says loudly what it is.
  Process insecure(
      binaryPath("tally-ledger"),
      {"--data-dir", ledgerDir(), "--listen", "127.0.0.1:0", "--metrics", "", "--insecure"},
      dir_.file("insecure.log"), /*ready_fd=*/true, Link::kTls);
  ASSERT_GT(insecure.waitReady(kReadyTimeoutMs), 0) << insecure.log();
  EXPECT_NE(insecure.log().find("level=warn component=ledger event=insecure"), std::string::npos)
      << insecure.log();
}

TEST_F(TlsLinkTest, TallyctlIsServedWithTheOperatorKeyAndRefusedWithoutIt) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  EXPECT_NE(ledger_->log().find("event=operator_key_created"), std::string::npos);
  const CtlRun served = asOperator({"health"});
  EXPECT_EQ(served.code, 0) << served.output;

  // A key the ledger does not know: refused by the ledger, exit 11.
  const std::string stranger_dir = dir_.file("stranger");
  (void)agentIdentity(stranger_dir, "stranger");
  const CtlRun stranger = tallyctl({"--ledger", address_, "--key", stranger_dir + "/gateway.key",
                                    "--ledger-key", ledgerPublicKey(), "health"});
  EXPECT_EQ(stranger.code, 11) << stranger.output;
  EXPECT_NE(stranger.output.find("TLS: "), std::string::npos) << stranger.output;

  // No key at all: a usage error naming what is missing.
  const CtlRun keyless = tallyctl({"--ledger", address_, "health"});
  EXPECT_EQ(keyless.code, 2) << keyless.output;
  EXPECT_NE(keyless.output.find("--key"), std::string::npos) << keyless.output;

  // Plaintext to a TLS ledger: told so, not left hanging.
  const CtlRun plaintext = tallyctl({"--ledger", address_, "--insecure", "health"});
  EXPECT_EQ(plaintext.code, 11) << plaintext.output;
  EXPECT_NE(plaintext.output.find("speaks TLS"), std::string::npos) << plaintext.output;
}

}  // namespace
}  // namespace tally::testing
