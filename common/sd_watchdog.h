#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>

// The service-manager watchdog (systemd's WatchdogSec=): while running, sends "WATCHDOG=1" to
// $NOTIFY_SOCKET every interval_ms (sdWatchdogIntervalMs(): half of $WATCHDOG_USEC). A ping comes
// from the loop thread, so a wedged loop stops the pings and systemd restarts the daemon.
//
// Belongs to one libuv loop; owns its timer. start() with interval_ms 0 does nothing (no
// watchdog asked for). stop() closes the timer; the object must outlive the loop run that
// closes it (the loop's owner destroys it after uv_run returns). Non-copyable, non-movable.

namespace tally {

class SdWatchdog {
 public:
  // `on_error` is told when a ping cannot be sent (once per failure; the timer keeps going).
  SdWatchdog(uv_loop_t* loop, uint64_t interval_ms,
             std::function<void(const std::string&)> on_error);
  ~SdWatchdog() = default;
  SdWatchdog(const SdWatchdog&) = delete;
  SdWatchdog& operator=(const SdWatchdog&) = delete;

  // Sends the first ping now and arms the timer; false if the timer could not be set up.
  bool start();
  void stop();
  uint64_t intervalMs() const { return interval_ms_; }

 private:
  static void onTimer(uv_timer_t* timer);
  void ping();

  uv_loop_t* loop_;
  const uint64_t interval_ms_;
  std::function<void(const std::string&)> on_error_;
  uv_timer_t timer_{};
  bool started_ = false;
};

}  // namespace tally
