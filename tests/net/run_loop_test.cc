// net/run_loop.h on a real libuv loop: a timer and a socketpair watched with uv_poll.

#include "net/run_loop.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tally::net {
namespace {

// A repeating timer that closes itself after `fires_max` fires.
struct CountedTimer {
  uv_timer_t timer{};
  int fires = 0;
  int fires_max = 0;
};

void onCountedTimer(uv_timer_t* timer) {
  auto* counted = static_cast<CountedTimer*>(timer->data);
  if (++counted->fires == counted->fires_max)
    uv_close(reinterpret_cast<uv_handle_t*>(timer), nullptr);
}

LoopRunStats runTimer(uint64_t busy_poll_us, int* fires) {
  uv_loop_t loop;
  EXPECT_EQ(uv_loop_init(&loop), 0);
  CountedTimer counted{.fires_max = 3};
  counted.timer.data = &counted;
  EXPECT_EQ(uv_timer_init(&loop, &counted.timer), 0);
  EXPECT_EQ(uv_timer_start(&counted.timer, onCountedTimer, 1, 1), 0);
  const LoopRunStats stats = runLoop(&loop, busy_poll_us);
  *fires = counted.fires;
  EXPECT_EQ(uv_loop_close(&loop), 0);
  return stats;
}

TEST(RunLoopTest, WithoutBusyPollingItRunsUntilNothingIsLeftAndNeverPolls) {
  int fires = 0;
  const LoopRunStats stats = runTimer(0, &fires);
  EXPECT_EQ(fires, 3);
  EXPECT_EQ(stats.sleeps, 0u);
  EXPECT_EQ(stats.polls, 0u);
}

TEST(RunLoopTest, WithBusyPollingEachWakeUpIsFollowedByPollsAndItEndsWhenNothingIsLeft) {
  int fires = 0;
  const LoopRunStats stats = runTimer(200, &fires);
  EXPECT_EQ(fires, 3);
  EXPECT_GE(stats.sleeps, 1u);
  // Every wake-up but the last (after which nothing was left) was followed by polls.
  EXPECT_GE(stats.polls, stats.sleeps - 1);
}

// The closed-loop case: a timer's callback makes a socket readable (as a reply makes the
// gateway's next request arrive); the poll window handles it without a second sleep.
struct Pair {
  int fds[2] = {-1, -1};
  uv_timer_t timer{};
  uv_poll_t poll{};
  bool read = false;
};

// Long enough that the byte, written before the window opens, is always read inside it.
constexpr uint64_t kPollWindowUs = 1000;
// Several ticks of libuv's coarse loop clock, so the timer is never due before the first sleep.
constexpr uint64_t kTimerMs = 20;

TEST(RunLoopTest, AnEventReadyInsideThePollWindowIsHandledWithoutAnotherSleep) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  Pair pair;
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair.fds), 0);
  pair.timer.data = &pair;
  pair.poll.data = &pair;
  ASSERT_EQ(uv_timer_init(&loop, &pair.timer), 0);
  ASSERT_EQ(uv_poll_init(&loop, &pair.poll, pair.fds[0]), 0);
  ASSERT_EQ(uv_poll_start(&pair.poll, UV_READABLE,
                          [](uv_poll_t* poll, int status, int events) {
                            auto* p = static_cast<Pair*>(poll->data);
                            EXPECT_EQ(status, 0);
                            EXPECT_TRUE(events & UV_READABLE);
                            char byte = 0;
                            EXPECT_EQ(::read(p->fds[0], &byte, 1), 1);
                            p->read = true;
                            uv_close(reinterpret_cast<uv_handle_t*>(poll), nullptr);
                          }),
            0);
  uv_update_time(&loop);
  ASSERT_EQ(uv_timer_start(
                &pair.timer,
                [](uv_timer_t* timer) {
                  auto* p = static_cast<Pair*>(timer->data);
                  EXPECT_EQ(::write(p->fds[1], "x", 1), 1);
                  uv_close(reinterpret_cast<uv_handle_t*>(timer), nullptr);
                },
                kTimerMs, 0),
            0);
  const LoopRunStats stats = runLoop(&loop, kPollWindowUs);
  EXPECT_TRUE(pair.read);
  // The one that ended with the timer. Without the window, reading the byte takes a second.
  EXPECT_EQ(stats.sleeps, 1u);
  EXPECT_EQ(uv_loop_close(&loop), 0);
  ::close(pair.fds[0]);
  ::close(pair.fds[1]);
}

}  // namespace
}  // namespace tally::net
