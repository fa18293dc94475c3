#include "net/run_loop.h"

namespace tally::net {

LoopRunStats runLoop(uv_loop_t* loop, uint64_t busy_poll_us) {
  LoopRunStats stats;
  if (busy_poll_us == 0) {
    uv_run(loop, UV_RUN_DEFAULT);
    return stats;
  }
  const uint64_t window_ns = busy_poll_us * 1000;
  for (;;) {
    ++stats.sleeps;
    if (uv_run(loop, UV_RUN_ONCE) == 0) return stats;
    const uint64_t until_ns = uv_hrtime() + window_ns;
    do {
      ++stats.polls;
      if (uv_run(loop, UV_RUN_NOWAIT) == 0) return stats;
    } while (uv_hrtime() < until_ns);
  }
}

}  // namespace tally::net
