#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/shard_book.h"
#include "core/status.h"

struct sqlite3;

// The agent's durable identity and shard state (docs/SHARDS.md): its boot epoch and the durable
// half of its shard book, four tables in the same DIR/agent.db as the outbox, on the outbox
// store's connection — so the same pragmas (WAL, synchronous=FULL), the same data-dir lock and
// the same fsync'd commit path. One file keeps the boot epoch, the outbox and the shards in one
// crash-consistent place: a restart that sees a new boot epoch also sees every shard the previous
// process held.
//
//   gateway_state(key, value)   'boot_epoch': the agent's boot epoch
//   shards(shard_id, grant BLOB, balances…, closed, close_reason, used, report_pending,
//          ledger state…, times, unreconcilable)   grant: EmergencyShardV1 as the ledger signed it, written
//                                  once at insert and never rewritten
//   shard_reservations(reservation_id, shard_id, reservation BLOB)   LimitReservationV1
//   shard_fences(subject, route, fence)                             highest fence seen
//
// The boot epoch lived in the outbox's meta table up to agent.db schema_version 1; open() moves
// it here (the larger of the two if both exist) and deletes the old row, in one transaction, so an
// older data dir keeps its epoch and never boots with a lower one.
//
// `unreconcilable` (ShardUnreconcilable, 0 = no) was added after the table: open() adds the
// column (default 0) to an older file; an older build ignores it (and would report the shard
// again, as it did before).
//
// commit() writes everything one ShardBookChanges names in one transaction; it returns once
// the WAL is fsync'd, so the shell replies only after it. restore() feeds a ShardBook at boot.
//
// Borrows `db`, the open agent.db (agent::OutboxStore::connection()), which must outlive this.
// Not thread-safe: the agent's loop thread only.

namespace tally::agent {

// The number of shards `db` holds (0 when it never held any: no shards table). A partitioned
// agent refuses to start over an unpartitioned agent's DIR/agent.db that still holds shards:
// their reports go to that agent's one ledger, and nothing would ever send them.
Result<uint64_t> countStoredShards(sqlite3* db);

class ShardStore {
 public:
  // Creates the tables if missing (IF NOT EXISTS: an agent.db of an older build gains them) and
  // moves a boot epoch of the older layout into gateway_state.
  static Result<std::unique_ptr<ShardStore>> open(sqlite3* db);
  ~ShardStore() = default;
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // The agent's boot epoch, incremented durably at every start before serving (SPEC §6 rule 3):
  // returns the new value (1 on a new store). kCorruption if the stored value is out of range.
  Result<uint64_t> incrementBootEpoch();

  // Every row `changes` names, as `book` holds it now; one transaction, durable on return.
  Status commit(const ShardBook& book, const ShardBookChanges& changes);

  // Loads every row into `book` (fences, shards, reservations) and finishes its restore.
  // A grant blob that does not decode or whose signature fails is quarantined by the book (see
  // the report), never used; a damaged reservation row or balances that do not conserve are
  // kCorruption (the agent refuses to start rather than guess).
  Result<ShardRestoreReport> restore(ShardBook* book, uint64_t now_ms);

  struct Key {
    explicit Key() = default;
  };
  ShardStore(Key, sqlite3* db) : db_(db) {}

 private:
  Status upsertShard(const std::string& shard_id, const ShardBook::Shard& shard);
  Status upsertReservation(const Reservation& reservation);
  Status deleteRow(const char* sql, const std::string& key);
  Status upsertFence(const SubjectRoute& subject_route, uint64_t fence);
  Status loadFences(ShardBook* book);
  Status loadShards(ShardBook* book);
  Status loadReservations(ShardBook* book);

  sqlite3* db_;
};

}  // namespace tally::agent
