#pragma once

#include <cstdint>

#include "core/ledger.h"
#include "core/status.h"
#include "ledger/store.h"

// Rebuilds a fresh core Ledger from the durable record: policies, then accounts, then
// reservations, then the ledger's own consistency audit. Any inconsistency is an error that
// names it; the ledger refuses to serve rather than serve a state it cannot vouch for.

namespace tally::ledger {

struct RestoreSummary {
  uint64_t policies = 0;
  uint64_t accounts = 0;
  uint64_t reservations = 0;
  uint64_t gateways = 0;
  uint64_t shards = 0;
  uint64_t ledger_clock_ms = 0;  // max(persisted high-water mark, now)
};

Result<RestoreSummary> restoreLedger(Store* store, Ledger* ledger, uint64_t wall_now_ms);

}  // namespace tally::ledger
