#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

// `tally-ledger --data-dir DIR backup DEST` (docs/operations.md "Backup and restore"): an
// online, consistent copy of the ledger's store, taken with SQLite's backup API while the
// ledger serves (or while it is stopped). It never takes DIR/LOCK: in WAL mode a reader copies
// a committed snapshot without holding the ledger's commits or fold off.
//
// Consistency across the two files. tables.db folds a prefix of ledger.db's log (folded_seq),
// and ledger.db deletes only rows already folded (trimmed_seq <= folded_seq on disk, both only
// grow). So ledger.db is copied first and tables.db second: the copied tables then hold at
// least every row the copied log lacks (folded_seq(tables copy) >= trimmed_seq(log copy)), and
// loading the copy yields a committed prefix of the ledger's history: the state after some
// commit between the two snapshots. Copying in the other order could lose the rows folded and
// trimmed in between.
//
// DEST is a new directory (it must not exist, or be empty) that is a ready data dir: ledger.db,
// tables.db and, when DIR has one, the signing key ledger.key (mode 0600; a restored ledger must
// sign with the key the agents trust). Before returning, the copy is opened and restored into a
// scratch ledger (as `check` does): a backup that would not start is reported, and removed.

namespace tally::ledger {

struct BackupSummary {
  uint64_t accounts = 0;
  uint64_t reservations = 0;
  uint64_t policies = 0;
  uint64_t bytes = 0;  // of the two database files
  int64_t folded_seq = 0;
};

// Copies DIR's store into DEST as described above.
[[nodiscard]] Result<BackupSummary> backupStore(const std::string& data_dir,
                                                const std::string& dest_dir, uint64_t wall_now_ms);

// The command: prints what was copied; returns 0, or 1 when the backup failed (nothing is left
// in DEST then).
int runBackup(const std::string& data_dir, const std::string& dest_dir, uint64_t wall_now_ms);

}  // namespace tally::ledger
