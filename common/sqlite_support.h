#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

// Small helpers over the SQLite C API shared by the agent's and the ledger's stores: every
// sqlite3_* return code becomes a Status naming the operation; binding, stepping, reading columns
// and one-off queries. Not a general wrapper: only what the stores need. Stateless.

#define TALLY_SQLITE_RETURN_IF_ERROR(expr)          \
  do {                                              \
    if (Status status_ = (expr); !status_.isOk()) { \
      return status_;                               \
    }                                               \
  } while (false)

namespace tally::sqlite {

// The Status for a failed sqlite3_* call `rc` during `operation`: kResourceExhausted "disk full"
// for SQLITE_FULL (a full disk or max_page_count), kCorruption for a damaged file,
// kInvalidArgument for a constraint, kIoError for the rest.
Status statusOf(sqlite3* db, int rc, std::string_view operation);
Status execSql(sqlite3* db, const char* sql, std::string_view operation);

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

// A prepared statement, finalized when it goes out of scope (on every path).
class Statement {
 public:
  Statement() = default;
  ~Statement() { (void)sqlite3_finalize(stmt_); }  // repeats an error already reported
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Status prepare(sqlite3* db, const char* sql) {
    const int rc = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, std::string("prepare ") + sql);
  }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

Status bindInt64(sqlite3* db, sqlite3_stmt* stmt, int index, int64_t value, const char* op);
// Text and blobs are bound SQLITE_STATIC: the caller steps the statement before the bound value
// goes out of scope. A zero-length blob binds as an empty blob, not NULL.
Status bindText(sqlite3* db, sqlite3_stmt* stmt, int index, std::string_view value, const char* op);
Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, std::span<const uint8_t> bytes,
                const char* op);
// Steps a statement that returns no rows.
Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op);

// Valid until the statement is stepped, reset or finalized.
std::span<const uint8_t> columnBlob(sqlite3_stmt* stmt, int column);
std::string columnText(sqlite3_stmt* stmt, int column);

// One-off statement (setup only): prepare, step, hand at most one row to `row` (nullptr when
// there is none), finalize.
template <typename F>
Status queryOnce(sqlite3* db, const char* sql, std::string_view op, F&& row) {
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

// queryOnce() for the first column of the first row: `*value` is nullopt (queryInt) or left as
// it was (queryText) when there is no row.
Status queryInt(sqlite3* db, const char* sql, std::string_view operation,
                std::optional<int64_t>* value);
Status queryText(sqlite3* db, const char* sql, std::string_view operation, std::string* value);

// Steps `stmt` to the end, handing each row to `row`; resets it afterwards.
template <typename F>
Status forEachRow(sqlite3* db, sqlite3_stmt* stmt, const char* op, F&& row) {
  ResetOnExit reset(stmt);
  for (;;) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return statusOf(db, rc, op);
    TALLY_SQLITE_RETURN_IF_ERROR(row(stmt));
  }
}

}  // namespace tally::sqlite
