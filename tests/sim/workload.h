#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ledger_types.h"
#include "core/policy.h"
#include "tests/sim/rng.h"

// What one run asks of the fleet, chosen by the seed: tenants (subjects) and routes with
// different burst, refill, hold TTL, hard execution limit and overdraft; one tenant whose budget
// sits at every maximum of core/limits.h; a subject of the longest allowed length matched by a
// pattern; a subject no budget matches. Policies are republished with changed values and
// rolled back during the run.

namespace tally::sim {

// Fair scheduling (SPEC §7), in about one seed in 40: one route served by three tenants of
// weights 1, 2 and 4, each with the same fairness budget, on which every agent limits started
// work to `started_max` (1–3) and its gateway keeps several starts of each tenant waiting. The
// tenants and the route are in `budgets` only (the direct gateways never use them), and a
// republished policy keeps their values.
struct FairWorkload {
  std::string route;
  std::vector<std::string> tenants;  // weights 1, 2, 4 in this order
  uint64_t started_max = 1;
  uint64_t window_admissions = 0;
  uint32_t budget_permille = 0;
};

inline constexpr uint64_t kFairSeedsPermille = 25;     // one seed in 40
inline constexpr uint64_t kFairWindowAdmissions = 21;  // 3 × (1 + 2 + 4)
inline constexpr uint32_t kFairBudgetPermille = 150;

struct Workload {
  std::vector<std::string> subjects;
  std::vector<std::string> routes;
  std::vector<Budget> budgets;  // the first policy
  uint64_t hold_ttl_ms_max = 0;
  uint64_t hard_limit_ms_max = 0;
  uint64_t shard_ttl_ms_max = 0;
  std::optional<FairWorkload> fair;
};

bool isFairBudget(const Budget& budget);

Workload makeWorkload(Rng* rng);
// The same budgets with new values for some of them (a republished policy).
std::vector<Budget> changedBudgets(const std::vector<Budget>& budgets, Rng* rng);
// The longest hold TTL and hard execution limit among `budgets`.
uint64_t holdTtlMsMax(const std::vector<Budget>& budgets);
uint64_t hardLimitMsMax(const std::vector<Budget>& budgets);
uint64_t shardTtlMsMax(const std::vector<Budget>& budgets);

// The request_digest a simulated gateway puts on a reserve: a 64-bit FNV-1a of the fields the
// canonical digest covers (wire/digest.h canonicalRequestDigest), spread over the 32 bytes. The
// ledger and the agent only compare digests, never recompute one, so what they decide is the
// same as with SHA-256 of the canonical encoding, which cost 5% of the simulator's instructions
// (the real digest is tested in tests/wire and used by tallyctl, the agent's HTTP API and the
// client library).
Digest requestDigest(const ReserveRequest& request);

}  // namespace tally::sim
