#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/types.h"

// The agent's durable outbox, as a pure queue (SPEC §7): settle, release, mark-unknown and
// operation receipts that could not reach the ledger. The shell persists every entry before the
// gateway hears its acknowledgement and removes it once the ledger answered definitively.
//
// Delivery is strictly in order (head of line): a mark-unknown is never overtaken by the
// receipt that resolves it. At most one entry is in flight. Failed attempts back off
// exponentially; the jitter is an input (`jitter_permille`), so the queue stays deterministic.
// Redelivery is safe because every ledger operation is idempotent per reservation id.

namespace tally {

enum class OutboxKind : uint8_t { kSettle = 0, kRelease, kMarkUnknown, kReportOperation };
const char* outboxKindName(OutboxKind kind);

struct OutboxEntry {
  uint64_t seq = 0;  // assigned by append(), strictly increasing
  OutboxKind kind = OutboxKind::kSettle;
  std::string reservation_id;
  std::string operation_id;
  Units actual_units = 0;
  uint64_t enqueued_at_ms = 0;
  uint32_t attempts = 0;
  uint64_t next_attempt_ms = 0;

  bool operator==(const OutboxEntry&) const = default;
};

struct OutboxOptions {
  uint64_t entries_max = 1'000'000;
  uint64_t backoff_initial_ms = 50;
  uint64_t backoff_max_ms = 5'000;
};

enum class OutboxCode : uint8_t { kOk = 0, kFull, kNotHead, kNotInFlight };

class Outbox {
 public:
  explicit Outbox(OutboxOptions options = {});

  // Appends; kFull (nothing changed) at entries_max: the caller answers the gateway with a
  // retryable error instead of an acknowledgement.
  OutboxCode append(OutboxEntry entry, uint64_t now_ms, uint64_t* seq);
  // Rebuilds from the durable record (any order); the next seq continues after the largest.
  void restore(std::vector<OutboxEntry> entries);

  // Takes back the entries from `seq` on: the tail the shell failed to write durably, never
  // acknowledged (the gateway retries it), so it must never be delivered nor block the queue.
  // `*discarded` says how many. kNotHead (nothing changed) if that tail holds the entry in
  // flight: only durable entries are ever sent.
  OutboxCode discardFrom(uint64_t seq, size_t* discarded);

  // The head, if it is due and nothing is in flight; null otherwise.
  const OutboxEntry* due(uint64_t now_ms) const;
  OutboxCode markSent(uint64_t seq);
  // The ledger answered (any definitive reply): the head leaves the queue.
  OutboxCode onDelivered(uint64_t seq);
  // Transport failure or timeout: the head stays and is retried after a backoff.
  OutboxCode onFailed(uint64_t seq, uint64_t now_ms, uint32_t jitter_permille);

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool inFlight() const { return in_flight_; }
  uint64_t oldestAgeMs(uint64_t now_ms) const;
  const std::deque<OutboxEntry>& entries() const { return entries_; }

 private:
  OutboxOptions options_;
  std::deque<OutboxEntry> entries_;
  uint64_t next_seq_ = 1;
  bool in_flight_ = false;
};

}  // namespace tally
