#pragma once

#include <cstdint>

// What both daemons tell glibc's allocator first thing at start (docs/security.md "Connections
// and limits"): allocations of kMmapThresholdBytes and more get pages of their own, given back
// to the system when freed. glibc's default threshold (128 KiB) rises to the size of every large
// buffer freed, after which such buffers come from the heap and its high-water mark stays
// resident: replies queued for 50 clients that did not read kept 450-550 KiB each resident
// where they held ~300 KiB. Fixing the threshold keeps the resident set near what connections
// hold (tests/integration/connection_bounds_test.cc measures it).

namespace tally {

inline constexpr uint64_t kMmapThresholdBytes = 128 * 1024;

// mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes); false if glibc refused it.
bool fixMallocMmapThreshold();

}  // namespace tally
