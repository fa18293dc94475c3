#include "common/wall_clock.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace tally {
namespace {

uint64_t readMs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
}

}  // namespace

uint64_t wallClockMs() { return readMs(CLOCK_REALTIME); }
uint64_t monotonicClockMs() { return readMs(CLOCK_MONOTONIC); }

uint64_t monotonicClockUs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

std::string formatRfc3339(uint64_t unix_ms) {
  const time_t seconds = static_cast<time_t>(unix_ms / 1000);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string formatRfc3339Ms(uint64_t unix_ms) {
  const time_t seconds = static_cast<time_t>(unix_ms / 1000);
  tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + n, sizeof(text) - n, ".%03uZ", static_cast<unsigned>(unix_ms % 1000));
  return text;
}

LedgerClock::LedgerClock(uint64_t floor_ms)
    : anchor_wall_ms_(std::max(wallClockMs(), floor_ms)),
      anchor_monotonic_ms_(monotonicClockMs()),
      last_ms_(anchor_wall_ms_) {}

uint64_t LedgerClock::nowMs() {
  const uint64_t now = anchor_wall_ms_ + (monotonicClockMs() - anchor_monotonic_ms_);
  last_ms_ = std::max(last_ms_, now);
  return last_ms_;
}

}  // namespace tally
