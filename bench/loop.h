#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>

#include "core/status.h"

// Small libuv owners for tally-bench's one loop thread.

namespace tally::bench {

// Owns one uv_timer_t. init() before use; close() before destruction (the destructor asserts
// that the close callback ran, or that init() never succeeded). Non-copyable, non-movable.
class Timer {
 public:
  explicit Timer(uv_loop_t* loop) : loop_(loop) {}
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  [[nodiscard]] Status init();
  // Fires once after `timeout_ms`, calling `on_fire` on the loop thread.
  [[nodiscard]] Status start(uint64_t timeout_ms, std::function<void()> on_fire);
  void stop();
  void close();
  bool closed() const { return !initialized_ || close_done_; }

 private:
  static void onFire(uv_timer_t* timer);

  uv_loop_t* loop_;
  uv_timer_t timer_{};
  std::function<void()> on_fire_;
  bool initialized_ = false;
  bool closing_ = false;
  bool close_done_ = false;
};

// Runs `loop` one iteration at a time until `done()` holds or `timeout_ms` has passed, using
// `deadline` (initialized, idle) as the bound. Returns false on timeout.
bool runUntil(uv_loop_t* loop, Timer* deadline, uint64_t timeout_ms,
              const std::function<bool()>& done);

}  // namespace tally::bench
