#include "tests/sim/workload.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "core/limits.h"

namespace tally::sim {
namespace {

// Values a real policy would carry: small buckets that run dry, slow and fast refill, hold TTLs
// short enough to race a start, hard limits of seconds to minutes.
void randomize(Budget* b, Rng* rng) {
  b->burst = rng->range(1, 4) * rng->range(1, 250);
  b->refill_per_second = rng->chance(200) ? 0 : rng->range(1, 200);
  b->max_single_reservation = rng->chance(500) ? b->burst : rng->range(1, b->burst);
  b->hold_ttl_ms = rng->range(100, 5'000);
  b->hard_execution_limit_ms = rng->range(500, 120'000);
  b->max_overdraft = rng->chance(300) ? 0 : rng->range(1, b->burst);
  b->priority = static_cast<uint32_t>(rng->below(3));
  b->weight = static_cast<uint32_t>(rng->range(1, 10));
  // Emergency shards on about half the budgets: agents keep shards of them and admit from
  // those while the ledger is out of reach. Short lives, so that shards expire within a run.
  b->emergency = {};
  if (rng->chance(500)) {
    b->emergency = {.enabled = true,
                    .shard_units = rng->range(1, b->burst),
                    .shard_ttl_ms = rng->range(2'000, 20'000)};
  }
}

Budget base(std::string subject_pattern, std::string route) {
  Budget b;
  b.subject_pattern = std::move(subject_pattern);
  b.route = std::move(route);
  b.unit = "tokens";
  return b;
}

// The scheduler, not the ledger, is the bottleneck: buckets that never run dry, one class, no
// emergency shards (a shard-owned start is not scheduled), a hold TTL the waiting starts can
// outlive when time jumps.
void addFair(Workload* w, Rng* rng) {
  FairWorkload fair{.route = "route-fair",
                    .tenants = {"fair-w1", "fair-w2", "fair-w4"},
                    .started_max = rng->range(1, 3),
                    .window_admissions = kFairWindowAdmissions,
                    .budget_permille = kFairBudgetPermille};
  const uint64_t hold_ttl_ms = rng->range(1'000, 8'000);
  const uint32_t weights[] = {1, 2, 4};
  for (size_t t = 0; t < fair.tenants.size(); ++t) {
    Budget b = base(fair.tenants[t], fair.route);
    b.burst = 1'000'000;
    b.refill_per_second = 1'000'000;
    b.max_single_reservation = 10;
    b.hold_ttl_ms = hold_ttl_ms;
    b.hard_execution_limit_ms = 30'000;
    b.max_overdraft = 10;
    b.priority = 1;
    b.weight = weights[t];
    b.fairness_budget_permille = fair.budget_permille;
    w->budgets.push_back(b);
  }
  w->fair = std::move(fair);
}

}  // namespace

bool isFairBudget(const Budget& budget) { return budget.subject_pattern.starts_with("fair-"); }

Workload makeWorkload(Rng* rng) {
  Workload w;
  const uint64_t tenants = rng->range(2, 4);
  const uint64_t routes = rng->range(1, 3);
  for (uint64_t r = 0; r < routes; ++r) w.routes.push_back("route-" + std::to_string(r));
  for (uint64_t t = 0; t < tenants; ++t) {
    const std::string subject = "tenant-" + std::to_string(t);
    w.subjects.push_back(subject);
    for (const std::string& route : w.routes) {
      Budget b = base(subject, route);
      randomize(&b, rng);
      w.budgets.push_back(b);
    }
  }
  // A subject of the maximal length, matched by a pattern budget on the first route.
  w.subjects.push_back("wide-" + std::string(limits::kSubjectBytesMax - 5, 'w'));
  Budget wide = base("wide-*", w.routes.front());
  randomize(&wide, rng);
  w.budgets.push_back(wide);
  // Every policy value at its maximum (hard limit kept realistic: the gate bounds the time an
  // UNKNOWN may take to close).
  w.subjects.push_back("max");
  Budget max = base("max", w.routes.front());
  max.burst = limits::kBurstUnitsMax;
  max.refill_per_second = limits::kRefillPerSecondMax;
  max.max_single_reservation = limits::kBurstUnitsMax;
  max.max_overdraft = limits::kUnitsPerRequestMax;
  max.hold_ttl_ms = rng->chance(500) ? limits::kHoldTtlMsMax : 2'000;
  max.hard_execution_limit_ms = 60'000;
  max.weight = 1'000'000;
  max.fairness_budget_permille = 1000;
  w.budgets.push_back(max);
  // No budget matches this one: every reservation is refused (kNoBudget).
  w.subjects.push_back("nobody");
  // Drawn last, so that the other seeds' workloads are those they were before.
  if (rng->chance(kFairSeedsPermille)) addFair(&w, rng);
  w.hold_ttl_ms_max = holdTtlMsMax(w.budgets);
  w.hard_limit_ms_max = hardLimitMsMax(w.budgets);
  w.shard_ttl_ms_max = shardTtlMsMax(w.budgets);
  return w;
}

std::vector<Budget> changedBudgets(const std::vector<Budget>& budgets, Rng* rng) {
  std::vector<Budget> changed = budgets;
  for (Budget& b : changed) {
    if (b.subject_pattern != "max" && !isFairBudget(b) && rng->chance(500)) randomize(&b, rng);
  }
  return changed;
}

uint64_t holdTtlMsMax(const std::vector<Budget>& budgets) {
  uint64_t max = 0;
  for (const Budget& b : budgets) max = std::max(max, b.hold_ttl_ms);
  return max;
}

uint64_t shardTtlMsMax(const std::vector<Budget>& budgets) {
  uint64_t max = 0;
  for (const Budget& b : budgets) max = std::max(max, b.emergency.shard_ttl_ms);
  return max;
}

uint64_t hardLimitMsMax(const std::vector<Budget>& budgets) {
  uint64_t max = 0;
  for (const Budget& b : budgets) max = std::max(max, b.hard_execution_limit_ms);
  return max;
}

Digest requestDigest(const ReserveRequest& request) {
  uint64_t hash = 14695981039346656037ull;
  auto mix = [&hash](std::string_view bytes) {
    for (const char c : bytes) {
      hash ^= static_cast<uint8_t>(c);
      hash *= 1099511628211ull;
    }
  };
  auto field = [&mix](std::string_view value) {  // length-prefixed: "ab"+"c" is not "a"+"bc"
    const uint64_t size = value.size();
    mix(std::string_view(reinterpret_cast<const char*>(&size), sizeof size));
    mix(value);
  };
  auto number = [&mix](uint64_t value) {
    mix(std::string_view(reinterpret_cast<const char*>(&value), sizeof value));
  };
  field(request.reservation_id);
  field(request.subject);
  field(request.route);
  number(request.units);
  number(request.policy_generation);
  number(request.priority);
  field(request.region);
  Digest digest{};
  for (size_t i = 0; i < digest.size(); i += sizeof hash) {
    std::memcpy(digest.data() + i, &hash, sizeof hash);
    hash = hash * 6364136223846793005ull + 1442695040888963407ull;
  }
  return digest;
}

}  // namespace tally::sim
