#include "ledger/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/assert.h"
#include "ledger/store_codec.h"

#define TALLY_STORE_RETURN_IF_ERROR(expr)           \
  do {                                              \
    if (Status status_ = (expr); !status_.isOk()) { \
      return status_;                               \
    }                                               \
  } while (false)

namespace tally::ledger {
namespace {

constexpr mode_t kDataDirMode = 0750;
constexpr mode_t kLockFileMode = 0640;
constexpr const char* kMetaSchemaVersion = "schema_version";
constexpr const char* kMetaLedgerClockMs = "ledger_clock_ms";
constexpr const char* kMetaFoldedSeq = "folded_seq";  // highest log seq ever folded

// Spelled out rather than trusting defaults (STYLE: bound everything).
constexpr const char* kPragmas[] = {
    "PRAGMA synchronous=FULL",         "PRAGMA foreign_keys=OFF",  "PRAGMA busy_timeout=5000",
    "PRAGMA wal_autocheckpoint=10000", "PRAGMA temp_store=MEMORY", "PRAGMA cache_size=-65536",
};
constexpr int64_t kSynchronousFull = 2;

constexpr const char* kCreateSchema[] = {
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)",
    "CREATE TABLE log(seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE TABLE policies(generation INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE TABLE accounts(subject TEXT, route TEXT, generation INTEGER, body BLOB NOT NULL, "
    "PRIMARY KEY(subject, route, generation)) WITHOUT ROWID",
    "CREATE TABLE reservations(id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
};

std::string errnoText(int error) { return std::string(std::strerror(error)); }

// The Status for a failed sqlite3_* call `rc` during `operation`.
Status sqliteStatus(sqlite3* db, int rc, std::string_view operation) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string message =
      std::string(operation) + ": " + detail + " (sqlite code " + std::to_string(rc) + ")";
  switch (rc & 0xff) {
    case SQLITE_FULL: return Status::resourceExhausted("disk full: " + message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return Status::corruption(message);
    default: return Status::ioError(message);
  }
}

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

Status bindInt64(sqlite3* db, sqlite3_stmt* stmt, int index, int64_t value, const char* op) {
  int rc = sqlite3_bind_int64(stmt, index, value);
  return rc == SQLITE_OK ? Status::ok() : sqliteStatus(db, rc, op);
}

// Text and blobs are bound SQLITE_STATIC: every caller steps the statement before the bound
// value goes out of scope.
Status bindText(sqlite3* db, sqlite3_stmt* stmt, int index, const std::string& value,
                const char* op) {
  int rc = sqlite3_bind_text64(stmt, index, value.data(), value.size(), SQLITE_STATIC, SQLITE_UTF8);
  return rc == SQLITE_OK ? Status::ok() : sqliteStatus(db, rc, op);
}

Status bindBlob(sqlite3* db, sqlite3_stmt* stmt, int index, const Blob& blob, const char* op) {
  std::span<const uint8_t> bytes = blobBytes(blob);
  int rc = sqlite3_bind_blob64(stmt, index, bytes.data(), bytes.size(), SQLITE_STATIC);
  return rc == SQLITE_OK ? Status::ok() : sqliteStatus(db, rc, op);
}

// Steps a statement that returns no rows.
Status stepDone(sqlite3* db, sqlite3_stmt* stmt, const char* op) {
  int rc = sqlite3_step(stmt);
  return rc == SQLITE_DONE ? Status::ok() : sqliteStatus(db, rc, op);
}

std::span<const uint8_t> columnBlob(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  int size = sqlite3_column_bytes(stmt, column);
  if (data == nullptr || size <= 0) return {};
  return {static_cast<const uint8_t*>(data), static_cast<size_t>(size)};
}

std::string columnText(sqlite3_stmt* stmt, int column) {
  const unsigned char* text = sqlite3_column_text(stmt, column);
  int size = sqlite3_column_bytes(stmt, column);
  if (text == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

Status execSql(sqlite3* db, const char* sql, const char* op) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  return rc == SQLITE_OK ? Status::ok() : sqliteStatus(db, rc, op);
}

// One-off statement (setup only): prepare, step, read at most one row with `row`, finalize.
template <typename F>
Status queryOnce(sqlite3* db, const char* sql, const char* op, F&& row) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
  if (rc != SQLITE_OK) return sqliteStatus(db, rc, op);
  rc = sqlite3_step(stmt);
  Status status;
  if (rc == SQLITE_ROW) {
    status = row(stmt);
  } else if (rc != SQLITE_DONE) {
    status = sqliteStatus(db, rc, op);
  } else {
    status = row(nullptr);
  }
  int finalize_rc = sqlite3_finalize(stmt);
  if (status.isOk() && finalize_rc != SQLITE_OK && rc == SQLITE_ROW) {
    status = sqliteStatus(db, finalize_rc, op);
  }
  return status;
}

// Creates `dir` and any missing parent with kDataDirMode, and makes each new entry durable by
// syncing its parent directory.
Status syncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::ioError("open directory " + dir + ": " + errnoText(errno));
  int rc = ::fsync(fd);
  int error = errno;
  ::close(fd);
  if (rc != 0) return Status::ioError("fsync directory " + dir + ": " + errnoText(error));
  return Status::ok();
}

Status makeDataDir(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), kDataDirMode) == 0) {
      size_t slash = prefix.find_last_of('/');
      std::string parent = slash == std::string::npos ? "." : prefix.substr(0, slash + 1);
      TALLY_STORE_RETURN_IF_ERROR(syncDirectory(parent));
      continue;
    }
    if (errno != EEXIST) {
      return Status::ioError("create data dir " + prefix + ": " + errnoText(errno));
    }
  }
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) {
    return Status::ioError("data dir " + dir + ": " + errnoText(errno));
  }
  if (!S_ISDIR(info.st_mode)) {
    return Status::failedPrecondition("data dir " + dir + " exists and is not a directory");
  }
  return Status::ok();
}

// Takes the exclusive lock that keeps two ledgers off one data dir. Returns the locked fd.
Result<int> lockDataDir(const std::string& dir) {
  std::string path = dir + "/" + SqliteStore::kLockFileName;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, kLockFileMode);
  if (fd < 0) return Status::ioError("open " + path + ": " + errnoText(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return Status::failedPrecondition("data dir " + dir + " is in use: another ledger holds " +
                                        path);
    }
    return Status::ioError("lock " + path + ": " + errnoText(error));
  }
  return fd;
}

}  // namespace

// --- Prepared statements ------------------------------------------------------------------------

enum StatementId : size_t {
  kBegin,
  kBeginRead,
  kCommit,
  kInsertLog,
  kSelectLog,
  kDeleteLogUpTo,
  kUpsertPolicy,
  kUpsertAccount,
  kUpsertReservation,
  kDeleteReservation,
  kSetMetaMax,
  kGetMeta,
  kSelectPolicies,
  kSelectAccounts,
  kSelectReservations,
  kStatementCount,
};

constexpr std::array<const char*, kStatementCount> kStatementSql = {
    "BEGIN IMMEDIATE",
    "BEGIN DEFERRED",
    "COMMIT",
    "INSERT INTO log(seq, body) VALUES(?1, ?2)",
    "SELECT seq, body FROM log ORDER BY seq",
    "DELETE FROM log WHERE seq <= ?1",
    "INSERT OR REPLACE INTO policies(generation, body) VALUES(?1, ?2)",
    "INSERT OR REPLACE INTO accounts(subject, route, generation, body) VALUES(?1, ?2, ?3, ?4)",
    "INSERT OR REPLACE INTO reservations(id, body) VALUES(?1, ?2)",
    "DELETE FROM reservations WHERE id = ?1",
    "INSERT INTO meta(key, value) VALUES(?1, ?2) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
    "SELECT value FROM meta WHERE key = ?1",
    "SELECT generation, body FROM policies ORDER BY generation",
    "SELECT subject, route, generation, body FROM accounts ORDER BY subject, route, generation",
    "SELECT id, body FROM reservations ORDER BY id",
};

struct SqliteStore::Statements {
  std::array<sqlite3_stmt*, kStatementCount> stmt{};

  Statements() = default;
  Statements(const Statements&) = delete;
  Statements& operator=(const Statements&) = delete;
  ~Statements() {
    // sqlite3_finalize repeats the statement's last error, already reported when it happened.
    for (sqlite3_stmt* s : stmt) (void)sqlite3_finalize(s);
  }
  sqlite3_stmt* operator[](StatementId id) const { return stmt[id]; }
};

// The latest image of every row a run of log batches touched. A reservation mapped to nullopt
// was deleted.
struct SqliteStore::Fold {
  std::map<Generation, PolicyRecord> policies;
  std::map<AccountKey, AccountRecord> accounts;
  std::unordered_map<std::string, std::optional<Reservation>> reservations;
  uint64_t ledger_clock_ms = 0;

  void apply(StoreBatch&& batch) {
    // Deletions first: an id compacted and then reused within the batch ends up present.
    for (std::string& id : batch.deleted_reservations) reservations[std::move(id)] = std::nullopt;
    for (Reservation& reservation : batch.reservations) {
      std::string id = reservation.reservation_id;
      reservations[std::move(id)] = std::move(reservation);
    }
    for (PolicyRecord& record : batch.policies) {
      Generation generation = record.policy.generation;
      policies[generation] = std::move(record);
    }
    for (AccountRecord& record : batch.accounts) {
      AccountKey key = record.key;
      accounts[std::move(key)] = std::move(record);
    }
    ledger_clock_ms = std::max(ledger_clock_ms, batch.ledger_clock_ms);
  }
};

// --- Table readers ------------------------------------------------------------------------------

namespace {

// Steps `stmt` to the end, handing each row to `row`.
template <typename F>
Status forEachRow(sqlite3* db, sqlite3_stmt* stmt, const char* op, F&& row) {
  ResetOnExit reset(stmt);
  for (;;) {
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return sqliteStatus(db, rc, op);
    TALLY_STORE_RETURN_IF_ERROR(row(stmt));
  }
}

Status checkBodySize(std::span<const uint8_t> body, uint64_t bytes_max, const std::string& where) {
  if (body.size() <= bytes_max) return Status::ok();
  return Status::corruption(where + ": body of " + std::to_string(body.size()) +
                            " bytes is above batch_bytes_max");
}

Status readPolicies(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                    std::map<Generation, PolicyRecord>* out) {
  return forEachRow(db, stmt, "read policies", [&](sqlite3_stmt* row) -> Status {
    const auto generation = static_cast<Generation>(sqlite3_column_int64(row, 0));
    const std::string where = "policies generation " + std::to_string(generation);
    std::span<const uint8_t> body = columnBlob(row, 1);
    TALLY_STORE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<PolicyRecord> record = decodePolicyRecord(body);
    if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
    if (record.value().policy.generation != generation) {
      return Status::corruption(where + ": body holds generation " +
                                std::to_string(record.value().policy.generation));
    }
    (*out)[generation] = std::move(record).value();
    return Status::ok();
  });
}

Status readAccounts(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                    std::map<AccountKey, AccountRecord>* out) {
  return forEachRow(db, stmt, "read accounts", [&](sqlite3_stmt* row) -> Status {
    AccountKey key{.subject = columnText(row, 0),
                   .route = columnText(row, 1),
                   .generation = static_cast<Generation>(sqlite3_column_int64(row, 2))};
    const std::string where =
        "accounts (" + key.subject + ", " + key.route + ", " + std::to_string(key.generation) + ")";
    std::span<const uint8_t> body = columnBlob(row, 3);
    TALLY_STORE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<AccountRecord> record = decodeAccountRecord(body);
    if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
    if (record.value().key != key) return Status::corruption(where + ": body holds another key");
    (*out)[std::move(key)] = std::move(record).value();
    return Status::ok();
  });
}

// Appends in id order (the statement sorts; SQLite's BINARY collation is std::string's order).
Status readReservations(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                        std::vector<Reservation>* out) {
  return forEachRow(db, stmt, "read reservations", [&](sqlite3_stmt* row) -> Status {
    const std::string id = columnText(row, 0);
    const std::string where = "reservations id '" + id + "'";
    std::span<const uint8_t> body = columnBlob(row, 1);
    TALLY_STORE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<Reservation> record = decodeReservationRecord(body);
    if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
    if (record.value().reservation_id != id) {
      return Status::corruption(where + ": body holds id '" + record.value().reservation_id + "'");
    }
    out->push_back(std::move(record).value());
    return Status::ok();
  });
}

bool byId(const Reservation& a, const Reservation& b) {
  return a.reservation_id < b.reservation_id;
}

// The table's reservations with the log's changes applied (nullopt: deleted), sorted by id. A
// linear merge, so that load() never holds the table twice.
std::vector<Reservation> mergeReservations(
    std::vector<Reservation> table,
    std::unordered_map<std::string, std::optional<Reservation>> changes) {
  if (!std::is_sorted(table.begin(), table.end(), byId)) {
    std::sort(table.begin(), table.end(), byId);
  }
  std::vector<std::pair<std::string, std::optional<Reservation>>> sorted_changes(
      std::make_move_iterator(changes.begin()), std::make_move_iterator(changes.end()));
  std::sort(sorted_changes.begin(), sorted_changes.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Reservation> out;
  out.reserve(table.size() + sorted_changes.size());
  auto next = table.begin();
  for (auto& [id, change] : sorted_changes) {
    while (next != table.end() && next->reservation_id < id) out.push_back(std::move(*next++));
    if (next != table.end() && next->reservation_id == id) ++next;  // replaced or deleted
    if (change) out.push_back(std::move(*change));
  }
  while (next != table.end()) out.push_back(std::move(*next++));
  return out;
}

}  // namespace

// --- Open ---------------------------------------------------------------------------------------

SqliteStore::SqliteStore(Key, std::string database_path, int lock_fd, SqliteStoreOptions options)
    : database_path_(std::move(database_path)), lock_fd_(lock_fd), options_(options) {}

SqliteStore::~SqliteStore() {
  statements_.reset();
  if (db_ != nullptr) {
    // Every statement is finalized, so close cannot be refused; an error here (in the closing
    // WAL checkpoint) loses nothing, since every commit was already durable in the WAL.
    int rc = sqlite3_close(db_);
    if (rc != SQLITE_OK) {
      std::fprintf(stderr, "tally: closing %s: %s\n", database_path_.c_str(), sqlite3_errstr(rc));
    }
  }
  // The lock goes last: the file is closed before another ledger may open it.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const std::string& data_dir,
                                                       SqliteStoreOptions options) {
  if (data_dir.empty()) return Status::invalidArgument("data dir: empty path");
  TALLY_STORE_RETURN_IF_ERROR(makeDataDir(data_dir));
  Result<int> lock_fd = lockDataDir(data_dir);
  if (!lock_fd.isOk()) return lock_fd.status();
  auto store = std::make_unique<SqliteStore>(Key{}, data_dir + "/" + kDatabaseFileName,
                                             lock_fd.value(), options);
  TALLY_STORE_RETURN_IF_ERROR(store->initialize());
  // Makes the entries of a new LOCK, ledger.db and WAL durable before the first reply depends
  // on them.
  TALLY_STORE_RETURN_IF_ERROR(syncDirectory(data_dir));
  return store;
}

Status SqliteStore::initialize() {
  int rc =
      sqlite3_open_v2(database_path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) return sqliteStatus(db_, rc, "open " + database_path_);
  rc = sqlite3_extended_result_codes(db_, 1);
  if (rc != SQLITE_OK) return sqliteStatus(db_, rc, "enable extended result codes");
  TALLY_STORE_RETURN_IF_ERROR(applyPragmas());
  TALLY_STORE_RETURN_IF_ERROR(createSchema());
  TALLY_STORE_RETURN_IF_ERROR(prepareStatements());
  return readLogPosition();
}

Status SqliteStore::applyPragmas() {
  // Only takes effect on a new file, so it precedes journal_mode (which writes the header).
  TALLY_STORE_RETURN_IF_ERROR(execSql(db_, "PRAGMA page_size=4096", "set page_size"));
  std::string journal_mode;
  TALLY_STORE_RETURN_IF_ERROR(
      queryOnce(db_, "PRAGMA journal_mode=WAL", "set journal_mode", [&](sqlite3_stmt* row) {
        if (row != nullptr) journal_mode = columnText(row, 0);
        return Status::ok();
      }));
  if (journal_mode != "wal") {
    return Status::ioError("set journal_mode: " + database_path_ + " is in journal mode '" +
                           journal_mode + "', not 'wal'");
  }
  for (const char* pragma : kPragmas) TALLY_STORE_RETURN_IF_ERROR(execSql(db_, pragma, pragma));
  if (options_.database_pages_max > 0) {
    const std::string pragma =
        "PRAGMA max_page_count=" + std::to_string(options_.database_pages_max);
    TALLY_STORE_RETURN_IF_ERROR(execSql(db_, pragma.c_str(), "set max_page_count"));
  }
  int64_t synchronous = -1;
  TALLY_STORE_RETURN_IF_ERROR(
      queryOnce(db_, "PRAGMA synchronous", "read synchronous", [&](sqlite3_stmt* row) {
        if (row != nullptr) synchronous = sqlite3_column_int64(row, 0);
        return Status::ok();
      }));
  if (synchronous != kSynchronousFull) {
    return Status::ioError("set synchronous: got " + std::to_string(synchronous) + ", not FULL");
  }
  return Status::ok();
}

// Creates the tables in a new file, or checks an existing file's schema version. Refuses a file
// that holds other tables but no version (not a ledger database).
Status SqliteStore::createSchema() {
  TALLY_STORE_RETURN_IF_ERROR(execSql(db_, "BEGIN IMMEDIATE", "begin schema setup"));
  Status status = [&]() -> Status {
    int64_t tables = 0;
    bool has_meta = false;
    TALLY_STORE_RETURN_IF_ERROR(queryOnce(
        db_, "SELECT count(*), sum(name = 'meta') FROM sqlite_master WHERE type = 'table'",
        "read schema", [&](sqlite3_stmt* row) {
          if (row == nullptr) return Status::ok();
          tables = sqlite3_column_int64(row, 0);
          has_meta = sqlite3_column_int64(row, 1) > 0;
          return Status::ok();
        }));
    if (!has_meta && tables > 0) {
      return Status::failedPrecondition(database_path_ + " is not a tally ledger database");
    }
    if (has_meta) {
      std::optional<int64_t> version;
      TALLY_STORE_RETURN_IF_ERROR(
          queryOnce(db_, "SELECT value FROM meta WHERE key = 'schema_version'",
                    "read schema_version", [&](sqlite3_stmt* row) {
                      if (row != nullptr && sqlite3_column_type(row, 0) == SQLITE_INTEGER) {
                        version = sqlite3_column_int64(row, 0);
                      }
                      return Status::ok();
                    }));
      if (version != kSchemaVersion) {
        return Status::failedPrecondition(
            database_path_ + " has schema_version " +
            (version ? std::to_string(*version) : std::string("(none)")) +
            "; this build reads only " + std::to_string(kSchemaVersion));
      }
      return Status::ok();
    }
    for (const char* sql : kCreateSchema) TALLY_STORE_RETURN_IF_ERROR(execSql(db_, sql, sql));
    std::string insert_version = std::string("INSERT INTO meta(key, value) VALUES('") +
                                 kMetaSchemaVersion + "', " + std::to_string(kSchemaVersion) + ")";
    return execSql(db_, insert_version.c_str(), "write schema_version");
  }();
  if (!status.isOk()) return rollbackIfOpen(status);
  return execSql(db_, "COMMIT", "commit schema setup");
}

Status SqliteStore::prepareStatements() {
  statements_ = std::make_unique<Statements>();
  for (size_t i = 0; i < kStatementCount; ++i) {
    int rc = sqlite3_prepare_v3(db_, kStatementSql[i], -1, SQLITE_PREPARE_PERSISTENT,
                                &statements_->stmt[i], nullptr);
    if (rc != SQLITE_OK) {
      return sqliteStatus(db_, rc, std::string("prepare ") + kStatementSql[i]);
    }
  }
  return Status::ok();
}

Status SqliteStore::readLogPosition() {
  int64_t max_seq = 0;
  TALLY_STORE_RETURN_IF_ERROR(queryOnce(db_, "SELECT count(*), coalesce(max(seq), 0) FROM log",
                                        "read log position", [&](sqlite3_stmt* row) {
                                          if (row == nullptr) return Status::ok();
                                          log_rows_ = sqlite3_column_int64(row, 0);
                                          max_seq = sqlite3_column_int64(row, 1);
                                          return Status::ok();
                                        }));
  std::optional<int64_t> folded_seq;
  TALLY_STORE_RETURN_IF_ERROR(readMeta(kMetaFoldedSeq, &folded_seq));
  next_seq_ = std::max(max_seq, folded_seq.value_or(0)) + 1;
  return Status::ok();
}

Status SqliteStore::readMeta(const char* key, std::optional<int64_t>* value) {
  sqlite3_stmt* stmt = (*statements_)[kGetMeta];
  ResetOnExit reset(stmt);
  const std::string op = std::string("read meta ") + key;
  int rc = sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
  if (rc != SQLITE_OK) return sqliteStatus(db_, rc, op.c_str());
  rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE) {
    *value = std::nullopt;
    return Status::ok();
  }
  if (rc != SQLITE_ROW) return sqliteStatus(db_, rc, op.c_str());
  if (sqlite3_column_type(stmt, 0) != SQLITE_INTEGER) {
    return Status::corruption("meta " + std::string(key) + " is not an integer");
  }
  *value = sqlite3_column_int64(stmt, 0);
  return Status::ok();
}

// --- Failure handling ---------------------------------------------------------------------------

Status SqliteStore::checkUsable() const {
  if (failed_.isOk()) return Status::ok();
  return Status::failedPrecondition("store failed earlier, durability unknown: " +
                                    failed_.toString());
}

Status SqliteStore::noteFailure(Status status) {
  if (status.code() == StatusCode::kIoError || status.code() == StatusCode::kCorruption) {
    if (failed_.isOk()) failed_ = status;
  }
  return status;
}

Status SqliteStore::rollbackIfOpen(Status status) {
  if (sqlite3_get_autocommit(db_) != 0) return status;  // SQLite already ended the transaction
  int rc = sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc == SQLITE_OK) return status;
  // The connection is stuck in a transaction: nothing more can be trusted to commit.
  return Status::ioError(status.toString() + "; then " +
                         sqliteStatus(db_, rc, "rollback").toString());
}

// --- Commit -------------------------------------------------------------------------------------

Status SqliteStore::commit(const StoreBatch& batch) {
  TALLY_STORE_RETURN_IF_ERROR(checkUsable());
  const Blob blob = encodeBatch(batch);
  const uint64_t bytes = blobBytes(blob).size();
  if (bytes > options_.batch_bytes_max) {
    return Status::resourceExhausted("store batch of " + std::to_string(bytes) +
                                     " bytes, at most " + std::to_string(options_.batch_bytes_max) +
                                     " allowed");
  }
  const Statements& s = *statements_;
  Status status = [&]() -> Status {
    {
      ResetOnExit reset(s[kBegin]);
      TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kBegin], "begin commit"));
    }
    {
      ResetOnExit reset(s[kInsertLog]);
      TALLY_STORE_RETURN_IF_ERROR(bindInt64(db_, s[kInsertLog], 1, next_seq_, "append log row"));
      TALLY_STORE_RETURN_IF_ERROR(bindBlob(db_, s[kInsertLog], 2, blob, "append log row"));
      TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kInsertLog], "append log row"));
    }
    ResetOnExit reset(s[kCommit]);
    return stepDone(db_, s[kCommit], "commit log row");
  }();
  if (!status.isOk()) return noteFailure(rollbackIfOpen(status));
  // Durable from here on: whatever happens below, this batch is acknowledged as committed.
  ++next_seq_;
  ++log_rows_;
  if (options_.checkpoint_log_rows > 0 && log_rows_ >= options_.checkpoint_log_rows) {
    last_checkpoint_status_ = checkpoint();
  }
  return Status::ok();
}

// --- Checkpoint ---------------------------------------------------------------------------------

Status SqliteStore::checkpoint() {
  TALLY_STORE_RETURN_IF_ERROR(checkUsable());
  if (log_rows_ == 0) return Status::ok();
  const Statements& s = *statements_;
  Status status = [&]() -> Status {
    {
      ResetOnExit reset(s[kBegin]);
      TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kBegin], "begin checkpoint"));
    }
    Fold fold;
    int64_t last_seq = 0;
    TALLY_STORE_RETURN_IF_ERROR(foldLog(&fold, &last_seq));
    TALLY_STORE_RETURN_IF_ERROR(writeFold(fold, last_seq));
    ResetOnExit reset(s[kCommit]);
    return stepDone(db_, s[kCommit], "commit checkpoint");
  }();
  if (!status.isOk()) return noteFailure(rollbackIfOpen(status));
  log_rows_ = 0;
  return Status::ok();
}

// Reads every log row in seq order into `fold`. Decoding is the read-back check of each record.
Status SqliteStore::foldLog(Fold* fold, int64_t* last_seq) {
  return forEachRow(db_, (*statements_)[kSelectLog], "read log", [&](sqlite3_stmt* row) {
    const int64_t seq = sqlite3_column_int64(row, 0);
    const std::string where = "log seq " + std::to_string(seq);
    std::span<const uint8_t> body = columnBlob(row, 1);
    TALLY_STORE_RETURN_IF_ERROR(checkBodySize(body, options_.batch_bytes_max, where));
    Result<StoreBatch> batch = decodeBatch(body);
    if (!batch.isOk()) return Status::corruption(where + ": " + batch.status().message());
    fold->apply(std::move(batch).value());
    *last_seq = seq;
    return Status::ok();
  });
}

Status SqliteStore::writeFold(const Fold& fold, int64_t last_seq) {
  const Statements& s = *statements_;
  for (const auto& [generation, record] : fold.policies) {
    const Blob blob = encodePolicyRecord(record);
    ResetOnExit reset(s[kUpsertPolicy]);
    const char* op = "checkpoint policy";
    TALLY_STORE_RETURN_IF_ERROR(
        bindInt64(db_, s[kUpsertPolicy], 1, static_cast<int64_t>(generation), op));
    TALLY_STORE_RETURN_IF_ERROR(bindBlob(db_, s[kUpsertPolicy], 2, blob, op));
    TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kUpsertPolicy], op));
  }
  for (const auto& [key, record] : fold.accounts) {
    const Blob blob = encodeAccountRecord(record);
    ResetOnExit reset(s[kUpsertAccount]);
    const char* op = "checkpoint account";
    TALLY_STORE_RETURN_IF_ERROR(bindText(db_, s[kUpsertAccount], 1, key.subject, op));
    TALLY_STORE_RETURN_IF_ERROR(bindText(db_, s[kUpsertAccount], 2, key.route, op));
    TALLY_STORE_RETURN_IF_ERROR(
        bindInt64(db_, s[kUpsertAccount], 3, static_cast<int64_t>(key.generation), op));
    TALLY_STORE_RETURN_IF_ERROR(bindBlob(db_, s[kUpsertAccount], 4, blob, op));
    TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kUpsertAccount], op));
  }
  // In key order, so that consecutive writes land on the same B-tree pages.
  std::vector<const std::pair<const std::string, std::optional<Reservation>>*> ordered;
  ordered.reserve(fold.reservations.size());
  for (const auto& entry : fold.reservations) ordered.push_back(&entry);
  std::sort(ordered.begin(), ordered.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  for (const auto* entry : ordered) {
    const std::string& id = entry->first;
    const std::optional<Reservation>& reservation = entry->second;
    if (!reservation) {
      ResetOnExit reset(s[kDeleteReservation]);
      const char* op = "checkpoint reservation deletion";
      TALLY_STORE_RETURN_IF_ERROR(bindText(db_, s[kDeleteReservation], 1, id, op));
      TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kDeleteReservation], op));
      continue;
    }
    const Blob blob = encodeReservationRecord(*reservation);
    ResetOnExit reset(s[kUpsertReservation]);
    const char* op = "checkpoint reservation";
    TALLY_STORE_RETURN_IF_ERROR(bindText(db_, s[kUpsertReservation], 1, id, op));
    TALLY_STORE_RETURN_IF_ERROR(bindBlob(db_, s[kUpsertReservation], 2, blob, op));
    TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kUpsertReservation], op));
  }
  TALLY_STORE_RETURN_IF_ERROR(
      setMetaMax(kMetaLedgerClockMs, static_cast<int64_t>(fold.ledger_clock_ms)));
  TALLY_STORE_RETURN_IF_ERROR(setMetaMax(kMetaFoldedSeq, last_seq));
  ResetOnExit reset(s[kDeleteLogUpTo]);
  TALLY_STORE_RETURN_IF_ERROR(bindInt64(db_, s[kDeleteLogUpTo], 1, last_seq, "delete folded log"));
  return stepDone(db_, s[kDeleteLogUpTo], "delete folded log");
}

Status SqliteStore::setMetaMax(const char* key, int64_t value) {
  sqlite3_stmt* stmt = (*statements_)[kSetMetaMax];
  ResetOnExit reset(stmt);
  const std::string op = std::string("write meta ") + key;
  int rc = sqlite3_bind_text(stmt, 1, key, -1, SQLITE_STATIC);
  if (rc != SQLITE_OK) return sqliteStatus(db_, rc, op.c_str());
  TALLY_STORE_RETURN_IF_ERROR(bindInt64(db_, stmt, 2, value, op.c_str()));
  return stepDone(db_, stmt, op.c_str());
}

// --- Load ---------------------------------------------------------------------------------------

Result<StoreContents> SqliteStore::load() {
  const Statements& s = *statements_;
  {
    ResetOnExit reset(s[kBeginRead]);
    TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kBeginRead], "begin load"));
  }
  StoreContents contents;
  Status status = loadInTransaction(&contents);
  if (!status.isOk()) return rollbackIfOpen(status);
  ResetOnExit reset(s[kCommit]);
  TALLY_STORE_RETURN_IF_ERROR(stepDone(db_, s[kCommit], "end load"));
  return contents;
}

Status SqliteStore::loadInTransaction(StoreContents* contents) {
  const Statements& s = *statements_;
  const uint64_t bytes_max = options_.batch_bytes_max;
  std::map<Generation, PolicyRecord> policies;
  std::map<AccountKey, AccountRecord> accounts;
  std::vector<Reservation> reservations;
  TALLY_STORE_RETURN_IF_ERROR(readPolicies(db_, s[kSelectPolicies], bytes_max, &policies));
  TALLY_STORE_RETURN_IF_ERROR(readAccounts(db_, s[kSelectAccounts], bytes_max, &accounts));
  TALLY_STORE_RETURN_IF_ERROR(
      readReservations(db_, s[kSelectReservations], bytes_max, &reservations));
  std::optional<int64_t> clock_ms;
  TALLY_STORE_RETURN_IF_ERROR(readMeta(kMetaLedgerClockMs, &clock_ms));

  Fold fold;
  int64_t last_seq = 0;
  TALLY_STORE_RETURN_IF_ERROR(foldLog(&fold, &last_seq));

  for (auto& [generation, record] : fold.policies) policies[generation] = std::move(record);
  for (auto& [key, record] : fold.accounts) accounts[key] = std::move(record);
  contents->policies.reserve(policies.size());
  for (auto& [generation, record] : policies) contents->policies.push_back(std::move(record));
  contents->accounts.reserve(accounts.size());
  for (auto& [key, record] : accounts) contents->accounts.push_back(std::move(record));
  contents->reservations = mergeReservations(std::move(reservations), std::move(fold.reservations));
  contents->ledger_clock_ms =
      std::max(static_cast<uint64_t>(clock_ms.value_or(0)), fold.ledger_clock_ms);
  return Status::ok();
}

}  // namespace tally::ledger
