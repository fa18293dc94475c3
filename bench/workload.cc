#include "bench/workload.h"

namespace tally::bench {

Budget benchBudget(const std::string& prefix) {
  return Budget{
      .subject_pattern = prefix + "-*",
      .route = kBenchRoute,
      .unit = "units",
      .refill_per_second = kBenchRefillPerSecond,
      .burst = kBenchBurst,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 600'000,
      .max_overdraft = kBenchBurst,
  };
}

std::string subjectName(const std::string& prefix, uint64_t subject) {
  return prefix + "-" + std::to_string(subject);
}

std::string reservationId(const std::string& prefix, uint64_t seq) {
  return prefix + "-" + std::to_string(seq);
}

std::string operationId(uint64_t seq) { return "op-" + std::to_string(seq); }

CycleParams Workload::next() {
  // The peers' driver, new_cycle(): subject, units, then 1 in 10 over-use by 1..10, else
  // actual in 0..units.
  CycleParams c{.seq = next_seq_++};
  c.subject = static_cast<uint32_t>(rng_() % subjects_);
  c.units = 1 + rng_() % kUnitsMax;
  if (rng_() % kOveruseOneInN == 0) {
    c.actual = c.units + 1 + rng_() % kOveruseMax;
  } else {
    c.actual = rng_() % (c.units + 1);
  }
  return c;
}

}  // namespace tally::bench
