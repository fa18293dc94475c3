#pragma once

#include <cstdint>
#include <string>
#include <vector>

// The readable record of one run (tally-sim --replay): one line per thing that happened, with
// the simulated time since the run began. Off during bulk runs: callers test on() before
// formatting a line, so a run that is not traced pays nothing for it.

namespace tally::sim {

class Trace {
 public:
  Trace(bool on, uint64_t origin_ms) : on_(on), origin_ms_(origin_ms) {}

  bool on() const { return on_; }
  void add(uint64_t now_ms, const std::string& line) {
    if (on_) lines_.push_back("+" + std::to_string(now_ms - origin_ms_) + "ms " + line);
  }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  bool on_;
  uint64_t origin_ms_;
  std::vector<std::string> lines_;
};

}  // namespace tally::sim
