#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <set>

// The kill -9 durability tests' harness: a forked child runs `child(ack_fd)`, which writes each
// uint64_t it has made durable to ack_fd (and _exits, never returns); once `acks_before_kill`
// acknowledgements have arrived the parent SIGKILLs it and reaps it. *acknowledged gets every
// acknowledgement, those written just before the kill included. Call it under
// ASSERT_NO_FATAL_FAILURE: a child that stops acknowledging for 30 s, or exits early, fails.

namespace tally::testing {

inline void killAfterAcknowledgements(uint64_t acks_before_kill,
                                      const std::function<void(int ack_fd)>& child,
                                      std::set<uint64_t>* acknowledged) {
  int ack[2] = {-1, -1};
  ASSERT_EQ(::pipe(ack), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ack[0]);
    child(ack[1]);
    ::_exit(0);
  }
  ::close(ack[1]);
  uint64_t value = 0;
  while (acknowledged->size() < acks_before_kill) {
    pollfd fd{.fd = ack[0], .events = POLLIN, .revents = 0};
    ASSERT_EQ(::poll(&fd, 1, 30'000), 1) << "child stopped acknowledging";
    ASSERT_EQ(::read(ack[0], &value, sizeof(value)), static_cast<ssize_t>(sizeof(value)))
        << "child exited early";
    acknowledged->insert(value);
  }
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int wait_status = 0;
  ASSERT_EQ(::waitpid(pid, &wait_status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wait_status));
  while (::read(ack[0], &value, sizeof(value)) == static_cast<ssize_t>(sizeof(value))) {
    acknowledged->insert(value);
  }
  ::close(ack[0]);
}

}  // namespace tally::testing
