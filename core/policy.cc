#include "core/policy.h"

#include <set>
#include <utility>

#include "core/limits.h"

namespace tally {
namespace {

// max_single_reservation and emergency.shard_units are at most burst, so every unit value of a
// budget is within the request maximum the wire enforces.
static_assert(limits::kBurstUnitsMax <= limits::kUnitsPerRequestMax);

constexpr uint64_t kHourMs = 3600ull * 1000;
constexpr uint64_t kDayMs = 24 * kHourMs;

Status badKey(const std::string& key, const std::string& why) {
  return Status::invalidArgument("budget key '" + key + "': " + why);
}

Status checkText(const std::string& key, const std::string& value, uint64_t bytes_max,
                 bool required) {
  if (required && value.empty()) return badKey(key, "must not be empty");
  if (value.size() > bytes_max) {
    return badKey(key, "longer than " + std::to_string(bytes_max) + " bytes");
  }
  return Status::ok();
}

Status checkRange(const std::string& key, uint64_t value, uint64_t min, uint64_t max) {
  if (value < min || value > max) {
    return badKey(key, std::to_string(value) + " is outside [" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
  }
  return Status::ok();
}

}  // namespace

const char* rolloutModeName(RolloutMode mode) {
  switch (mode) {
    case RolloutMode::kOff: return "off";
    case RolloutMode::kShadow: return "shadow";
    case RolloutMode::kEnforce: return "enforce";
  }
  return "unknown";
}

const char* epochPeriodName(EpochPeriod period) {
  switch (period) {
    case EpochPeriod::kHour: return "hour";
    case EpochPeriod::kDay: return "day";
  }
  return "unknown";
}

uint64_t epochPeriodMs(EpochPeriod period) {
  return period == EpochPeriod::kDay ? kDayMs : kHourMs;
}

uint64_t accountingEpochStartMs(uint64_t now_ms, EpochPeriod period) {
  const uint64_t period_ms = epochPeriodMs(period);
  return now_ms - now_ms % period_ms;
}

bool subjectMatches(const std::string& pattern, const std::string& subject) {
  if (!pattern.empty() && pattern.back() == '*') {
    const std::string_view prefix(pattern.data(), pattern.size() - 1);
    return std::string_view(subject).substr(0, prefix.size()) == prefix;
  }
  return pattern == subject;
}

Status validateBudget(const Budget& b) {
  const std::pair<const char*, Status> text_checks[] = {
      {"subject", checkText("subject", b.subject_pattern, limits::kSubjectBytesMax, true)},
      {"route", checkText("route", b.route, limits::kRouteBytesMax, true)},
      {"region", checkText("region", b.region, limits::kRegionBytesMax, false)},
      {"unit", checkText("unit", b.unit, limits::kUnitNameBytesMax, true)},
  };
  for (const auto& [key, status] : text_checks) {
    if (!status.isOk()) return status;
  }
  const size_t star = b.subject_pattern.find('*');
  if (star != std::string::npos && star + 1 != b.subject_pattern.size()) {
    return badKey("subject", "'*' is only allowed as the last character");
  }
  if (Status s = checkRange("burst", b.burst, 1, limits::kBurstUnitsMax); !s.isOk()) return s;
  if (Status s =
          checkRange("refill_per_second", b.refill_per_second, 0, limits::kRefillPerSecondMax);
      !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("max_single_reservation", b.max_single_reservation, 1, b.burst);
      !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("hold_ttl_ms", b.hold_ttl_ms, 1, limits::kHoldTtlMsMax); !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("hard_execution_limit_ms", b.hard_execution_limit_ms, 1,
                            limits::kHardExecutionLimitMsMax);
      !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("max_overdraft", b.max_overdraft, 0, limits::kUnitsPerRequestMax);
      !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("weight", b.weight, 1, 1'000'000); !s.isOk()) return s;
  if (Status s = checkRange("fairness_budget", b.fairness_budget_permille, 0, 1000); !s.isOk()) {
    return s;
  }
  if (Status s = checkRange("rollout.percent", b.rollout.percent, 0, 100); !s.isOk()) return s;
  if (b.emergency.enabled) {
    if (Status s = checkRange("emergency.shard_units", b.emergency.shard_units, 1, b.burst);
        !s.isOk()) {
      return s;
    }
    if (Status s = checkRange("emergency.shard_ttl_ms", b.emergency.shard_ttl_ms, 1,
                              limits::kHardExecutionLimitMsMax);
        !s.isOk()) {
      return s;
    }
  }
  return Status::ok();
}

Status validatePolicy(const Policy& policy) {
  if (policy.budgets.empty()) return Status::invalidArgument("policy has no [[budget]]");
  if (policy.budgets.size() > limits::kBudgetsPerPolicyMax) {
    return Status::invalidArgument("policy has more than " +
                                   std::to_string(limits::kBudgetsPerPolicyMax) + " budgets");
  }
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t i = 0; i < policy.budgets.size(); ++i) {
    const Budget& budget = policy.budgets[i];
    if (Status s = validateBudget(budget); !s.isOk()) {
      return Status::invalidArgument("budget #" + std::to_string(i + 1) + ": " + s.message());
    }
    // The region is a fence on the budget, not part of its key: the accounts of a
    // subject/route are governed by one budget whatever the requests' regions.
    if (!seen.emplace(budget.subject_pattern, budget.route).second) {
      return Status::invalidArgument(
          "budget #" + std::to_string(i + 1) + ": subject '" + budget.subject_pattern +
          "' and route '" + budget.route +
          "' already have a budget (whatever its region: budgets per region of one route are "
          "made with one ledger per region, or with distinct routes)");
    }
  }
  return Status::ok();
}

const Budget* matchBudget(const Policy& policy, const std::string& subject,
                          const std::string& route) {
  const Budget* best = nullptr;
  size_t best_prefix = 0;
  for (const Budget& budget : policy.budgets) {
    if (budget.route != route || !subjectMatches(budget.subject_pattern, subject)) continue;
    if (budget.subject_pattern == subject) return &budget;
    const size_t prefix = budget.subject_pattern.size() - 1;
    if (best == nullptr || prefix > best_prefix) {
      best = &budget;
      best_prefix = prefix;
    }
  }
  return best;
}

bool regionAdmits(const Budget& budget, std::string_view region) {
  return budget.region.empty() || region.empty() || budget.region == region;
}

std::string regionRefusal(const Budget& budget, std::string_view region) {
  return "no budget for subject/route in region '" + std::string(region) +
         "': the budget of subject '" + budget.subject_pattern + "' and route '" + budget.route +
         "' is fenced to region '" + budget.region + "'";
}

}  // namespace tally
