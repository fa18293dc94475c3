#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/types.h"

// admissionBudget.v1 (SPEC §3): one budget per subject pattern/route. A published policy is a
// list of budgets under one generation, immutable once published.

namespace tally {

enum class RolloutMode : uint8_t { kOff = 0, kShadow, kEnforce };
enum class EpochPeriod : uint8_t { kHour = 0, kDay };

const char* rolloutModeName(RolloutMode mode);
const char* epochPeriodName(EpochPeriod period);
uint64_t epochPeriodMs(EpochPeriod period);
// Start of the accounting period containing `now_ms` (ledger clock = Unix ms).
uint64_t accountingEpochStartMs(uint64_t now_ms, EpochPeriod period);

struct EmergencyMode {
  bool enabled = false;
  Units shard_units = 0;
  uint64_t shard_ttl_ms = 0;

  bool operator==(const EmergencyMode&) const = default;
};

struct Rollout {
  RolloutMode mode = RolloutMode::kEnforce;
  uint32_t percent = 100;  // share of routes that enforce, chosen by a stable hash

  bool operator==(const Rollout&) const = default;
};

struct Budget {
  // "tenant-7" matches exactly; "tenant-*" matches every subject with that prefix; "*" all.
  std::string subject_pattern;
  std::string route;
  std::string region;  // "": any region; otherwise a fence (regionAdmits)
  std::string unit;
  Units refill_per_second = 0;
  Units burst = 0;
  std::string estimator_digest;
  Units max_single_reservation = 0;
  uint64_t hold_ttl_ms = 0;
  uint64_t hard_execution_limit_ms = 0;
  Units max_overdraft = 0;
  uint32_t priority = 0;
  uint32_t weight = 1;
  uint32_t fairness_budget_permille = 0;  // allowed |admitted share - fair share|, in ‰
  EpochPeriod accounting_epoch = EpochPeriod::kHour;
  EmergencyMode emergency;
  Rollout rollout;

  bool operator==(const Budget&) const = default;
};

struct Policy {
  Generation generation = 0;  // assigned by the ledger at publish
  std::vector<Budget> budgets;

  bool operator==(const Policy&) const = default;
};

bool subjectMatches(const std::string& pattern, const std::string& subject);

// Checks one budget; the error names the offending key as the policy file spells it.
Status validateBudget(const Budget& budget);
// Checks every budget and that no two budgets share (subject_pattern, route), whatever their
// regions: a region fences a budget, it does not key one (docs/LEDGER.md "Regions").
Status validatePolicy(const Policy& policy);

// The budget that governs (subject, route): an exact subject match wins over a pattern; among
// patterns, the longest prefix wins. Null if none. The region plays no part here: an account
// (subject, route, generation) has one budget; regionAdmits() is then the fence.
const Budget* matchBudget(const Policy& policy, const std::string& subject,
                          const std::string& route);
// The result points into `policy`: never into a temporary one.
const Budget* matchBudget(Policy&& policy, const std::string& subject,
                          const std::string& route) = delete;

// Whether `budget` may admit a request from `region`: a budget without a region admits every
// region, a request without one ("the gateway does not say") is admitted by every budget, and
// otherwise the two must be equal.
bool regionAdmits(const Budget& budget, std::string_view region);
// The refusal message when regionAdmits() is false; names both regions.
std::string regionRefusal(const Budget& budget, std::string_view region);

}  // namespace tally
