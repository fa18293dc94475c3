#pragma once

#include <cstdint>
#include <string>

// Reading the real clocks. Only shells (daemons, tools) call these; core/ never does.

namespace tally {

uint64_t wallClockMs();       // CLOCK_REALTIME, Unix ms
uint64_t monotonicClockMs();  // CLOCK_MONOTONIC, ms since an arbitrary point
uint64_t monotonicClockUs();

// "2026-07-19T14:00:00Z" / "2026-07-19T14:00:00.123Z" (UTC).
std::string formatRfc3339(uint64_t unix_ms);
std::string formatRfc3339Ms(uint64_t unix_ms);

// The ledger clock: Unix milliseconds that never go backwards, across wall-clock steps (NTP)
// within a process and across restarts (floor = the persisted high-water mark). It advances
// with the monotonic clock from an anchor taken at construction.
class LedgerClock {
 public:
  explicit LedgerClock(uint64_t floor_ms);
  uint64_t nowMs();

 private:
  uint64_t anchor_wall_ms_;
  uint64_t anchor_monotonic_ms_;
  uint64_t last_ms_;
};

}  // namespace tally
