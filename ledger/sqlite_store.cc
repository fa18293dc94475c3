#include "ledger/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "common/data_dir.h"
#include "common/sqlite_connection.h"
#include "common/sqlite_support.h"
#include "core/assert.h"
#include "ledger/sqlite_store_files.h"
#include "ledger/store_codec.h"

namespace tally::ledger {

using sqlite::Connection;
using sqlite::inTransaction;
using sqlite::ResetOnExit;
using sqlite::stepDone;
namespace files = store_files;

static_assert(SqliteStore::kSchemaVersion == files::kSchemaVersion);

namespace {

constexpr int64_t kPageBytes = 4096;

constexpr int64_t kBusyTimeoutMs = 5000;
constexpr int64_t kCommitCacheKib = 16 * 1024;
constexpr int64_t kTablesCacheKib = 64 * 1024;  // the fold's upserts into tables.db
constexpr int64_t kReaderCacheKib = 8 * 1024;   // load(): one scan of tables.db
// The commit connection checkpoints by itself only when the WAL has grown this many times past
// log_wal_frames_max: the fold thread is stuck or disabled.
constexpr uint64_t kBackstopWalFactor = 4;
// Before the commit path is asked to copy the rest of the WAL (and so restart it), the fold
// thread's PASSIVE checkpoints run until at most this many frames are left, for at most this
// many rounds.
constexpr int kRestartFramesLeftMax = 64;
constexpr int kPassiveRoundsMax = 4;
// How long the fold thread holds off reading the log while a WAL restart is under way (about
// two commits).
constexpr int64_t kWalRestartWaitMs = 100;

// Both files' own pragmas (sqlite::FilePragmas::extra).
constexpr const char* kFilePragmas[] = {
    // Debian builds SQLite with SECURE_DELETE on, which zeroes and writes every freed page: for
    // ledger.db, each trimmed log row's overflow pages. Nothing here is secret from whoever can
    // read the data dir (tables.db holds the same records).
    "PRAGMA secure_delete=OFF",
};

// Opens `path` and applies `pragmas` and kFilePragmas.
Result<std::unique_ptr<Connection>> openFile(const std::string& path, sqlite::FilePragmas pragmas) {
  pragmas.extra = kFilePragmas;
  Result<std::unique_ptr<Connection>> connection = Connection::open(path);
  if (!connection.isOk()) return connection.status();
  TALLY_SQLITE_RETURN_IF_ERROR(connection.value()->applyPragmas(pragmas));
  return connection;
}

uint64_t threadCpuUs() {
  timespec now{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now) != 0) return 0;
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000 + static_cast<uint64_t>(now.tv_nsec) / 1000;
}

uint64_t elapsedUs(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - since)
                                   .count());
}

bool isSticky(const Status& status) {
  return status.code() == StatusCode::kIoError || status.code() == StatusCode::kCorruption;
}

}  // namespace

// --- Open ---------------------------------------------------------------------------------------

SqliteStore::SqliteStore(Key, const std::string& data_dir, int lock_fd, SqliteStoreOptions options)
    : database_path_(data_dir + "/" + kDatabaseFileName),
      tables_path_(data_dir + "/" + kTablesFileName),
      lock_fd_(lock_fd),
      options_(options) {}

SqliteStore::~SqliteStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  fold_wanted_.notify_all();
  if (fold_thread_.joinable()) fold_thread_.join();
  // The fold thread's connections first: the last connection to close a file checkpoints it.
  fold_tables_.reset();
  fold_log_.reset();
  tables_.reset();
  log_.reset();
  // The lock goes last: the files are closed before another ledger may open them.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const std::string& data_dir,
                                                       SqliteStoreOptions options) {
  if (data_dir.empty()) return Status::invalidArgument("data dir: empty path");
  if (options.fold_rows_per_transaction_max == 0 || options.fold_bytes_per_transaction_max == 0 ||
      options.trim_rows_per_commit_max == 0 || options.log_wal_frames_max == 0) {
    return Status::invalidArgument(
        "fold_rows_per_transaction_max, fold_bytes_per_transaction_max, trim_rows_per_commit_max "
        "and log_wal_frames_max must be positive");
  }
  TALLY_SQLITE_RETURN_IF_ERROR(makeDataDir(data_dir));
  Result<int> lock_fd = lockDataDir(data_dir, kLockFileName, "ledger");
  if (!lock_fd.isOk()) return lock_fd.status();
  auto store = std::make_unique<SqliteStore>(Key{}, data_dir, lock_fd.value(), options);
  TALLY_SQLITE_RETURN_IF_ERROR(store->initialize());
  // Makes the entries of a new LOCK, both files and their WALs durable before the first reply
  // depends on them.
  TALLY_SQLITE_RETURN_IF_ERROR(syncDirectory(data_dir));
  store->fold_thread_ = std::thread([raw = store.get()] { raw->runFold(); });
  return store;
}

Status SqliteStore::initialize() {
  // tables.db first: whether ledger.db may be created depends on what tables.db holds.
  int64_t folded_seq = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(openTables(&folded_seq));
  TALLY_SQLITE_RETURN_IF_ERROR(openLog(folded_seq));
  TALLY_SQLITE_RETURN_IF_ERROR(openFoldConnections());
  std::lock_guard lock(mu_);
  committed_seq_ = next_seq_ - 1;
  folded_seq_ = folded_seq;
  return Status::ok();
}

Status SqliteStore::openTables(int64_t* folded_seq) {
  Result<std::unique_ptr<Connection>> tables =
      openFile(tables_path_, {.wal_autocheckpoint_pages = 0,  // writes only the schema
                              .cache_kib = kReaderCacheKib,
                              .max_page_count = options_.database_pages_max,
                              .busy_timeout_ms = kBusyTimeoutMs});
  if (!tables.isOk()) return tables.status();
  tables_ = std::move(tables).value();
  TALLY_SQLITE_RETURN_IF_ERROR(files::createOrCheckSchema(
      *tables_, files::kTablesSchema, "reservations", files::kTablesMigrations));
  TALLY_SQLITE_RETURN_IF_ERROR(tables_->prepare(files::kTablesStatementSql));
  std::optional<int64_t> folded;
  TALLY_SQLITE_RETURN_IF_ERROR(files::readMeta(tables_->db(), (*tables_)[files::kTablesGetMeta],
                                               files::kMetaFoldedSeq, &folded));
  if (folded.value_or(0) < 0) return Status::corruption(tables_path_ + ": negative folded_seq");
  *folded_seq = folded.value_or(0);
  return Status::ok();
}

Status SqliteStore::openLog(int64_t folded_seq) {
  const int64_t wal_frames = static_cast<int64_t>(options_.log_wal_frames_max);
  Result<std::unique_ptr<Connection>> log =
      openFile(database_path_,
               {.wal_autocheckpoint_pages = wal_frames * static_cast<int64_t>(kBackstopWalFactor),
                // Room for the WAL to overshoot log_wal_frames_max between two folds without being
                // truncated (and then regrown, which makes every fsync also write file metadata).
                .journal_size_limit_bytes = 2 * wal_frames * kPageBytes,
                .cache_kib = kCommitCacheKib,
                .max_page_count = options_.database_pages_max,
                .busy_timeout_ms = kBusyTimeoutMs});
  if (!log.isOk()) return log.status();
  log_ = std::move(log).value();
  if (folded_seq > 0) {
    // Only an existing log may go with tables that folded part of one.
    TALLY_SQLITE_RETURN_IF_ERROR(sqlite::queryOnce(
        log_->db(), "SELECT count(*) FROM sqlite_master WHERE type = 'table'", "read schema",
        [&](sqlite3_stmt* row) {
          if (row != nullptr && sqlite3_column_int64(row, 0) > 0) return Status::ok();
          return Status::failedPrecondition(database_path_ + " is missing or empty, but " +
                                            tables_path_ + " has folded its log up to seq " +
                                            std::to_string(folded_seq) +
                                            ": the log after it is lost; refusing to start");
        }));
  }
  TALLY_SQLITE_RETURN_IF_ERROR(
      files::createOrCheckSchema(*log_, files::kLogSchema, "log", files::kLogMigrations));
  TALLY_SQLITE_RETURN_IF_ERROR(log_->prepare(files::kLogStatementSql));
  std::optional<int64_t> trimmed;
  TALLY_SQLITE_RETURN_IF_ERROR(
      files::readMeta(log_->db(), (*log_)[files::kLogGetMeta], files::kMetaTrimmedSeq, &trimmed));
  trimmed_seq_ = trimmed.value_or(0);
  if (trimmed_seq_ < 0 || trimmed_seq_ > folded_seq) {
    return Status::corruption(database_path_ + " deleted log rows up to seq " +
                              std::to_string(trimmed_seq_) + " but " + tables_path_ +
                              " holds them only up to seq " + std::to_string(folded_seq) +
                              ": tables.db is missing or older than the log");
  }
  int64_t max_seq = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(sqlite::queryOnce(log_->db(),
                                                 "SELECT coalesce(max(seq), 0) FROM log",
                                                 "read log position", [&](sqlite3_stmt* row) {
                                                   if (row != nullptr)
                                                     max_seq = sqlite3_column_int64(row, 0);
                                                   return Status::ok();
                                                 }));
  next_seq_ = std::max({max_seq, trimmed_seq_, folded_seq}) + 1;
  return Status::ok();
}

Status SqliteStore::openFoldConnections() {
  Result<std::unique_ptr<Connection>> fold_log =
      openFile(database_path_, {.wal_autocheckpoint_pages = 0,  // never writes: checkpoints
                                .cache_kib = kCommitCacheKib,
                                .max_page_count = options_.database_pages_max,
                                .busy_timeout_ms = kBusyTimeoutMs});
  if (!fold_log.isOk()) return fold_log.status();
  fold_log_ = std::move(fold_log).value();
  TALLY_SQLITE_RETURN_IF_ERROR(fold_log_->prepare(files::kLogStatementSql));
  Result<std::unique_ptr<Connection>> fold_tables =
      openFile(tables_path_, {.wal_autocheckpoint_pages = 4096,
                              .journal_size_limit_bytes = 64 << 20,
                              .cache_kib = kTablesCacheKib,
                              .max_page_count = options_.database_pages_max,
                              .busy_timeout_ms = kBusyTimeoutMs});
  if (!fold_tables.isOk()) return fold_tables.status();
  fold_tables_ = std::move(fold_tables).value();
  return fold_tables_->prepare(files::kTablesStatementSql);
}

// --- Failure handling ---------------------------------------------------------------------------

Status SqliteStore::checkUsable() {
  if (!failed_.isOk()) {
    return Status::failedPrecondition("store failed earlier, durability unknown: " +
                                      failed_.toString());
  }
  std::lock_guard lock(mu_);
  if (!fold_failed_.isOk()) {
    return Status::failedPrecondition("store's fold failed earlier: " + fold_failed_.toString());
  }
  return Status::ok();
}

Status SqliteStore::noteFailure(Status status) {
  if (isSticky(status) && failed_.isOk()) failed_ = status;
  return status;
}

int64_t SqliteStore::foldedSeq() const {
  std::lock_guard lock(mu_);
  return folded_seq_;
}

Status SqliteStore::foldStatus() const {
  std::lock_guard lock(mu_);
  return fold_failed_.isOk() ? fold_status_ : fold_failed_;
}

SqliteStoreStats SqliteStore::stats() const {
  SqliteStoreStats stats = commit_stats_;
  std::lock_guard lock(mu_);
  stats.folds = fold_stats_.folds;
  stats.folded_rows = fold_stats_.folded_rows;
  stats.fold_us = fold_stats_.fold_us;
  stats.fold_cpu_us = fold_stats_.fold_cpu_us;
  stats.log_wal_checkpoints = fold_stats_.log_wal_checkpoints;
  return stats;
}

// --- Commit -------------------------------------------------------------------------------------

Status SqliteStore::commit(const StoreBatch& batch) {
  const auto started = std::chrono::steady_clock::now();
  TALLY_SQLITE_RETURN_IF_ERROR(checkUsable());
  const std::span<const uint8_t> body = encoder_.encode(batch);
  const uint64_t bytes = body.size();
  if (bytes > options_.batch_bytes_max) {
    return Status::resourceExhausted("store batch of " + std::to_string(bytes) +
                                     " bytes, at most " + std::to_string(options_.batch_bytes_max) +
                                     " allowed");
  }
  int64_t trim_to = trimmed_seq_;
  {
    std::lock_guard lock(mu_);
    trim_to = std::min(folded_seq_,
                       trimmed_seq_ + static_cast<int64_t>(options_.trim_rows_per_commit_max));
  }
  TALLY_SQLITE_RETURN_IF_ERROR(noteFailure(appendLogRow(body, trim_to)));
  // Durable from here on: this batch is acknowledged as committed.
  const int64_t seq = next_seq_++;
  ++commit_stats_.commits;
  commit_stats_.log_bytes += bytes;
  if (trim_to > trimmed_seq_) {
    ++commit_stats_.trims;
    commit_stats_.trimmed_rows += static_cast<uint64_t>(trim_to - trimmed_seq_);
    trimmed_seq_ = trim_to;
  }
  int current = 0;
  int highwater = 0;
  if (sqlite3_db_status(log_->db(), SQLITE_DBSTATUS_CACHE_WRITE, &current, &highwater, 1) ==
      SQLITE_OK) {
    commit_stats_.log_pages_written += static_cast<uint64_t>(current);
  }
  bool wake = false;
  bool restart = false;
  {
    std::lock_guard lock(mu_);
    committed_seq_ = seq;
    if (wal_restart_ == WalRestart::kCopied) {
      // This commit began by starting the WAL over (unless a reader kept it from doing so; the
      // fold thread then asks again later). The fold thread may read the log again.
      wal_restart_ = WalRestart::kIdle;
      wake = true;
    }
    wake = wake || foldDue();
    restart = wal_restart_ == WalRestart::kWanted;
  }
  if (wake) fold_wanted_.notify_one();
  if (restart) restartLogWal();
  commit_stats_.commit_us += elapsedUs(started);
  return Status::ok();
}

// One transaction: deletes the log rows up to trim_to (already durable in tables.db), appends
// `body` as log row next_seq_.
Status SqliteStore::appendLogRow(std::span<const uint8_t> body, int64_t trim_to) {
  const Connection& log = *log_;
  sqlite3* db = log.db();
  return inTransaction(log, files::kLogBegin, files::kLogCommit, "commit log row", [&]() -> Status {
    if (trim_to > trimmed_seq_) {
      ResetOnExit reset(log[files::kLogDeleteUpTo]);
      const char* op = "trim folded log rows";
      TALLY_SQLITE_RETURN_IF_ERROR(
          sqlite::bindInt64(db, log[files::kLogDeleteUpTo], 1, trim_to, op));
      TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, log[files::kLogDeleteUpTo], op));
      TALLY_SQLITE_RETURN_IF_ERROR(
          files::setMetaMax(db, log[files::kLogSetMetaMax], files::kMetaTrimmedSeq, trim_to));
    }
    ResetOnExit reset(log[files::kLogInsert]);
    const char* op = "append log row";
    TALLY_SQLITE_RETURN_IF_ERROR(sqlite::bindInt64(db, log[files::kLogInsert], 1, next_seq_, op));
    TALLY_SQLITE_RETURN_IF_ERROR(sqlite::bindBlob(db, log[files::kLogInsert], 2, body, op));
    return stepDone(db, log[files::kLogInsert], op);
  });
}

// --- Checkpoint ---------------------------------------------------------------------------------

Status SqliteStore::checkpoint() {
  TALLY_SQLITE_RETURN_IF_ERROR(checkUsable());
  const int64_t target = next_seq_ - 1;
  int64_t folded = 0;
  {
    std::unique_lock lock(mu_);
    requested_seq_ = std::max(requested_seq_, target);
    fold_wanted_.notify_one();
    const uint64_t attempts_before = fold_attempts_;
    // Each fold attempt either advances folded_seq_ or fails, so this wait ends.
    fold_done_.wait(lock, [&] {
      return folded_seq_ >= target || !fold_failed_.isOk() ||
             (fold_attempts_ > attempts_before && !fold_status_.isOk());
    });
    if (!fold_failed_.isOk()) return fold_failed_;
    if (folded_seq_ < target) return fold_status_;
    folded = folded_seq_;
  }
  if (folded <= trimmed_seq_) return Status::ok();
  TALLY_SQLITE_RETURN_IF_ERROR(noteFailure(trimLog(folded)));
  commit_stats_.trimmed_rows += static_cast<uint64_t>(folded - trimmed_seq_);
  trimmed_seq_ = folded;
  return Status::ok();
}

Status SqliteStore::trimLog(int64_t trim_to) {
  const Connection& log = *log_;
  sqlite3* db = log.db();
  return inTransaction(log, files::kLogBegin, files::kLogCommit, "trim log", [&]() -> Status {
    ResetOnExit reset(log[files::kLogDeleteUpTo]);
    const char* op = "trim folded log rows";
    TALLY_SQLITE_RETURN_IF_ERROR(sqlite::bindInt64(db, log[files::kLogDeleteUpTo], 1, trim_to, op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, log[files::kLogDeleteUpTo], op));
    return files::setMetaMax(db, log[files::kLogSetMetaMax], files::kMetaTrimmedSeq, trim_to);
  });
}

// --- Load ---------------------------------------------------------------------------------------

Result<StoreContents> SqliteStore::load() {
  StoreContents contents;
  const Connection& log = *log_;
  // ledger.db's read snapshot is taken before tables.db's (in loadContents()), so the log rows
  // after the folded_seq it then reads cannot have been trimmed in between. (Trims also run only
  // on this thread, so none can run during load() anyway.)
  TALLY_SQLITE_RETURN_IF_ERROR(inTransaction(log, files::kLogBeginRead, files::kLogCommit, "load",
                                             [&] { return loadContents(&contents); }));
  return contents;
}

// Inside a read transaction on ledger.db.
Status SqliteStore::loadContents(StoreContents* contents) {
  const Connection& log = *log_;
  std::optional<int64_t> trimmed;
  TALLY_SQLITE_RETURN_IF_ERROR(
      files::readMeta(log.db(), log[files::kLogGetMeta], files::kMetaTrimmedSeq, &trimmed));
  files::TablesImage image;
  TALLY_SQLITE_RETURN_IF_ERROR(
      inTransaction(*tables_, files::kTablesBeginRead, files::kTablesCommit, "load tables",
                    [&] { return files::readTables(*tables_, options_.batch_bytes_max, &image); }));
  if (trimmed.value_or(0) > image.folded_seq) {
    return Status::corruption(database_path_ + " deleted log rows up to seq " +
                              std::to_string(trimmed.value_or(0)) + " but " + tables_path_ +
                              " holds them only up to seq " + std::to_string(image.folded_seq));
  }
  files::LogFold fold;
  sqlite3_stmt* select = log[files::kLogSelectAfter];
  TALLY_SQLITE_RETURN_IF_ERROR(
      sqlite::bindInt64(log.db(), select, 1, image.folded_seq, "read log"));
  TALLY_SQLITE_RETURN_IF_ERROR(
      sqlite::forEachRow(log.db(), select, "read log", [&](sqlite3_stmt* row) {
        return files::foldLogRow(sqlite3_column_int64(row, 0), sqlite::columnBlob(row, 1),
                                 options_.batch_bytes_max, &fold);
      }));
  if (fold.rows > 0 && fold.first_seq != image.folded_seq + 1) {
    return Status::corruption("log seq " + std::to_string(fold.first_seq) + " follows " +
                              tables_path_ + "'s folded_seq " + std::to_string(image.folded_seq) +
                              ": log rows are missing");
  }
  *contents = files::mergeContents(std::move(image), std::move(fold));
  return Status::ok();
}

// --- Fold thread --------------------------------------------------------------------------------

bool SqliteStore::foldDue() const {
  if (!fold_failed_.isOk() || committed_seq_ <= folded_seq_) return false;
  if (requested_seq_ > folded_seq_) return true;
  const uint64_t threshold = options_.checkpoint_log_rows;
  return threshold > 0 && static_cast<uint64_t>(committed_seq_ - folded_seq_) >= threshold;
}

void SqliteStore::runFold() {
  // Names the thread in top, perf and /proc (best effort: a name changes nothing else).
  (void)::pthread_setname_np(::pthread_self(), "tally-fold");
  std::unique_lock lock(mu_);
  for (;;) {
    fold_wanted_.wait(lock, [&] { return stop_ || foldDue(); });
    if (stop_) return;
    // One burst: everything committed by now, in transactions of at most
    // fold_rows_per_transaction_max rows, then one round of WAL upkeep. Fewer, larger bursts
    // disturb the commit path's fsyncs less often.
    const int64_t burst_end = committed_seq_;
    Status status;
    while (status.isOk() && !stop_ && folded_seq_ < burst_end) {
      const int64_t after = folded_seq_;
      int64_t last =
          std::min(burst_end, after + static_cast<int64_t>(options_.fold_rows_per_transaction_max));
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      const uint64_t cpu_started_us = threadCpuUs();
      status = foldRange(after, &last);
      const uint64_t cpu_us = threadCpuUs() - cpu_started_us;
      const uint64_t fold_us = elapsedUs(started);
      lock.lock();
      if (status.isOk()) {
        ++fold_stats_.folds;
        fold_stats_.folded_rows += static_cast<uint64_t>(last - after);
        fold_stats_.fold_us += fold_us;
        fold_stats_.fold_cpu_us += cpu_us;
      }
    }
    if (status.isOk() && !stop_) {
      lock.unlock();
      status = maintainLogWal();
      lock.lock();
    }
    ++fold_attempts_;
    fold_status_ = status;
    if (isSticky(status)) fold_failed_ = status;
    fold_done_.notify_all();
    if (!status.isOk() && !isSticky(status)) {
      fold_wanted_.wait_for(lock, std::chrono::milliseconds(options_.fold_retry_ms),
                            [&] { return stop_; });
    }
    // Bounded: with no commits coming (an idle ledger, or checkpoint() waiting on this thread),
    // folding goes on and the restart waits for a later burst.
    fold_wanted_.wait_for(lock, std::chrono::milliseconds(kWalRestartWaitMs),
                          [&] { return stop_ || wal_restart_ == WalRestart::kIdle; });
  }
}

// Folds log rows (after_seq, *last_seq] into tables.db in one transaction (fewer when they pass
// fold_bytes_per_transaction_max; *last_seq is then lowered), then publishes the new
// folded_seq. Fold thread only.
Status SqliteStore::foldRange(int64_t after_seq, int64_t* last_seq) {
  std::vector<Blob> bodies;
  TALLY_SQLITE_RETURN_IF_ERROR(
      files::readLogRows(*fold_log_, after_seq, *last_seq, options_.batch_bytes_max,
                         options_.fold_bytes_per_transaction_max, &bodies));
  *last_seq = after_seq + static_cast<int64_t>(bodies.size());
  BatchFolder folder;
  for (size_t i = 0; i < bodies.size(); ++i) {
    if (Status status = folder.add(std::move(bodies[i])); !status.isOk()) {
      const int64_t seq = after_seq + 1 + static_cast<int64_t>(i);
      return Status::corruption("fold: log seq " + std::to_string(seq) + ": " + status.message());
    }
  }
  Result<StoreBatch> net = folder.finish();
  if (!net.isOk()) {
    return Status::corruption("fold: log seqs " + std::to_string(after_seq + 1) + ".." +
                              std::to_string(*last_seq) + ": " + net.status().message());
  }
  TALLY_SQLITE_RETURN_IF_ERROR(
      inTransaction(*fold_tables_, files::kTablesBegin, files::kTablesCommit, "fold: write tables",
                    [&] { return files::writeFold(*fold_tables_, &net.value(), *last_seq); }));
  // Durable in tables.db: the commit path may delete these rows from here on.
  std::lock_guard lock(mu_);
  folded_seq_ = *last_seq;
  return Status::ok();
}

// Copies ledger.db's WAL back into ledger.db without holding commits off. Once the WAL is long
// and nearly all copied, asks the commit path to copy the rest (restartLogWal()), after which
// the next commit starts the WAL over. Fold thread only.
Status SqliteStore::maintainLogWal() {
  sqlite3* db = fold_log_->db();
  for (int round = 0; round < kPassiveRoundsMax; ++round) {
    int wal_frames = 0;
    int copied_frames = 0;
    int rc = sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal_frames,
                                       &copied_frames);
    // BUSY: the commit path is checkpointing; try again after the next fold.
    if ((rc & 0xff) == SQLITE_BUSY) return Status::ok();
    if (rc != SQLITE_OK) return sqlite::statusOf(db, rc, "checkpoint ledger.db WAL");
    std::lock_guard lock(mu_);
    ++fold_stats_.log_wal_checkpoints;
    if (static_cast<uint64_t>(wal_frames) < options_.log_wal_frames_max ||
        wal_restart_ != WalRestart::kIdle) {
      return Status::ok();
    }
    if (wal_frames - copied_frames <= kRestartFramesLeftMax) {
      wal_restart_ = WalRestart::kWanted;
      return Status::ok();
    }
  }
  return Status::ok();
}

// Commit path, when the fold thread asked (kWanted): copies the few WAL frames its checkpoint
// has not, so that the next commit restarts the WAL from its beginning (overwriting a file of
// stable size, which makes its fsyncs cheaper than appending). Costs this commit one small copy and
// one fsync of ledger.db. The batch is already durable: a failure here fails the next commit, not
// this one.
void SqliteStore::restartLogWal() {
  const auto started = std::chrono::steady_clock::now();
  int wal_frames = 0;
  int copied_frames = 0;
  int rc = sqlite3_wal_checkpoint_v2(log_->db(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal_frames,
                                     &copied_frames);
  commit_stats_.log_wal_restart_us += elapsedUs(started);
  // BUSY: the fold thread is checkpointing; try again after the next commit. So too when a
  // reader's snapshot kept some frames from being copied.
  if ((rc & 0xff) == SQLITE_BUSY) return;
  if (rc != SQLITE_OK) {
    (void)noteFailure(sqlite::statusOf(log_->db(), rc, "checkpoint ledger.db WAL"));
    return;
  }
  if (copied_frames < wal_frames) return;
  ++commit_stats_.log_wal_restarts;
  std::lock_guard lock(mu_);
  wal_restart_ = WalRestart::kCopied;
}

}  // namespace tally::ledger
