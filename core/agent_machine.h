#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/outbox.h"

// The part of tally-agent's decisions that concerns gateway requests on their way to the ledger
// and the durable outbox (SPEC §7), as a pure machine: events and `now_ms` in, plain-value effects
// out. No libuv, SQLite, clock or RNG (backoff jitter is an argument). The shell keeps what it
// needs to carry the effects out (the request bodies and reply callbacks, by token) and feeds
// back what happened.
//
//  * Window: at most `window_max` forwarded requests are sent and unanswered; the rest wait, in
//    order, up to `waiting_max` (then kUnavailable at once). When a waiting request's turn comes,
//    its requester's liveness decides: gone → dropped, never sent; there → sent. A sent request
//    is always resolved by the shell (never dropped after sending).
//  * Outbox durability: queue() appends to the outbox; flush() (once per loop iteration) emits
//    one Persist effect for everything appended since; persisted(ok) answers each of them QUEUED
//    only if the write succeeded, otherwise takes the batch back out of the outbox (it is never
//    delivered nor blocks later entries) and answers kUnavailable. Only durable entries are ever
//    delivered; delivery is in order, one in flight.
//  * Shutdown: shutdown() answers every requester still waiting: a sent follow-up is queued and
//    persisted (QUEUED only after persisted(ok)); everything else gets kUnavailable "retry with
//    the same id". After that persist the outbox takes nothing more.
//
// Tokens are the shell's names for requesters (each used once, never 0). Single-threaded.

namespace tally {

struct AgentSend {
  uint64_t token = 0;  // send the request held under `token` to the ledger
  bool operator==(const AgentSend&) const = default;
};
struct AgentDrop {
  uint64_t token = 0;  // its requester is gone: not sent; release what the shell holds for it
  bool operator==(const AgentDrop&) const = default;
};
struct AgentReplyUnavailable {
  uint64_t token = 0;
  std::string message;
  bool operator==(const AgentReplyUnavailable&) const = default;
};
struct AgentReplyQueued {
  uint64_t token = 0;
  OutboxEntry entry;  // durable: its seq is in the store
  bool operator==(const AgentReplyQueued&) const = default;
};
struct AgentPersist {
  std::vector<OutboxEntry> entries;  // one transaction; then feed persisted()
  bool operator==(const AgentPersist&) const = default;
};
using AgentEffect =
    std::variant<AgentSend, AgentDrop, AgentReplyUnavailable, AgentReplyQueued, AgentPersist>;
using AgentEffects = std::vector<AgentEffect>;

inline constexpr const char* kAgentOutcomeUnknown = "outcome unknown; retry with the same id";
inline constexpr const char* kAgentShuttingDown =
    "the agent is shutting down; retry with the same id";

struct AgentMachineOptions {
  uint64_t window_max = 1'024;
  uint64_t waiting_max = 65'536;
  OutboxOptions outbox;
};

class AgentMachine {
 public:
  explicit AgentMachine(AgentMachineOptions options);

  // Rebuilds the outbox from the store (every entry durable).
  void restore(std::vector<OutboxEntry> entries);

  // --- the window -----------------------------------------------------------------------------
  // A gateway request to forward. `follow_up`: the outbox entry it becomes if it was sent and
  // its answer is lost (or the shutdown deadline comes first).
  AgentEffects submit(uint64_t token, std::optional<OutboxEntry> follow_up);
  // The waiting request whose turn it is, if the window has room.
  std::optional<uint64_t> nextToSend() const;
  // Its turn came and its requester is (not) alive: Send or Drop.
  AgentEffects admitNext(bool requester_alive);
  // The link's result for a sent `token` came back (answer or failure): frees its slot. False
  // if the token was already answered (shutdown): the shell then ignores the result.
  bool onResult(uint64_t token);

  // --- the outbox ------------------------------------------------------------------------------
  // Queues `entry` for requester `token`; its reply comes with persisted(). Full, or after the
  // shutdown's last write: kUnavailable at once.
  AgentEffects queue(uint64_t token, OutboxEntry entry, uint64_t now_ms);
  // End of a loop iteration: one Persist for everything queued since the last one (or nothing).
  AgentEffects flush();
  // The outcome of the last Persist.
  AgentEffects persisted(bool ok, const std::string& error);
  // The head to deliver now (durable, due, none in flight); the shell sends it and reports.
  std::optional<OutboxEntry> nextDelivery(uint64_t now_ms);
  // `delivered`: the ledger's final word (the entry leaves); otherwise a retry after backoff.
  void onDelivery(uint64_t seq, bool delivered, uint64_t now_ms, uint32_t jitter_permille);

  // --- shutdown --------------------------------------------------------------------------------
  // Answers every requester still waiting (see above); returns the effects, a Persist last if
  // anything was queued. Idempotent.
  AgentEffects shutdown(uint64_t now_ms);
  bool closed() const { return closed_; }

  size_t waiting() const { return waiting_.size(); }
  size_t sent() const { return sent_; }
  const Outbox& outbox() const { return outbox_; }
  uint64_t durableSeq() const { return durable_seq_; }

 private:
  struct Forwarded {
    std::optional<OutboxEntry> follow_up;
    bool sent = false;
  };
  struct Queued {
    uint64_t token = 0;
    OutboxEntry entry;
  };

  AgentMachineOptions options_;
  std::map<uint64_t, Forwarded> forwarded_;  // by token: waiting or sent, requester waiting
  std::deque<uint64_t> waiting_;
  size_t sent_ = 0;
  Outbox outbox_;
  uint64_t durable_seq_ = 0;         // every seq up to here is in the store
  std::vector<Queued> unpersisted_;  // appended, not yet in a Persist
  std::vector<Queued> persisting_;   // in the Persist whose outcome is awaited
  bool closing_ = false;             // shutdown() ran: the next Persist is the last
  bool closed_ = false;
};

}  // namespace tally
