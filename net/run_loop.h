#pragma once

#include <uv.h>

#include <cstdint>

// How a daemon runs its libuv loop (docs/AGENT.md "Busy polling"). With busy_poll_us = 0 it is
// uv_run(UV_RUN_DEFAULT): the thread sleeps in epoll_wait whenever nothing is ready. With
// busy_poll_us > 0, each time the loop wakes from a sleep it then polls without sleeping
// (uv_run(UV_RUN_NOWAIT), an epoll_wait with a zero timeout) for busy_poll_us before it may sleep
// again. An event that arrives inside that window, such as a closed-loop gateway's next request
// right after its reply, is then handled without the thread being woken: on a VM that wake-up
// costs tens of µs. The price is up to busy_poll_us of CPU per wake-up.

namespace tally::net {

struct LoopRunStats {
  uint64_t sleeps = 0;  // iterations that could block (UV_RUN_ONCE)
  uint64_t polls = 0;   // iterations that could not (UV_RUN_NOWAIT)
};

// Runs `loop` until nothing is left to run in it (no active handle or request), as
// uv_run(UV_RUN_DEFAULT) does. Not for a loop stopped with uv_stop: that ends one iteration only.
LoopRunStats runLoop(uv_loop_t* loop, uint64_t busy_poll_us);

}  // namespace tally::net
