#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/agent_decisions.h"
#include "core/agent_machine.h"
#include "core/agent_policy.h"
#include "core/agent_unknown.h"
#include "core/fair_scheduler.h"
#include "core/ledger_protocol.h"
#include "core/local_book.h"
#include "core/shard_keeping.h"

// Everything tally-agent decides about a gateway request, from its arrival to its answer, as one
// pure machine (SPEC §7): it routes each request (core/agent_decisions.h), keeps the window and
// the outbox (AgentMachine), local reservations (LocalBook), RESERVATION_UNKNOWN and its
// resolution by query with the same id (UnknownReservations), the policy (AgentPolicy), the
// USAGE_UNKNOWN gauge, the shutdown and drain deadlines, and hands shard-owned reservations and
// partition admissions to a ShardKeeping it borrows (optional). Events and `now_ms` in,
// plain-value effects out (takeEffects()); no libuv, SQLite, clock or RNG (backoff jitter is an
// argument). The shell (agent/agent_service.cc) carries the effects out and feeds back what
// happened; a simulator does the same with its own clock, network and storage.
//
// Tokens name gateway requesters and ledger calls alike (newToken(); never 0). For a request,
// the shell keeps the request as it came (to send it when AgentSend says so) and its reply
// channel, until a reply effect for the token, AgentDrop, or AgentToShards (then ShardKeeping's
// ShardGatewayAnswer for the same token answers it). Single-threaded.

namespace tally {

// Any other ledger request a gateway may send through the agent: forwarded as is.
struct AgentOtherRequest {
  bool changes_policy = false;  // publish or rollback: the policy is fetched again after it
};
using AgentRequest =
    std::variant<ReserveRequest, StartRequest, SettleRequest, ReleaseRequest, MarkUnknownRequest,
                 ReportOperationRequest, QueryRequest, AgentOtherRequest, ExtendRequest>;

struct AgentLinkState {
  bool connected = false;
  LinkHealth health = LinkHealth::kHealthy;
};

// What one ledger call returned, as the shell saw it.
struct AgentLedgerAnswer {
  LinkOutcome outcome = LinkOutcome::kLost;     // kNotSent: the link refused before sending
  std::string error;                            // not answered: the status message
  std::string error_detail;                     // not answered: code and message, for the log
  std::optional<ReservationReply> reservation;  // answered with a ReservationReply
  // Answered with a PolicyAnswer (its reply, and its policy if it has one).
  std::optional<PolicyReply> policy_reply;
  std::optional<Policy> policy;
  std::string label;  // the answer's outcome label, for the log
};

// --- effects (besides AgentMachine's AgentSend, AgentDrop, AgentReplyUnavailable,
// AgentReplyQueued, AgentPersist, and ShardKeeping's ShardNote for log lines) -----------------
struct AgentReplyReservation {  // answer `token` with this reply
  uint64_t token = 0;
  ReservationReply reply;
};
struct AgentReplyLedgerAnswer {  // answer `token` with the ledger's answer being fed right now
  uint64_t token = 0;
};
struct AgentShowPolicy {
  Generation unless_generation = 0;  // ShowPolicyRequest's (AgentPolicy::unlessGeneration)
};
using AgentCallBody = std::variant<QueryRequest, ReserveRequest, OutboxEntry, AgentShowPolicy>;
struct AgentCall {  // send `body` to the ledger; feed the result to onAnswer(call, …)
  uint64_t call = 0;
  AgentCallBody body;
};
// The ledger request a call sends: the one translation the agent's shell, the simulator's agent
// node and the agent fuzzer all use.
LedgerRequest callRequest(AgentCallBody body);
struct AgentRemoveDelivered {  // the outbox entry was delivered: remove it from the store
  uint64_t seq = 0;
};
struct AgentToShards {  // ShardKeeping answers `token` (after its commit)
  uint64_t token = 0;
};
struct AgentCountShadow {  // the shadow-decision metric
  ShadowDecision decision;
};
struct AgentShutdownAnswering {};  // the shutdown answers follow
struct AgentShutdownAnswered {};   // … and are done
struct AgentDrainDone {
  uint64_t left = 0;  // entries still in the outbox (durable, for the next start)
  bool connected = false;
};
using AgentCoreEffect =
    std::variant<AgentSend, AgentDrop, AgentReplyUnavailable, AgentReplyQueued, AgentPersist,
                 AgentReplyReservation, AgentReplyLedgerAnswer, AgentCall, AgentRemoveDelivered,
                 AgentToShards, AgentCountShadow, ShardNote, AgentShutdownAnswering,
                 AgentShutdownAnswered, AgentDrainDone>;
using AgentCoreEffects = std::vector<AgentCoreEffect>;

struct AgentCoreOptions {
  uint64_t policy_refresh_ms = 5'000;
  uint64_t outbox_entries_max = 1'000'000;
  uint64_t local_reservations_max = 100'000;
  uint64_t unknown_max = 100'000;
  int64_t unavailable_retry_after_ms = 1'000;
  uint64_t resolve_batch_max = 64;
  uint64_t central_ids_max = 100'000;
  uint64_t ledger_window_max = 1'024;
  uint64_t waiting_max = 65'536;
  // Fair scheduling of starts (core/fair_scheduler.h): per-route limits on started work; no
  // route listed, no scheduling.
  FairSchedulerOptions fair;
#ifdef TALLY_TEST_FAULTS
  UnknownReservationsFaults unknown_faults;  // core/agent_unknown.h
#endif
};

class AgentCore {
 public:
  // `alive(token)`: whether the requester of `token` can still hear an answer (asked when its
  // turn in the window comes). `shards` (optional) must outlive the core.
  AgentCore(AgentCoreOptions options, std::function<bool(uint64_t token)> alive,
            ShardKeeping* shards);
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // The shard keeping to hand shard-owned reservations to (null: none); before start().
  void setShards(ShardKeeping* shards) { shards_ = shards; }
  uint64_t newToken() { return next_token_++; }

  // Restores the outbox (every entry durable); from now on calls go out.
  void start(std::vector<OutboxEntry> restored, uint64_t now_ms);
  void stop() { started_ = false; }

  // A gateway request under `token`.
  void onRequest(uint64_t token, const AgentRequest& request, const AgentLinkState& link,
                 uint64_t now_ms);
  // The result of a ledger call (a forwarded request's token, or an AgentCall's call id).
  // `jitter_permille` (0..1000): the outbox's backoff jitter, should this be a failed delivery.
  void onAnswer(uint64_t call, const AgentLedgerAnswer& answer, const AgentLinkState& link,
                uint64_t now_ms, uint32_t jitter_permille);
  // The outcome of the last AgentPersist.
  void persisted(bool ok, const std::string& error, uint64_t now_ms);
  // The link (re)connected: the policy is fetched, the outbox pumped.
  void onConnected(const AgentLinkState& link, uint64_t now_ms);
  // End of a loop iteration: one AgentPersist for what was queued; requests the window has
  // room for are sent.
  void onIterationEnd(uint64_t now_ms);
  // The pump tick (every pump_interval_ms): local expiry, deadlines, policy refresh, outbox,
  // background RESERVATION_UNKNOWN resolution, the drain's end.
  void onTick(const AgentLinkState& link, uint64_t now_ms);

  // Shutdown: every requester still waiting is answered at now + timeout_ms (at once for 0).
  void beginShutdown(uint64_t timeout_ms, uint64_t now_ms);
  // Delivers what it can until the outbox is empty, the link is gone or timeout_ms passed;
  // then AgentDrainDone.
  void beginDrain(uint64_t timeout_ms, const AgentLinkState& link, uint64_t now_ms);

  AgentCoreEffects takeEffects() { return std::exchange(effects_, {}); }

  const AgentMachine& machine() const { return machine_; }
  const UnknownReservations& unknown() const { return unknown_; }
  const AgedIds& usageUnknown() const { return usage_unknown_; }
  const LocalBook& local() const { return local_; }
  const AgentPolicy& policy() const { return policy_; }
  const FairScheduler& fair() const { return fair_; }

 private:
  // What to do with the answer to a call.
  struct ReserveAnswerStep {
    ReserveRequest request;
    RolloutMode mode = RolloutMode::kEnforce;
  };
  struct StartAnswerStep {
    std::string id;
    bool slotted = false;  // holds a slot of the fair scheduler
  };
  struct FollowUpAnswerStep {
    OutboxEntry entry;
  };
  struct QueryAnswerStep {
    std::string id;
  };
  struct OtherAnswerStep {
    bool changes_policy = false;
  };
  struct ResolveQueryStep {
    std::string id;
  };
  struct ResolveResendStep {
    std::string id;
  };
  struct DeliveryStep {
    OutboxEntry entry;
  };
  struct PolicyStep {};
  using Step =
      std::variant<ReserveAnswerStep, StartAnswerStep, FollowUpAnswerStep, QueryAnswerStep,
                   OtherAnswerStep, ResolveQueryStep, ResolveResendStep, DeliveryStep, PolicyStep>;
  struct Forward {
    Step step;
    std::string central_id;  // a reserve's id: remembered when sent
  };

  void reserve(uint64_t token, const ReserveRequest& request, const AgentLinkState& link,
               uint64_t now_ms);
  void start(uint64_t token, const StartRequest& request, const AgentLinkState& link,
             uint64_t now_ms);
  void followUp(uint64_t token, OutboxKind kind, const AgentRequest& request,
                const AgentLinkState& link, uint64_t now_ms);
  void query(uint64_t token, const QueryRequest& request, const AgentLinkState& link,
             uint64_t now_ms);
  // Streaming top-up: a local (off/shadow) reservation through the LocalBook; a central one
  // forwarded while the link is usable, else UNAVAILABLE (never a local guess); a shard-owned
  // one UNAVAILABLE (this build does not grow a shard reservation).
  void extend(uint64_t token, const ExtendRequest& request, const AgentLinkState& link,
              uint64_t now_ms);
  void forward(uint64_t token, std::optional<OutboxEntry> follow_up, Step step,
               std::string central_id, uint64_t now_ms);
  void sendWaiting(uint64_t now_ms);
  void take(AgentEffects effects, uint64_t now_ms);
  // Fair scheduling: a start through the scheduler; admitted starts forwarded; the answer.
  void scheduleStart(uint64_t token, const StartRequest& request, uint64_t now_ms);
  void forwardAdmitted(uint64_t now_ms);
  void onStartAnswer(const StartAnswerStep& step, const AgentLedgerAnswer& answer, uint64_t now_ms);
  FairStartTerms fairTerms(const std::string& subject, const std::string& route,
                           uint32_t request_priority) const;
  void dispatchAnswer(uint64_t call, const AgentLedgerAnswer& answer, const AgentLinkState& link,
                      uint64_t now_ms, uint32_t jitter_permille);
  void call(Step step, AgentCallBody body);
  bool toShards(uint64_t token, const ShardOperation& operation, uint64_t now_ms);

  void onForwardAnswer(uint64_t token, Step step, const AgentLedgerAnswer& answer,
                       const AgentLinkState& link, uint64_t now_ms);
  void onCallAnswer(Step step, const AgentLedgerAnswer& answer, const AgentLinkState& link,
                    uint64_t now_ms, uint32_t jitter_permille);
  void resolveUnknown(const std::string& id, uint64_t waiter, const AgentLinkState& link);
  void resolutionFailed(const std::string& id, const std::string& why);
  // `reply` set: the waiters hear it; otherwise the ledger answer being fed.
  void resolved(const std::string& id, std::optional<ReservationReply> reply,
                const std::string& label, uint64_t now_ms);
  void enqueue(uint64_t token, OutboxEntry entry, uint64_t now_ms);
  void pumpOutbox(const AgentLinkState& link, uint64_t now_ms);
  void fetchPolicy(const AgentLinkState& link, uint64_t now_ms);
  void answerEveryPending(uint64_t now_ms);
  void unavailable(uint64_t token, std::string message);
  void note(ShardNote note) { effects_.push_back(std::move(note)); }

  AgentCoreOptions options_;
  std::function<bool(uint64_t)> alive_;
  ShardKeeping* shards_;
  bool started_ = false;
  uint64_t next_token_ = 1;
  AgentPolicy policy_;
  FairScheduler fair_;
  LocalBook local_;
  UnknownReservations unknown_;
  std::unordered_map<std::string, std::vector<uint64_t>> unknown_waiters_;  // gateway retries
  AgedIds usage_unknown_;
  AgedIds central_ids_;
  AgentMachine machine_;
  AgentDeadlines deadlines_;
  std::map<uint64_t, Forward> forwarded_;  // by token: submitted to the window, not answered
  std::map<uint64_t, Step> calls_;         // by call id: the core's own calls in flight
  AgentCoreEffects effects_;
};

}  // namespace tally
