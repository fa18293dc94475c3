#include "agent/outbox_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <iterator>
#include <limits>
#include <string_view>
#include <utility>

#include "common/data_dir.h"
#include "common/sqlite_connection.h"
#include "common/sqlite_support.h"
#include "core/assert.h"
#include "core/limits.h"

namespace tally::agent {

using namespace sqlite;  // the SQLite helpers: statusOf, bind*, stepDone, column*, ...

namespace {

constexpr int64_t kBusyTimeoutMs = 5000;  // the flock keeps other agents out; this is a backstop
constexpr int64_t kWalAutocheckpointPages = 1000;
constexpr int64_t kJournalSizeLimitBytes = 16 << 20;
constexpr int64_t kCacheKib = 8 * 1024;
constexpr size_t kMetaKeyBytesMax = 256;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

constexpr const char* kMetaSchemaVersion = "schema_version";
// schema_version 1 kept the boot epoch in meta; 2 keeps it in shard/store.h's gateway_state.
// A version-1 file is upgraded at open: the version is raised here and the boot epoch moved by
// ShardStore::open (a version-2 file still holding the meta row is one whose move is pending).
constexpr int64_t kSchemaVersionBootEpochInMeta = 1;

constexpr const char* kSchema[] = {
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT",
    "CREATE TABLE outbox ("
    " seq INTEGER PRIMARY KEY NOT NULL,"
    " kind INTEGER NOT NULL,"
    " reservation_id TEXT NOT NULL,"
    " operation_id TEXT NOT NULL,"
    " actual_units INTEGER NOT NULL,"
    " enqueued_at_ms INTEGER NOT NULL,"
    " attempts INTEGER NOT NULL,"
    " next_attempt_ms INTEGER NOT NULL) STRICT",
    "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT",
};

// agent.db's own pragmas (sqlite::FilePragmas::extra).
constexpr const char* kFilePragmas[] = {
    "PRAGMA locking_mode=NORMAL",
    "PRAGMA trusted_schema=OFF",
};

// Indexed by OutboxStore::Statement.
constexpr const char* kStatementSql[] = {
    "BEGIN IMMEDIATE",
    "COMMIT",
    "INSERT INTO outbox(seq, kind, reservation_id, operation_id, actual_units, enqueued_at_ms,"
    " attempts, next_attempt_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    "DELETE FROM outbox WHERE seq = ?1",
    "SELECT seq, kind, reservation_id, operation_id, actual_units, enqueued_at_ms, attempts,"
    " next_attempt_ms FROM outbox ORDER BY seq",
    "SELECT value FROM kv WHERE key = ?1",
    "INSERT INTO kv(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value = "
    "excluded.value",
};

Status validateEntry(const OutboxEntry& entry) {
  const std::string where = "outbox entry seq " + std::to_string(entry.seq);
  if (entry.seq == 0 || entry.seq > static_cast<uint64_t>(kInt64Max)) {
    return Status::invalidArgument(where + ": seq must be in 1..INT64_MAX");
  }
  if (entry.actual_units > static_cast<uint64_t>(kInt64Max) ||
      entry.enqueued_at_ms > static_cast<uint64_t>(kInt64Max) ||
      entry.next_attempt_ms > static_cast<uint64_t>(kInt64Max)) {
    return Status::invalidArgument(where + ": a value is above INT64_MAX");
  }
  if (entry.reservation_id.size() > limits::kReservationIdBytesMax ||
      entry.operation_id.size() > limits::kOperationIdBytesMax) {
    return Status::invalidArgument(where + ": reservation or operation id too long");
  }
  if (static_cast<uint8_t>(entry.kind) > static_cast<uint8_t>(OutboxKind::kReportOperation)) {
    return Status::invalidArgument(where + ": unknown kind");
  }
  return Status::ok();
}

// A row as written by insertEntry(); kCorruption for anything insertEntry() could not write.
Result<OutboxEntry> readEntry(sqlite3_stmt* row) {
  const int64_t seq = sqlite3_column_int64(row, 0);
  const int64_t kind = sqlite3_column_int64(row, 1);
  const int64_t actual = sqlite3_column_int64(row, 4);
  const int64_t enqueued = sqlite3_column_int64(row, 5);
  const int64_t attempts = sqlite3_column_int64(row, 6);
  const int64_t next_attempt = sqlite3_column_int64(row, 7);
  const std::string where = "outbox row seq " + std::to_string(seq);
  if (seq <= 0 || actual < 0 || enqueued < 0 || next_attempt < 0 || attempts < 0 ||
      attempts > std::numeric_limits<uint32_t>::max()) {
    return Status::corruption(where + ": value out of range");
  }
  if (kind < 0 || kind > static_cast<int64_t>(OutboxKind::kReportOperation)) {
    return Status::corruption(where + ": unknown kind " + std::to_string(kind));
  }
  OutboxEntry entry{.seq = static_cast<uint64_t>(seq),
                    .kind = static_cast<OutboxKind>(kind),
                    .reservation_id = columnText(row, 2),
                    .operation_id = columnText(row, 3),
                    .actual_units = static_cast<Units>(actual),
                    .enqueued_at_ms = static_cast<uint64_t>(enqueued),
                    .attempts = static_cast<uint32_t>(attempts),
                    .next_attempt_ms = static_cast<uint64_t>(next_attempt)};
  if (Status valid = validateEntry(entry); !valid.isOk()) {
    return Status::corruption(where + ": " + valid.message());
  }
  return entry;
}

}  // namespace

// --- Open ---------------------------------------------------------------------------------------

OutboxStore::OutboxStore(Key, std::string path, int lock_fd)
    : path_(std::move(path)), lock_fd_(lock_fd) {}

OutboxStore::~OutboxStore() {
  connection_.reset();
  // The lock goes last: the file is closed before another agent may open it.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<OutboxStore>> OutboxStore::open(const std::string& data_dir,
                                                       OutboxStoreOptions options) {
  if (data_dir.empty()) return Status::invalidArgument("data dir: empty path");
  TALLY_SQLITE_RETURN_IF_ERROR(makeDataDir(data_dir));
  Result<int> lock_fd = lockDataDir(data_dir, kLockFileName, "agent");
  if (!lock_fd.isOk()) return lock_fd.status();
  auto store =
      std::make_unique<OutboxStore>(Key{}, data_dir + "/" + kDatabaseFileName, lock_fd.value());
  TALLY_SQLITE_RETURN_IF_ERROR(store->initialize(options));
  // The entries of a new LOCK, agent.db and its WAL are durable before anything depends on them.
  TALLY_SQLITE_RETURN_IF_ERROR(syncDirectory(data_dir));
  return store;
}

Status OutboxStore::initialize(const OutboxStoreOptions& options) {
  Result<std::unique_ptr<sqlite::Connection>> connection = sqlite::Connection::open(path_);
  if (!connection.isOk()) return connection.status();
  connection_ = std::move(connection).value();
  db_ = connection_->db();
  TALLY_SQLITE_RETURN_IF_ERROR(
      connection_->applyPragmas({.wal_autocheckpoint_pages = kWalAutocheckpointPages,
                                 .journal_size_limit_bytes = kJournalSizeLimitBytes,
                                 .cache_kib = kCacheKib,
                                 .max_page_count = options.database_pages_max,
                                 .busy_timeout_ms = kBusyTimeoutMs,
                                 .extra = kFilePragmas}));
  TALLY_SQLITE_RETURN_IF_ERROR(createOrCheckSchema());
  static_assert(std::size(kStatementSql) == kStatementCount);
  return connection_->prepare(kStatementSql);
}

Status OutboxStore::createOrCheckSchema() {
  TALLY_SQLITE_RETURN_IF_ERROR(execSql(db_, "BEGIN IMMEDIATE", "begin schema setup"));
  Status status = [&]() -> Status {
    std::optional<int64_t> tables;
    TALLY_SQLITE_RETURN_IF_ERROR(queryInt(
        db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table'", "read schema", &tables));
    std::optional<int64_t> has_meta;
    TALLY_SQLITE_RETURN_IF_ERROR(
        queryInt(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
                 "read schema", &has_meta));
    if (has_meta.value_or(0) == 0) {
      if (tables.value_or(0) > 0) {
        return Status::failedPrecondition(path_ + " is not a tally agent database");
      }
      for (const char* create : kSchema) TALLY_SQLITE_RETURN_IF_ERROR(execSql(db_, create, create));
      const std::string insert = std::string("INSERT INTO meta(key, value) VALUES('") +
                                 kMetaSchemaVersion + "', " + std::to_string(kSchemaVersion) + ")";
      return execSql(db_, insert.c_str(), "write schema_version");
    }
    std::optional<int64_t> version;
    TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db_,
                                          "SELECT value FROM meta WHERE key = 'schema_version'",
                                          "read schema_version", &version));
    if (version == kSchemaVersionBootEpochInMeta) {
      const std::string upgrade = "UPDATE meta SET value = " + std::to_string(kSchemaVersion) +
                                  " WHERE key = '" + kMetaSchemaVersion + "'";
      return execSql(db_, upgrade.c_str(), "upgrade schema_version");
    }
    if (version != kSchemaVersion) {
      return Status::failedPrecondition(
          path_ + " has schema_version " + (version ? std::to_string(*version) : "(none)") +
          "; this build reads only " + std::to_string(kSchemaVersion));
    }
    return Status::ok();
  }();
  if (!status.isOk()) return connection_->rollbackIfOpen(std::move(status));
  return execSql(db_, "COMMIT", "commit schema setup");
}

// --- Transactions -------------------------------------------------------------------------------

template <typename F>
Status OutboxStore::inTransaction(const char* what, F&& body) {
  return sqlite::inTransaction(*connection_, kBegin, kCommit, what, std::forward<F>(body));
}

// --- Outbox -------------------------------------------------------------------------------------

Status OutboxStore::insertEntry(const OutboxEntry& entry) {
  TALLY_SQLITE_RETURN_IF_ERROR(validateEntry(entry));
  constexpr const char* kOp = "append outbox entry";
  sqlite3_stmt* stmt = (*connection_)[kInsertEntry];
  ResetOnExit reset(stmt);
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt, 1, static_cast<int64_t>(entry.seq), kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt, 2, static_cast<int64_t>(entry.kind), kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt, 3, entry.reservation_id, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt, 4, entry.operation_id, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(
      bindInt64(db_, stmt, 5, static_cast<int64_t>(entry.actual_units), kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(
      bindInt64(db_, stmt, 6, static_cast<int64_t>(entry.enqueued_at_ms), kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt, 7, static_cast<int64_t>(entry.attempts), kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(
      bindInt64(db_, stmt, 8, static_cast<int64_t>(entry.next_attempt_ms), kOp));
  return stepDone(db_, stmt, kOp);
}

Status OutboxStore::append(const OutboxEntry& entry) {
  // With synchronous=FULL, COMMIT returns once the WAL holding the row is fsync'd.
  TALLY_SQLITE_RETURN_IF_ERROR(validateEntry(entry));
  return inTransaction("append outbox entry", [&] { return insertEntry(entry); });
}

Status OutboxStore::appendBatch(const std::vector<OutboxEntry>& entries) {
  if (entries.empty()) return Status::ok();
  for (const OutboxEntry& entry : entries) TALLY_SQLITE_RETURN_IF_ERROR(validateEntry(entry));
  return inTransaction("append outbox batch", [&]() -> Status {
    for (const OutboxEntry& entry : entries) TALLY_SQLITE_RETURN_IF_ERROR(insertEntry(entry));
    return Status::ok();
  });
}

Status OutboxStore::remove(uint64_t seq) {
  if (seq == 0 || seq > static_cast<uint64_t>(kInt64Max)) return Status::ok();  // never stored
  constexpr const char* kOp = "remove outbox entry";
  sqlite3_stmt* stmt = (*connection_)[kDeleteEntry];
  ResetOnExit reset(stmt);
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt, 1, static_cast<int64_t>(seq), kOp));
  return stepDone(db_, stmt, kOp);
}

Result<std::vector<OutboxEntry>> OutboxStore::load() {
  sqlite3_stmt* stmt = (*connection_)[kSelectEntries];
  ResetOnExit reset(stmt);
  std::vector<OutboxEntry> entries;
  for (;;) {
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) return statusOf(db_, rc, "load outbox");
    Result<OutboxEntry> entry = readEntry(stmt);
    if (!entry.isOk()) return Status::corruption(path_ + ": " + entry.status().message());
    // Rows come by seq (the primary key): strictly increasing.
    TALLY_ASSERT(entries.empty() || entries.back().seq < entry.value().seq);
    entries.push_back(std::move(entry).value());
  }
  return entries;
}

// --- Meta ---------------------------------------------------------------------------------------

Status OutboxStore::putMeta(const std::string& key, int64_t value) {
  if (key.empty() || key.size() > kMetaKeyBytesMax) {
    return Status::invalidArgument("meta key must be 1.." + std::to_string(kMetaKeyBytesMax) +
                                   " bytes");
  }
  const std::string op = "put meta '" + key + "'";
  sqlite3_stmt* stmt = (*connection_)[kPutKv];
  ResetOnExit reset(stmt);
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt, 1, key, op.c_str()));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt, 2, value, op.c_str()));
  return stepDone(db_, stmt, op.c_str());
}

Result<std::optional<int64_t>> OutboxStore::getMeta(const std::string& key) {
  sqlite3_stmt* stmt = (*connection_)[kGetKv];
  ResetOnExit reset(stmt);
  const std::string op = "get meta '" + key + "'";
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt, 1, key, op.c_str()));
  const int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) return std::optional<int64_t>(sqlite3_column_int64(stmt, 0));
  if (rc == SQLITE_DONE) return std::optional<int64_t>();
  return statusOf(db_, rc, op);
}

}  // namespace tally::agent
