#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/agent_core.h"
#include "core/link_health.h"
#include "core/shard_keeping.h"
#include "tests/sim/network.h"
#include "tests/sim/rng.h"
#include "tests/sim/shard_store.h"
#include "tests/sim/trace.h"
#include "tests/sim/workload.h"
#include "wire/codec.h"

// One simulated tally-agent process: the real agent machine (AgentCore with its AgentMachine,
// AgentPolicy, LocalBook and outbox) and the real shard keeping (ShardKeeping around a
// ShardBook), driven through their seam as agent/agent_service.cc and agent/shard_keeper.cc
// drive them (docs/ARCHITECTURE.md "Driving the agent without its shell"), with the
// simulator's clock, network and storage:
//
//  * its gateway talks to it over a local socket (request(); answers come out of
//    takeReplies());
//  * it talks to the ledger over the simulated network (frames to kLedgerNode), with the
//    ledger link's rules: a call while not connected fails at once, an unanswered call fails
//    after request_timeout_ms, a lost connection fails every call in flight; a
//    LinkHealthMonitor (the real one) turns timeouts and answers into the link's health;
//  * its durable state (the outbox rows and a SimShardStore) survives a crash; a restart
//    gets a new boot epoch, restores the shard book and the outbox, and starts over.
//
// Every entry point ends a loop iteration as the shell does (onIterationEnd, then the shard
// keeping's commit).

namespace tally::sim {

// An account the agent keeps shards for is dropped after this long without a reserve (so that,
// at the end of a run, its last shards expire and are reported).
inline constexpr uint64_t kAccountIdleMs = 20'000;

#ifdef TALLY_TEST_FAULTS
struct AgentFaults {
  ShardBookFaults book;      // core's injected shard-book bugs, set on every book it builds
  FairSchedulerFaults fair;  // core's injected fair-scheduler bugs, in every AgentCore it builds
  UnknownReservationsFaults unknown;  // core's injected resolution bugs, likewise
};
#endif

// One tenant's fairness on a fairly scheduled route, as one agent measured it over a run.
struct TenantFairness {
  std::string tenant;
  double error = 0;  // the worst |admitted share - fair share| of a completed window, 0 … 1
  uint32_t budget_permille = 0;
  uint64_t windows = 0;  // completed windows the tenant waited or was admitted in
};

// Rounding of a window's error against an integer budget in ‰.
inline constexpr double kFairnessEpsilonPermille = 1e-6;

// What the simulator's watch of the fair scheduler found.
struct FairViolation {
  bool over_budget = false;  // a window's error above the budget; otherwise a broken rule
  std::string detail;
};

class AgentNode {
 public:
  using Reply = std::pair<uint64_t, wire::ResponseBody>;  // (the gateway's tag, the answer)

  AgentNode(NodeId id, uint32_t index, Rng rng, const ShardCrypto* crypto, Network* network,
            Trace* trace, std::function<bool()> ledger_up);

  NodeId id() const { return id_; }
  const std::string& gatewayName() const { return gateway_name_; }
  const PublicKey& gatewayKey() const { return gateway_key_; }
  bool up() const { return core_ != nullptr; }
  uint64_t bootEpoch() const { return boot_epoch_; }

  // The accounts its configuration keeps shards for (from its next start on).
  void configureAccounts(std::vector<SubjectRoute> accounts) { accounts_ = std::move(accounts); }
  // Fair scheduling of the route's starts (from its next start on): `started_max` and the
  // fairness window of `fair`. After every entry point the agent then reads its scheduler's
  // FairnessMeter (a completed window's per-tenant errors, against `budget_permille`) and
  // checks the scheduler's rules (below); takeFairViolations() hands out what failed.
  void configureFair(const FairWorkload& fair) { fair_ = fair; }
  std::vector<FairViolation> takeFairViolations() { return std::exchange(fair_violations_, {}); }
  // By tenant, over every boot.
  const std::map<std::string, TenantFairness>& fairness() const { return fair_worst_; }
  // Boots the process (boot epoch + 1); false, with `error`, if the durable state cannot be
  // restored (it stays down).
  bool start(uint64_t now_ms, std::string* error);
  void crash(uint64_t now_ms);

  // A gateway request under the gateway's `tag`; when down, answered UNAVAILABLE at once.
  void request(uint64_t tag, const wire::RequestBody& body, uint64_t now_ms);
  void onFrame(const std::vector<uint8_t>& frame, uint64_t now_ms);
  // The pump timer (local expiry, outbox, policy refresh) and the link's timeouts.
  void pump(uint64_t now_ms);
  // The shard keeper's maintain timer.
  void maintain(uint64_t now_ms);
  std::vector<Reply> takeReplies() { return std::exchange(replies_, {}); }

  void failWrites(uint64_t count) {
    outbox_failing_ = count;
    shard_store_.failCommits(count);
  }

  // For the checks (up only).
  const ShardBook& book() const { return keeping_->book(); }
  size_t outboxDepth() const { return core_->machine().outbox().size(); }
  size_t outboxRows() const { return outbox_rows_.size(); }
  bool busy() const;  // calls in flight or answers owed
  // Changes whenever the process or its machines may have changed.
  uint64_t version() const { return version_; }
  uint64_t crashes() const { return crashes_; }
  // Shard report frames this node sent while receipts still held units and then superseded by
  // a later report of the same shard (across restarts): stale, a rogue's replays. Taken once.
  std::deque<std::vector<uint8_t>> takeStaleReports() { return std::exchange(stale_reports_, {}); }
#ifdef TALLY_TEST_FAULTS
  void setFaults(AgentFaults faults) { faults_ = faults; }
#endif

 private:
  enum class CallKind : uint8_t { kCore, kIssue, kReport, kStatus };
  struct Call {
    CallKind kind = CallKind::kCore;
    uint64_t core_call = 0;  // kCore: the token or call id to feed onAnswer
    SubjectRoute account;    // kIssue
    std::string shard_id;    // kReport
    uint64_t sent_ms = 0;
  };

  AgentLinkState linkState() const { return {.connected = connected_, .health = monitor_.state()}; }
  bool linkUsable() const;
  void updateLink(uint64_t now_ms);
  void send(Call call, wire::RequestBody body, uint64_t now_ms);
  void answered(Call call, wire::ResponseBody body, uint64_t now_ms);
  void failed(Call call, const std::string& why, uint64_t now_ms);
  void endIteration(uint64_t now_ms);
  void perform(uint64_t now_ms, const wire::ResponseBody* answer = nullptr);
  void reply(uint64_t token, wire::ResponseBody body);
  void trace(uint64_t now_ms, const std::string& line);
  // The watch of the fair scheduler: the rules SPEC §7 and issue 10 state, checked where they
  // can fail, from what this process sees (its gateway's requests, its ledger's answers, the
  // starts it sends):
  //  * it never holds a reservation the ledger did not answer RESERVED to this agent;
  //  * within a tenant and priority class, starts are sent in the order they began to wait,
  //    except one sent at or past its reservation's expiry (handed out so the ledger answers
  //    EXPIRED);
  //  * after a pump (the scheduler's tick), no start waits past its reservation's expiry.
  void fairRequest(uint64_t token, const std::string& id, uint64_t now_ms);
  void fairSent(uint64_t token, uint64_t now_ms);
  void fairWatch(uint64_t now_ms, bool pumped);
  void fairViolation(bool over_budget, std::string detail, uint64_t now_ms);

  NodeId id_;
  std::string gateway_name_;
  PublicKey gateway_key_{};
  Rng rng_;
  const ShardCrypto* crypto_;
  Network* network_;
  Trace* trace_;
  std::function<bool()> ledger_up_;
  std::vector<SubjectRoute> accounts_;

  // Durable: survives a crash.
  std::map<uint64_t, OutboxEntry> outbox_rows_;
  SimShardStore shard_store_;
  uint64_t boot_epoch_ = 0;
  uint64_t outbox_failing_ = 0;

  // The process.
  std::unique_ptr<ShardKeeping> keeping_;
  std::unique_ptr<AgentCore> core_;
  std::map<uint64_t, uint64_t> tags_;           // gateway token → the gateway's tag
  std::map<uint64_t, wire::RequestBody> held_;  // token → the request, until sent
  std::map<uint64_t, Call> calls_;              // by wire request id
  std::vector<uint64_t> failed_now_;            // calls refused while not connected
  LinkHealthMonitor monitor_{LinkHealthThresholds{}, 0};
  bool connected_ = false;
  uint64_t next_request_id_ = 1;  // across restarts: never reused on this node
  std::vector<Reply> replies_;
  uint64_t version_ = 0;
  uint64_t crashes_ = 0;
  static constexpr size_t kStaleReportsKept = 4;
  std::map<std::string, std::vector<uint8_t>> holding_reports_;  // by shard id
  std::deque<std::vector<uint8_t>> stale_reports_;
#ifdef TALLY_TEST_FAULTS
  AgentFaults faults_;
#endif

  // Fair scheduling (configureFair).
  struct FairWaiting {
    std::pair<std::string, uint32_t> queue;  // (tenant, class)
    std::string id;
    uint64_t expires_at_ms = 0;
  };
  std::optional<FairWorkload> fair_;
  std::map<std::string, uint64_t> ledger_reserved_;  // the route's ids answered RESERVED → expiry
  std::map<uint64_t, FairWaiting> fair_waiting_;     // waiting starts by token (this boot)
  std::map<std::pair<std::string, uint32_t>, std::deque<uint64_t>> fair_queues_;  // arrival order
  uint64_t fair_windows_seen_ = 0;  // of this boot's meter
  std::map<std::string, TenantFairness> fair_worst_;
  std::vector<FairViolation> fair_violations_;
};

}  // namespace tally::sim
