#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/sim/runner.h"

// The release gate's figures over many runs (issue 10, "The gate"): per check, how many runs
// failed it; the p99 of the simulated time USAGE_UNKNOWN took to close; the seeds that failed.

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
  // Any count above 0, or the p99 above 10 minutes of simulated time.
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
  std::vector<FailedRun> failed_;  // the first few, by seed
};

inline constexpr uint64_t kUnknownConvergenceMsMax = 10 * 60 * 1000;
inline constexpr size_t kFailedRunsKept = 20;

}  // namespace tally::sim
