#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

// Small helpers over the SQLite C API for the store's two files (ledger/sqlite_store.h): Status
// mapping, one connection with its prepared statements, binding and stepping. Not a general
// wrapper: only what the store needs.

#define TALLY_STORE_RETURN_IF_ERROR(expr)           \
  do {                                              \
    if (Status status_ = (expr); !status_.isOk()) { \
      return status_;                               \
    }                                               \
  } while (false)

namespace tally::ledger::sqlite {

// The Status for a failed sqlite3_* call `rc` during `operation`: kResourceExhausted for a full
// disk (or max_page_count), kCorruption for a damaged file, kIoError for the rest.
Status statusOf(sqlite3* db, int rc, std::string_view operation);

// Clears a statement for reuse when the scope ends. sqlite3_reset repeats the last step's
// error, which the caller already checked, so its result carries nothing new.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit() {
    (void)sqlite3_reset(stmt_);
    (void)sqlite3_clear_bindings(stmt_);
  }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* stmt_;
};

Status bindInt64(sqlite3* db, sqlite3_stmt* stmt, int index, int64_t value, const char* op);
// Text and blobs are bound SQLITE_STATIC: the caller steps the statement before the bound value
// goes out of scope.
Status bindText(sqlite3* db, sqlite3_stmt* stmt, int index, std::string_view value, const char* op);
Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, std::span<const uint8_t> bytes,
                const char* op);
// Steps a statement that returns no rows.
Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op);
Status execSql(sqlite3* db, const char* sql, const char* op);

std::span<const uint8_t> columnBlob(sqlite3_stmt* stmt, int column);
std::string columnText(sqlite3_stmt* stmt, int column);

// One-off statement (setup only): prepare, step, hand at most one row to `row` (nullptr when
// there is none), finalize.
template <typename F>
Status queryOnce(sqlite3* db, const char* sql, const char* op, F&& row) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) return statusOf(db, rc, op);
  rc = sqlite3_step(stmt);
  Status status;
  if (rc == SQLITE_ROW) {
    status = row(stmt);
  } else if (rc != SQLITE_DONE) {
    status = statusOf(db, rc, op);
  } else {
    status = row(nullptr);
  }
  int finalize_rc = sqlite3_finalize(stmt);
  if (status.isOk() && finalize_rc != SQLITE_OK && rc == SQLITE_ROW) {
    status = statusOf(db, finalize_rc, op);
  }
  return status;
}

// Steps `stmt` to the end, handing each row to `row`; resets it afterwards.
template <typename F>
Status forEachRow(sqlite3* db, sqlite3_stmt* stmt, const char* op, F&& row) {
  ResetOnExit reset(stmt);
  for (;;) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return statusOf(db, rc, op);
    TALLY_STORE_RETURN_IF_ERROR(row(stmt));
  }
}

// The pragmas every store file gets, spelled out rather than trusting defaults.
struct FilePragmas {
  // Pages in the WAL after which a commit on this connection checkpoints; 0: never (someone
  // else checkpoints, see SqliteStore's fold thread).
  int64_t wal_autocheckpoint_pages = 0;
  // A WAL larger than this is truncated back to it when a commit on this connection restarts
  // the WAL; -1: never truncated.
  int64_t journal_size_limit_bytes = -1;
  int64_t cache_kib = 0;
  uint64_t max_page_count = 0;  // 0: SQLite's maximum
  int64_t busy_timeout_ms = 5000;
};

// One SQLite connection and its prepared statements, closed by the destructor (statements
// first, so close cannot be refused). Opened NOMUTEX: used by one thread at a time, and handed
// between threads only with a happens-before edge (thread start, join, a mutex).
class Connection {
 public:
  // Opens (creating if missing) `path` read-write with extended result codes.
  static Result<std::unique_ptr<Connection>> open(const std::string& path);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  struct Key {
    explicit Key() = default;
  };
  // Only open() can make a Key: use open().
  Connection(Key, std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  sqlite3* db() const { return db_; }
  const std::string& path() const { return path_; }

  // page_size=4096, journal_mode=WAL and synchronous=FULL (both read back and checked), then
  // `pragmas`.
  Status applyPragmas(const FilePragmas& pragmas);
  // Prepares `sql` with SQLITE_PREPARE_PERSISTENT; statement i is (*this)[i].
  Status prepare(std::span<const char* const> sql);
  sqlite3_stmt* operator[](size_t index) const { return statements_[index]; }

  // Ends an open transaction after `status` went wrong; returns `status` (or worse, when the
  // rollback itself fails and the connection is stuck in a transaction).
  Status rollbackIfOpen(Status status) const;

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  std::vector<sqlite3_stmt*> statements_;
};

}  // namespace tally::ledger::sqlite
