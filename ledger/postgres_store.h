#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "ledger/store.h"

// The Store on PostgreSQL (libpq): `store = "postgres"`. The same seam as SqliteStore, so the
// ledger keeps its in-memory machine and its group commit; PostgreSQL only carries durability.
//
// Layout: the tables of ledger/postgres_store_schema.h in the schema `tally` of the database the
// connection string names, one row per record (its latest image), readable with psql
// (docs/scale-out.md). The schema is created when a database without it is first opened and
// migrated in the same transaction when it is older (schema_version in tally.meta).
//
// Commit: one transaction per batch — BEGIN, one statement per table the batch touches (its
// rows as binary arrays), the meta update, COMMIT — sent as one libpq pipeline, so a batch costs
// one round trip and one WAL flush however many operations it carries. The session runs with
// synchronous_commit = on: COMMIT returns once the WAL is flushed (and, when the server has
// synchronous_standby_names, once a synchronous standby has it). commit() returns OK only then.
//
// Exclusion and fencing: open() takes the exclusive flock on DIR/LOCK (the data dir keeps the
// signing key) and the lease in tally.lease: the next epoch, when the lease has lapsed or its
// holder's PostgreSQL session is gone. A second ledger on the same database is refused at open
// ("holds its writer lock") after a grace of 0.5 s (time for the session of a ledger killed just
// before to end), or, as a standby (options.standby), polls until it can take it.
// Every commit's transaction begins with the fence (postgres_schema::kFence): it renews the
// lease and fails the transaction unless this store still holds its epoch, so a deposed primary
// (e.g. one that was SIGSTOPped past its lease while a standby took over) commits nothing more:
// commit() returns kFailedPrecondition and deposed() is true from then on. renewLease() renews
// it between commits (an idle primary), from the ledger's loop.
//
// Errors: every failure is a Status naming the operation and PostgreSQL's message. A connection
// that breaks (server gone, network cut) makes durability of the batch in flight unknown: that
// kIoError is sticky and every later commit() is refused with kFailedPrecondition, so the ledger
// stops and rebuilds from the store at its next start. A statement refused on a live connection
// (e.g. a full disk: kResourceExhausted) was rolled back; commit() may be retried.
//
// Threads: like every Store, used by one thread at a time. Owns its connection and the lock fd;
// non-copyable, non-movable.

namespace tally::ledger {

namespace pg {
class Connection;
}

// tally.lease as read.
struct LeaseState {
  int64_t epoch = 0;
  std::string holder;
  std::string address;
  int64_t expires_in_ms = 0;  // 0 once lapsed
};

struct PostgresStoreOptions {
  // Largest record body load() accepts before calling it corrupt (as SqliteStore's
  // batch_bytes_max).
  uint64_t body_bytes_max = uint64_t{256} << 20;
  // The lease: how long one acquisition or renewal holds it (server clock), who holds it (unique
  // per process: a restart is a new holder; empty: "pid P open N") and where it serves (for
  // operators and standbys).
  uint64_t lease_ms = 3'000;
  std::string holder;
  std::string address;
  // When the lease is held by another live ledger: wait for it (poll every lease_ms / 5, at
  // least 10 ms), calling on_standby at every poll with the lease as read (its holder and
  // address: a standby answers with it), instead of refusing. Called on the thread that opens.
  bool standby = false;
  std::function<void(const LeaseState&)> on_standby;
};

struct PostgresStoreStats {
  uint64_t commits = 0;
  uint64_t commit_us = 0;    // wall time inside commit(): the round trip and the WAL flush
  uint64_t statements = 0;   // statements the commits ran (BEGIN and COMMIT included)
  uint64_t param_bytes = 0;  // bytes of parameters sent (encoded records and keys)
};

class PostgresStore final : public Store {
 public:
  static constexpr const char* kLockFileName = "LOCK";
  // Written into the data dir at open (the database it names, without credentials), so that
  // the ledger refuses to start the SQLite store on a data dir whose record is in PostgreSQL.
  static constexpr const char* kMarkerFileName = "postgres-store";

  // Creates `data_dir` if missing and locks it, connects with `conninfo` (a libpq connection
  // string or URI; multi-host strings with target_session_attrs=read-write find the primary),
  // creates or migrates the schema, takes the lease (waiting as a standby if options.standby)
  // and prepares the statements.
  // Writes DIR/kMarkerFileName. kFailedPrecondition if the data dir or the database is held by
  // another ledger, the data dir holds a SQLite store, the server refuses the connection, or the
  // schema is newer than this build.
  static Result<std::unique_ptr<PostgresStore>> open(const std::string& data_dir,
                                                     const std::string& conninfo,
                                                     PostgresStoreOptions options = {});

  ~PostgresStore() override;
  PostgresStore(const PostgresStore&) = delete;
  PostgresStore& operator=(const PostgresStore&) = delete;

  [[nodiscard]] Status commit(const StoreBatch& batch) override;
  [[nodiscard]] Result<StoreContents> load() override;

  // Renews the lease between commits. OK if renewed, or if a commit is in flight (it renews);
  // kFailedPrecondition once deposed (another ledger holds a newer epoch); kIoError if
  // PostgreSQL cannot be reached. Thread-safe against commit().
  [[nodiscard]] Status renewLease();
  bool deposed() const;
  // Once deposed(): the lease as read when this store found it was deposed (who holds it now
  // and where it serves: a deposed primary names it to its clients); empty fields when it could
  // not be read.
  LeaseState deposedBy() const;
  int64_t epoch() const { return epoch_; }
  // The lease as the database has it now (a new query; not thread-safe against commit()).
  Result<LeaseState> readLease();

  PostgresStoreStats stats() const { return stats_; }
  // Where it is connected ("host=... port=... dbname=..."), for logs.
  std::string describe() const;

 private:
  struct Key {
    explicit Key() = default;
  };

 public:
  // Only open() can make a Key: use open().
  PostgresStore(Key, int lock_fd, std::unique_ptr<pg::Connection> connection,
                PostgresStoreOptions options);

 private:
  Status initialize();
  Status createOrMigrateSchema();
  Status rollbackAfter(Status status);
  Status acquireLease();
  Status depose(const std::string& why);

  const int lock_fd_;
  std::unique_ptr<pg::Connection> connection_;
  const PostgresStoreOptions options_;
  Status failed_;  // OK unless a broken connection left durability unknown, or deposed
  int64_t epoch_ = 0;
  mutable std::mutex mutex_;  // the connection: commit() (commit thread) and renewLease() (loop)
  std::atomic<bool> deposed_{false};  // read by the loop without the mutex
  LeaseState deposed_by_;             // under mutex_, set before deposed_
  PostgresStoreStats stats_;
};

}  // namespace tally::ledger
