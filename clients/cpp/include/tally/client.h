#pragma once

#include <cstdint>
#include <memory>
#include <string>

// tally's C++ gateway client: the native agent protocol (docs/protocol.md) over the agent's
// Unix socket, with the protocol's retry rules built in. Link with `pkg-config --libs
// tally-client`. Plain types only: no tally-internal header is needed to use it.
//
// Retry rules (every call, until ClientOptions::deadline_ms):
//  * an answer that says nothing happened or the outcome is unknown (`unavailable`, a ledger
//    table `resourceExhausted`) is retried with the same request (same id, same fields),
//    after a jittered backoff (backoff_first_ms doubling to backoff_max_ms);
//  * a lost answer (timeout, connection lost): the connection is reopened; a reserve is
//    resolved by querying its id (a receipt found is the answer, `duplicate` true; not found:
//    the same reserve is sent again); any other request is sent again as it is (the ledger
//    answers a repeat as a duplicate);
//  * everything else is the answer, returned as it is: ok, queued, rejected (a new attempt
//    needs a new id), conflicts, not found, invalid argument.
// A client holds one connection; it is not thread-safe (one per thread).

namespace tally {

struct ClientOptions {
  std::string socket_path = "/run/tally/agent.sock";
  uint64_t attempt_timeout_ms = 5'000;  // one request's wait for its answer
  uint64_t deadline_ms = 30'000;        // all attempts of one call
  uint64_t backoff_first_ms = 50;
  uint64_t backoff_max_ms = 2'000;
};

enum class Outcome : uint8_t {
  kOk,           // done (also a duplicate of an earlier request)
  kQueued,       // a follow-up durably in the agent's outbox
  kRejected,     // admission refused: receipt.limiting_dimension, receipt.retry_after_ms
  kConflict,     // idempotency/operation conflict, expired, invalid state (code says which)
  kNotFound,     // no such reservation
  kInvalid,      // the request is wrong: fix it
  kUnavailable,  // no definitive answer before the deadline: retry later with the same id
  kError,        // another error (permission denied, internal, a protocol error)
};
const char* outcomeName(Outcome outcome);

// The receipt, with tallyctl's --json field names in snake case.
struct Receipt {
  std::string reservation_id;
  std::string state;  // "RESERVED", "STARTED", "SETTLED", …
  std::string subject;
  std::string route;
  std::string operation_id;
  uint64_t reserved_units = 0;
  uint64_t actual_units = 0;
  uint64_t refunded_units = 0;  // by this call
  uint64_t debt_units = 0;
  uint64_t policy_generation = 0;
  uint64_t expires_at_ms = 0;
  std::string limiting_dimension;  // rejections: "capacity", "debt", …
  int64_t retry_after_ms = -1;     // rejections: -1 never under this policy
};

struct Answer {
  Outcome outcome = Outcome::kError;
  std::string code;  // the reply or error code, e.g. "OK", "REJECTED", "UNAVAILABLE"
  bool duplicate = false;
  Receipt receipt;  // empty when the answer carries none
  std::string message;
  int attempts = 0;  // requests sent for this call
};

struct ReserveArgs {
  std::string reservation_id;
  std::string subject;
  std::string route;
  uint64_t units = 0;
  std::string region;  // optional
  uint32_t priority = 0;
  uint64_t policy_generation = 0;  // 0: the active one
};

class Client {
 public:
  explicit Client(ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Answer reserve(const ReserveArgs& args);
  Answer start(const std::string& reservation_id, const std::string& operation_id);
  Answer settle(const std::string& reservation_id, const std::string& operation_id,
                uint64_t actual_units);
  Answer release(const std::string& reservation_id);
  Answer markUnknown(const std::string& reservation_id, const std::string& operation_id);
  Answer report(const std::string& reservation_id, const std::string& operation_id,
                uint64_t actual_units);
  // Streaming top-up: the STARTED reservation now holds `reserved_units_total` in all (a new
  // total, so a retry never charges twice); REJECTED: stop the work (docs/protocol.md "extend").
  Answer extend(const std::string& reservation_id, const std::string& operation_id,
                uint64_t reserved_units_total);
  Answer query(const std::string& reservation_id);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally
