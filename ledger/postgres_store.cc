#include "ledger/postgres_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "common/data_dir.h"
#include "ledger/postgres_store_connection.h"
#include "ledger/postgres_store_rows.h"
#include "ledger/postgres_store_schema.h"

namespace tally::ledger {

namespace schema = postgres_schema;

namespace {

constexpr const char* kApplicationName = "tally-ledger";
// How long a start that is not a standby retries the lease before it is refused.
constexpr uint64_t kRefuseGraceMs = 500;
// What SqliteStore keeps in a data dir (tables.db; ledger.db before schema version 6): a data
// dir that holds one is not silently left behind.
constexpr std::array<const char*, 2> kSqliteFileNames = {"tables.db", "ledger.db"};

bool queryBool(const pg::Rows& rows) {
  return rows.count() == 1 && !rows.isNull(0, 0) && rows.bytes(0, 0).size() == 1 &&
         rows.bytes(0, 0)[0] != 0;
}

std::vector<std::string> leaseParams(int64_t epoch, const std::string& holder, uint64_t lease_ms) {
  return {pg::int8Param(epoch), holder, pg::int8Param(static_cast<int64_t>(lease_ms))};
}

std::string describeLease(const LeaseState& lease) {
  return "epoch " + std::to_string(lease.epoch) + ", holder " + lease.holder + ", address " +
         lease.address + ", lapses in " + std::to_string(lease.expires_in_ms) + " ms";
}

// DIR/postgres-store: where this data dir's record is. Rewritten at every open (durably: a
// crash right after must not leave a data dir that looks like a fresh SQLite one).
Status writeMarker(const std::string& data_dir, const std::string& where) {
  const std::string path = data_dir + "/" + PostgresStore::kMarkerFileName;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return Status::ioError("open " + path + ": " + std::strerror(errno));
  const Status written = writeAllAndSync(fd, path, "tally-ledger store: postgres " + where + "\n");
  ::close(fd);
  TALLY_PG_RETURN_IF_ERROR(written);
  return syncParentDirectory(path);
}

}  // namespace

PostgresStore::PostgresStore(Key, int lock_fd, std::unique_ptr<pg::Connection> connection,
                             PostgresStoreOptions options)
    : lock_fd_(lock_fd), connection_(std::move(connection)), options_(options) {}

PostgresStore::~PostgresStore() {
  // Lets go of the lease, so that a standby (or a restart) takes it at once; a no-op once
  // deposed (the epoch is no longer ours).
  if (epoch_ != 0 && !connection_->broken()) {
    (void)connection_->query(schema::kReleaseLease, {pg::int8Param(epoch_), options_.holder},
                             "release the lease");
  }
  connection_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<PostgresStore>> PostgresStore::open(const std::string& data_dir,
                                                           const std::string& conninfo,
                                                           PostgresStoreOptions options) {
  if (data_dir.empty()) return Status::invalidArgument("data dir: empty path");
  if (conninfo.empty()) return Status::invalidArgument("postgres: empty connection string");
  if (options.holder.empty()) {
    // Unique per open in this process: each open is a new holder of the lease.
    static std::atomic<uint64_t> opens{0};
    options.holder = "pid " + std::to_string(::getpid()) + " open " + std::to_string(++opens);
  }
  TALLY_PG_RETURN_IF_ERROR(makeDataDir(data_dir));
  Result<int> lock_fd = lockDataDir(data_dir, kLockFileName, "ledger");
  if (!lock_fd.isOk()) return lock_fd.status();
  for (const char* name : kSqliteFileNames) {
    struct stat sqlite_file {};
    const std::string sqlite_path = data_dir + "/" + name;
    if (::stat(sqlite_path.c_str(), &sqlite_file) == 0) {
      ::close(lock_fd.value());
      return Status::failedPrecondition(
          sqlite_path +
          " exists: this data dir holds a SQLite store, and the postgres store does "
          "not read it; use another data dir (docs/scale-out.md)");
    }
  }
  Result<std::unique_ptr<pg::Connection>> connection =
      pg::Connection::open(conninfo, kApplicationName);
  if (!connection.isOk()) {
    ::close(lock_fd.value());
    return connection.status();
  }
  auto store = std::make_unique<PostgresStore>(Key{}, lock_fd.value(),
                                               std::move(connection).value(), options);
  TALLY_PG_RETURN_IF_ERROR(store->initialize());
  TALLY_PG_RETURN_IF_ERROR(writeMarker(data_dir, store->describe()));
  return store;
}

Status PostgresStore::initialize() {
  pg::Connection& connection = *connection_;
  // Durability is the session's, whatever the server's default says.
  TALLY_PG_RETURN_IF_ERROR(
      connection.exec("SET synchronous_commit = on", "set synchronous_commit"));
  // NOTICEs ("schema tally already exists, skipping") would go to stderr, unstructured.
  TALLY_PG_RETURN_IF_ERROR(
      connection.exec("SET client_min_messages = warning", "set client_min_messages"));
  // A transaction left open by a ledger that stopped mid-pipeline must not hold the lease row.
  TALLY_PG_RETURN_IF_ERROR(
      connection.exec("SET idle_in_transaction_session_timeout = " +
                          std::to_string(std::max<uint64_t>(options_.lease_ms, 1)),
                      "set idle_in_transaction_session_timeout"));
  TALLY_PG_RETURN_IF_ERROR(createOrMigrateSchema());
  TALLY_PG_RETURN_IF_ERROR(acquireLease());
  for (const schema::Statement* statement : schema::kStatements) {
    TALLY_PG_RETURN_IF_ERROR(connection.prepare(statement->name, statement->sql, statement->name));
  }
  return Status::ok();
}

// Takes the lease (the next epoch), or refuses, or as a standby polls until it can.
Status PostgresStore::acquireLease() {
  if (options_.holder.empty() || options_.lease_ms == 0) {
    return Status::invalidArgument("postgres: the lease needs a holder and lease_ms > 0");
  }
  const uint64_t poll_ms = std::max<uint64_t>(options_.lease_ms / 5, 10);
  // Not a standby: a holder whose session is about to end (a ledger killed just now, restarted
  // at once) gets a short grace before the start is refused.
  const auto refuse_at =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kRefuseGraceMs);
  for (;;) {
    Result<pg::Rows> taken = connection_->query(
        schema::kAcquireLease,
        {options_.holder, options_.address, pg::int8Param(static_cast<int64_t>(options_.lease_ms))},
        "take the lease");
    if (!taken.isOk()) return taken.status();
    if (taken.value().count() == 1) {
      return taken.value().int8(0, 0, &epoch_);
    }
    Result<LeaseState> held = readLease();
    if (!held.isOk()) return held.status();
    if (!options_.standby && std::chrono::steady_clock::now() >= refuse_at) {
      return Status::failedPrecondition(
          "postgres: " + connection_->describe() +
          " is in use: another tally-ledger holds its writer lock (the lease: " +
          describeLease(held.value()) + ")");
    }
    if (options_.standby && options_.on_standby) options_.on_standby(held.value());
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));  // polling, not syncing
  }
}

Result<LeaseState> PostgresStore::readLease() {
  Result<pg::Rows> rows = connection_->query(schema::kSelectLease, {}, "read the lease");
  if (!rows.isOk()) return rows.status();
  if (rows.value().count() != 1) return Status::corruption("postgres: tally.lease has no row");
  LeaseState lease;
  TALLY_PG_RETURN_IF_ERROR(rows.value().int8(0, 0, &lease.epoch));
  lease.holder = rows.value().text(0, 1);
  lease.address = rows.value().text(0, 2);
  TALLY_PG_RETURN_IF_ERROR(rows.value().int8(0, 3, &lease.expires_in_ms));
  return lease;
}

Status PostgresStore::depose(const std::string& why) {
  std::string now_held;
  if (Result<LeaseState> held = readLease(); held.isOk()) {
    now_held = " (the lease now: " + describeLease(held.value()) + ")";
    deposed_by_ = held.value();
  }
  deposed_ = true;
  failed_ =
      Status::failedPrecondition("postgres: deposed: " + why + ": epoch " + std::to_string(epoch_) +
                                 " is no longer this ledger's" + now_held);
  return failed_;
}

bool PostgresStore::deposed() const { return deposed_.load(); }

LeaseState PostgresStore::deposedBy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return deposed_by_;
}

Status PostgresStore::renewLease() {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return Status::ok();  // a commit is in flight: its fence renews
  if (!failed_.isOk()) return failed_;
  Result<pg::Rows> renewed = connection_->query(
      schema::kRenewLease.sql, leaseParams(epoch_, options_.holder, options_.lease_ms),
      "renew the lease");
  if (!renewed.isOk()) return renewed.status();
  if (renewed.value().count() != 1) return depose("renewing the lease");
  return Status::ok();
}

Status PostgresStore::rollbackAfter(Status status) {
  if (!connection_->broken()) (void)connection_->exec("ROLLBACK", "rollback");
  return status;
}

// In one transaction: creates the schema in a database without it, or checks the version and
// runs every migration step from it on.
Status PostgresStore::createOrMigrateSchema() {
  pg::Connection& connection = *connection_;
  TALLY_PG_RETURN_IF_ERROR(connection.exec("BEGIN", "open schema"));
  auto run = [&]() -> Status {
    TALLY_PG_RETURN_IF_ERROR(
        connection.exec("CREATE SCHEMA IF NOT EXISTS tally", "create schema tally"));
    Result<pg::Rows> exists =
        connection.query("SELECT to_regclass('tally.meta') IS NOT NULL", {}, "find tally.meta");
    if (!exists.isOk()) return exists.status();
    if (!queryBool(exists.value())) {
      for (const char* sql : schema::kSchema) {
        TALLY_PG_RETURN_IF_ERROR(connection.exec(sql, "create tables"));
      }
      return connection.exec("INSERT INTO tally.meta(key, value) VALUES ('schema_version', " +
                                 std::to_string(schema::kSchemaVersion) + ")",
                             "record schema_version");
    }
    Result<pg::Rows> version = connection.query(
        "SELECT value FROM tally.meta WHERE key = 'schema_version'", {}, "read schema_version");
    if (!version.isOk()) return version.status();
    if (version.value().count() != 1) {
      return Status::corruption("postgres: tally.meta has no schema_version row");
    }
    int64_t found = 0;
    TALLY_PG_RETURN_IF_ERROR(version.value().int8(0, 0, &found));
    if (found == schema::kSchemaVersion) return Status::ok();
    int64_t at = found;
    for (const schema::Migration& migration : schema::kMigrations) {
      if (migration.from_version != at) continue;
      for (const char* sql : migration.statements) {
        TALLY_PG_RETURN_IF_ERROR(connection.exec(sql, "migrate schema"));
      }
      ++at;
    }
    if (at != schema::kSchemaVersion) {
      return Status::failedPrecondition(
          "postgres: schema tally is at version " + std::to_string(found) + "; this build uses " +
          std::to_string(schema::kSchemaVersion) + " and cannot migrate from it");
    }
    return connection.exec(
        "UPDATE tally.meta SET value = " + std::to_string(schema::kSchemaVersion) +
            " WHERE key = 'schema_version'",
        "record schema_version");
  };
  if (Status status = run(); !status.isOk()) return rollbackAfter(status);
  return connection.exec("COMMIT", "commit schema");
}

Status PostgresStore::commit(const StoreBatch& batch) {
  const auto started = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_.isOk()) {
    return Status::failedPrecondition("store failed earlier, durability unknown: " +
                                      failed_.toString());
  }
  std::vector<pg::Step> steps;
  steps.push_back({schema::kBegin.name, {}});
  steps.push_back({schema::kFence.name, leaseParams(epoch_, options_.holder, options_.lease_ms)});
  for (pg::Step& step : postgres_rows::batchSteps(batch)) steps.push_back(std::move(step));
  steps.push_back({schema::kCommit.name, {}});
  if (Status status = connection_->pipeline(steps, "commit batch"); !status.isOk()) {
    if (connection_->broken()) {
      failed_ = Status::ioError(status.message() + " (connection lost: durability unknown)");
      return failed_;
    }
    (void)rollbackAfter(status);
    // Was it the fence? Then this ledger is deposed and stays so.
    Result<LeaseState> held = readLease();
    if (held.isOk() && (held.value().epoch != epoch_ || held.value().holder != options_.holder)) {
      return depose("committing a batch");
    }
    return status;
  }
  ++stats_.commits;
  stats_.statements += steps.size();
  for (const pg::Step& step : steps) {
    for (const std::string& param : step.params) stats_.param_bytes += param.size();
  }
  stats_.commit_us += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::steady_clock::now() - started)
                                                .count());
  return Status::ok();
}

Result<StoreContents> PostgresStore::load() {
  pg::Connection& connection = *connection_;
  TALLY_PG_RETURN_IF_ERROR(
      connection.exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "load: begin"));
  StoreContents contents;
  if (Status status = postgres_rows::readContents(connection, options_.body_bytes_max, &contents);
      !status.isOk()) {
    return rollbackAfter(status);
  }
  TALLY_PG_RETURN_IF_ERROR(connection.exec("COMMIT", "load: commit"));
  return contents;
}

std::string PostgresStore::describe() const { return connection_->describe(); }

}  // namespace tally::ledger
