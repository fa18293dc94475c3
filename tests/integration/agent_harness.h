#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/ledger_types.h"
#include "core/status.h"
#include "tests/integration/ledger_fixture.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/process.h"
#include "wire/codec.h"

// Shared pieces of the tally-agent integration tests: an agent child process that can be
// killed and restarted on the same data dir and socket, the fixture of a fleet (one ledger,
// several agents, optional fault proxies between them), typed calls through an agent, and a
// Prometheus scrape over a raw socket. Everything here waits with a deadline.

namespace tally::testing {

// A call through an agent can take the agent's own ledger timeout (request_timeout_ms) plus its
// resolution by query: gateways wait longer than that.
inline constexpr uint64_t kAgentCallTimeoutMs = 20'000;
// How long a test waits for asynchronous delivery (outbox, reconnect with backoff).
inline constexpr uint64_t kDeliveryTimeoutMs = 60'000;

// The agent settings every test starts from: short ledger timeouts so faults show quickly.
struct AgentSettings {
  uint64_t request_timeout_ms = 500;
  uint64_t policy_refresh_ms = 100;
  uint32_t failures_to_partition = 3;
  uint64_t partition_after_ms = 1'500;
  uint64_t drain_timeout_ms = 2'000;
  std::string extra_toml;               // appended before the [health] table
  std::vector<std::string> extra_args;  // appended to the command line
  // Set: `--partitions MAP` (docs/scale-out.md "Partitioned subjects") instead of `--ledger`.
  std::string partitions;
};

// Runs `binary args…` to completion (stdout and stderr into `log_path`) and returns what it
// printed; kUnavailable if it did not exit 0 within `timeout_ms`.
Result<std::string> runForOutput(const std::string& binary, const std::vector<std::string>& args,
                                 const std::string& log_path, uint64_t timeout_ms = kExitTimeoutMs);
// The string value of "key":"value" in a one-line JSON object (no escapes); empty if absent.
std::string jsonString(const std::string& json, const std::string& key);

// One tally-agent on `data_dir` serving `socket_path`, started and stopped as often as a test
// likes; every start appends to the same log.
class AgentInstance {
 public:
  AgentInstance(std::string name, std::string data_dir, std::string socket_path,
                std::string config_path, std::string log_path);
  AgentInstance(const AgentInstance&) = delete;
  AgentInstance& operator=(const AgentInstance&) = delete;

  // Writes the config, spawns `tally-agent --data-dir D --ledger LEDGER --socket S --config C
  // --metrics 127.0.0.1:0 --ready-fd N` (`--partitions MAP` for --ledger if the settings name
  // partitions; `ledger_address` is then unused) and waits for its readiness line (which names the
  // metrics port). Precondition: not running.
  [[nodiscard]] Status start(const std::string& ledger_address, const AgentSettings& settings);
  void kill9();
  int terminate(uint64_t timeout_ms = kExitTimeoutMs);
  // The exit code once it exits (-1 if it did not within `timeout_ms`).
  int waitExit(uint64_t timeout_ms = kExitTimeoutMs);
  bool running();
  bool signal(int signal_number);

  const std::string& name() const { return name_; }
  const std::string& socketPath() const { return socket_path_; }
  uint16_t metricsPort() const { return metrics_port_; }
  client::Endpoint endpoint() const;
  Result<std::unique_ptr<client::BlockingClient>> connect() const;
  std::string log() const;

 private:
  std::string name_;
  std::string data_dir_;
  std::string socket_path_;
  std::string config_path_;
  std::string log_path_;
  std::unique_ptr<Process> process_;
  uint16_t metrics_port_ = 0;
  int starts_ = 0;
};

// A reply through an agent: a ReservationReply, or the agent's ErrorReply (e.g. kUnavailable).
struct AgentAnswer {
  bool is_error = false;
  ReservationReply reply;
  wire::ErrorReply error;
};
std::string describe(const AgentAnswer& answer);
// An error answer of code UNAVAILABLE (the agent could not reach the ledger, or is stopping).
inline bool isUnavailable(const AgentAnswer& answer) {
  return answer.is_error && answer.error.code == wire::ErrorCode::kUnavailable;
}
Result<AgentAnswer> agentAnswerOf(Result<wire::Response> response);
Result<AgentAnswer> callAgent(client::BlockingClient& client, const wire::RequestBody& body,
                              uint64_t timeout_ms = kAgentCallTimeoutMs);
// Pipelined: every body sent, then every answer received; in request order.
std::vector<Result<AgentAnswer>> callAgentPipelined(client::BlockingClient& client,
                                                    const std::vector<wire::RequestBody>& bodies,
                                                    uint64_t timeout_ms = kAgentCallTimeoutMs);

// HTTP GET http://127.0.0.1:PORT/PATH with HTTP/1.0 over a raw socket; the body of a 200.
Result<std::string> httpGet(uint16_t port, const std::string& path, uint64_t timeout_ms);
// The sum of every sample of `name` whose labels include each of `labels` (k="v" pairs).
// Lines are Prometheus text format: `name{labels} value` or `name value`.
double metricSum(const std::string& exposition, const std::string& name,
                 const std::map<std::string, std::string>& labels = {});

// A fleet: the ledger fixture, plus agents and fault proxies.
class AgentFleetTest : public LedgerServiceTest {
 protected:
  void TearDown() override;

  // Starts agent `index` (creating it on first use) against `ledger_address` (the ledger's own
  // port, or a proxy's address).
  void startAgent(size_t index, const std::string& ledger_address,
                  const AgentSettings& settings = {});
  std::string ledgerAddress() const { return "127.0.0.1:" + std::to_string(ledger_.port()); }
  std::unique_ptr<client::BlockingClient> gateway(size_t agent_index);
  // A proxy in front of the running ledger.
  FaultProxy& addProxy();

  // Queries the ledger directly until `done(reply)` holds for `id`, or the deadline; returns the
  // last reply. Pauses between polls.
  ReservationReply waitForLedger(const std::string& id,
                                 const std::function<bool(const ReservationReply&)>& done,
                                 uint64_t timeout_ms = kDeliveryTimeoutMs);

  std::vector<std::unique_ptr<FaultProxy>> proxies_;
  std::vector<std::unique_ptr<AgentInstance>> agents_;
};

}  // namespace tally::testing
