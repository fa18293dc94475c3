#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/sqlite_support.h"
#include "core/status.h"

// One SQLite store file opened the same way by the agent and the ledger: the connection, its
// pragmas and its prepared statements.

namespace tally::sqlite {

// The pragmas every store file gets, spelled out rather than trusting defaults.
struct FilePragmas {
  // Pages in the WAL after which a commit on this connection checkpoints; 0: never (someone
  // else checkpoints, e.g. the ledger's fold thread in ledger/sqlite_store.h).
  int64_t wal_autocheckpoint_pages = 0;
  // A WAL larger than this is truncated back to it when a commit on this connection restarts
  // the WAL; -1: never truncated.
  int64_t journal_size_limit_bytes = -1;
  int64_t cache_kib = 0;
  uint64_t max_page_count = 0;  // 0: SQLite's maximum
  int64_t busy_timeout_ms = 5000;
  // The file's own pragmas, run after synchronous, foreign_keys and temp_store and before the
  // sizes above. Must outlive applyPragmas().
  std::span<const char* const> extra = {};
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

// Runs `body` inside BEGIN (statement `begin`) ... COMMIT on `connection`; rolls back when it
// fails.
template <typename F>
Status inTransaction(const Connection& connection, size_t begin, size_t commit, const char* what,
                     F&& body) {
  sqlite3* db = connection.db();
  Status status = [&]() -> Status {
    {
      ResetOnExit reset(connection[begin]);
      TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, connection[begin], what));
    }
    TALLY_SQLITE_RETURN_IF_ERROR(body());
    ResetOnExit reset(connection[commit]);
    return stepDone(db, connection[commit], what);
  }();
  if (!status.isOk()) return connection.rollbackIfOpen(status);
  return status;
}

}  // namespace tally::sqlite
