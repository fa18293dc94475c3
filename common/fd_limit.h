#pragma once

#include <cstdint>
#include <string>

#include "common/log.h"

// Raising the soft limit on open file descriptors (RLIMIT_NOFILE) to the hard limit, which both
// daemons do first thing at start (docs/security.md "File descriptors"): every connection is a
// descriptor, and a daemon started under `ulimit -n 1024` would otherwise stop accepting at about
// a thousand clients while new ones hang in the backlog. The hard limit is the operator's (or
// systemd's LimitNOFILE=) ceiling; nothing here raises it.

namespace tally {

struct FdLimit {
  uint64_t soft_before = 0;
  uint64_t soft = 0;  // after: the hard limit when raised
  uint64_t hard = 0;
  bool raised = false;  // soft < hard before, and setrlimit succeeded
  std::string error;    // getrlimit/setrlimit failed: why (the limit is then unchanged)
};

// What the soft limit should become: the hard limit, except an unlimited hard limit (which Linux
// refuses as a soft NOFILE value) is capped at `nr_open` (/proc/sys/fs/nr_open). Never lower than
// `soft`.
uint64_t fdLimitTarget(uint64_t soft, uint64_t hard, bool hard_unlimited, uint64_t nr_open);

// Raises this process's soft RLIMIT_NOFILE to fdLimitTarget(); never fails the caller.
FdLimit raiseFdLimit();

// One line: "fd_limit" (info) with soft_before, soft, hard; a warning naming the error instead
// when the limit could not be raised.
void logFdLimit(const FdLimit& limit, Logger* logger);

}  // namespace tally
