#include "common/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace tally {
namespace {

// /proc/sys/fs/nr_open, or Linux's default (2^20) when it cannot be read.
uint64_t nrOpen() {
  std::ifstream file("/proc/sys/fs/nr_open");
  uint64_t value = 0;
  if (file >> value && value > 0) return value;
  return 1u << 20;
}

}  // namespace

uint64_t fdLimitTarget(uint64_t soft, uint64_t hard, bool hard_unlimited, uint64_t nr_open) {
  const uint64_t ceiling = hard_unlimited ? nr_open : hard;
  return std::max(soft, ceiling);
}

FdLimit raiseFdLimit() {
  FdLimit out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    out.error = std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno);
    return out;
  }
  const bool soft_unlimited = limit.rlim_cur == RLIM_INFINITY;
  const bool hard_unlimited = limit.rlim_max == RLIM_INFINITY;
  out.soft_before = soft_unlimited ? UINT64_MAX : limit.rlim_cur;
  out.soft = out.soft_before;
  out.hard = hard_unlimited ? UINT64_MAX : limit.rlim_max;
  if (soft_unlimited) return out;
  const uint64_t target = fdLimitTarget(limit.rlim_cur, limit.rlim_max, hard_unlimited, nrOpen());
  if (target == limit.rlim_cur) return out;
  limit.rlim_cur = static_cast<rlim_t>(target);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    out.error = std::string("setrlimit(RLIMIT_NOFILE, ") + std::to_string(target) +
                "): " + std::strerror(errno);
    return out;
  }
  out.soft = target;
  out.raised = true;
  return out;
}

void logFdLimit(const FdLimit& limit, Logger* logger) {
  if (!limit.error.empty()) {
    logger->warn("fd_limit_not_raised",
                 {{"soft", limit.soft_before}, {"hard", limit.hard}, {"error", limit.error}});
    return;
  }
  logger->info("fd_limit", {{"soft_before", limit.soft_before},
                            {"soft", limit.soft},
                            {"hard", limit.hard},
                            {"raised", limit.raised}});
}

}  // namespace tally
