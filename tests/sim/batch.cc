#include "tests/sim/batch.h"

#include <atomic>
#include <thread>
#include <vector>

namespace tally::sim {

GateSummary runSeeds(uint64_t first_seed, uint64_t count, unsigned jobs,
                     const RunOptions& options) {
  std::atomic<uint64_t> next{0};
  std::vector<GateSummary> summaries(jobs == 0 ? 1 : jobs);
  auto work = [&](GateSummary* summary) {
    for (uint64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      RunOptions run = options;
      run.seed = first_seed + i;
      run.trace = false;
      summary->add(runOne(run));
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < summaries.size(); ++t) threads.emplace_back(work, &summaries[t]);
  work(&summaries[0]);
  for (std::thread& thread : threads) thread.join();
  GateSummary total;
  for (const GateSummary& summary : summaries) total.merge(summary);
  return total;
}

}  // namespace tally::sim
