// TLS on the agent-ledger and tallyctl-ledger link (docs/security.md "The link"), with the real
// binaries: tally-ledger serving TLS with ledger.key and admitting enrolled gateway keys and its
// operator key, tally-agent pinning the ledger's key, tallyctl with --key. Every other
// integration test runs the daemons with --insecure (tests/support/process.h, Link).

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/tls_link_fixture.h"

namespace tally::testing {
namespace {

class TlsLinkTest : public TlsLinkFixture {};

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
  ASSERT_GT(insecure.waitReady(kTlsReadyTimeoutMs), 0) << insecure.log();
  EXPECT_NE(insecure.log().find("level=warn component=ledger event=insecure"), std::string::npos)
      << insecure.log();
}

TEST_F(TlsLinkTest, TallyctlIsServedWithTheOperatorKeyAndRefusedWithoutIt) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  EXPECT_NE(ledger_->log().find("event=operator_key_created"), std::string::npos);
  const CtlRun served = asOperator({"health"});
  EXPECT_EQ(served.code, 0) << served.output;
  // The ledger's operator key is the first operator, "admin" with role admin.
  EXPECT_NE(ledger_->log().find("role=operator gateway=\"\" why=\"\" operator=admin "
                                "operator_role=admin"),
            std::string::npos)
      << ledger_->log();

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
