#include "common/malloc_tuning.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string_view>

// jemalloc's control interface: defined when jemalloc is linked, null otherwise.
extern "C" int mallctl(const char* name, void* old_value, size_t* old_length, void* new_value,
                       size_t new_length) __attribute__((weak));

// jemalloc's options, read when it starts (an operator's MALLOC_CONF is applied after them):
// allocations of kMmapThresholdBytes (128 KiB) and more come from an arena of their own whose
// freed pages are given back at once, as fixMallocMmapThreshold() makes glibc do. Under its
// default the pages of freed reply buffers stay resident for up to 10 s: 50 clients that did not
// read grew the ledger by 30 MiB where they held 12 (tests/integration/connection_bounds_test.cc).
extern "C" {
const char* malloc_conf = "oversize_threshold:131072";
}

namespace tally {

static_assert(kMmapThresholdBytes == 131072, "malloc_conf's oversize_threshold says the same");

bool runningOnJemalloc() { return mallctl != nullptr; }

bool fixMallocMmapThreshold() {
  if (runningOnJemalloc()) return true;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
}

int reexecWithHugePageMalloc(char** argv) {
  if (runningOnJemalloc() || std::getenv("GLIBC_TUNABLES") != nullptr) return 0;
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
