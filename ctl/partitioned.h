#pragma once

#include <cstdint>
#include <functional>

#include "core/status.h"
#include "ctl/args.h"
#include "ctl/commands.h"
#include "wire/codec.h"

// tallyctl against a partitioned fleet (--partitions, core/partition_map.h): `audit` of every
// subject asks each partition's ledger and prints the sum (mergePartitionAudits: every
// partition's accounts and shards; conserved only if each partition conserves and holds only
// its own subjects); `audit --subject S` asks S's partition only. The transport is passed in, so
// this runs in tests without ledgers.

namespace tally::ctl {

// Sends one request to partition `partition`'s ledger (its primary among its addresses).
using PartitionCallFn =
    std::function<Result<wire::Response>(uint32_t partition, const wire::RequestBody&)>;

// The whole command for an invocation with partitions (parseArgs admits only audit, help and
// version there). A partition that fails is reported as that command's failure, naming it.
CommandOutput runPartitionedCommand(const Invocation& invocation, const PartitionCallFn& call);

}  // namespace tally::ctl
