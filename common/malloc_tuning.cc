#include "common/malloc_tuning.h"

#include <malloc.h>

namespace tally {

bool fixMallocMmapThreshold() {
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
}

}  // namespace tally
