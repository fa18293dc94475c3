#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/ledger_types.h"
#include "core/status.h"
#include "tests/support/process.h"
#include "wire/codec.h"

// Shared pieces of the tally-ledger integration tests: a ledger child process that can be
// killed and restarted on the same data dir, request builders, typed calls, audit sums and
// pacing helpers. Everything here waits with a deadline.

namespace tally {

// Readable gtest output for the core enums and values (found by ADL).
void PrintTo(ReplyCode code, std::ostream* os);
void PrintTo(ReservationState state, std::ostream* os);
void PrintTo(LimitingDimension dimension, std::ostream* os);
void PrintTo(GenerationState state, std::ostream* os);
void PrintTo(const Balances& balances, std::ostream* os);
void PrintTo(const AccountKey& key, std::ostream* os);
std::string describe(const Reservation& receipt);
std::string describe(const ReservationReply& reply);

void PrintTo(ErrorCode code, std::ostream* os);  // core/ledger_protocol.h

namespace wire {
std::string describe(const ResponseBody& body);
}  // namespace wire

namespace testing {

inline constexpr uint64_t kReadyTimeoutMs = 10'000;
inline constexpr uint64_t kCallTimeoutMs = 10'000;
inline constexpr uint64_t kExitTimeoutMs = 10'000;

// One tally-ledger on `data_dir`, started and stopped as often as a test likes; every start
// appends to the same log. Owns the current child (killed by the destructor). The data dir and
// log belong to the caller's TempDir.
class LedgerInstance {
 public:
  LedgerInstance(std::string data_dir, std::string log_path);
  LedgerInstance(const LedgerInstance&) = delete;
  LedgerInstance& operator=(const LedgerInstance&) = delete;

  // Spawns `tally-ledger --data-dir D --listen 127.0.0.1:0 --ready-fd N` and waits for the
  // readiness line. Precondition: not running.
  [[nodiscard]] Status start();
  void kill9();
  // Sends `signal_number` (e.g. SIGSTOP to freeze it); false if it is not running.
  bool signal(int signal_number);
  // SIGTERM, then the exit code (or -1 if it did not exit within `timeout_ms`).
  int terminate(uint64_t timeout_ms = kExitTimeoutMs);
  // Waits for it to exit by itself; the exit code, or -1 if it did not within `timeout_ms`.
  int waitExit(uint64_t timeout_ms = kExitTimeoutMs);
  // False once the child has exited (reaped here).
  bool running();
  uint16_t port() const { return port_; }
  pid_t pid() const { return process_ != nullptr ? process_->pid() : -1; }
  // The Prometheus endpoint's port (each instance picks a free one), from the ready line.
  uint16_t metricsPort() const { return metrics_port_; }
  client::Endpoint endpoint() const;
  Result<std::unique_ptr<client::BlockingClient>> connect() const;
  std::string log() const;
  const std::string& dataDir() const { return data_dir_; }

 private:
  std::string data_dir_;
  std::string log_path_;
  std::unique_ptr<Process> process_;
  uint16_t port_ = 0;
  uint16_t metrics_port_ = 0;
  int starts_ = 0;
};

struct BudgetSpec {
  std::string subject = "tenant-1";
  std::string route = "chat";
  Units burst = 1000;
  Units refill_per_second = 0;
  uint64_t hold_ttl_ms = 600'000;
  Units max_single_reservation = 0;  // 0: the burst
  Units max_overdraft = 1'000'000;
  uint64_t hard_execution_limit_ms = 600'000;
};
Budget makeBudget(const BudgetSpec& spec);

struct ReserveSpec {
  std::string id;
  std::string subject = "tenant-1";
  std::string route = "chat";
  Units units = 1;
  Generation generation = 0;
  std::string region;  // "": the gateway does not say
};
// A reserve request carrying its canonical digest.
ReserveRequest makeReserve(const ReserveSpec& spec);

// Typed calls: the reply, or a Status describing the transport failure or unexpected body.
Result<ReservationReply> callReservation(client::BlockingClient& client,
                                         const wire::RequestBody& body);
Result<PolicyReply> publishPolicy(client::BlockingClient& client, std::vector<Budget> budgets);
Result<PolicyReply> rollbackPolicy(client::BlockingClient& client);
Result<AuditReport> auditLedger(client::BlockingClient& client,
                                const wire::AuditRequest& request = {});
Result<wire::HealthReply> health(client::BlockingClient& client);
// Sends every request pipelined (in chunks of 256 in flight) and returns the replies in
// request order.
std::vector<Result<ReservationReply>> callPipelined(client::BlockingClient& client,
                                                    const std::vector<wire::RequestBody>& bodies);
// Unpacks a response received with BlockingClient::receive().
Result<ReservationReply> reservationOf(Result<wire::Response> response);

const AccountView* findAccount(const AuditReport& report, const AccountKey& key);
// Balances summed over every generation of (subject, route).
Balances sumBalances(const AuditReport& report, const SubjectRoute& subject_route);
std::string describe(const AuditReport& report);

// Pacing helpers. They decide when a request leaves, never whether a test passes.
uint64_t wallNowMs();  // CLOCK_REALTIME ms: the ledger clock's base on this host
void waitUntilWallMs(uint64_t wall_ms);
void pauseMs(uint64_t ms);
// Bounded polling on an observable condition: true as soon as `done()` is, false if it is still
// false after `timeout_ms` (asked once more at the end).
bool pollUntil(const std::function<bool()>& done, uint64_t timeout_ms, uint64_t interval_ms = 20);
// How many times `needle` occurs in `text` (overlaps counted): events in a daemon's log.
size_t countOf(const std::string& text, const std::string& needle);
// The PRNG seed: TALLY_TEST_SEED if set, else fresh; printed so a failure can be replayed.
uint64_t testSeed(const char* test_name);

}  // namespace testing
}  // namespace tally

#define TALLY_CONCAT_INNER(a, b) a##b
#define TALLY_CONCAT(a, b) TALLY_CONCAT_INNER(a, b)

// `lhs = value of expr`, or a fatal gtest failure naming the Status. Only in void functions.
#define TALLY_ASSIGN_OR_FAIL(lhs, expr)                                              \
  auto TALLY_CONCAT(tally_result_, __LINE__) = (expr);                               \
  ASSERT_TRUE(TALLY_CONCAT(tally_result_, __LINE__).isOk())                          \
      << #expr << ": " << TALLY_CONCAT(tally_result_, __LINE__).status().toString(); \
  lhs = std::move(TALLY_CONCAT(tally_result_, __LINE__)).value()
