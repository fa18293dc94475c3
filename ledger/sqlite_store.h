#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "core/status.h"
#include "ledger/commit_log.h"
#include "ledger/store.h"
#include "ledger/store_codec.h"

// The production Store: the commit log (DIR/log/, ledger/commit_log.h) and one SQLite file,
// DIR/tables.db, in WAL mode with synchronous=FULL.
//
// Layout.
//  * DIR/log/ holds the commit log. commit() appends the whole batch as ONE record (one flat
//    Cap'n Proto blob, one pwrite, one fdatasync), so a batch costs one flush however many
//    operations it carries, and writes only its own bytes.
//  * DIR/tables.db holds `policies`, `accounts`, `reservations`, `gateways`, `shards`, `fences`,
//    `period_snapshots`, `operators` and `audit_log` (one row per record, latest image),
//    `meta.shard_sequence` and `meta.folded_seq`: every log record with seq <= folded_seq is in
//    the tables. Schema version 7; older data dirs are migrated when opened (below). Version 6
//    wrote the log's batches packed; they are read as they are.
//  * A background fold thread reads log records after folded_seq, folds them into tables.db in
//    transactions of at most fold_rows_per_transaction_max records that also raise folded_seq,
//    and publishes each new folded_seq. It decodes only the latest image of each row in a
//    transaction (BatchFolder). The commit path then releases the folded records, whose
//    segments the log recycles: the log on disk is the unfolded records plus about two segments.
//  * load() reads tables.db and replays the log records with seq > folded_seq over it. A crash
//    at any point is safe: a record is released only after its images are durable in tables.db,
//    and replaying records that were already folded is harmless (they are full images, replayed
//    in order up to the end of the log, so later images still win).
//  * Data dirs of schema version 5 and older kept the log as a table of DIR/ledger.db. open()
//    copies its rows after folded_seq into a new log (DIR/log.migrating/, synced, then renamed
//    to DIR/log/), then deletes ledger.db: a crash in between leaves either the old layout
//    (migrated again) or the new log next to an old ledger.db (deleted again).
//
// Threads. Two threads touch a SqliteStore:
//  * the caller's thread — open(), commit(), load(), checkpoint(), stats(), the destructor, one
//    call at a time (for the ledger, a libuv worker runs commit() while the loop thread waits;
//    the Store contract). It appends to the log and owns a reader connection to tables.db (for
//    load()).
//  * the fold thread, started by open() and joined by the destructor. It reads the log (the
//    log's read() may run beside an append) and owns its own connection to tables.db.
//  Everything they share (committed and folded seqs, the fold's status, its stats, stop) lives
//  under mu_. Neither thread holds mu_ during I/O.
//
// Ownership and lifetime. A SqliteStore owns the log, its two connections, every prepared
// statement, the fold thread and an exclusive flock on DIR/LOCK, all released by the
// destructor; the lock keeps a second process (or a second SqliteStore in this one) out of the
// data dir. Non-copyable, non-movable.
//
// Errors. Every failure is a Status naming the operation: kResourceExhausted for a full disk,
// kCorruption for a damaged file or record (with the log seq or table key), kIoError for the
// rest. After a kIoError or kCorruption in commit() or in the fold thread, durability is unknown
// or the record cannot be read back, so the store refuses every later commit()/checkpoint()
// with kFailedPrecondition; the ledger must stop and rebuild from disk. A full disk is not
// sticky: nothing was appended; commit() may be retried, and the fold thread retries after
// fold_retry_ms.

namespace tally::sqlite {
class Connection;
}

namespace tally::ledger {

struct SqliteStoreOptions {
  // The fold thread starts a burst once this many committed log rows are not yet folded, and
  // folds everything committed by then; 0: it folds only when checkpoint() asks (tests). Fewer,
  // larger bursts disturb the commit path's fsyncs less often (measured: 1024 against 256
  // lowers the benchmark's cycle p99 from ~10 to ~8 ms).
  uint64_t checkpoint_log_rows = 1024;
  // Most log rows, and most bytes of them, that one fold transaction reads from ledger.db and
  // writes into tables.db (a transaction always takes at least one row).
  uint64_t fold_rows_per_transaction_max = 256;
  uint64_t fold_bytes_per_transaction_max = uint64_t{64} << 20;
  // The log starts a new segment file once the current one would pass this many bytes.
  uint64_t log_segment_bytes = uint64_t{32} << 20;
  // After a non-sticky fold failure (a full disk), the fold thread waits this long to retry.
  uint64_t fold_retry_ms = 1000;
  // Largest encoded batch commit() accepts (kResourceExhausted beyond it); also the largest log
  // record or table blob load() and the fold read before calling it corrupt.
  uint64_t batch_bytes_max = uint64_t{256} << 20;
  // PRAGMA max_page_count of tables.db: the largest it may grow, in pages (4 KiB); reaching it
  // fails folds with kResourceExhausted like a full disk. 0: SQLite's maximum.
  uint64_t database_pages_max = 0;
};

struct SqliteStoreStats {
  // Commit path.
  uint64_t commits = 0;
  uint64_t commit_us = 0;  // wall time inside commit(), fsync included
  uint64_t encode_us = 0;  // of which encoding the batch
  uint64_t log_bytes = 0;  // encoded batches appended to the log
  uint64_t log_segments_created = 0;
  uint64_t log_segments_recycled = 0;
  uint64_t log_segments_deleted = 0;
  // Fold thread.
  uint64_t folds = 0;  // tables.db transactions
  uint64_t folded_rows = 0;
  uint64_t fold_us = 0;      // reading, folding and writing, including tables.db's fsync
  uint64_t fold_cpu_us = 0;  // the fold thread's CPU time
};

class SqliteStore final : public Store {
 public:
  static constexpr int64_t kSchemaVersion = 7;
  static constexpr const char* kLogDirName = "log";
  static constexpr const char* kTablesFileName = "tables.db";
  // Where schema versions 5 and older kept the log (migrated by open()).
  static constexpr const char* kLegacyLogFileName = "ledger.db";
  static constexpr const char* kLockFileName = "LOCK";

  // Creates `data_dir` (mode 0750) if missing, locks it, opens or creates the log and tables.db
  // (migrating an older layout), starts the fold thread. kFailedPrecondition if another store
  // holds the dir or a file has a schema version this build does not read; kCorruption if log
  // records that tables.db does not hold are missing or damaged (or the log is gone while
  // tables.db exists).
  static Result<std::unique_ptr<SqliteStore>> open(const std::string& data_dir,
                                                   SqliteStoreOptions options = {});

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Durable when it returns OK. Also releases the log records the fold thread has made durable
  // in tables.db.
  [[nodiscard]] Status commit(const StoreBatch& batch) override;
  [[nodiscard]] Result<StoreContents> load() override;

  // Waits until the fold thread has folded every committed log record, then releases them all.
  // Returns the fold's failure if it fails meanwhile.
  [[nodiscard]] Status checkpoint();

  // Log records committed and not yet released (not known to be folded by the commit path).
  uint64_t pendingLogRows() const;
  // The highest log seq durable in tables.db.
  int64_t foldedSeq() const;
  // OK, or the fold thread's latest failure (sticky or not).
  Status foldStatus() const;
  SqliteStoreStats stats() const;
  const std::string& logPath() const { return log_path_; }
  // Bytes the log's segment files take.
  uint64_t logDiskBytes() const;
  const std::string& tablesPath() const { return tables_path_; }

 private:
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can make a Key: use open().
  SqliteStore(Key, const std::string& data_dir, int lock_fd, SqliteStoreOptions options);

 private:
  Status initialize();
  Status openTables(int64_t* folded_seq);
  Status openLog(int64_t folded_seq, bool require_segments);
  Status migrateLegacyLog(int64_t folded_seq);
  Status openFoldConnection();

  Status checkUsable();
  // Turns an I/O or corruption failure into the sticky failed state (see the class comment).
  Status noteFailure(Status status);
  Status loadContents(StoreContents* contents);

  // Fold thread.
  void runFold();
  bool foldDue() const;  // under mu_
  Status foldRange(int64_t after_seq, int64_t* last_seq);
  // foldRange's reading and writing, with the buffers and lists it leaves to foldRange.
  Status writeFoldOf(int64_t after_seq, int64_t* last_seq);

  const std::string data_dir_;
  const std::string log_path_;
  const std::string tables_path_;
  const int lock_fd_;
  const SqliteStoreOptions options_;

  // Appended and released on the caller's thread, read by both (see CommitLog).
  std::unique_ptr<CommitLog> log_;

  // Caller's thread only.
  std::unique_ptr<sqlite::Connection> tables_;  // tables.db: load
  int64_t next_seq_ = 1;                        // seq of the next log record; never reused
  Status failed_;                               // OK unless a failure made durability unknown
  SqliteStoreStats commit_stats_;
  BatchEncoder encoder_;

  // Fold thread only, between its start and its join.
  std::unique_ptr<sqlite::Connection> fold_tables_;  // tables.db: writes folds
  // Each fold's net effect, reused: its lists, megabytes in a busy fold, allocated afresh each
  // time were given back and faulted in again every fold (docs/PERFORMANCE.md). Kept up to
  // kFoldNetKeptBytesMax of capacity.
  StoreBatch fold_net_;
  // The records each fold reads, one buffer per record, reused likewise: freed together, a
  // fold's buffers made one free range large enough for jemalloc to give back at once, so every
  // fold faulted them in again. Kept up to kFoldBuffersKeptBytesMax.
  std::vector<std::vector<uint64_t>> fold_buffers_;

  // Shared, under mu_.
  mutable std::mutex mu_;
  std::condition_variable fold_wanted_;  // the fold thread waits here
  std::condition_variable fold_done_;    // checkpoint() waits here
  int64_t committed_seq_ = 0;            // highest durable log seq
  int64_t folded_seq_ = 0;               // highest log seq durable in tables.db
  int64_t requested_seq_ = 0;            // checkpoint() wants folded_seq_ >= it
  uint64_t fold_attempts_ = 0;
  Status fold_status_;  // the latest fold attempt's
  Status fold_failed_;  // sticky: OK unless a fold failed with kIoError or kCorruption
  bool stop_ = false;
  SqliteStoreStats fold_stats_;

  std::thread fold_thread_;  // last: started when everything above is ready
};

}  // namespace tally::ledger
