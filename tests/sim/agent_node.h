#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
  ShardBookFaults book;  // core's injected shard-book bugs, set on every book it builds
};
#endif

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
#ifdef TALLY_TEST_FAULTS
  AgentFaults faults_;
#endif
};

}  // namespace tally::sim
