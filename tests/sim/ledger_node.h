#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/ledger_requests.h"
#include "tests/sim/network.h"
#include "tests/sim/storage.h"
#include "tests/sim/trace.h"
#include "wire/codec.h"

// The simulated tally-ledger process: the real core Ledger and its request dispatch
// (LedgerRequests, core/ledger_requests.h) behind the real wire decoding, group commit and
// restore, as ledger/server.cc runs them, without libuv or SQLite.
//
//  * receive() decodes one frame and answers it with LedgerRequests::apply, the daemon's own
//    dispatch; the reply is held, not sent.
//  * commit() takes the changed rows (storeBatchOf, ledger/store_batch.cc) into the SimStore;
//    only once that succeeded are the held replies sent. A failed commit stops the process
//    (the server's "stop serving"): nothing held is sent.
//  * crash() loses the Ledger, the uncommitted changes and every held reply; restart() builds a
//    new Ledger from the durable rows through restoreLedger (ledger/restore.cc).

namespace tally::sim {

inline constexpr NodeId kLedgerNode = 0;

// A reply the ledger made durable and sent, with the request it answers, for the checker.
struct CommittedReply {
  NodeId to = 0;
  wire::RequestBody request;
  wire::Response response;
  // A fresh admission (RESERVED, not a duplicate) while its subject/route owed debt.
  bool admitted_in_debt = false;
  std::vector<LedgerEvent> events;  // what LedgerRequests::apply reported
};

#ifdef TALLY_TEST_FAULTS
// Shell-side faults (the simulator's ledger shell, not core) for the can-fail test.
struct NodeFaults {
  bool reply_before_commit = false;  // send replies before their batch is durable
  LedgerFaults ledger;               // core's injected bugs, set on every Ledger it builds
};
#endif

class LedgerNode {
 public:
  LedgerNode(Rng rng, LedgerOptions options, Network* network, Trace* trace);

  bool up() const { return ledger_ != nullptr; }
  Ledger& ledger() { return *ledger_; }
  const Ledger& ledger() const { return *ledger_; }
  SimStore& store() { return store_; }
  const LedgerOptions& options() const { return options_; }

  void receive(const Envelope& envelope, uint64_t now_ms);
  // Applies a request that does not come over the network (the run's first policy).
  void applyLocal(const wire::RequestBody& request, uint64_t now_ms);
  // Expiry, hard-limit closing and compaction, as the server's tick timer does (not durable
  // until the next commit).
  void tick(uint64_t now_ms);
  // Commits the batch; returns the replies sent. On a failed commit the process stops
  // (crashed; restart() brings it back).
  std::vector<CommittedReply> commit(uint64_t now_ms);
  bool hasUncommitted() const { return !held_.empty() || dirty_; }

  // Requests from `node` come as from enrolled gateway `gateway_name`, as over an agent's TLS
  // link (LedgerRequests::apply binds its reservations to it); any other node's as over an
  // --insecure link.
  void bindGateway(NodeId node, std::string gateway_name) {
    gateways_[node] = std::move(gateway_name);
  }

  // The ledger key (signs shard grants); set on every Ledger it builds. Must outlive it.
  void setShardCrypto(const ShardCrypto* crypto);

  void crash(uint64_t now_ms);
  // False (and the process stays down) if the durable rows cannot be restored.
  bool restart(uint64_t now_ms, std::string* error);

  // The two halves of an expiry with the run's other events between them (Ledger::beginExpiry,
  // completeExpiry): a start can race the expiry task.
  bool beginExpiry(const std::string& reservation_id, uint64_t now_ms);
  bool completeExpiry(const std::string& reservation_id, uint64_t now_ms);

  uint64_t crashes() const { return crashes_; }
  // Changes whenever the process or its Ledger may have changed (a tick that changed nothing
  // and a commit of no rows leave it): a step that leaves it unchanged cannot have broken a
  // check of the ledger's state.
  uint64_t version() const { return version_; }
#ifdef TALLY_TEST_FAULTS
  void setFaults(NodeFaults faults);
#endif

 private:
  // LedgerRequests::apply, the daemon's dispatch; fills `held`'s admission flag and events.
  wire::ResponseBody dispatch(const wire::RequestBody& body, uint64_t now_ms, CommittedReply* held);
  void attach();  // a LedgerRequests over the current Ledger

  LedgerOptions options_;
  Network* network_;
  Trace* trace_;
  SimStore store_;
  std::unique_ptr<Ledger> ledger_;
  std::unique_ptr<LedgerRequests> requests_;  // over ledger_
  const ShardCrypto* crypto_ = nullptr;
  std::vector<CommittedReply> held_;
  std::map<NodeId, std::string> gateways_;  // bindGateway
  bool dirty_ = false;                      // a tick changed something since the last commit
  uint64_t crashes_ = 0;
  uint64_t version_ = 0;
#ifdef TALLY_TEST_FAULTS
  NodeFaults faults_;
#endif
};

}  // namespace tally::sim
