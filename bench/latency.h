#pragma once

#include <cstdint>
#include <vector>

#include "bench/bench_limits.h"

// Latency samples of one series (an operation, or the whole cycle), in nanoseconds, and the
// percentiles the peers' driver prints. Bounded: at most `samples_max` are kept; later ones are
// counted in dropped() only.

namespace tally::bench {

struct LatencySummary {
  uint64_t count = 0;  // samples kept
  double p50_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  double mean_us = 0;
};

class LatencySeries {
 public:
  explicit LatencySeries(uint64_t samples_max = limits::kLatencySamplesMax)
      : samples_max_(samples_max) {}

  void add(uint64_t nanoseconds) {
    if (samples_.size() < samples_max_) {
      samples_.push_back(nanoseconds);
    } else {
      ++dropped_;
    }
  }
  uint64_t dropped() const { return dropped_; }

  // Percentiles as the peers' driver computes them: the ceil(p·n)-th smallest sample (clamped
  // to 1..n). NaN when empty. Reorders the samples.
  LatencySummary summarize();

 private:
  uint64_t samples_max_;
  uint64_t dropped_ = 0;
  std::vector<uint64_t> samples_;
};

}  // namespace tally::bench
