#include "core/agent_machine.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"

namespace tally {

AgentMachine::AgentMachine(AgentMachineOptions options)
    : options_(options), outbox_(options.outbox) {
  TALLY_ASSERT(options_.window_max >= 1);
}

void AgentMachine::restore(std::vector<OutboxEntry> entries) {
  for (const OutboxEntry& entry : entries) durable_seq_ = std::max(durable_seq_, entry.seq);
  outbox_.restore(std::move(entries));
}

// --- the window ----------------------------------------------------------------------------------

AgentEffects AgentMachine::submit(uint64_t token, std::optional<OutboxEntry> follow_up) {
  TALLY_ASSERT(token != 0 && !forwarded_.contains(token));
  if (closing_) return {AgentReplyUnavailable{token, kAgentShuttingDown}};
  if (waiting_.size() >= options_.waiting_max) {
    return {AgentReplyUnavailable{
        token, "the agent has too many requests waiting for the ledger; retry with the same id"}};
  }
  forwarded_.emplace(token, Forwarded{.follow_up = std::move(follow_up)});
  waiting_.push_back(token);
  return {};
}

std::optional<uint64_t> AgentMachine::nextToSend() const {
  if (waiting_.empty() || sent_ >= options_.window_max) return std::nullopt;
  return waiting_.front();
}

AgentEffects AgentMachine::admitNext(bool requester_alive) {
  const std::optional<uint64_t> next = nextToSend();
  TALLY_ASSERT(next.has_value());
  waiting_.pop_front();
  auto it = forwarded_.find(*next);
  TALLY_ASSERT(it != forwarded_.end() && !it->second.sent);
  if (!requester_alive) {
    // Nobody would hear the answer and the ledger never saw it: dropped before it is sent.
    forwarded_.erase(it);
    return {AgentDrop{*next}};
  }
  it->second.sent = true;  // from here on it is resolved, never dropped
  ++sent_;
  return {AgentSend{*next}};
}

bool AgentMachine::onResult(uint64_t token) {
  auto it = forwarded_.find(token);
  if (it == forwarded_.end()) return false;
  TALLY_ASSERT(it->second.sent && sent_ > 0);
  --sent_;
  forwarded_.erase(it);
  return true;
}

// --- the outbox ----------------------------------------------------------------------------------

AgentEffects AgentMachine::queue(uint64_t token, OutboxEntry entry, uint64_t now_ms) {
  if (closed_) return {AgentReplyUnavailable{token, kAgentShuttingDown}};
  uint64_t seq = 0;
  if (outbox_.append(std::move(entry), now_ms, &seq) == OutboxCode::kFull) {
    return {AgentReplyUnavailable{token, "the agent's outbox is full; retry later"}};
  }
  TALLY_ASSERT(outbox_.entries().back().seq == seq && seq > durable_seq_);
  unpersisted_.push_back(Queued{.token = token, .entry = outbox_.entries().back()});
  return {};
}

AgentEffects AgentMachine::flush() {
  if (unpersisted_.empty() || !persisting_.empty()) return {};
  persisting_ = std::exchange(unpersisted_, {});
  AgentPersist persist;
  persist.entries.reserve(persisting_.size());
  for (const Queued& queued : persisting_) persist.entries.push_back(queued.entry);
  return {std::move(persist)};
}

AgentEffects AgentMachine::persisted(bool ok, const std::string& error) {
  TALLY_ASSERT(!persisting_.empty());
  std::vector<Queued> batch = std::exchange(persisting_, {});
  AgentEffects effects;
  effects.reserve(batch.size());
  if (ok) {
    durable_seq_ = batch.back().entry.seq;  // the point where QUEUED becomes true
    for (Queued& queued : batch) {
      effects.push_back(AgentReplyQueued{queued.token, std::move(queued.entry)});
    }
  } else {
    // Never acknowledged, so taken back: never delivered, and what follows is not blocked.
    // Anything queued after this batch was not persisted either: it goes with it.
    size_t discarded = 0;
    const OutboxCode code = outbox_.discardFrom(batch.front().entry.seq, &discarded);
    TALLY_ASSERT(code == OutboxCode::kOk);  // only durable entries are ever in flight
    for (Queued& queued : std::exchange(unpersisted_, {})) batch.push_back(std::move(queued));
    TALLY_ASSERT(discarded == batch.size());
    for (const Queued& queued : batch) {
      effects.push_back(AgentReplyUnavailable{
          queued.token,
          "the agent could not queue it durably: " + error + "; retry with the same ids"});
    }
  }
  if (closing_ && unpersisted_.empty()) closed_ = true;
  return effects;
}

std::optional<OutboxEntry> AgentMachine::nextDelivery(uint64_t now_ms) {
  const OutboxEntry* head = outbox_.due(now_ms);
  if (head == nullptr || head->seq > durable_seq_) return std::nullopt;
  const OutboxEntry entry = *head;
  const OutboxCode sent = outbox_.markSent(entry.seq);
  TALLY_ASSERT(sent == OutboxCode::kOk);
  return entry;
}

void AgentMachine::onDelivery(uint64_t seq, bool delivered, uint64_t now_ms,
                              uint32_t jitter_permille) {
  const OutboxCode code =
      delivered ? outbox_.onDelivered(seq) : outbox_.onFailed(seq, now_ms, jitter_permille);
  TALLY_ASSERT(code == OutboxCode::kOk);
}

// --- shutdown ------------------------------------------------------------------------------------

AgentEffects AgentMachine::shutdown(uint64_t now_ms) {
  if (closing_) return {};
  closing_ = true;
  AgentEffects effects;
  waiting_.clear();
  // In token order: follow-ups enter the outbox in the order they were handed in.
  for (auto& [token, request] : std::exchange(forwarded_, {})) {
    if (!request.sent) {
      effects.push_back(
          AgentReplyUnavailable{token,
                                "not sent to the ledger before shutdown; retry with the "
                                "same id"});
    } else if (request.follow_up.has_value()) {
      AgentEffects queued = queue(token, std::move(*request.follow_up), now_ms);
      effects.insert(effects.end(), queued.begin(), queued.end());
    } else {
      effects.push_back(AgentReplyUnavailable{token, kAgentOutcomeUnknown});
    }
  }
  sent_ = 0;
  AgentEffects persist = flush();
  effects.insert(effects.end(), persist.begin(), persist.end());
  if (persisting_.empty() && unpersisted_.empty()) closed_ = true;
  return effects;
}

}  // namespace tally
