#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

// `tally-ledger --data-dir DIR backup DEST` (docs/operations.md "Backup and restore"): an
// online, consistent copy of the ledger's store, taken while the ledger serves (or while it is
// stopped). It never takes DIR/LOCK: the log is read record by record (CommitLog::copyLog) and
// tables.db is copied with SQLite's backup API, which in WAL mode reads a committed snapshot
// without holding the ledger's commits or fold off.
//
// Consistency between the two. tables.db folds a prefix of the log (folded_seq), and the ledger
// recycles only log segments whose records are all folded. So the log is copied first and
// tables.db second: the copied tables then hold at least every record the copied log lacks at
// its start, and loading the copy yields a committed prefix of the ledger's history: the state
// after some commit between the two copies. (When the tables were folded past the end of the
// log copy, the copy's log is an empty one at their folded_seq.) Copying in the other order
// could lose the records folded and recycled in between.
//
// DEST is a new directory (it must not exist, or be empty) that is a ready data dir: log/,
// tables.db and, when DIR has one, the signing key ledger.key (mode 0600; a restored ledger must
// sign with the key the agents trust). Before returning, the copy is opened and restored into a
// scratch ledger (as `check` does): a backup that would not start is reported, and removed.

namespace tally::ledger {

struct BackupSummary {
  uint64_t accounts = 0;
  uint64_t reservations = 0;
  uint64_t policies = 0;
  uint64_t bytes = 0;  // of the log's segments and tables.db
  int64_t folded_seq = 0;
};

// Copies DIR's store into DEST as described above.
[[nodiscard]] Result<BackupSummary> backupStore(const std::string& data_dir,
                                                const std::string& dest_dir, uint64_t wall_now_ms);

// The command: prints what was copied; returns 0, or 1 when the backup failed (nothing is left
// in DEST then).
int runBackup(const std::string& data_dir, const std::string& dest_dir, uint64_t wall_now_ms);

}  // namespace tally::ledger
