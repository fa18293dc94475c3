#pragma once

#include <cstdint>
#include <optional>

#include "common/log.h"
#include "core/ledger.h"
#include "wire/codec.h"

// The ledger server's answers to the nine gateway and emergency-shard requests
// (docs/SHARDS.md), with their logs: gateway_enrolled, shard_issued, shard_reconciled,
// shard_conflict (error level, with the details), shard_revoked and shard_written_off. Runs on
// the loop thread; the caller persists what the ledger's takeChangedRows() then names before it
// sends the reply.

namespace tally::ledger {

// nullopt if `body` is not one of the shard requests.
std::optional<wire::ResponseBody> dispatchShardRequest(Ledger* ledger, Logger* logger,
                                                       const wire::RequestBody& body,
                                                       uint64_t now_ms);

}  // namespace tally::ledger
