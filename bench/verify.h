#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/rpc.h"
#include "core/ledger_types.h"
#include "core/status.h"

// The checks after the timed phase (and the baseline before it), through the ledger's Audit and
// Query requests:
//  * the audit conserves (the ledger-wide flag and every bench account's);
//  * every bench subject holds nothing: reserved == 0 on each of its accounts; no debt;
//  * per subject, spent + debt (summed over its accounts) grew by exactly the sum of `actual`
//    this run settled on it;
//  * a sample of reservations, replayed from the seed, is SETTLED with the expected units.

namespace tally::bench {

// The bench subjects' accounts, from an audit filtered by the bench route.
struct BenchAudit {
  bool conserved = true;                // the ledger-wide audit flag
  std::vector<std::string> violations;  // the ledger's, first few
  std::vector<AccountView> accounts;    // accounts of <prefix>-<i>, i < subjects
  std::vector<uint32_t> subject_of;     // accounts[k] belongs to subject subject_of[k]
  uint64_t pages = 0;                   // audit pages asked for (limits::kAuditRoutesPerPage each)

  // spent + debt per subject, summed over its accounts.
  std::vector<Units> consumedPerSubject(uint32_t subjects) const;
};

// Audits route "bench" and keeps the accounts of this run's subjects. If the ledger cannot
// answer the whole route in one frame, audits subject by subject (pipelined). Errors: transport,
// timeouts, unexpected replies.
Result<BenchAudit> auditBench(Rpc* rpc, const std::string& prefix, uint32_t subjects);

struct VerifyInput {
  std::string prefix;
  uint32_t subjects = 0;
  uint64_t seed = 0;
  uint64_t cycles_created = 0;
  uint32_t sample_queries = 0;
  std::vector<Units> baseline_consumed;  // consumedPerSubject() before the run
  std::vector<Units> settled_actual;     // per subject, what this run settled
};

struct VerifyReport {
  std::vector<std::string> failures;  // empty: PASS
  std::vector<std::string> notes;     // what was checked, for humans
};

VerifyReport verifyRun(Rpc* rpc, const VerifyInput& input);

}  // namespace tally::bench
