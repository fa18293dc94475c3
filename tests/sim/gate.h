#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tests/sim/runner.h"

// The release gate's figures over many runs (issue 10, "The gate"): per check, how many runs
// failed it; the p99 of the simulated time USAGE_UNKNOWN took to close; each tenant's worst
// fairness error against its budget; the seeds that failed.

namespace tally::sim {

struct FailedRun {
  uint64_t seed = 0;
  Finding first;
};

class GateSummary {
 public:
  void add(const RunResult& result);
  void merge(const GateSummary& other);

  uint64_t interleavings() const { return interleavings_; }
  uint64_t count(Check check) const { return counts_[static_cast<size_t>(check)]; }
  // Nearest-rank p99 over every sample, to 100 ms (the histogram's resolution); 0 if none.
  uint64_t unknownConvergenceP99Ms() const;
  const std::vector<FailedRun>& failedRuns() const { return failed_; }
  // How much of SPEC §4's period close the runs exercised (closed periods compared).
  uint64_t closedPeriodsChecked() const { return closed_periods_checked_; }
  // Reservations agents admitted from shards, and agent restarts (new boot epochs).
  uint64_t shardAdmissions() const { return shard_admissions_; }
  uint64_t agentRestarts() const { return agent_restarts_; }
  // By tenant: the worst fairness error of any completed window of any run, its budget, and
  // the windows measured (seeds with fair scheduling).
  const std::map<std::string, TenantFairness>& fairness() const { return fairness_; }
  // A tenant's worst error in ‰ of a window's admissions, rounded up (the unit of the budget):
  // it is within its budget exactly when this is at most budget_permille.
  static uint64_t errorPermille(const TenantFairness& tenant);
  // Any count above 0, the p99 above 10 minutes of simulated time, or a tenant's worst
  // fairness error above its budget.
  bool passes() const;

  std::string json() const;
  std::string text() const;

 private:
  static constexpr uint64_t kBucketMs = 100;
  static constexpr size_t kBuckets = 36'000;  // one hour; the last bucket holds the rest

  uint64_t interleavings_ = 0;
  std::array<uint64_t, kCheckCount> counts_{};
  std::vector<uint64_t> histogram_ = std::vector<uint64_t>(kBuckets + 1, 0);
  uint64_t samples_ = 0;
  uint64_t closed_periods_checked_ = 0;
  uint64_t shard_admissions_ = 0;
  uint64_t agent_restarts_ = 0;
  std::map<std::string, TenantFairness> fairness_;
  std::vector<FailedRun> failed_;  // the first few, by seed
};

inline constexpr uint64_t kUnknownConvergenceMsMax = 10 * 60 * 1000;
inline constexpr size_t kFailedRunsKept = 20;

}  // namespace tally::sim
