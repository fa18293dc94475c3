#include "agent/sqlite_support.h"

#include <sqlite3.h>

namespace tally::agent {

// The Status for a failed sqlite3_* call `rc` during `operation`.
Status statusOf(sqlite3* db, int rc, std::string_view operation) {
  const std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const std::string message =
      std::string(operation) + ": " + detail + " (sqlite code " + std::to_string(rc) + ")";
  switch (rc & 0xff) {
    case SQLITE_FULL: return Status::resourceExhausted("disk full: " + message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Status::corruption(message);
    case SQLITE_CONSTRAINT: return Status::invalidArgument(message);
    default: return Status::ioError(message);
  }
}

Status execSql(sqlite3* db, const char* sql, std::string_view operation) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, operation);
}

Status queryInt(sqlite3* db, const char* sql, std::string_view operation,
                std::optional<int64_t>* value) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) return statusOf(db, rc, operation);
  rc = sqlite3_step(stmt);
  Status status;
  if (rc == SQLITE_ROW) {
    *value = sqlite3_column_int64(stmt, 0);
  } else if (rc == SQLITE_DONE) {
    *value = std::nullopt;
  } else {
    status = statusOf(db, rc, operation);
  }
  // finalize repeats the step's error, already reported.
  (void)sqlite3_finalize(stmt);
  return status;
}

Status queryText(sqlite3* db, const char* sql, std::string_view operation, std::string* value) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) return statusOf(db, rc, operation);
  rc = sqlite3_step(stmt);
  Status status;
  if (rc == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    *value = text != nullptr ? reinterpret_cast<const char*>(text) : "";
  } else if (rc != SQLITE_DONE) {
    status = statusOf(db, rc, operation);
  }
  (void)sqlite3_finalize(stmt);
  return status;
}

ResetOnExit::~ResetOnExit() {
  (void)sqlite3_reset(stmt_);
  (void)sqlite3_clear_bindings(stmt_);
}

Status bindInt64(sqlite3* db, sqlite3_stmt* stmt, int index, int64_t value, const char* op) {
  const int rc = sqlite3_bind_int64(stmt, index, value);
  return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, op);
}

Status bindText(sqlite3* db, sqlite3_stmt* stmt, int index, std::string_view value,
                const char* op) {
  const int rc =
      sqlite3_bind_text64(stmt, index, value.data(), value.size(), SQLITE_STATIC, SQLITE_UTF8);
  return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, op);
}

Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op) {
  const int rc = sqlite3_step(stmt);
  return rc == SQLITE_DONE ? Status::ok() : statusOf(db, rc, op);
}

std::string columnText(sqlite3_stmt* stmt, int column) {
  const unsigned char* text = sqlite3_column_text(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (text == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, std::span<const uint8_t> value,
                const char* op) {
  // A zero-length blob binds as an empty blob, not NULL.
  static const uint8_t kEmpty = 0;
  const void* data = value.empty() ? &kEmpty : value.data();
  const int rc = sqlite3_bind_blob64(stmt, index, data, value.size(), SQLITE_STATIC);
  return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, op);
}

std::vector<uint8_t> columnBlob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (data == nullptr || size <= 0) return {};
  const auto* bytes = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(bytes, bytes + size);
}

}  // namespace tally::agent
