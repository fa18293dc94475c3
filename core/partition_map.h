#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/ledger_protocol.h"
#include "core/ledger_types.h"
#include "core/policy.h"
#include "core/status.h"

// Partitioned subjects (docs/scale-out.md "Partitioned subjects"): for more capacity than one
// ledger primary, the subjects are split over N partitions, each a ledger primary (with its own
// standbys and its own database) that alone holds the accounts, reservations and shards of its
// subjects. The map is configuration, the same everywhere it is published (agents, tallyctl):
// partition i's ledger addresses, in partition order. A subject belongs to partition
// subjectHash(subject) % N — a stable hash of its bytes, so every process, in any language,
// computes the same partition, and the map's addresses can change (a new standby, a moved host)
// without moving a subject. Changing N moves subjects and is not supported (see the doc).
//
// Pure: no I/O, no clock.

namespace tally {

// Partitions a map may have (one is a plain, unpartitioned ledger).
inline constexpr size_t kPartitionsMax = 1024;

struct PartitionMap {
  // partitions[i]: the "HOST:PORT" addresses of partition i's ledger (its primary and standbys,
  // in the order clients try them), at least one each.
  std::vector<std::vector<std::string>> partitions;

  uint32_t size() const { return static_cast<uint32_t>(partitions.size()); }
  bool operator==(const PartitionMap&) const = default;
};

// FNV-1a, 64 bits, of the subject's bytes (offset basis 0xcbf29ce484222325, prime
// 0x100000001b3): the partition hash. Stable: it is part of the configuration contract.
uint64_t subjectHash(std::string_view subject);
// The partition that owns `subject` among `count` (≥ 1): subjectHash(subject) % count.
uint32_t partitionOf(std::string_view subject, uint32_t count);

// "A1,A2;B1,B2": partitions separated by ';', each a comma-separated list of its addresses, in
// partition order (spaces around items are ignored). kInvalidArgument for an empty text, an empty
// partition or address, or more than kPartitionsMax partitions. Addresses are not resolved here.
Result<PartitionMap> parsePartitionMap(std::string_view text);
// The inverse: the map as parsePartitionMap() reads it.
std::string formatPartitionMap(const PartitionMap& map);

// Where a request goes in a partitioned fleet.
enum class PartitionRouting : uint8_t {
  kOne,            // the partition of the subject it names (`partition`)
  kAll,            // every partition (fleet-wide: audit of all subjects, health, gateways,
                   // policy — publish splits its budgets, splitBudgets())
  kByReservation,  // the partition of its reservation's subject, which the sender knows from
                   // the reserve (start, settle, release, query, extend, mark, report)
  kByShard,        // the partition that issued the shard (its grant names the subject)
  kNone,           // a request kind this build does not know: not sent
};
struct PartitionTarget {
  PartitionRouting routing = PartitionRouting::kNone;
  uint32_t partition = 0;  // kOne only
};
PartitionTarget partitionTarget(const LedgerRequest& request, uint32_t count);

// A policy's budgets for each of `count` partitions: a budget for one subject goes to that
// subject's partition only; a pattern ("tenant-*", "*") may match subjects of every partition and
// goes to each. Order is kept within each partition.
std::vector<std::vector<Budget>> splitBudgets(std::span<const Budget> budgets, uint32_t count);

// The fleet's audit: reports[i] is partition i's. Accounts and shards of every partition, sorted
// by key and id; conserved when every partition conserves and every account and shard is in the
// partition its subject maps to (one that is not is a violation naming both partitions: a
// misconfigured map or a subject written to the wrong ledger). Violations are prefixed
// "partition I: ". as_of_ms is the latest partition's (each ledger has its own clock). Period
// fields are left empty: periods are audited per partition.
AuditReport mergePartitionAudits(std::span<const AuditReport> reports);

}  // namespace tally
