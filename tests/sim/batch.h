#pragma once

#include <cstdint>

#include "tests/sim/gate.h"
#include "tests/sim/runner.h"

// Runs seeds first_seed … first_seed + count - 1 on `jobs` threads. Each run owns every machine
// it drives (the core is single-threaded per instance); threads share only the seed counter.
// The summary does not depend on `jobs`.

namespace tally::sim {

GateSummary runSeeds(uint64_t first_seed, uint64_t count, unsigned jobs,
                     const RunOptions& options = {});

}  // namespace tally::sim
