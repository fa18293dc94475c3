#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/status.h"

// A minimal sd_notify(3) without libsystemd: one datagram with `state` (e.g. "READY=1",
// "STOPPING=1", "WATCHDOG=1") to the AF_UNIX socket named by $NOTIFY_SOCKET. A name starting
// with '@' is in the abstract namespace. Without $NOTIFY_SOCKET (not under systemd) it does
// nothing and returns ok.

namespace tally {

Status sdNotify(const std::string& state);

// Socket activation (sd_listen_fds(3)): the number of descriptors passed from fd 3 on when
// $LISTEN_PID is this process and $LISTEN_FDS is set; 0 otherwise. Unsets both variables so
// that children do not inherit them.
int sdListenFds();

// sd_watchdog_enabled(3): how often to send "WATCHDOG=1", in ms: half of `watchdog_usec` (the
// text of $WATCHDOG_USEC, a positive decimal), at least 1 ms. 0 (no watchdog) when `watchdog_usec`
// is null, empty or not a positive decimal, or when `watchdog_pid` (the text of $WATCHDOG_PID)
// is set and names another process than `self`.
uint64_t watchdogIntervalMs(const char* watchdog_usec, const char* watchdog_pid, pid_t self);

// watchdogIntervalMs() of this process's environment; unsets WATCHDOG_USEC and WATCHDOG_PID so
// that children do not inherit them.
uint64_t sdWatchdogIntervalMs();

}  // namespace tally
