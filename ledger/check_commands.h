#pragma once

#include <cstdint>
#include <string>

// `tally-ledger --data-dir DIR check` and `repair` (docs/RUNBOOK.md "A record the ledger cannot
// apply"): the operator's way out of a store that a restore refuses. Both open the store (its
// lock: the ledger must be stopped), print to stdout, and return the process exit code.

namespace tally::ledger {

inline constexpr int kExitCheckClean = 0;
inline constexpr int kExitCheckBadRecords = 65;  // EX_DATAERR, as a refused restore
inline constexpr int kExitCheckStartup = 1;      // the store could not be opened or read

// Lists every record findBadRecords() names; with none, tries a full restore and reports its
// error if it fails.
int runCheck(const std::string& data_dir, uint64_t wall_now_ms);

// Plans the repair, proves that the repaired contents restore cleanly, appends every
// correction to DIR/quarantine.jsonl (fsync'd), then commits the batch. Writes nothing when
// anything is unrepairable or the trial restore fails.
int runRepair(const std::string& data_dir, uint64_t wall_now_ms);

}  // namespace tally::ledger
