#pragma once

#include <cstdint>

// What both daemons tell glibc's allocator first thing at start (docs/security.md "Connections
// and limits"): allocations of kMmapThresholdBytes and more get pages of their own, given back
// to the system when freed. glibc's default threshold (128 KiB) rises to the size of every large
// buffer freed, after which such buffers come from the heap and its high-water mark stays
// resident: replies queued for 50 clients that did not read kept 450-550 KiB each resident
// where they held ~300 KiB. Fixing the threshold keeps the resident set near what connections
// hold (tests/integration/connection_bounds_test.cc measures it).
//
// Release builds link both daemons with jemalloc (tally_allocator in the top-level CMakeLists);
// the sanitizer builds, and a build with TALLY_JEMALLOC=OFF, run on glibc's malloc. The tuning
// below is glibc's, and does nothing on jemalloc: jemalloc returns freed pages by its own decay,
// and a restart on it is faster without huge pages than glibc's with them (docs/LEDGER.md).

namespace tally {

// True when malloc is jemalloc's (its mallctl is linked in).
bool runningOnJemalloc();

inline constexpr uint64_t kMmapThresholdBytes = 128 * 1024;

// mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes); false if glibc refused it. Nothing on jemalloc.
bool fixMallocMmapThreshold();

// The tunable the ledger runs with (docs/LEDGER.md "Restart time"): glibc's malloc asks for
// transparent huge pages (madvise) for its heap and its large mappings. A restart over 1,000,000
// live reservations writes ~1 GB of fresh memory; with 4 KiB pages a quarter of its CPU went to
// page faults (docs/PERFORMANCE.md).
inline constexpr const char* kHugePageMallocTunables = "glibc.malloc.hugetlb=1";

// Called first in main, before anything is opened: when GLIBC_TUNABLES is not set at all,
// sets it to kHugePageMallocTunables and re-executes the running binary (its path) with
// the same arguments, the same pid and the same inherited descriptors, since glibc reads
// tunables only at exec. Returns only when it did not re-execute: the variable was already set
// (by the operator, even to an empty string, which is the opt-out, or by the first exec), or
// execv failed (then the variable is unset again and the errno is returned; 0 otherwise).
// Never on jemalloc.
int reexecWithHugePageMalloc(char** argv);

}  // namespace tally
