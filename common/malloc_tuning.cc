#include "common/malloc_tuning.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace tally {

bool fixMallocMmapThreshold() {
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
}

int reexecWithHugePageMalloc(char** argv) {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return 0;
  if (::setenv("GLIBC_TUNABLES", kHugePageMallocTunables, 0) != 0) return errno;
  ::execv("/proc/self/exe", argv);
  const int exec_errno = errno;
  ::unsetenv("GLIBC_TUNABLES");
  return exec_errno;
}

}  // namespace tally
