#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "core/ledger_protocol.h"

// Which partition's ledger link a partitioned agent sends a gateway request to (docs/scale-out.md
// "Partitioned subjects"; the fleet's rule is partitionTarget(), core/partition_map.h): a reserve
// to its subject's partition; a follow-up (start, settle, release, query, extend, mark-unknown,
// report) to the partition the agent recorded at its reservation's reserve; a fleet-wide request
// (health, audit of every subject, policy) to every partition. With one partition every request
// goes to partition 0, so an unpartitioned agent routes exactly as before.
//
// Pure: the record of reservation → partition is the caller's (it must be durable: a follow-up
// may come after an agent restart), passed in as a lookup.

namespace tally {

struct AgentPartitionRoute {
  enum class Kind : uint8_t {
    kPartition,   // send to `partition`
    kUnrecorded,  // a follow-up whose reserve this agent has no record of: the reservation may be
                  // on any partition (its id is unique in the fleet), ask each
    kEvery,       // fleet-wide: every partition
    kNotSent,     // a request kind this build does not know
  };
  Kind kind = Kind::kNotSent;
  uint32_t partition = 0;  // kPartition only

  bool operator==(const AgentPartitionRoute&) const = default;
};

// The partition recorded at the reserve of a reservation id, if any.
using RecordedPartition = std::function<std::optional<uint32_t>(std::string_view reservation_id)>;

// `count` ≥ 1 partitions. A recorded partition ≥ count (a record from another map) is kUnrecorded.
AgentPartitionRoute agentPartitionRoute(const LedgerRequest& request, uint32_t count,
                                        const RecordedPartition& recorded);

// The reservation id a reserve or a follow-up names; empty for every other request.
std::string_view reservationIdOf(const LedgerRequest& request);

}  // namespace tally
