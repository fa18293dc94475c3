#include "common/sqlite_support.h"

namespace tally::sqlite {

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

Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, std::span<const uint8_t> bytes,
                const char* op) {
  // A null pointer would bind NULL.
  static const uint8_t kEmpty = 0;
  const void* data = bytes.empty() ? &kEmpty : bytes.data();
  const int rc = sqlite3_bind_blob64(stmt, index, data, bytes.size(), SQLITE_STATIC);
  return rc == SQLITE_OK ? Status::ok() : statusOf(db, rc, op);
}

Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op) {
  const int rc = sqlite3_step(stmt);
  return rc == SQLITE_DONE ? Status::ok() : statusOf(db, rc, op);
}

std::span<const uint8_t> columnBlob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (data == nullptr || size <= 0) return {};
  return {static_cast<const uint8_t*>(data), static_cast<size_t>(size)};
}

std::string columnText(sqlite3_stmt* stmt, int column) {
  const unsigned char* text = sqlite3_column_text(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (text == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

Status queryInt(sqlite3* db, const char* sql, std::string_view operation,
                std::optional<int64_t>* value) {
  return queryOnce(db, sql, operation, [&](sqlite3_stmt* row) {
    *value = row != nullptr ? std::optional<int64_t>(sqlite3_column_int64(row, 0)) : std::nullopt;
    return Status::ok();
  });
}

Status queryText(sqlite3* db, const char* sql, std::string_view operation, std::string* value) {
  return queryOnce(db, sql, operation, [&](sqlite3_stmt* row) {
    if (row != nullptr) *value = columnText(row, 0);
    return Status::ok();
  });
}

}  // namespace tally::sqlite
