#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/ledger_types.h"

// A sustained reserve → start → settle load against a real ledger, from several client
// connections (one thread each), pipelined: each client sends a window of reserves, receives
// their replies, then the starts of those admitted, then their settles. Every request is
// recorded as SENT before it is written and ACKNOWLEDGED only when its reply arrived, so after
// a crash a test knows exactly which outcomes the ledger promised (acknowledged) and which may
// or may not have happened (sent, unanswered).
//
// A client stops at the first transport failure (the ledger died or closed the connection),
// at stop(), or after cycles_per_client_max cycles. Replies that are not the expected success
// are recorded as unexpected() (the test fails on them).

namespace tally::testing {

enum class Step : uint8_t { kNone = 0, kReserve, kStart, kSettle };
const char* stepName(Step step);

struct CycleRecord {
  std::string subject;
  std::string route;
  std::string reservation_id;
  std::string operation_id;
  Digest digest{};
  Units units = 0;
  Units actual = 0;
  Step sent = Step::kNone;    // furthest step written to the socket (perhaps partially)
  Step acked = Step::kNone;   // furthest step whose reply arrived
  Generation generation = 0;  // from the reserve's reply
  std::chrono::steady_clock::time_point reserve_sent_at;
};

struct CycleLoadOptions {
  std::string id_prefix = "load";  // unique per load: ids are PREFIX-cCLIENT-N
  std::string subject = "tenant-1";
  std::string route = "chat";
  int clients = 4;
  int window = 8;                      // cycles pipelined per client
  uint64_t cycles_per_client_max = 0;  // 0: until stop() or the connection fails
  Units units_max = 100;
  uint64_t seed = 1;
  uint64_t call_timeout_ms = 10'000;
};

class CycleLoad {
 public:
  CycleLoad(client::Endpoint endpoint, CycleLoadOptions options);
  ~CycleLoad();  // stop() and join()
  CycleLoad(const CycleLoad&) = delete;
  CycleLoad& operator=(const CycleLoad&) = delete;

  void start();
  // Waits until `acks` replies were acknowledged in total; false if that did not happen within
  // `timeout_ms` or every client finished first.
  bool waitForAcks(uint64_t acks, uint64_t timeout_ms);
  // Clients finish their current step and exit.
  void stop();
  void join();

  uint64_t acks() const { return acks_.load(); }
  // After join(): every cycle any client began, and the replies that were not plain success.
  std::vector<CycleRecord> records() const;
  std::vector<std::string> unexpected() const;

 private:
  struct Client {
    int index = 0;
    std::deque<CycleRecord> records;  // stable addresses while the client appends
    std::thread thread;
  };

  void run(Client* client);
  // Sends `step` for every record of `batch` that acknowledged the previous step, then receives
  // the replies. False when the client must stop.
  bool runStep(client::BlockingClient& connection, std::vector<CycleRecord*>& batch, Step step);
  bool checkReply(const CycleRecord& record, Step step, const ReservationReply& reply);
  void noteUnexpected(std::string what);
  void noteAck();

  client::Endpoint endpoint_;
  CycleLoadOptions options_;
  std::vector<Client> clients_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> acks_{0};
  std::atomic<int> running_{0};
  mutable std::mutex mutex_;
  std::condition_variable progress_;
  std::vector<std::string> unexpected_;
};

// What a verification pass learned from the restarted ledger.
struct DurabilitySummary {
  Units held = 0;      // units of found reservations that still hold (RESERVED, STARTED…)
  Units spent = 0;     // actual units of found SETTLED / SETTLED_WITH_DEBT reservations
  uint64_t found = 0;  // records the ledger knows
  uint64_t acked = 0;  // records with at least one acknowledged step
  uint64_t applied_unacked = 0;  // sent-but-unacknowledged steps that the ledger did apply
};

// Queries every record that was sent (pipelined on `connection`) and checks, with gtest
// expectations, that every acknowledged step is durable with the acknowledged outcome and that
// an unacknowledged step is either absent or applied exactly as sent. Then re-sends each known
// reserve with its id and digest, and each settled one's settle with another actual: both must
// come back as duplicates with the same receipt, refunding nothing.
DurabilitySummary verifyDurable(client::BlockingClient& connection,
                                const std::vector<CycleRecord>& records);

// The ledger's audit after a verifyDurable(): it conserves, and tenant-1/chat (the cycles'
// account, funded with `burst`) holds what the found reservations hold and has spent what they
// settled.
void expectAuditMatches(client::BlockingClient& connection, const DurabilitySummary& summary,
                        Units burst);

}  // namespace tally::testing
