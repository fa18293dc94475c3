#include "ledger/backup.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/data_dir.h"
#include "core/ledger.h"
#include "ledger/commit_log.h"
#include "ledger/restore.h"
#include "ledger/sqlite_store.h"
#include "ledger/sqlite_store_files.h"

namespace tally::ledger {
namespace {

namespace files = store_files;

// A busy source (WAL recovery by another connection) is retried this often, this far apart.
constexpr int kBusyRetriesMax = 100;
constexpr int kBusyRetryMs = 50;
constexpr int kBusyTimeoutMs = 5000;

Status sqliteError(sqlite3* db, const std::string& what) {
  return Status::ioError(what + ": " + (db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
}

struct CloseDb {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, CloseDb>;

Result<Db> openDb(const std::string& path, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) return sqliteError(db.get(), "open " + path);
  if (sqlite3_busy_timeout(db.get(), kBusyTimeoutMs) != SQLITE_OK) {
    return sqliteError(db.get(), "busy_timeout " + path);
  }
  return db;
}

// One file, in one read transaction of the source (sqlite3_backup_step(-1)): a committed
// snapshot. The source is opened read-write but never written (a read-only connection could not
// create the WAL index when the ledger is stopped); it never touches DIR/LOCK.
Status copyDatabase(const std::string& source_path, const std::string& dest_path) {
  if (::access(source_path.c_str(), F_OK) != 0) {
    return Status::failedPrecondition(source_path + " does not exist: not a ledger data dir");
  }
  Result<Db> source = openDb(source_path, SQLITE_OPEN_READWRITE);
  if (!source.isOk()) return source.status();
  Result<Db> dest = openDb(dest_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (!dest.isOk()) return dest.status();
  if (sqlite3_exec(dest.value().get(), "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr) !=
      SQLITE_OK) {
    return sqliteError(dest.value().get(), "synchronous " + dest_path);
  }
  sqlite3_backup* backup =
      sqlite3_backup_init(dest.value().get(), "main", source.value().get(), "main");
  if (backup == nullptr) return sqliteError(dest.value().get(), "backup " + source_path);
  int rc = SQLITE_OK;
  for (int attempt = 0; attempt <= kBusyRetriesMax; ++attempt) {
    rc = sqlite3_backup_step(backup, -1);
    if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
    sqlite3_sleep(kBusyRetryMs);
  }
  const int finished = sqlite3_backup_finish(backup);
  if (rc != SQLITE_DONE) {
    return Status::ioError("backup " + source_path + ": " + sqlite3_errstr(rc));
  }
  if (finished != SQLITE_OK) return sqliteError(dest.value().get(), "backup " + source_path);
  // The copy keeps WAL mode; a checkpoint moves everything into the file itself (fsync'd) so
  // DEST is complete without its -wal.
  if (sqlite3_wal_checkpoint_v2(dest.value().get(), nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr,
                                nullptr) != SQLITE_OK) {
    return sqliteError(dest.value().get(), "checkpoint " + dest_path);
  }
  return Status::ok();
}

Status copyKey(const std::string& source_path, const std::string& dest_path) {
  std::ifstream in(source_path, std::ios::binary);
  if (!in) return Status::ioError("read " + source_path + ": " + std::strerror(errno));
  std::stringstream content;
  content << in.rdbuf();
  const int fd = ::open(dest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::ioError("create " + dest_path + ": " + std::strerror(errno));
  const Status written = writeAllAndSync(fd, dest_path, content.str());
  if (::close(fd) != 0 && written.isOk()) {
    return Status::ioError("close " + dest_path + ": " + std::strerror(errno));
  }
  return written;
}

// DEST must be new: a missing directory (created here) or an empty one.
Status prepareDest(const std::string& dest_dir) {
  std::error_code error;
  if (std::filesystem::exists(dest_dir, error)) {
    if (!std::filesystem::is_directory(dest_dir, error)) {
      return Status::failedPrecondition(dest_dir + " exists and is not a directory");
    }
    if (!std::filesystem::is_empty(dest_dir, error) || error) {
      return Status::failedPrecondition(dest_dir + " is not empty: back up into a new directory");
    }
  }
  return makeDataDir(dest_dir);
}

uint64_t fileBytes(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

// Opens the copy as the ledger would and restores it into a scratch ledger.
Result<BackupSummary> verifyCopy(const std::string& dest_dir, uint64_t wall_now_ms) {
  Result<std::unique_ptr<SqliteStore>> opened = SqliteStore::open(dest_dir);
  if (!opened.isOk()) return opened.status();
  std::unique_ptr<SqliteStore> store = std::move(opened).value();
  Ledger scratch;
  Result<RestoreSummary> restored = restoreLedger(store.get(), &scratch, wall_now_ms);
  if (!restored.isOk()) return restored.status();
  return BackupSummary{.accounts = restored.value().accounts,
                       .reservations = restored.value().reservations,
                       .policies = restored.value().policies,
                       .bytes = store->logDiskBytes() + fileBytes(store->tablesPath()),
                       .folded_seq = store->foldedSeq()};
}

// tables.db's folded_seq in the copy at `path`.
Result<int64_t> foldedSeqOf(const std::string& path) {
  Result<Db> db = openDb(path, SQLITE_OPEN_READONLY);
  if (!db.isOk()) return db.status();
  sqlite3_stmt* get = nullptr;
  if (sqlite3_prepare_v2(db.value().get(), files::kTablesStatementSql[files::kTablesGetMeta], -1,
                         &get, nullptr) != SQLITE_OK) {
    return sqliteError(db.value().get(), "read folded_seq of " + path);
  }
  int64_t folded = 0;
  const Status read = files::readFoldedSeq(db.value().get(), get, path, &folded);
  sqlite3_finalize(get);
  if (!read.isOk()) return read;
  return folded;
}

// The log first, then the tables: the copied log then ends at or before what the ledger had
// committed when the tables were copied, and starts at or before their folded_seq + 1 (the
// ledger recycles only folded segments, and a segment recycled under the copy restarts it past
// the recycled records: CommitLog::copyLog). When the tables folded past the log copy's end,
// every record of the copy is in them, and the copy's log becomes an empty one at that seq.
Status copyLogThenTables(const std::string& data_dir, const std::string& dest_dir) {
  const std::string log_dir = data_dir + "/" + SqliteStore::kLogDirName;
  const std::string dest_log = dest_dir + "/" + SqliteStore::kLogDirName;
  const std::string tables = std::string("/") + SqliteStore::kTablesFileName;
  std::error_code error;
  if (!std::filesystem::exists(log_dir, error)) {
    // A data dir a ledger of schema version 5 or older left (not opened since the upgrade):
    // copied as it is; opening the copy migrates it.
    for (const char* name : {SqliteStore::kLegacyLogFileName, SqliteStore::kTablesFileName}) {
      const std::string file = std::string("/") + name;
      if (Status s = copyDatabase(data_dir + file, dest_dir + file); !s.isOk()) return s;
    }
    return Status::ok();
  }
  Result<int64_t> log_end = CommitLog::copyLog(log_dir, dest_log);
  if (!log_end.isOk()) return log_end.status();
  if (Status s = copyDatabase(data_dir + tables, dest_dir + tables); !s.isOk()) return s;
  Result<int64_t> folded = foldedSeqOf(dest_dir + tables);
  if (!folded.isOk()) return folded.status();
  if (folded.value() > log_end.value()) {
    std::filesystem::remove_all(dest_log, error);
    if (error) return Status::ioError("remove " + dest_log + ": " + error.message());
    Result<std::unique_ptr<CommitLog>> empty =
        CommitLog::open(dest_log, folded.value(), /*require_segments=*/false);
    if (!empty.isOk()) return empty.status();
    if (Status s = empty.value()->ensureSegment(); !s.isOk()) return s;
  }
  return Status::ok();
}

// Everything after prepareDest().
Result<BackupSummary> copyInto(const std::string& data_dir, const std::string& dest_dir,
                               uint64_t wall_now_ms) {
  if (Status s = copyLogThenTables(data_dir, dest_dir); !s.isOk()) return s;
  const std::string key = data_dir + "/ledger.key";
  if (::access(key.c_str(), F_OK) == 0) {
    if (Status s = copyKey(key, dest_dir + "/ledger.key"); !s.isOk()) return s;
  }
  if (Status s = syncDirectory(dest_dir); !s.isOk()) return s;
  return verifyCopy(dest_dir, wall_now_ms);
}

}  // namespace

Result<BackupSummary> backupStore(const std::string& data_dir, const std::string& dest_dir,
                                  uint64_t wall_now_ms) {
  if (Status s = prepareDest(dest_dir); !s.isOk()) return s;
  return copyInto(data_dir, dest_dir, wall_now_ms);
}

int runBackup(const std::string& data_dir, const std::string& dest_dir, uint64_t wall_now_ms) {
  std::error_code error;
  const bool existed = std::filesystem::exists(dest_dir, error);
  if (Status s = prepareDest(dest_dir); !s.isOk()) {
    std::fprintf(stderr, "tally-ledger: backup: %s\n", s.toString().c_str());
    return 1;
  }
  Result<BackupSummary> backup = copyInto(data_dir, dest_dir, wall_now_ms);
  if (!backup.isOk()) {
    std::fprintf(stderr, "tally-ledger: backup %s into %s: %s\n", data_dir.c_str(),
                 dest_dir.c_str(), backup.status().toString().c_str());
    // Leave nothing that could pass for a backup (an existing DEST was empty before).
    std::filesystem::remove_all(dest_dir, error);
    if (existed) std::filesystem::create_directory(dest_dir, error);
    return 1;
  }
  const BackupSummary& summary = backup.value();
  std::printf(
      "backup %s: ok: %llu accounts, %llu reservations, %llu policies, %llu bytes, folded seq "
      "%lld; restore it by copying it as a stopped ledger's data dir (docs/operations.md)\n",
      dest_dir.c_str(), static_cast<unsigned long long>(summary.accounts),
      static_cast<unsigned long long>(summary.reservations),
      static_cast<unsigned long long>(summary.policies),
      static_cast<unsigned long long>(summary.bytes), static_cast<long long>(summary.folded_seq));
  return 0;
}

}  // namespace tally::ledger
