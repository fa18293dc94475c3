#include "core/outbox.h"

#include <algorithm>

#include "core/assert.h"
#include "core/checked_math.h"

namespace tally {

const char* outboxKindName(OutboxKind kind) {
  switch (kind) {
    case OutboxKind::kSettle: return "settle";
    case OutboxKind::kRelease: return "release";
    case OutboxKind::kMarkUnknown: return "mark-unknown";
    case OutboxKind::kReportOperation: return "report-operation";
  }
  return "unknown";
}

Outbox::Outbox(OutboxOptions options) : options_(options) {
  TALLY_ASSERT(options_.backoff_initial_ms > 0);
  TALLY_ASSERT(options_.backoff_max_ms >= options_.backoff_initial_ms);
}

OutboxCode Outbox::append(OutboxEntry entry, uint64_t now_ms, uint64_t* seq) {
  if (entries_.size() >= options_.entries_max) return OutboxCode::kFull;
  entry.seq = next_seq_++;
  entry.enqueued_at_ms = now_ms;
  entry.attempts = 0;
  entry.next_attempt_ms = now_ms;
  *seq = entry.seq;
  entries_.push_back(std::move(entry));
  return OutboxCode::kOk;
}

void Outbox::restore(std::vector<OutboxEntry> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const OutboxEntry& a, const OutboxEntry& b) { return a.seq < b.seq; });
  for (OutboxEntry& entry : entries) {
    next_seq_ = std::max(next_seq_, entry.seq + 1);
    entries_.push_back(std::move(entry));
  }
  in_flight_ = false;
}

OutboxCode Outbox::discardFrom(uint64_t seq, size_t* discarded) {
  *discarded = 0;
  if (in_flight_ && !entries_.empty() && entries_.front().seq >= seq) return OutboxCode::kNotHead;
  while (!entries_.empty() && entries_.back().seq >= seq) {
    entries_.pop_back();
    ++*discarded;
  }
  return OutboxCode::kOk;
}

const OutboxEntry* Outbox::due(uint64_t now_ms) const {
  if (in_flight_ || entries_.empty()) return nullptr;
  const OutboxEntry& head = entries_.front();
  return now_ms >= head.next_attempt_ms ? &head : nullptr;
}

OutboxCode Outbox::markSent(uint64_t seq) {
  if (entries_.empty() || entries_.front().seq != seq) return OutboxCode::kNotHead;
  TALLY_ASSERT(!in_flight_);
  in_flight_ = true;
  ++entries_.front().attempts;
  return OutboxCode::kOk;
}

OutboxCode Outbox::onDelivered(uint64_t seq) {
  if (entries_.empty() || entries_.front().seq != seq) return OutboxCode::kNotHead;
  if (!in_flight_) return OutboxCode::kNotInFlight;
  entries_.pop_front();
  in_flight_ = false;
  return OutboxCode::kOk;
}

OutboxCode Outbox::onFailed(uint64_t seq, uint64_t now_ms, uint32_t jitter_permille) {
  if (entries_.empty() || entries_.front().seq != seq) return OutboxCode::kNotHead;
  if (!in_flight_) return OutboxCode::kNotInFlight;
  in_flight_ = false;
  OutboxEntry& head = entries_.front();
  const uint32_t doublings = std::min<uint32_t>(head.attempts > 0 ? head.attempts - 1 : 0, 30);
  const uint64_t base = std::min(options_.backoff_max_ms, options_.backoff_initial_ms << doublings);
  // Jitter spreads retries of many agents after a shared outage: up to +100% of the base.
  const uint64_t jitter = base * std::min<uint32_t>(jitter_permille, 1000) / 1000;
  head.next_attempt_ms = saturatingAdd(now_ms, std::min(options_.backoff_max_ms, base + jitter));
  return OutboxCode::kOk;
}

uint64_t Outbox::oldestAgeMs(uint64_t now_ms) const {
  if (entries_.empty()) return 0;
  const uint64_t enqueued = entries_.front().enqueued_at_ms;
  return now_ms > enqueued ? now_ms - enqueued : 0;
}

}  // namespace tally
