#pragma once

#include <cstdint>
#include <optional>

#include "core/ledger_types.h"
#include "core/policy.h"

// The region fence (core/policy.h regionAdmits) where the agent admits without the ledger: from
// an emergency shard during a partition. A shard holds units of the budget of its subject/route,
// so it may admit only what that budget's fence admits (docs/LEDGER.md "Regions").

namespace tally {

// The answer to give instead of trying the shards, or nullopt to try them:
//  * the known policy's budget is fenced to another region: REJECTED "no-budget", the message
//    naming both regions (what the ledger would answer), never to be retried as is;
//  * the request names a region and the agent holds no policy to check it against (a restart
//    during the partition): REJECTED "ledger-unavailable", retry after
//    `unavailable_retry_after_ms`, as when no shard can admit.
std::optional<ReservationReply> shardRegionRefusal(const std::optional<Policy>& policy,
                                                   const ReserveRequest& request,
                                                   int64_t unavailable_retry_after_ms,
                                                   uint64_t now_ms);

}  // namespace tally
