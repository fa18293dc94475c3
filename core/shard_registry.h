#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/account_book.h"
#include "core/ledger_types.h"
#include "core/shard_record.h"
#include "core/shard_types.h"
#include "core/status.h"

// The ledger's side of emergency shards (SPEC §6, docs/SHARDS.md): enrolled gateways, every
// shard carved (grant, state, the agent's last accepted report), the fence of each
// subject/route and the shard sequence. Owned by the core Ledger; pure, deterministic and
// single-threaded like it. Every time arrives as `now_ms`.
//
// Borrows the Ledger's AccountBook (which outlives it) and moves capacity only through it:
// carve (available → retiredForEmergency), recordShardSpent, recordShardDebt and remint into
// the *current* generation. Borrows a ShardCrypto (set by the shell; must outlive every call).
//
// Invariants (asserted after every change, audited by audit()):
//  * per shard: allocated = spent + reminted + retired;
//  * per account: retiredForEmergency = Σ retired over the shards carved from it;
//  * a duplicate report remints 0; units of holding receipts (RESERVED, STARTED,
//    USAGE_UNKNOWN) are never reminted; a shard in CONFLICT or WRITTEN_OFF remints nothing more.

namespace tally {

#ifdef TALLY_TEST_FAULTS
// Test-only, compiled only into tally_core_testing (never into a shipped binary).
struct ShardRegistryFaults {
  // Deliberately wrong: the units of holding receipts count as proven unused.
  bool remint_holding_receipts = false;
  // Deliberately wrong: a report the accepted one supersedes (delivered late, or replayed) is
  // reconciled as if it were the latest.
  bool reconcile_superseded_reports = false;
};
#endif

class ShardRegistry {
 public:
  // `shard_retention_ms`: how long after its expiry a RECONCILED shard with nothing retired is
  // kept (its grant, receipts and issue request id: the window for retried issues and reports).
  // The ledger's `shard_retention_ms` (default limits::kShardRetentionMsDefault, a day), not the
  // receipts' idempotency window: an agent that did not hear its report accepted must find the
  // shard when it reports again. A report after it is answered kNotFound (unknownShard).
  ShardRegistry(AccountBook* accounts, uint64_t shard_retention_ms)
      : accounts_(accounts), shard_retention_ms_(shard_retention_ms) {}
  ShardRegistry(const ShardRegistry&) = delete;
  ShardRegistry& operator=(const ShardRegistry&) = delete;

  void setCrypto(const ShardCrypto* crypto) { crypto_ = crypto; }
#ifdef TALLY_TEST_FAULTS
  void setFaultsForTesting(ShardRegistryFaults faults);  // out of line: see Ledger's
#endif

  GatewayReply enrollGateway(const std::string& gateway_name, const PublicKey& public_key,
                             uint64_t now_ms);
  GatewayReply listGateways() const;
  GatewayReply setGatewayEnabled(const std::string& gateway_name, bool enabled);
  // Replaces the gateway's key with `new_key` now; the key it replaces stays admitted as its
  // previous key until now_ms + overlap_ms (at most limits::kGatewayKeyOverlapMsMax) or until
  // endKeyOverlap(). During a rotation the previous key stays the one the gateway had before it.
  GatewayReply rotateGatewayKey(const std::string& gateway_name, const PublicKey& new_key,
                                uint64_t overlap_ms, uint64_t now_ms);
  // The gateway's current key was used (on the link): its previous key is no longer admitted.
  // The previous key it retired, if one was admitted at `now_ms`.
  std::optional<PublicKey> endKeyOverlap(const std::string& gateway_name, uint64_t now_ms);

  ShardReply issue(const ShardIssueRequest& request, uint64_t now_ms);
  // kNotFound (typed: "this ledger has no record of the shard", never retried by the agent)
  // for a shard it does not hold; see unknownShard().
  ShardReply report(const ShardReport& report, uint64_t now_ms);
  // The named shards of `gateway_name` (every gateway if empty); unknown ids are left out.
  ShardReply status(const std::string& gateway_name, const std::vector<std::string>& ids) const;
  ShardReply list(const std::string& gateway_name, std::optional<ShardState> state) const;
  // Exactly one of shard_id and gateway_name is non-empty.
  ShardReply revoke(const std::string& shard_id, const std::string& gateway_name);
  ShardReply writeOff(const std::string& shard_id, uint64_t now_ms);

  struct TickOutcome {
    uint64_t reminted = 0;   // deferred remints performed
    uint64_t compacted = 0;  // RECONCILED shards with nothing retired, past retention, dropped
  };
  // Performs deferred remints that fell due and compacts shards past retention (at most
  // `items_max` of each).
  TickOutcome tick(uint64_t now_ms, uint64_t items_max);

  // Appends every shard's view (sorted by id) and the shard equations' violations.
  void audit(AuditReport* report) const;

  // Rebuilding from the durable record, after the accounts and before serving.
  Status restoreGateway(const GatewayRecord& gateway);
  Status restoreShard(const ShardRecord& record);
  Status restoreFence(const FenceRecord& fence);
  void restoreShardSequence(uint64_t shard_sequence);
  Status finishRestore();

  ShardChangedRows takeChangedRows();

  const ShardRecord* find(const std::string& shard_id) const;
  const GatewayRecord* findGateway(const std::string& gateway_name) const;
  // Every enrolled gateway by name, without the copy listGateways() answers with.
  const std::map<std::string, GatewayRecord>& gateways() const { return gateways_; }
  // The gateway whose key, or previous key however old, `key` is (a key is one gateway's, and
  // never also an operator's); nullptr if none.
  const GatewayRecord* gatewayWithKey(const PublicKey& key) const;
  uint64_t fenceOf(const std::string& subject, const std::string& route) const;
  uint64_t shardSequence() const { return shard_sequence_; }
  size_t shardCount() const { return shards_.size(); }

 private:
  // Rule 1 refusals: code REJECTED with permission_denied set; nothing changes.
  static ShardReply permissionDenied(std::string message);
  // A report about a shard the registry does not hold (compacted after shard_retention_ms, or
  // never issued in this state): kNotFound, no shard in the reply, nothing changes, when the
  // grant verifies under the ledger key and its gateway is enrolled with the report's key and
  // enabled; else permissionDenied as for any rule-1 refusal.
  ShardReply unknownShard(const ShardReport& report) const;
  ShardReply refuseIssue(const ShardIssueRequest& request, uint64_t now_ms);
  ShardReply carveAndGrant(const ShardIssueRequest& request, AccountEntry* entry,
                           const Budget& budget, uint64_t now_ms);
  ShardReply reconcile(ShardRecord* record, const ShardReport& report, uint64_t now_ms);
  ShardReply recordConflict(ShardRecord* record, const ShardReport& report, const std::string& why);
  // Moves `units` of the record's retired units to spent on the source account.
  // False (nothing changed) if a balance would overflow.
  [[nodiscard]] bool recordSpent(ShardRecord* record, Units units);
  // Remints up to `target` in total (minus what was reminted); returns what this call reminted.
  Units remintUpTo(ShardRecord* record, Units target, uint64_t now_ms);
  AccountEntry* sourceOf(const ShardRecord& record);
  size_t liveShardsOf(const std::string& gateway_name, const AccountKey& source) const;
  ShardLedgerView viewOf(const ShardRecord& record) const;
  ShardReply answer(ReplyCode code, const ShardRecord* record, std::string message = {}) const;
  void touched(const ShardRecord& record);
  void touchedGateway(const std::string& gateway_name);
  void assertConserved(const ShardRecord& record) const;
  // Queues `record` for compaction if it qualifies (RECONCILED, nothing retired or deferred).
  void maybeQueueCompaction(const ShardRecord& record);

  AccountBook* accounts_;
  uint64_t shard_retention_ms_;
  const ShardCrypto* crypto_ = nullptr;
#ifdef TALLY_TEST_FAULTS
  ShardRegistryFaults faults_;
#endif
  std::map<std::string, GatewayRecord> gateways_;
  std::map<std::string, ShardRecord> shards_;              // by shard id
  std::map<std::string, std::string> by_request_id_;       // issue request id → shard id
  std::map<SubjectRoute, uint64_t> fences_;                // absent: 1
  std::set<std::pair<uint64_t, std::string>> deferred_;    // (remint_due_at_ms, shard id)
  std::set<std::pair<uint64_t, std::string>> compaction_;  // (compact at ms, shard id)
  uint64_t shard_sequence_ = 0;
  std::set<std::string> changed_gateways_;
  std::set<std::string> changed_shards_;
  std::set<std::string> deleted_shards_;
  std::set<SubjectRoute> changed_fences_;
  bool sequence_changed_ = false;
};

}  // namespace tally
