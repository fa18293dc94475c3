#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/outbox.h"
#include "core/status.h"

struct sqlite3;

namespace tally::sqlite {
class Connection;
}

// The agent's durable record (SPEC §7): the outbox of settle, release, mark-unknown and
// operation receipts not yet delivered to the ledger, and a few integers. The same file holds the
// agent's boot epoch and shards (shard/store.h), on this store's connection.
//
// One SQLite file DIR/agent.db: WAL, synchronous=FULL, every pragma spelled out and the two that
// matter read back. A write returns only once it is in the fsync'd WAL, so an entry whose
// append() returned survives kill -9 and power loss. DIR/LOCK is flock'ed for the store's
// lifetime: two agents never share a data dir.
//
// Schema: meta(key, value) holds schema_version (2; a version-1 file, whose meta also held the
// boot epoch, is upgraded at open and its boot epoch moved by ShardStore::open; any other version
// is refused); outbox holds one row per entry, by seq; kv holds putMeta()'s integers.
//
// Errors: kResourceExhausted "disk full" for SQLITE_FULL (or max_page_count), kCorruption for a
// damaged file or a row this build cannot read, kInvalidArgument for an entry that cannot be
// stored (seq 0, a seq already stored, a value above INT64_MAX), kFailedPrecondition for a
// locked dir or another schema version, kIoError naming the operation for the rest.
//
// Owns its SQLite connection, prepared statements and the lock fd. Not thread-safe: one thread
// (the agent's loop) uses it. Writes block that thread for an fsync.

namespace tally::agent {

struct OutboxStoreOptions {
  uint64_t database_pages_max = 0;  // PRAGMA max_page_count (4 KiB pages); 0: SQLite's maximum
};

class OutboxStore {
 public:
  static constexpr int64_t kSchemaVersion = 2;
  static constexpr const char* kDatabaseFileName = "agent.db";
  static constexpr const char* kLockFileName = "LOCK";

  // Creates `data_dir` (mode 0750) if missing, locks it, opens or creates agent.db.
  static Result<std::unique_ptr<OutboxStore>> open(const std::string& data_dir,
                                                   OutboxStoreOptions options = {});
  ~OutboxStore();
  OutboxStore(const OutboxStore&) = delete;
  OutboxStore& operator=(const OutboxStore&) = delete;

  Status append(const OutboxEntry& entry);                      // durable on return (fsync'd)
  Status appendBatch(const std::vector<OutboxEntry>& entries);  // one transaction
  // After delivery. Removing a seq that is not stored is not an error (redelivery is harmless).
  Status remove(uint64_t seq);
  Result<std::vector<OutboxEntry>> load();  // every entry not removed, by seq

  // Keys are 1..256 bytes (kInvalidArgument otherwise).
  Status putMeta(const std::string& key, int64_t value);
  Result<std::optional<int64_t>> getMeta(const std::string& key);

  // The open connection, for the other tables of agent.db (shard/store.h): same file,
  // pragmas, lock and thread. Valid while this store lives.
  sqlite3* connection() { return db_; }

  struct Key {
    explicit Key() = default;
  };
  // Only open() can make a Key: use open().
  OutboxStore(Key, std::string path, int lock_fd);

 private:
  enum Statement : size_t {
    kBegin = 0,
    kCommit,
    kInsertEntry,
    kDeleteEntry,
    kSelectEntries,
    kGetKv,
    kPutKv,
    kStatementCount,
  };

  Status initialize(const OutboxStoreOptions& options);
  Status createOrCheckSchema();
  Status insertEntry(const OutboxEntry& entry);
  // Runs `body` between BEGIN IMMEDIATE and COMMIT; rolls back when anything fails.
  template <typename F>
  Status inTransaction(const char* what, F&& body);

  std::string path_;
  int lock_fd_;
  std::unique_ptr<sqlite::Connection> connection_;  // statement i is (*connection_)[i]
  sqlite3* db_ = nullptr;                           // connection_->db()
};

}  // namespace tally::agent
