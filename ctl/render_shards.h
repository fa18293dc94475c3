#pragma once

#include <string>

#include "core/shard_types.h"
#include "ctl/json.h"

// Pieces of tallyctl's rendering of gateways and emergency shards, shared by `shard …` and
// `audit` (ctl/render.h has the full answers).

namespace tally::ctl {

// One shard as a JSON object. `with_grant`: the whole grant (shard list/revoke/write-off); without
// it only what an audit carries (no fence, times, keys).
void shardJson(JsonWriter& w, const ShardLedgerView& view, bool with_grant);
// One shard as a few lines of text: identity, central equation, the agent's local equation.
std::string shardHuman(const ShardLedgerView& view, bool with_grant);

}  // namespace tally::ctl
