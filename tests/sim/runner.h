#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/sim/agent_node.h"
#include "tests/sim/checks.h"
#include "tests/sim/gateway.h"
#include "tests/sim/ledger_node.h"

// One interleaving: the seed builds a workload, a ledger, gateways and an operator on a
// misbehaving network, runs a few hundred steps chosen by the seed with every check after each,
// then heals everything, lets simulated time pass and checks the end state.

namespace tally::sim {

struct RunOptions {
  uint64_t seed = 1;
  bool trace = false;
#ifdef TALLY_TEST_FAULTS
  NodeFaults node_faults;
  GatewayFaults gateway_faults;
  AgentFaults agent_faults;
#endif
};

struct RunResult {
  uint64_t seed = 0;
  uint64_t steps = 0;
  std::array<bool, kCheckCount> failed{};
  std::vector<Finding> findings;  // in order; the first is the first failed check
  std::vector<uint64_t> convergence_ms;
  std::vector<std::string> trace;  // when traced
  uint64_t crashes = 0;
  uint64_t messages = 0;
  uint64_t closed_periods_checked = 0;  // accounting periods compared live vs durable
  uint64_t shard_admissions = 0;        // reservations agents admitted from shards
  uint64_t agent_restarts = 0;
  std::vector<TenantFairness> fairness;  // per agent and tenant (seeds with fair scheduling)

  bool ok() const { return findings.empty(); }
};

RunResult runOne(const RunOptions& options);

}  // namespace tally::sim
