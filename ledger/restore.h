#pragma once

#include <cstdint>
#include <vector>

#include "core/ledger.h"
#include "core/status.h"
#include "ledger/restore_check.h"
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
  // Wall time of each phase, for the `restored` log line and bench/restart.sh: reading and
  // decoding the store (0 when given contents), checking and applying the records, then
  // finishing (deadline queues, shard registry, the full audit).
  uint64_t load_ms = 0;
  uint64_t apply_ms = 0;
  uint64_t finish_ms = 0;
};

// Refuses (kCorruption) a store holding any record findBadRecords() names, before applying
// anything, and lists them in `*bad_records` when given: the shell names each and exits with
// its own code, and `tally-ledger check` / `repair` take it from there.
Result<RestoreSummary> restoreLedger(Store* store, Ledger* ledger, uint64_t wall_now_ms,
                                     std::vector<BadRecord>* bad_records = nullptr);
// The same from contents already loaded (check and repair try a restore without committing).
Result<RestoreSummary> restoreLedger(StoreContents contents, Ledger* ledger, uint64_t wall_now_ms,
                                     std::vector<BadRecord>* bad_records = nullptr);

}  // namespace tally::ledger
