#include "common/sqlite_connection.h"

#include <cstdio>

#include "common/sqlite_support.h"
#include "core/assert.h"

namespace tally::sqlite {

// --- Connection ---------------------------------------------------------------------------------

namespace {
constexpr int64_t kSynchronousFull = 2;
}  // namespace

Result<std::unique_ptr<Connection>> Connection::open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  // Owned from here on, even when the open failed (sqlite3_open_v2 still allocates a handle).
  auto connection = std::make_unique<Connection>(Key{}, path, db);
  if (rc != SQLITE_OK) return statusOf(db, rc, "open " + path);
  rc = sqlite3_extended_result_codes(db, 1);
  if (rc != SQLITE_OK) return statusOf(db, rc, "enable extended result codes on " + path);
  return connection;
}

Connection::~Connection() {
  // sqlite3_finalize repeats the statement's last error, already reported when it happened.
  for (sqlite3_stmt* stmt : statements_) (void)sqlite3_finalize(stmt);
  if (db_ == nullptr) return;
  // Every statement is finalized, so close cannot be refused; an error here (in the closing WAL
  // checkpoint) loses nothing, since every transaction was already durable in the WAL.
  int rc = sqlite3_close(db_);
  if (rc != SQLITE_OK) {
    std::fprintf(stderr, "tally: closing %s: %s\n", path_.c_str(), sqlite3_errstr(rc));
  }
}

Status Connection::applyPragmas(const FilePragmas& pragmas) {
  // Only takes effect on a new file, so it precedes journal_mode (which writes the header).
  TALLY_SQLITE_RETURN_IF_ERROR(execSql(db_, "PRAGMA page_size=4096", "set page_size"));
  std::string journal_mode;
  TALLY_SQLITE_RETURN_IF_ERROR(
      queryOnce(db_, "PRAGMA journal_mode=WAL", "set journal_mode", [&](sqlite3_stmt* row) {
        if (row != nullptr) journal_mode = columnText(row, 0);
        return Status::ok();
      }));
  if (journal_mode != "wal") {
    return Status::ioError("set journal_mode: " + path_ + " is in journal mode '" + journal_mode +
                           "', not 'wal'");
  }
  std::vector<std::string> statements = {
      "PRAGMA synchronous=FULL",
      "PRAGMA foreign_keys=OFF",
      "PRAGMA temp_store=MEMORY",
  };
  statements.insert(statements.end(), pragmas.extra.begin(), pragmas.extra.end());
  statements.push_back("PRAGMA wal_autocheckpoint=" +
                       std::to_string(pragmas.wal_autocheckpoint_pages));
  statements.push_back("PRAGMA journal_size_limit=" +
                       std::to_string(pragmas.journal_size_limit_bytes));
  statements.push_back("PRAGMA cache_size=-" + std::to_string(pragmas.cache_kib));
  for (const std::string& sql : statements) {
    TALLY_SQLITE_RETURN_IF_ERROR(execSql(db_, sql.c_str(), sql.c_str()));
  }
  if (pragmas.max_page_count > 0) {
    const std::string sql = "PRAGMA max_page_count=" + std::to_string(pragmas.max_page_count);
    TALLY_SQLITE_RETURN_IF_ERROR(execSql(db_, sql.c_str(), "set max_page_count"));
  }
  int rc = sqlite3_busy_timeout(db_, static_cast<int>(pragmas.busy_timeout_ms));
  if (rc != SQLITE_OK) return statusOf(db_, rc, "set busy handler");
  int64_t synchronous = -1;
  TALLY_SQLITE_RETURN_IF_ERROR(
      queryOnce(db_, "PRAGMA synchronous", "read synchronous", [&](sqlite3_stmt* row) {
        if (row != nullptr) synchronous = sqlite3_column_int64(row, 0);
        return Status::ok();
      }));
  if (synchronous != kSynchronousFull) {
    return Status::ioError("set synchronous on " + path_ + ": got " + std::to_string(synchronous) +
                           ", not FULL");
  }
  return Status::ok();
}

Status Connection::prepare(std::span<const char* const> sql) {
  TALLY_ASSERT(statements_.empty());
  statements_.assign(sql.size(), nullptr);
  for (size_t i = 0; i < sql.size(); ++i) {
    int rc =
        sqlite3_prepare_v3(db_, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &statements_[i], nullptr);
    if (rc != SQLITE_OK) return statusOf(db_, rc, std::string("prepare ") + sql[i]);
  }
  return Status::ok();
}

Status Connection::rollbackIfOpen(Status status) const {
  if (sqlite3_get_autocommit(db_) != 0) return status;  // SQLite already ended the transaction
  int rc = sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc == SQLITE_OK) return status;
  return Status::ioError(status.toString() + "; then " + statusOf(db_, rc, "rollback").toString());
}

}  // namespace tally::sqlite
