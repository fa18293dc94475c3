#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "core/policy.h"
#include "core/types.h"

// What tally-bench asks for: the budget it publishes, the names it uses, and the parameters of
// each cycle, drawn from a seeded PRNG exactly as the peers' driver draws them (same order, same
// arithmetic), so a seed reproduces the same sequence of cycles, and verification can replay it.

namespace tally::bench {

inline constexpr const char* kBenchRoute = "bench";
inline constexpr Units kUnitsMax = 100;         // reserve 1..100 units
inline constexpr Units kOveruseMax = 10;        // over-use settles units+1..units+kOveruseMax
inline constexpr uint64_t kOveruseOneInN = 10;  // one cycle in 10 over-uses
inline constexpr Units kBenchBurst = 1'000'000'000'000;  // 1e12: nothing is ever rejected
inline constexpr Units kBenchRefillPerSecond = 1'000'000;

// The bench budget: subject pattern "<prefix>-*", route "bench", burst 1e12, refill 1e6/s, max
// single reservation 1000, hold TTL 30 s, hard execution limit 600 s, max overdraft 1e12.
// Over-use is taken from `available` (SPEC §4), which never runs low at this burst, so no cycle
// ever records debt (debt would freeze admission).
Budget benchBudget(const std::string& prefix);

std::string subjectName(const std::string& prefix, uint64_t subject);
std::string reservationId(const std::string& prefix, uint64_t seq);
std::string operationId(uint64_t seq);

struct CycleParams {
  uint64_t seq = 0;
  uint32_t subject = 0;
  Units units = 0;
  Units actual = 0;

  // What the ledger must refund on settle: units - actual, or 0 for over-use.
  Units refund() const { return actual <= units ? units - actual : 0; }
  // SPEC §4: a settle above the reservation ends SETTLED_WITH_DEBT even when `available` covers
  // the excess; its receipt's debt_units says how much became debt (always 0 here).
  bool overuse() const { return actual > units; }
};

// Draws cycle 0, 1, 2, … Deterministic for a (seed, subjects) pair. Owns its PRNG.
class Workload {
 public:
  Workload(uint64_t seed, uint32_t subjects) : rng_(seed), subjects_(subjects) {}

  CycleParams next();
  uint64_t drawn() const { return next_seq_; }

 private:
  std::mt19937_64 rng_;
  uint32_t subjects_;
  uint64_t next_seq_ = 0;
};

}  // namespace tally::bench
