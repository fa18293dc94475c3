#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/gateway_server.h"
#include "agent/metrics.h"
#include "agent/outbox_store.h"
#include "agent/shard_keeper.h"
#include "central-client/ledger_link.h"
#include "common/log.h"
#include "core/agent_core.h"
#include "core/agent_decisions.h"
#include "core/agent_machine.h"
#include "core/agent_policy.h"
#include "core/agent_unknown.h"
#include "core/local_book.h"
#include "core/outbox.h"
#include "core/policy.h"
#include "wire/codec.h"

// What tally-agent does with each gateway request (SPEC §7), between the GatewayServer and the
// LedgerLink:
//
//  * Rollout per route (policy fetched with ShowPolicy on connect and every policy_refresh_ms;
//    none known → enforce): `off` admits locally (origin "off"); `shadow` asks the ledger,
//    records the decision and admits locally (origin "shadow") what the ledger refused;
//    `enforce` forwards. Later operations on a local reservation are answered locally.
//  * Link usable (connected, not PARTITIONED): every operation is forwarded. A reserve whose
//    answer is lost becomes RESERVATION_UNKNOWN: the gateway hears kUnavailable "outcome
//    unknown; retry with the same id"; the agent resolves it by Query with the same id (and, if
//    the ledger never saw it, re-sends the same reserve), in the background and when the
//    gateway retries. It never invents an id.
//  * Link unusable: reserve → REJECTED (ledger-unavailable, retry-after); start → kUnavailable;
//    settle / release / markUnknown / reportOperation → the durable outbox (fsync'd before the
//    QUEUED reply; one SQLite transaction per loop iteration). While the outbox is non-empty,
//    those operations always queue behind it (never overtake). A forwarded one whose answer is
//    lost is queued too.
//  * The outbox is delivered in order, one entry in flight, whenever the link is connected;
//    any ledger answer counts as delivered (non-OK codes are logged); transport failures back
//    off with jitter. An entry is durable (and its QUEUED reply sent) only once its write
//    succeeded; a batch whose write failed is taken back out of the queue and answered
//    kUnavailable, so it is never delivered and never blocks the entries after it.
//  * A gateway's request waits in a bounded queue until the link has room (ledger_window_max
//    requests of this agent's in flight). One whose requester (its connection) is gone by then
//    is dropped, never sent; one already sent is always resolved (a reserve through
//    RESERVATION_UNKNOWN and query, a follow-up lands or is queued).
//  * Shutdown: beginShutdown(timeout) arms one deadline. Until then requests finish normally;
//    at it (or when drain() ends, whichever is first) every requester still waiting is answered:
//    a follow-up already sent is queued durably (QUEUED only after its write), every other
//    request gets kUnavailable "retry with the same id". That write is the outbox's last:
//    nothing is queued after it.
//
// Every one of those decisions is core's AgentCore (core/agent_core.h), which sequences the
// agent's machines (AgentMachine, UnknownReservations, AgentPolicy, LocalBook, the routes of
// core/agent_decisions.h, and ShardKeeping for shard-owned reservations). This class only
// translates: it reads the wall clock once per event (a gateway request, a link answer, a timer
// tick, the end of a loop iteration), hands the event to the core, and carries the effects out
// (sends over the LedgerLink, writes the outbox store, replies, logs and counts).
//
// Owns its timers and check handle; borrows loop, link, store, metrics and logger, which must
// outlive it. Single-threaded (the loop thread).

namespace tally::agent {

struct AgentServiceOptions {
  uint64_t policy_refresh_ms = 5'000;
  uint64_t outbox_entries_max = 1'000'000;
  uint64_t local_reservations_max = 100'000;
  uint64_t unknown_max = 100'000;
  int64_t unavailable_retry_after_ms = 1'000;
  uint64_t pump_interval_ms = 20;
  uint64_t resolve_batch_max = 64;
  uint64_t seed = 0;
  // Reservation ids recently sent to the ledger: never admitted from a shard during a
  // partition (the ledger may hold them already).
  uint64_t central_ids_max = 100'000;
  // Gateway requests sent and unanswered at most (the link's in-flight count); more wait.
  uint64_t ledger_window_max = 1'024;
  // Gateway requests waiting for the window at most; beyond, kUnavailable at once.
  uint64_t waiting_max = 65'536;
  // Fair scheduling of starts per route (core/fair_scheduler.h); none listed: off.
  FairSchedulerOptions fair;
};

class AgentService {
 public:
  AgentService(uv_loop_t* loop, central::LedgerLink* link, OutboxStore* store,
               AgentMetrics* metrics, Logger* logger, AgentServiceOptions options);
  ~AgentService();
  AgentService(const AgentService&) = delete;
  AgentService& operator=(const AgentService&) = delete;

  // Emergency shards (docs/SHARDS.md): operations on reservations `keeper` owns are answered by
  // it in any health state, and partition-time reserves in enforce mode are admitted from its
  // usable shards. Optional (null: no shards); set before start(); must outlive the service.
  void setShardKeeper(ShardKeeper* keeper) {
    shards_ = keeper;
    core_.setShards(keeper != nullptr ? &keeper->keeping() : nullptr);
  }
  // Restores the outbox from the store and starts the timers.
  [[nodiscard]] Status start(std::vector<OutboxEntry> restored, uint64_t boot_epoch);
  // `alive` (optional) says whether the requester can still hear the answer.
  void handle(wire::RequestBody&& body, Respond respond, Alive alive = nullptr);

  // Arms the shutdown deadline (now + timeout_ms): at it, every requester still waiting is
  // answered (see above) and the outbox closes. Call once, before drain().
  void beginShutdown(uint64_t timeout_ms);
  // Delivers what it can of the outbox while the ledger is connected, until it is empty or
  // `timeout_ms` passed; then calls `on_done`. Entries left stay durable for the next start.
  void drain(uint64_t timeout_ms, std::function<void()> on_done);
  // Closes the timers and the check handle.
  void stop();

  GaugeSnapshot gauges() const;
  // Gateway requests dropped unsent because their requester was gone.
  uint64_t droppedGone() const { return dropped_gone_; }

 private:
  // What the shell holds for a gateway request until its answer.
  struct Held {
    wire::RequestBody body;  // sent as is when the core says AgentSend
    Alive alive;
  };

  AgentLinkState linkState() const;
  // Carries out the core's effects. `answer`: the ledger answer being fed, moved to the
  // requester an AgentReplyLedgerAnswer names (the core names at most one).
  void perform(wire::ResponseBody* answer = nullptr);
  void reply(uint64_t token, wire::ResponseBody&& body);
  void send(uint64_t call, wire::RequestBody&& body);
  void onLinkResult(uint64_t call, central::LinkResult&& result);
  void note(const ShardNote& note);

  static void onCheck(uv_check_t* check);
  static void onPump(uv_timer_t* timer);

  uv_loop_t* loop_;
  central::LedgerLink* link_;
  OutboxStore* store_;
  AgentMetrics* metrics_;
  Logger* logger_;
  AgentServiceOptions options_;
  std::mt19937_64 rng_;

  uv_check_t check_{};
  uv_timer_t pump_timer_{};
  std::vector<uv_handle_t*> handles_;  // initialized, closed by stop()
  int open_handles_ = 0;
  bool started_ = false;

  AgentCore core_;
  uint64_t boot_epoch_ = 0;
  ShardKeeper* shards_ = nullptr;

  std::unordered_map<uint64_t, Respond> responders_;  // by token: requesters waiting for a reply
  std::unordered_map<uint64_t, Held> held_;           // by token: not yet sent or answered
  uint64_t dropped_gone_ = 0;
  size_t shutdown_pending_ = 0;  // requesters waiting when the shutdown answers began
  std::function<void()> on_drained_;
};

}  // namespace tally::agent
