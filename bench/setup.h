#pragma once

#include <cstddef>
#include <string>

#include "bench/options.h"
#include "bench/rpc.h"
#include "core/status.h"
#include "core/types.h"

// Before the timed phase: a health check, then the policy the run needs.
//
// Publishing replaces the active policy with a new generation (SPEC §3), so tally-bench
// republishes the active policy's budgets unchanged, minus any earlier bench budget (route
// "bench", which belongs to tally-bench), plus this run's budget (workload.h benchBudget()).
// Other tenants keep being admitted; their old generation drains into the new one.

namespace tally::bench {

struct SetupOutcome {
  std::string server_version;
  bool published = false;
  Generation generation = 0;   // published, or the active one with --no-publish
  size_t budgets_kept = 0;     // other budgets carried over from the active policy
  size_t budgets_dropped = 0;  // earlier bench budgets left out
};

Result<SetupOutcome> setUp(Rpc* rpc, const BenchOptions& options);

}  // namespace tally::bench
