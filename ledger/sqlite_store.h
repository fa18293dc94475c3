#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "core/status.h"
#include "ledger/store.h"
#include "ledger/store_codec.h"

// The production Store: two SQLite files under the data dir, both in WAL mode with
// synchronous=FULL.
//
// Layout.
//  * DIR/ledger.db holds the commit log. commit() appends the whole batch as ONE row of `log`
//    (one packed Cap'n Proto blob, one transaction, one fsync), so a batch costs one fsync
//    however many operations it carries and no per-row SQL runs on the commit path.
//  * DIR/tables.db holds `policies`, `accounts`, `reservations`, `gateways`, `shards` and
//    `fences` (one row per record, latest image), `meta.shard_sequence` and `meta.folded_seq`:
//    every log row with seq <= folded_seq is in the tables. Schema version 3; a version-2 data
//    dir (before emergency shards) is migrated when opened: the shard tables are created.
//  * A background fold thread reads log rows after folded_seq from ledger.db (WAL lets it read
//    while commits append), folds them into tables.db in transactions of at most
//    fold_rows_per_transaction_max rows that also raise folded_seq, and publishes each new
//    folded_seq. It decodes only the latest image of each row in a transaction (BatchFolder). The
//    commit path then deletes log rows <= folded_seq inside its next commit transaction and
//    records them in ledger.db's meta.trimmed_seq. So trimmed_seq <= folded_seq always holds on
//    disk, and ledger.db keeps every row after trimmed_seq.
//  * load() reads tables.db and replays the log rows with seq > folded_seq over it. A crash at
//    any point is safe: a row is deleted only after its images are durable in tables.db, and
//    replaying rows that were already folded is harmless (they are full images, replayed in
//    order up to the end of the log, so later images still win).
//  * ledger.db's own WAL is copied back into ledger.db by the fold thread (PASSIVE checkpoints
//    after each fold, which never hold commits off). Once the WAL holds log_wal_frames_max
//    frames and nearly all are copied, the next commit copies the last few itself (one small
//    copy and one fsync), so that the commit after it starts the WAL over: commits keep
//    overwriting one WAL file of stable size instead of growing it, and no commit ever waits
//    for a lock. The commit connection's own autocheckpoint is a backstop only.
//
// Threads. Two threads touch a SqliteStore:
//  * the caller's thread — open(), commit(), load(), checkpoint(), stats(), the destructor, one
//    call at a time (for the ledger, a libuv worker runs commit() while the loop thread waits;
//    the Store contract). It owns the commit connection to ledger.db and a reader connection to
//    tables.db (for load()).
//  * the fold thread, started by open() and joined by the destructor. It owns its own two
//    connections (one per file), opened by open() before the thread starts and closed after the
//    join.
//  Everything they share (committed and folded seqs, the fold's status, its stats, stop) lives
//  under mu_. Neither thread holds mu_ during SQLite calls. The two connections to each file
//  meet only in SQLite's WAL locks, and only in ways that never block: WAL readers do not block
//  the writer, and PASSIVE checkpoints neither wait nor hold the writer lock.
//
// Ownership and lifetime. A SqliteStore owns its four connections, every prepared statement, the
// fold thread and an exclusive flock on DIR/LOCK, all released by the destructor; the lock keeps
// a second process (or a second SqliteStore in this one) out of the data dir. Non-copyable,
// non-movable.
//
// Errors. Every SQLite failure is a Status naming the operation: kResourceExhausted for a full
// disk, kCorruption for a damaged file or record (with the log seq or table key), kIoError for
// the rest. After a kIoError or kCorruption in commit(), in a trim, or in the fold thread,
// durability is unknown or the record cannot be read back, so the store refuses every later
// commit()/checkpoint() with kFailedPrecondition; the ledger must stop and rebuild from disk. A
// full disk is not sticky: the transaction was rolled back; commit() may be retried, and the
// fold thread retries after fold_retry_ms.

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
  // Most folded log rows one commit deletes from ledger.db. Deleting a log row costs the commit
  // ~20-40 us (SQLite walks the row's overflow pages to free them), so trims go in small steps.
  uint64_t trim_rows_per_commit_max = 32;
  // ledger.db's WAL is restarted from its beginning once it holds this many 4 KiB frames.
  uint64_t log_wal_frames_max = 8192;
  // After a non-sticky fold failure (a full disk), the fold thread waits this long to retry.
  uint64_t fold_retry_ms = 1000;
  // Largest encoded batch commit() accepts (kResourceExhausted beyond it); also the largest log
  // or table blob load() and the fold read before calling it corrupt.
  uint64_t batch_bytes_max = uint64_t{256} << 20;
  // PRAGMA max_page_count of each file: the largest it may grow, in pages (4 KiB); reaching it
  // fails commits with kResourceExhausted like a full disk. 0: SQLite's maximum.
  uint64_t database_pages_max = 0;
};

struct SqliteStoreStats {
  // Commit path.
  uint64_t commits = 0;
  uint64_t commit_us = 0;          // wall time inside commit(), fsync included
  uint64_t log_bytes = 0;          // encoded batches appended to the log
  uint64_t log_pages_written = 0;  // pages commits wrote to ledger.db's WAL
  uint64_t trims = 0;              // commits that also deleted folded log rows
  uint64_t trimmed_rows = 0;
  uint64_t log_wal_restarts = 0;    // commits that copied the WAL's last frames, to restart it
  uint64_t log_wal_restart_us = 0;  // what that copying (and its fsync) added to commits
  // Fold thread.
  uint64_t folds = 0;  // tables.db transactions
  uint64_t folded_rows = 0;
  uint64_t fold_us = 0;              // reading, folding and writing, including tables.db's fsync
  uint64_t fold_cpu_us = 0;          // the fold thread's CPU time
  uint64_t log_wal_checkpoints = 0;  // PASSIVE checkpoints of ledger.db's WAL
};

class SqliteStore final : public Store {
 public:
  static constexpr int64_t kSchemaVersion = 5;
  static constexpr const char* kDatabaseFileName = "ledger.db";
  static constexpr const char* kTablesFileName = "tables.db";
  static constexpr const char* kLockFileName = "LOCK";

  // Creates `data_dir` (mode 0750) if missing, locks it, opens or creates both files, starts the
  // fold thread. kFailedPrecondition if another store holds the dir, a file has another schema
  // version, or ledger.db is missing while tables.db already folded part of its log;
  // kCorruption if ledger.db was trimmed past what tables.db holds.
  static Result<std::unique_ptr<SqliteStore>> open(const std::string& data_dir,
                                                   SqliteStoreOptions options = {});

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Durable when it returns OK. Also deletes up to trim_rows_per_commit_max log rows that the
  // fold thread has made durable in tables.db, in the same transaction.
  [[nodiscard]] Status commit(const StoreBatch& batch) override;
  [[nodiscard]] Result<StoreContents> load() override;

  // Waits until the fold thread has folded every committed log row, then deletes them all from
  // ledger.db. Returns the fold's failure if it fails meanwhile.
  [[nodiscard]] Status checkpoint();

  // Log rows still in ledger.db (committed, not yet trimmed).
  uint64_t pendingLogRows() const { return static_cast<uint64_t>(next_seq_ - 1 - trimmed_seq_); }
  // The highest log seq durable in tables.db.
  int64_t foldedSeq() const;
  // OK, or the fold thread's latest failure (sticky or not).
  Status foldStatus() const;
  SqliteStoreStats stats() const;
  const std::string& databasePath() const { return database_path_; }
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
  Status openLog(int64_t folded_seq);
  Status openFoldConnections();

  Status checkUsable();
  // Turns an I/O or corruption failure into the sticky failed state (see the class comment).
  Status noteFailure(Status status);
  Status appendLogRow(std::span<const uint8_t> body, int64_t trim_to);
  Status trimLog(int64_t trim_to);
  Status loadContents(StoreContents* contents);

  // Fold thread.
  void runFold();
  bool foldDue() const;  // under mu_
  Status foldRange(int64_t after_seq, int64_t* last_seq);
  Status maintainLogWal();
  void restartLogWal();  // commit path

  const std::string database_path_;
  const std::string tables_path_;
  const int lock_fd_;
  const SqliteStoreOptions options_;

  // Caller's thread only.
  std::unique_ptr<sqlite::Connection> log_;     // ledger.db: commits, trims, load
  std::unique_ptr<sqlite::Connection> tables_;  // tables.db: load
  int64_t next_seq_ = 1;     // seq of the next log row; never reused, even after a trim
  int64_t trimmed_seq_ = 0;  // log rows <= it are deleted from ledger.db
  Status failed_;            // OK unless a failure made durability unknown
  SqliteStoreStats commit_stats_;
  BatchEncoder encoder_;

  // Fold thread only, between its start and its join.
  std::unique_ptr<sqlite::Connection> fold_log_;     // ledger.db: reads the log, checkpoints
  std::unique_ptr<sqlite::Connection> fold_tables_;  // tables.db: writes folds

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
  // Restarting ledger.db's WAL: the fold thread asks (kWanted) once its checkpoints copied
  // nearly all of it; a commit copies the rest (kCopied); the commit after it starts the WAL
  // over, and back to kIdle. The fold thread does not read the log meanwhile: its read snapshot
  // would keep the WAL from being copied or restarted.
  enum class WalRestart : uint8_t { kIdle, kWanted, kCopied };
  WalRestart wal_restart_ = WalRestart::kIdle;
  bool stop_ = false;
  SqliteStoreStats fold_stats_;

  std::thread fold_thread_;  // last: started when everything above is ready
};

}  // namespace tally::ledger
