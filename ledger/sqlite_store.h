#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "ledger/store.h"

struct sqlite3;
struct sqlite3_stmt;

// The production Store: one SQLite file, DIR/ledger.db, in WAL mode with synchronous=FULL.
//
// Layout. commit() appends the whole batch as ONE row of `log` (one packed Cap'n Proto blob, one
// transaction, one fsync), so a batch costs one fsync however many operations it carries and no
// per-row SQL runs on the commit path. checkpoint() folds the log into the tables `policies`,
// `accounts` and `reservations` (one row per record, latest image) and deletes the folded rows,
// all in one transaction: a crash at any point leaves either the log rows or their folded
// images, never neither. load() reads the tables and replays the log over them.
//
// Ownership and lifetime. A SqliteStore owns its sqlite3 connection, every prepared statement
// and an exclusive flock on DIR/LOCK, all released by the destructor; the lock keeps a second
// process (or a second SqliteStore in this one) out of the data dir for the store's lifetime.
// Non-copyable, non-movable. Used by one thread at a time (the connection is opened NOMUTEX).
//
// Errors. Every SQLite failure is a Status naming the operation: kResourceExhausted for a full
// disk, kCorruption for a damaged file or record (with the log seq or table key), kIoError for
// the rest. After a kIoError or kCorruption during commit() or checkpoint(), durability is
// unknown (fsync may have failed), so the store refuses every later commit()/checkpoint() with
// kFailedPrecondition; the ledger must stop and rebuild from disk. A full disk is not sticky: the
// transaction was rolled back and the same batch may be retried.

namespace tally::ledger {

struct SqliteStoreOptions {
  // commit() folds the log into the tables once this many rows are pending; 0: never (only
  // explicit checkpoint() calls fold).
  uint64_t checkpoint_log_rows = 256;
  // Largest encoded batch commit() accepts (kResourceExhausted beyond it); also the largest log
  // or table blob load() reads before calling it corrupt.
  uint64_t batch_bytes_max = uint64_t{256} << 20;
  // PRAGMA max_page_count: the largest the database may grow, in pages (4 KiB); reaching it
  // fails commits with kResourceExhausted like a full disk. 0: SQLite's maximum.
  uint64_t database_pages_max = 0;
};

class SqliteStore final : public Store {
 public:
  static constexpr int64_t kSchemaVersion = 1;
  static constexpr const char* kDatabaseFileName = "ledger.db";
  static constexpr const char* kLockFileName = "LOCK";

  // Creates `data_dir` (mode 0750) if missing, locks it, opens or creates DIR/ledger.db.
  // kFailedPrecondition if another store holds the dir or the file has another schema version.
  static Result<std::unique_ptr<SqliteStore>> open(const std::string& data_dir,
                                                   SqliteStoreOptions options = {});

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Durable when it returns OK. May fold the log first-hand (see checkpoint_log_rows); a failed
  // fold does not fail the commit (the batch is durable) and is reported by
  // lastCheckpointStatus().
  [[nodiscard]] Status commit(const StoreBatch& batch) override;
  [[nodiscard]] Result<StoreContents> load() override;

  // Folds every log row into the tables and deletes those rows, in one transaction.
  [[nodiscard]] Status checkpoint();

  uint64_t pendingLogRows() const { return log_rows_; }
  const Status& lastCheckpointStatus() const { return last_checkpoint_status_; }
  const std::string& databasePath() const { return database_path_; }

 private:
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can make a Key: use open().
  SqliteStore(Key, std::string database_path, int lock_fd, SqliteStoreOptions options);

 private:
  struct Statements;
  struct Fold;

  Status initialize();
  Status applyPragmas();
  Status createSchema();
  Status prepareStatements();
  Status readLogPosition();
  Status readMeta(const char* key, std::optional<int64_t>* value);
  Status setMetaMax(const char* key, int64_t value);

  Status checkUsable() const;
  // Turns an I/O or corruption failure into the sticky failed state (see the class comment).
  Status noteFailure(Status status);
  // Ends an open transaction after `status` went wrong; returns `status` (or worse).
  Status rollbackIfOpen(Status status);
  Status foldLog(Fold* fold, int64_t* last_seq);
  Status writeFold(const Fold& fold, int64_t last_seq);
  Status loadInTransaction(StoreContents* contents);

  std::string database_path_;
  int lock_fd_ = -1;
  SqliteStoreOptions options_;
  sqlite3* db_ = nullptr;
  std::unique_ptr<Statements> statements_;
  int64_t next_seq_ = 1;  // seq of the next log row; never reused, even after a checkpoint
  uint64_t log_rows_ = 0;
  Status failed_;  // OK unless a failure made durability unknown
  Status last_checkpoint_status_;
};

}  // namespace tally::ledger
