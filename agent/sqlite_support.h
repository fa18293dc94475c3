#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

struct sqlite3;
struct sqlite3_stmt;

// Small helpers shared by the agent's SQLite stores (outbox_store, shard_store): every sqlite3_*
// return code becomes a Status naming the operation. Not thread-safe; stateless.

namespace tally::agent {

// The Status for a failed sqlite3_* call `rc` during `operation`: kResourceExhausted "disk full"
// for SQLITE_FULL, kCorruption for a damaged file, kInvalidArgument for a constraint, kIoError
// for the rest.
Status statusOf(sqlite3* db, int rc, std::string_view operation);
Status execSql(sqlite3* db, const char* sql, std::string_view operation);
// One-off statement (setup only): hands the first row's first column to `*value` (nullopt when
// there is no row).
Status queryInt(sqlite3* db, const char* sql, std::string_view operation,
                std::optional<int64_t>* value);
Status queryText(sqlite3* db, const char* sql, std::string_view operation, std::string* value);

// Clears a statement for reuse when the scope ends; sqlite3_reset repeats the last step's error,
// which the caller already checked.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit();
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* stmt_;
};

Status bindInt64(sqlite3* db, sqlite3_stmt* stmt, int index, int64_t value, const char* op);
// Bound SQLITE_STATIC: the caller steps the statement while `value` lives.
Status bindText(sqlite3* db, sqlite3_stmt* stmt, int index, std::string_view value, const char* op);
Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, std::span<const uint8_t> value,
                const char* op);
Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op);
std::string columnText(sqlite3_stmt* stmt, int column);
std::vector<uint8_t> columnBlob(sqlite3_stmt* stmt, int column);

}  // namespace tally::agent
