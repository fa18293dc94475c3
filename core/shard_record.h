#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/reservation.h"
#include "core/shard_account.h"
#include "core/shard_types.h"
#include "core/types.h"

// The durable image of the ledger's shard registry (core/shard_registry.h): one ShardRecord per
// shard, one FenceRecord per subject/route whose fence was bumped, the gateways (GatewayRecord,
// core/shard_types.h) and the shard sequence. The shell stores them as full images (a later
// image of the same row replaces an earlier one) in the same group commit as the accounts they
// moved, so that a carve and its shard record are one durable step.

namespace tally {

struct ShardRecord {
  ShardGrant grant;                 // as issued and signed
  ShardIssueRequest issue_request;  // as received: a retry with the same request id must match
  ShardState state = ShardState::kIssued;
  // allocated = spent + reminted + retired (asserted after every change, audited).
  Units spent_units = 0;     // usage taken from the shard's retired units
  Units reminted_units = 0;  // proven unused and moved to the current generation
  Units retired_units = 0;   // still in the source account's retiredForEmergency
  Units debt_units = 0;      // usage beyond what the shard covered: debt on the source account
  // The last accepted report (after a conflict, `receipts` is the union of every accepted
  // report's terminal receipts plus the latest holding ones), sorted by reservation id.
  bool reported = false;
  uint64_t report_boot_epoch = 0;
  ShardBalances last_reported;
  std::vector<Reservation> receipts;
  // Deferred remint (a report from a boot epoch other than the grant's): at remint_due_at_ms
  // the tick remints up to remint_target_units in total. 0: none pending.
  uint64_t remint_due_at_ms = 0;
  Units remint_target_units = 0;

  bool operator==(const ShardRecord&) const = default;
};

struct FenceRecord {
  SubjectRoute key;
  uint64_t fence = 1;  // a subject/route never bumped has fence 1 and no record

  bool operator==(const FenceRecord&) const = default;
};

// The registry rows changed since the last take: pointers into the registry (valid until its
// next mutating call), each list sorted by key.
struct ShardChangedRows {
  std::vector<const GatewayRecord*> gateways;
  std::vector<const ShardRecord*> shards;
  std::vector<std::string> deleted_shards;  // compacted; disjoint from `shards`
  std::vector<FenceRecord> fences;
  bool shard_sequence_changed = false;
  uint64_t shard_sequence = 0;  // the last sequence number used

  bool empty() const {
    return gateways.empty() && shards.empty() && deleted_shards.empty() && fences.empty() &&
           !shard_sequence_changed;
  }
};

// allocated = spent + reminted + retired, computed without overflow.
bool isShardConserved(const ShardRecord& record);

// The sequence number in a shard id "shard-<n>", or 0 if the id is not of that form.
uint64_t shardSequenceOf(const std::string& shard_id);

}  // namespace tally
