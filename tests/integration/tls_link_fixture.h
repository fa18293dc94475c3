#pragma once

// The fixture of the TLS link tests (tls_link_test.cc, tls_identity_test.cc): tally-ledger serving
// TLS with ledger.key and its operator key, tally-agent pinning the ledger's key, tallyctl with
// --key, and in-process TLS clients presenting any key (docs/security.md "The link").

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "central-client/blocking_client.h"
#include "net/tls_session.h"
#include "shard/identity.h"
#include "tests/integration/agent_harness.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {

// net::TlsSession as the blocking client drives it (tallyctl has the same adapter).
class TlsTestSession final : public client::LinkSession {
 public:
  explicit TlsTestSession(std::unique_ptr<net::TlsSession> session)
      : session_(std::move(session)) {}
  Status start() override { return session_->start(); }
  Status feed(std::span<const uint8_t> ciphertext) override { return session_->feed(ciphertext); }
  Status write(std::span<const uint8_t> plaintext) override { return session_->write(plaintext); }
  std::vector<uint8_t> takeCiphertext() override { return session_->takeCiphertext(); }
  std::vector<uint8_t> takePlaintext() override { return session_->takePlaintext(); }
  bool handshakeDone() const override { return session_->handshakeDone(); }
  bool peerRefused() const override { return session_->peerRefused(); }
  std::optional<std::string> peerAlert() const override { return session_->peerAlert(); }

 private:
  std::unique_ptr<net::TlsSession> session_;
};

struct CtlRun {
  int code = -1;
  std::string output;
};

inline constexpr uint64_t kTlsReadyTimeoutMs = 20'000;
inline constexpr uint64_t kExitWaitMs = 20'000;

class TlsLinkFixture : public ::testing::Test {
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
    const int port = ledger_->waitReady(kTlsReadyTimeoutMs);
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
                     dir_.file("identity-" + name + "-" + std::to_string(++calls_) + ".log"));
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
    ASSERT_GE(agent_->waitReady(kTlsReadyTimeoutMs), 0) << agent_->log();
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

  // A TLS connection to the ledger presenting `key` and pinning the ledger's key, as tallyctl
  // and the agent make one.
  Result<std::unique_ptr<client::BlockingClient>> tlsClient(const identity::KeyPair& key) {
    Result<identity::KeyPair> ledger = identity::loadKeyPair(ledgerDir() + "/ledger.key");
    if (!ledger.isOk()) return ledger.status();
    Result<client::Endpoint> endpoint = client::parseTcpEndpoint(address_);
    if (!endpoint.isOk()) return endpoint.status();
    client::BlockingClientOptions options;
    options.tls =
        [key, pin = ledger.value().public_key]() -> Result<std::unique_ptr<client::LinkSession>> {
      Result<std::unique_ptr<net::TlsSession>> session = net::TlsSession::create(net::TlsOptions{
          .role = net::TlsRole::kClient, .key = key, .accept_peer = [pin](const PublicKey& peer) {
            return peer == pin;
          }});
      if (!session.isOk()) return session.status();
      return std::unique_ptr<client::LinkSession>(
          std::make_unique<TlsTestSession>(std::move(session).value()));
    };
    return client::BlockingClient::connect(endpoint.value(), kTlsReadyTimeoutMs,
                                           std::move(options));
  }

  TempDir dir_;
  std::unique_ptr<Process> ledger_;
  std::unique_ptr<Process> agent_;
  std::string address_;
  std::string agent_socket_;
  int calls_ = 0;
};

}  // namespace tally::testing
