#include "bench/loop.h"

#include <string>
#include <utility>

#include "core/assert.h"

namespace tally::bench {

Timer::~Timer() { TALLY_ASSERT(closed()); }

Status Timer::init() {
  TALLY_ASSERT(!initialized_);
  if (int rc = uv_timer_init(loop_, &timer_); rc != 0) {
    return Status::unavailable(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  timer_.data = this;
  initialized_ = true;
  return Status::ok();
}

Status Timer::start(uint64_t timeout_ms, std::function<void()> on_fire) {
  TALLY_ASSERT(initialized_ && !closing_);
  on_fire_ = std::move(on_fire);
  if (int rc = uv_timer_start(&timer_, onFire, timeout_ms, 0); rc != 0) {
    return Status::unavailable(std::string("uv_timer_start: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void Timer::onFire(uv_timer_t* timer) {
  auto* self = static_cast<Timer*>(timer->data);
  if (self->on_fire_) self->on_fire_();
}

void Timer::stop() {
  // uv_timer_stop always returns 0; a stopped or closing timer is a no-op.
  if (initialized_ && !closing_) (void)uv_timer_stop(&timer_);
}

void Timer::close() {
  if (!initialized_ || closing_) return;
  closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_),
           [](uv_handle_t* handle) { static_cast<Timer*>(handle->data)->close_done_ = true; });
}

bool runUntil(uv_loop_t* loop, Timer* deadline, uint64_t timeout_ms,
              const std::function<bool()>& done) {
  bool expired = false;
  if (!deadline->start(timeout_ms, [&expired] { expired = true; }).isOk()) return done();
  while (!done() && !expired) (void)uv_run(loop, UV_RUN_ONCE);
  deadline->stop();
  return done();
}

}  // namespace tally::bench
