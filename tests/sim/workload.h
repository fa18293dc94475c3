#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/policy.h"
#include "tests/sim/rng.h"

// What one run asks of the fleet, chosen by the seed: tenants (subjects) and routes with
// different burst, refill, hold TTL, hard execution limit and overdraft; one tenant whose budget
// sits at every maximum of core/limits.h; a subject of the longest allowed length matched by a
// pattern; a subject no budget matches. Policies are republished with changed values and
// rolled back during the run.

namespace tally::sim {

struct Workload {
  std::vector<std::string> subjects;
  std::vector<std::string> routes;
  std::vector<Budget> budgets;  // the first policy
  uint64_t hold_ttl_ms_max = 0;
  uint64_t hard_limit_ms_max = 0;
  uint64_t shard_ttl_ms_max = 0;
};

Workload makeWorkload(Rng* rng);
// The same budgets with new values for some of them (a republished policy).
std::vector<Budget> changedBudgets(const std::vector<Budget>& budgets, Rng* rng);
// The longest hold TTL and hard execution limit among `budgets`.
uint64_t holdTtlMsMax(const std::vector<Budget>& budgets);
uint64_t hardLimitMsMax(const std::vector<Budget>& budgets);
uint64_t shardTtlMsMax(const std::vector<Budget>& budgets);

}  // namespace tally::sim
