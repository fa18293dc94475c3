#include "common/sd_watchdog.h"

#include <utility>

#include "common/sd_notify.h"

namespace tally {

SdWatchdog::SdWatchdog(uv_loop_t* loop, uint64_t interval_ms,
                       std::function<void(const std::string&)> on_error)
    : loop_(loop), interval_ms_(interval_ms), on_error_(std::move(on_error)) {
  timer_.data = this;
}

bool SdWatchdog::start() {
  if (interval_ms_ == 0 || started_) return true;
  if (uv_timer_init(loop_, &timer_) != 0) return false;
  started_ = true;
  ping();
  uv_update_time(loop_);  // the loop's cached time may be from before a long start-up
  return uv_timer_start(&timer_, &SdWatchdog::onTimer, interval_ms_, interval_ms_) == 0;
}

void SdWatchdog::stop() {
  if (!started_) return;
  auto* handle = reinterpret_cast<uv_handle_t*>(&timer_);
  if (!uv_is_closing(handle)) uv_close(handle, nullptr);
}

void SdWatchdog::onTimer(uv_timer_t* timer) { static_cast<SdWatchdog*>(timer->data)->ping(); }

void SdWatchdog::ping() {
  if (Status s = sdNotify("WATCHDOG=1"); !s.isOk() && on_error_) on_error_(s.toString());
}

}  // namespace tally
