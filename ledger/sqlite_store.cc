#include "ledger/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
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

constexpr int64_t kBusyTimeoutMs = 5000;
constexpr int64_t kLegacyLogCacheKib = 16 * 1024;  // migrating an old ledger.db
constexpr int64_t kTablesCacheKib = 64 * 1024;     // the fold's upserts into tables.db
constexpr int64_t kReaderCacheKib = 8 * 1024;      // load(): one scan of tables.db
// A steady fold's lists take a few MiB (~5,000 reservations of 384 bytes at K=64); one grown
// past this by a large fold (a restart's backlog) is not kept.
constexpr size_t kFoldNetKeptBytesMax = size_t{16} << 20;

template <typename T>
size_t capacityBytes(const std::vector<T>& list) {
  return list.capacity() * sizeof(T);
}

// A fold's buffers, one per record it reads, are kept across folds up to this many bytes.
constexpr size_t kFoldBuffersKeptBytesMax = size_t{16} << 20;

// `bytes` of the `index`th buffer of `buffers` (word-aligned, so that a flat record is read in
// place), grown when the record is larger than what the buffer held before.
std::span<uint8_t> foldBuffer(std::vector<std::vector<uint64_t>>* buffers, size_t index,
                              size_t bytes) {
  if (index >= buffers->size()) buffers->resize(index + 1);
  std::vector<uint64_t>& buffer = (*buffers)[index];
  const size_t words = (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t);
  if (buffer.size() < words) buffer.resize(words);
  return {reinterpret_cast<uint8_t*>(buffer.data()), bytes};
}

// Keeps the first buffers up to kFoldBuffersKeptBytesMax in all; the rest are freed.
void trimFoldBuffers(std::vector<std::vector<uint64_t>>* buffers) {
  size_t kept_bytes = 0;
  size_t kept = 0;
  for (; kept < buffers->size(); ++kept) {
    kept_bytes += capacityBytes((*buffers)[kept]);
    if (kept_bytes > kFoldBuffersKeptBytesMax) break;
  }
  buffers->resize(kept);
}

// What `batch`'s lists hold allocated (their elements' own heap memory aside).
size_t listBytes(const StoreBatch& batch) {
  return std::apply([](const auto&... list) { return (capacityBytes(list) + ...); },
                    StoreBatch::listsOf(batch));
}

// Both files' own pragmas (sqlite::FilePragmas::extra).
constexpr const char* kFilePragmas[] = {
    // Debian builds SQLite with SECURE_DELETE on, which zeroes and writes every freed page.
    // Nothing here is secret from whoever can read the data dir (the log holds the same
    // records).
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
    : data_dir_(data_dir),
      log_path_(data_dir + "/" + kLogDirName),
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
  fold_tables_.reset();
  tables_.reset();
  log_.reset();
  // The lock goes last: the files are closed before another ledger may open them.
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const std::string& data_dir,
                                                       SqliteStoreOptions options) {
  if (data_dir.empty()) return Status::invalidArgument("data dir: empty path");
  if (options.fold_rows_per_transaction_max == 0 || options.fold_bytes_per_transaction_max == 0 ||
      options.log_segment_bytes == 0) {
    return Status::invalidArgument(
        "fold_rows_per_transaction_max, fold_bytes_per_transaction_max and log_segment_bytes "
        "must be positive");
  }
  TALLY_SQLITE_RETURN_IF_ERROR(makeDataDir(data_dir));
  Result<int> lock_fd = lockDataDir(data_dir, kLockFileName, "ledger");
  if (!lock_fd.isOk()) return lock_fd.status();
  auto store = std::make_unique<SqliteStore>(Key{}, data_dir, lock_fd.value(), options);
  TALLY_SQLITE_RETURN_IF_ERROR(store->initialize());
  // Makes the entries of a new LOCK, the log's directory and tables.db durable before the first
  // reply depends on them.
  TALLY_SQLITE_RETURN_IF_ERROR(syncDirectory(data_dir));
  store->fold_thread_ = std::thread([raw = store.get()] { raw->runFold(); });
  return store;
}

Status SqliteStore::initialize() {
  std::error_code error;
  const bool tables_existed = std::filesystem::exists(tables_path_, error);
  const bool legacy_log = std::filesystem::exists(data_dir_ + "/" + kLegacyLogFileName, error);
  int64_t folded_seq = 0;
  if (!tables_existed && !legacy_log) {
    // A new data dir: the log (with its first segment) exists before tables.db does, so that a
    // tables.db without a log always means a lost log.
    if (Status s = openLog(0, /*require_segments=*/false); !s.isOk()) {
      if (s.code() != StatusCode::kCorruption) return s;
      return Status::corruption(tables_path_ + " is missing, and the log cannot rebuild it: " +
                                s.message() + " (tables.db is missing or older than the log)");
    }
    TALLY_SQLITE_RETURN_IF_ERROR(openTables(&folded_seq));
  } else {
    TALLY_SQLITE_RETURN_IF_ERROR(openTables(&folded_seq));
    if (legacy_log) TALLY_SQLITE_RETURN_IF_ERROR(migrateLegacyLog(folded_seq));
    TALLY_SQLITE_RETURN_IF_ERROR(openLog(folded_seq, /*require_segments=*/tables_existed));
  }
  if (log_->lastSeq() < folded_seq) {
    return Status::corruption(log_path_ + " ends at seq " + std::to_string(log_->lastSeq()) +
                              " but " + tables_path_ + " has folded it up to seq " +
                              std::to_string(folded_seq) + ": the log's end is lost");
  }
  next_seq_ = log_->lastSeq() + 1;
  TALLY_SQLITE_RETURN_IF_ERROR(openFoldConnection());
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
  return files::readFoldedSeq(tables_->db(), (*tables_)[files::kTablesGetMeta], tables_path_,
                              folded_seq);
}

Status SqliteStore::openLog(int64_t folded_seq, bool require_segments) {
  Result<std::unique_ptr<CommitLog>> log = CommitLog::open(
      log_path_, folded_seq, require_segments,
      {.segment_bytes = options_.log_segment_bytes, .record_bytes_max = options_.batch_bytes_max});
  if (!log.isOk()) return log.status();
  log_ = std::move(log).value();
  // The log's position is on disk from the start (a segment named after its next seq).
  return log_->ensureSegment();
}

// Copies the rows of a schema-5-or-older DIR/ledger.db that tables.db has not folded into a new
// log, then deletes ledger.db (see the class comment).
Status SqliteStore::migrateLegacyLog(int64_t folded_seq) {
  const std::string legacy_path = data_dir_ + "/" + kLegacyLogFileName;
  std::error_code error;
  if (!std::filesystem::exists(log_path_, error)) {
    Result<std::unique_ptr<Connection>> opened =
        openFile(legacy_path, {.wal_autocheckpoint_pages = 0,
                               .cache_kib = kLegacyLogCacheKib,
                               .busy_timeout_ms = kBusyTimeoutMs});
    if (!opened.isOk()) return opened.status();
    Connection& legacy = *opened.value();
    TALLY_SQLITE_RETURN_IF_ERROR(
        files::createOrCheckSchema(legacy, files::kLogSchema, "log", files::kLogMigrations));
    TALLY_SQLITE_RETURN_IF_ERROR(legacy.prepare(files::kLogStatementSql));
    std::optional<int64_t> trimmed;
    TALLY_SQLITE_RETURN_IF_ERROR(
        files::readMeta(legacy.db(), legacy[files::kLogGetMeta], files::kMetaTrimmedSeq, &trimmed));
    if (trimmed.value_or(0) < 0 || trimmed.value_or(0) > folded_seq) {
      return Status::corruption(legacy_path + " deleted log rows up to seq " +
                                std::to_string(trimmed.value_or(0)) + " but " + tables_path_ +
                                " holds them only up to seq " + std::to_string(folded_seq) +
                                ": tables.db is missing or older than the log");
    }
    const std::string staging = data_dir_ + "/" + kLogDirName + ".migrating";
    std::filesystem::remove_all(staging, error);
    if (error) return Status::ioError("remove " + staging + ": " + error.message());
    {
      Result<std::unique_ptr<CommitLog>> created =
          CommitLog::open(staging, folded_seq, /*require_segments=*/false,
                          {.segment_bytes = options_.log_segment_bytes,
                           .record_bytes_max = options_.batch_bytes_max});
      if (!created.isOk()) return created.status();
      CommitLog& log = *created.value();
      sqlite3_stmt* select = legacy[files::kLogSelectAfter];
      TALLY_SQLITE_RETURN_IF_ERROR(
          sqlite::bindInt64(legacy.db(), select, 1, folded_seq, "migrate log"));
      TALLY_SQLITE_RETURN_IF_ERROR(
          sqlite::forEachRow(legacy.db(), select, "migrate log", [&](sqlite3_stmt* row) {
            const int64_t seq = sqlite3_column_int64(row, 0);
            if (seq != log.lastSeq() + 1) {
              return Status::corruption(legacy_path + ": log seq " + std::to_string(seq) +
                                        " follows seq " + std::to_string(log.lastSeq()) +
                                        ": log rows are missing");
            }
            return log.appendUnsynced(seq, sqlite::columnBlob(row, 1));
          }));
      TALLY_SQLITE_RETURN_IF_ERROR(log.ensureSegment());
      TALLY_SQLITE_RETURN_IF_ERROR(log.sync());
    }
    TALLY_SQLITE_RETURN_IF_ERROR(syncDirectory(staging));
    if (::rename(staging.c_str(), log_path_.c_str()) != 0) {
      return Status::ioError("rename " + staging + " to " + log_path_ + ": " +
                             std::strerror(errno));
    }
    TALLY_SQLITE_RETURN_IF_ERROR(syncDirectory(data_dir_));
  }
  // The log holds everything ledger.db held that tables.db lacks: ledger.db goes.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string path = legacy_path + suffix;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::ioError("delete " + path + ": " + std::strerror(errno));
    }
  }
  return syncDirectory(data_dir_);
}

Status SqliteStore::openFoldConnection() {
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

uint64_t SqliteStore::pendingLogRows() const { return log_->unreleasedRecords(); }

uint64_t SqliteStore::logDiskBytes() const { return log_->diskBytes(); }

SqliteStoreStats SqliteStore::stats() const {
  SqliteStoreStats stats = commit_stats_;
  const CommitLogStats log = log_->stats();
  stats.log_segments_created = log.segments_created;
  stats.log_segments_recycled = log.segments_recycled;
  stats.log_segments_deleted = log.segments_deleted;
  std::lock_guard lock(mu_);
  stats.folds = fold_stats_.folds;
  stats.folded_rows = fold_stats_.folded_rows;
  stats.fold_us = fold_stats_.fold_us;
  stats.fold_cpu_us = fold_stats_.fold_cpu_us;
  return stats;
}

// --- Commit -------------------------------------------------------------------------------------

Status SqliteStore::commit(const StoreBatch& batch) {
  const auto started = std::chrono::steady_clock::now();
  TALLY_SQLITE_RETURN_IF_ERROR(checkUsable());
  const std::span<const uint8_t> body = encoder_.encode(batch);
  commit_stats_.encode_us += elapsedUs(started);
  const uint64_t bytes = body.size();
  if (bytes > options_.batch_bytes_max) {
    return Status::resourceExhausted("store batch of " + std::to_string(bytes) +
                                     " bytes, at most " + std::to_string(options_.batch_bytes_max) +
                                     " allowed");
  }
  int64_t folded = 0;
  {
    std::lock_guard lock(mu_);
    folded = folded_seq_;
  }
  // Before the append, so that a segment the append starts may reuse a folded one.
  log_->release(folded);
  TALLY_SQLITE_RETURN_IF_ERROR(noteFailure(log_->append(next_seq_, body)));
  // Durable from here on: this batch is acknowledged as committed.
  const int64_t seq = next_seq_++;
  ++commit_stats_.commits;
  commit_stats_.log_bytes += bytes;
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    committed_seq_ = seq;
    wake = foldDue();
  }
  if (wake) fold_wanted_.notify_one();
  commit_stats_.commit_us += elapsedUs(started);
  return Status::ok();
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
  log_->release(folded);
  return Status::ok();
}

// --- Load ---------------------------------------------------------------------------------------

Result<StoreContents> SqliteStore::load() {
  StoreContents contents;
  TALLY_SQLITE_RETURN_IF_ERROR(loadContents(&contents));
  return contents;
}

// The log releases records only on this thread (commit(), checkpoint()), so every record after
// the folded_seq that tables.db's snapshot shows is still readable, whatever the fold thread
// does meanwhile.
Status SqliteStore::loadContents(StoreContents* contents) {
  files::TablesImage image;
  TALLY_SQLITE_RETURN_IF_ERROR(
      inTransaction(*tables_, files::kTablesBeginRead, files::kTablesCommit, "load tables",
                    [&] { return files::readTables(*tables_, options_.batch_bytes_max, &image); }));
  files::LogFold fold;
  std::vector<uint8_t> body;
  for (int64_t seq = image.folded_seq + 1; seq < next_seq_; ++seq) {
    TALLY_SQLITE_RETURN_IF_ERROR(log_->read(seq, &body));
    TALLY_SQLITE_RETURN_IF_ERROR(files::foldLogRow(seq, body, options_.batch_bytes_max, &fold));
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
    // fold_rows_per_transaction_max records. Fewer, larger bursts disturb the commit path's
    // flushes less often.
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
    ++fold_attempts_;
    fold_status_ = status;
    if (isSticky(status)) fold_failed_ = status;
    fold_done_.notify_all();
    if (!status.isOk() && !isSticky(status)) {
      fold_wanted_.wait_for(lock, std::chrono::milliseconds(options_.fold_retry_ms),
                            [&] { return stop_; });
    }
  }
}

// Folds log records (after_seq, *last_seq] into tables.db in one transaction (fewer when they
// pass fold_bytes_per_transaction_max; *last_seq is then lowered), then publishes the new
// folded_seq. Fold thread only.
Status SqliteStore::foldRange(int64_t after_seq, int64_t* last_seq) {
  const Status written = writeFoldOf(after_seq, last_seq);
  // The rows go now; the lists and the buffers stay for the next fold, unless a large fold grew
  // them past what is kept.
  fold_net_.clear();
  if (listBytes(fold_net_) > kFoldNetKeptBytesMax) fold_net_ = StoreBatch{};
  trimFoldBuffers(&fold_buffers_);
  TALLY_SQLITE_RETURN_IF_ERROR(written);
  // Durable in tables.db: the commit path may release these records from here on.
  std::lock_guard lock(mu_);
  folded_seq_ = *last_seq;
  return Status::ok();
}

Status SqliteStore::writeFoldOf(int64_t after_seq, int64_t* last_seq) {
  BatchFolder folder;  // before the buffers it reads from are reused
  uint64_t total_bytes = 0;
  int64_t seq = after_seq;
  size_t records = 0;
  // Always at least one record; stops after the one that passes the byte budget.
  while (seq < *last_seq && total_bytes <= options_.fold_bytes_per_transaction_max) {
    ++seq;
    kj::Array<kj::byte> body;
    TALLY_SQLITE_RETURN_IF_ERROR(log_->read(seq, [&](size_t bytes) {
      const std::span<uint8_t> buffer = foldBuffer(&fold_buffers_, records++, bytes);
      // Not owned: the folder only reads it, and is gone before the buffer is reused.
      body = kj::Array<kj::byte>(buffer.data(), buffer.size(), kj::NullArrayDisposer::instance);
      return buffer;
    }));
    total_bytes += body.size();
    if (Status status = folder.add(kj::mv(body)); !status.isOk()) {
      return Status::corruption("fold: log seq " + std::to_string(seq) + ": " + status.message());
    }
  }
  *last_seq = seq;
  if (Status status = folder.finishInto(&fold_net_); !status.isOk()) {
    return Status::corruption("fold: log seqs " + std::to_string(after_seq + 1) + ".." +
                              std::to_string(*last_seq) + ": " + status.message());
  }
  return inTransaction(*fold_tables_, files::kTablesBegin, files::kTablesCommit,
                       "fold: write tables",
                       [&] { return files::writeFold(*fold_tables_, &fold_net_, *last_seq); });
}

}  // namespace tally::ledger
