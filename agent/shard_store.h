#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/outbox_store.h"
#include "core/shard_book.h"
#include "core/status.h"

struct sqlite3;

// The durable half of the agent's shard book (docs/SHARDS.md): three tables in the same
// DIR/agent.db as the outbox, on the outbox store's connection — so the same pragmas (WAL,
// synchronous=FULL), the same data-dir lock and the same fsync'd commit path. One file keeps
// the boot epoch, the outbox and the shards in one crash-consistent place: a restart that sees
// a new boot epoch also sees every shard the previous process held.
//
//   shards(shard_id, grant BLOB, balances…, closed, close_reason, used, report_pending,
//          ledger state…, times)   grant: EmergencyShardV1 as the ledger signed it, written
//                                  once at insert and never rewritten
//   shard_reservations(reservation_id, shard_id, reservation BLOB)   LimitReservationV1
//   shard_fences(subject, route, fence)                             highest fence seen
//
// commit() writes everything one ShardBookChanges names in one transaction; it returns once
// the WAL is fsync'd, so the shell replies only after it. restore() feeds a ShardBook at boot.
//
// Borrows `outbox`'s connection (the OutboxStore must outlive this). Not thread-safe: the
// agent's loop thread only.

namespace tally::agent {

class ShardStore {
 public:
  // Creates the tables if missing (IF NOT EXISTS: an agent.db of an older build gains them).
  static Result<std::unique_ptr<ShardStore>> open(OutboxStore* outbox);
  ~ShardStore() = default;
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

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
