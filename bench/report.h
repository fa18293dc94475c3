#pragma once

#include "bench/cycle_loop.h"
#include "bench/options.h"
#include "bench/setup.h"
#include "bench/verify.h"

// The human-readable report and the RESULT line, in the layout of the peers' driver so that
// ../shared/peers/driver/summarize.sh reads tally's runs beside theirs.

namespace tally::bench {

// Prints to stdout; returns true when the run passes (no errors, every check passed).
bool printReport(const BenchOptions& options, const SetupOutcome& setup, CycleLoopResult* result,
                 const VerifyReport& verify);

}  // namespace tally::bench
