#pragma once

#include <cstdint>
#include <string_view>

#include "core/policy.h"

// Rollout per route (SPEC §7): `off` admits without calling the ledger, `shadow` calls it,
// records the decision and always admits, `enforce` obeys it. With `percent` < 100 under
// enforce, a stable hash of the route picks which routes enforce; the rest run as shadow, so a
// route's mode never flaps between agents or restarts.

namespace tally {

// FNV-1a 64 of the route: stable across processes, versions and machines.
uint64_t stableRouteHash(std::string_view route);

// The mode that applies to `route` under `rollout`.
RolloutMode effectiveRolloutMode(const Rollout& rollout, std::string_view route);

}  // namespace tally
