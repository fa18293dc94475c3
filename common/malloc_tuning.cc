#include "common/malloc_tuning.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string_view>

namespace tally {

bool fixMallocMmapThreshold() {
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
}

int reexecWithHugePageMalloc(char** argv) {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return 0;
  // The binary's own path, not /proc/self/exe: the process keeps its name ("exe" otherwise) in
  // ps, top, pkill and the journal. A binary replaced since the first exec reads "(deleted)".
  char path[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length < 0) return errno;
  if (length == 0 || static_cast<size_t>(length) >= sizeof(path) - 1) return ENAMETOOLONG;
  path[length] = '\0';
  if (std::string_view(path, static_cast<size_t>(length)).ends_with(" (deleted)")) return ENOENT;
  if (::setenv("GLIBC_TUNABLES", kHugePageMallocTunables, 0) != 0) return errno;
  ::execv(path, argv);
  const int exec_errno = errno;
  ::unsetenv("GLIBC_TUNABLES");
  return exec_errno;
}

}  // namespace tally
