#pragma once

#include <cstdint>

// Simulated time: milliseconds on the ledger clock (Unix ms), advanced only by the runner.
// Every machine receives it as the `now_ms` argument of its calls, as the daemons pass theirs.

namespace tally::sim {

class SimClock {
 public:
  explicit SimClock(uint64_t start_ms) : now_ms_(start_ms) {}

  uint64_t nowMs() const { return now_ms_; }
  void advance(uint64_t ms) { now_ms_ += ms; }

 private:
  uint64_t now_ms_;
};

}  // namespace tally::sim
