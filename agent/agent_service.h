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
// The rules live in core and this class carries them out: AgentMachine (the window, the outbox's
// durability and order, the shutdown answers), UnknownReservations (RESERVATION_UNKNOWN),
// AgentPolicy (when to fetch the policy, what an answer changes, rollout modes), and
// core/agent_decisions.h (reserveRoute / followUpRoute / startRoute, planReserveAnswer for the
// shadow bookkeeping and RESERVATION_UNKNOWN, trackUsageUnknown for the USAGE_UNKNOWN gauge,
// AgentDeadlines for shutdown and drain). The wall clock is read once per event (a gateway
// request, a link answer, a timer tick) and passed down as now_ms.
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
  void setShardKeeper(ShardKeeper* keeper) { shards_ = keeper; }
  // Restores the outbox from the store and starts the timers.
  [[nodiscard]] Status start(std::vector<OutboxEntry> restored, uint64_t boot_epoch);
  // `alive` (optional) says whether the requester can still hear the answer.
  void handle(wire::RequestBody body, Respond respond, Alive alive = nullptr);

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
  using OnAnswer = std::function<void(central::LinkResult result, Respond respond)>;
  // What the shell holds for a forwarded request until the machine says Send or Drop.
  struct Held {
    wire::RequestBody body;
    Alive alive;
    std::string central_id;  // a reserve's id: remembered when sent
    OnAnswer on_answer;
  };

  bool usable() const;
  // Sends `body` to the ledger for a gateway when the window has room; `on_answer` gets the
  // link's result and the requester's Respond, unless the shutdown deadline answered it first.
  void forward(wire::RequestBody body, Respond respond, Alive alive,
               std::optional<OutboxEntry> follow_up, std::string central_id, OnAnswer on_answer,
               uint64_t now_ms);
  void sendWaiting(uint64_t now_ms);
  // Carries out the machine's effects (sends, replies, the durable write).
  void perform(AgentEffects effects, uint64_t now_ms);
  Respond takeResponder(uint64_t token);
  void reserve(const ReserveRequest& request, Respond respond, Alive alive, uint64_t now_ms);
  void onReserveAnswer(const ReserveRequest& request, RolloutMode mode, central::LinkResult result,
                       Respond respond);
  void start(const StartRequest& request, Respond respond, Alive alive, uint64_t now_ms);
  void followUp(OutboxKind kind, wire::RequestBody body, Respond respond, Alive alive,
                uint64_t now_ms);
  void query(const QueryRequest& request, Respond respond, Alive alive, uint64_t now_ms);
  void forwardOther(wire::RequestBody body, Respond respond, Alive alive, uint64_t now_ms);
  // Answers `body` from the shard keeper if it owns `reservation_id`; false otherwise.
  bool answeredByShards(const std::string& reservation_id, const wire::RequestBody& body,
                        const Respond& respond, uint64_t now_ms);

  void resolveUnknown(const std::string& id, Respond waiter);
  void resolutionFailed(const std::string& id, const std::string& why);
  void resolved(const std::string& id, wire::ResponseBody body, uint64_t now_ms);

  void enqueue(OutboxEntry entry, Respond respond, uint64_t now_ms);
  void commitOutbox(uint64_t now_ms);
  void pumpOutbox(uint64_t now_ms);
  void noteDelivered(OutboxKind kind, const std::string& id, const wire::ResponseBody& body,
                     uint64_t now_ms);
  void answerEveryPending(uint64_t now_ms);
  void fetchPolicy(uint64_t now_ms);
  void onTimer(uint64_t now_ms);

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

  AgentPolicy policy_;
  LocalBook local_;
  UnknownReservations unknown_;
  std::unordered_map<std::string, std::vector<Respond>> unknown_waiters_;  // gateway retries
  AgedIds usage_unknown_;
  AgentMachine machine_;  // the window, the outbox, shutdown answers
  uint64_t boot_epoch_ = 0;
  ShardKeeper* shards_ = nullptr;
  AgedIds central_ids_;

  std::unordered_map<uint64_t, Respond> responders_;  // by token: requesters waiting for a reply
  std::unordered_map<uint64_t, Held> held_;           // by token: forwarded, not yet sent
  uint64_t next_token_ = 1;
  uint64_t dropped_gone_ = 0;

  AgentDeadlines deadlines_;
  std::function<void()> on_drained_;
};

// Pure: the ledger request that delivers an outbox entry.
wire::RequestBody outboxRequest(const OutboxEntry& entry);

}  // namespace tally::agent
