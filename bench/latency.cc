#include "bench/latency.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace tally::bench {
namespace {

double percentileUs(std::vector<uint64_t>* samples, double p) {
  if (samples->empty()) return NAN;
  size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(samples->size())));
  k = std::clamp<size_t>(k, 1, samples->size());
  std::nth_element(samples->begin(), samples->begin() + static_cast<std::ptrdiff_t>(k - 1),
                   samples->end());
  return static_cast<double>((*samples)[k - 1]) / 1000.0;
}

}  // namespace

LatencySummary LatencySeries::summarize() {
  LatencySummary summary{.count = samples_.size()};
  double sum = 0;
  for (uint64_t sample : samples_) sum += static_cast<double>(sample);
  summary.mean_us = samples_.empty() ? NAN : sum / static_cast<double>(samples_.size()) / 1000.0;
  summary.p50_us = percentileUs(&samples_, 0.50);
  summary.p99_us = percentileUs(&samples_, 0.99);
  summary.p999_us = percentileUs(&samples_, 0.999);
  return summary;
}

}  // namespace tally::bench
