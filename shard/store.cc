#include "shard/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "shard/codec.h"
#include "common/sqlite_support.h"
#include "core/assert.h"

namespace tally::agent {

using namespace sqlite;  // the SQLite helpers: statusOf, bind*, stepDone, column*, ...

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

constexpr const char* kSchema[] = {
    "CREATE TABLE IF NOT EXISTS gateway_state ("
    " key TEXT PRIMARY KEY NOT NULL,"
    " value INTEGER NOT NULL) STRICT",
    "CREATE TABLE IF NOT EXISTS shards ("
    " shard_id TEXT PRIMARY KEY NOT NULL,"
    " grant_blob BLOB NOT NULL,"
    " allocated INTEGER NOT NULL,"
    " local_available INTEGER NOT NULL,"
    " local_reserved INTEGER NOT NULL,"
    " local_spent INTEGER NOT NULL,"
    " local_retired INTEGER NOT NULL,"
    " overspent INTEGER NOT NULL,"
    " closed INTEGER NOT NULL,"
    " close_reason INTEGER NOT NULL,"
    " used INTEGER NOT NULL,"
    " report_pending INTEGER NOT NULL,"
    " ledger_known INTEGER NOT NULL,"
    " ledger_state INTEGER NOT NULL,"
    " ledger_spent INTEGER NOT NULL,"
    " ledger_reminted INTEGER NOT NULL,"
    " ledger_debt INTEGER NOT NULL,"
    " added_at_ms INTEGER NOT NULL,"
    " closed_at_ms INTEGER NOT NULL,"
    " final_at_ms INTEGER NOT NULL,"
    " unreconcilable INTEGER NOT NULL DEFAULT 0) STRICT",
    "CREATE TABLE IF NOT EXISTS shard_reservations ("
    " reservation_id TEXT PRIMARY KEY NOT NULL,"
    " shard_id TEXT NOT NULL,"
    " reservation_blob BLOB NOT NULL) STRICT",
    "CREATE TABLE IF NOT EXISTS shard_fences ("
    " subject TEXT NOT NULL,"
    " route TEXT NOT NULL,"
    " fence INTEGER NOT NULL,"
    " PRIMARY KEY (subject, route)) STRICT",
};

// The grant blob is written at insert only: an update never rewrites what the ledger signed.
constexpr const char* kUpsertShard =
    "INSERT INTO shards(shard_id, grant_blob, allocated, local_available, local_reserved,"
    " local_spent, local_retired, overspent, closed, close_reason, used, report_pending,"
    " ledger_known, ledger_state, ledger_spent, ledger_reminted, ledger_debt, added_at_ms,"
    " closed_at_ms, final_at_ms, unreconcilable)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,"
    " ?20, ?21)"
    " ON CONFLICT(shard_id) DO UPDATE SET allocated = excluded.allocated,"
    " local_available = excluded.local_available, local_reserved = excluded.local_reserved,"
    " local_spent = excluded.local_spent, local_retired = excluded.local_retired,"
    " overspent = excluded.overspent, closed = excluded.closed,"
    " close_reason = excluded.close_reason, used = excluded.used,"
    " report_pending = excluded.report_pending, ledger_known = excluded.ledger_known,"
    " ledger_state = excluded.ledger_state, ledger_spent = excluded.ledger_spent,"
    " ledger_reminted = excluded.ledger_reminted, ledger_debt = excluded.ledger_debt,"
    " added_at_ms = excluded.added_at_ms, closed_at_ms = excluded.closed_at_ms,"
    " final_at_ms = excluded.final_at_ms, unreconcilable = excluded.unreconcilable";
constexpr const char* kSelectShards =
    "SELECT shard_id, grant_blob, allocated, local_available, local_reserved, local_spent,"
    " local_retired, overspent, closed, close_reason, used, report_pending, ledger_known,"
    " ledger_state, ledger_spent, ledger_reminted, ledger_debt, added_at_ms, closed_at_ms,"
    " final_at_ms, unreconcilable FROM shards ORDER BY shard_id";
// The shards table of a build before `unreconcilable` gains it (0 for every row: none was).
constexpr const char* kHasUnreconcilable =
    "SELECT count(*) FROM pragma_table_info('shards') WHERE name = 'unreconcilable'";
constexpr const char* kAddUnreconcilable =
    "ALTER TABLE shards ADD COLUMN unreconcilable INTEGER NOT NULL DEFAULT 0";
constexpr const char* kDeleteShard = "DELETE FROM shards WHERE shard_id = ?1";
constexpr const char* kUpsertReservation =
    "INSERT INTO shard_reservations(reservation_id, shard_id, reservation_blob) VALUES(?1, ?2, ?3)"
    " ON CONFLICT(reservation_id) DO UPDATE SET shard_id = excluded.shard_id,"
    " reservation_blob = excluded.reservation_blob";
constexpr const char* kSelectReservations =
    "SELECT reservation_id, shard_id, reservation_blob FROM shard_reservations"
    " ORDER BY reservation_id";
constexpr const char* kDeleteReservation =
    "DELETE FROM shard_reservations WHERE reservation_id = ?1";
constexpr const char* kUpsertFence =
    "INSERT INTO shard_fences(subject, route, fence) VALUES(?1, ?2, ?3)"
    " ON CONFLICT(subject, route) DO UPDATE SET fence = max(fence, excluded.fence)";
constexpr const char* kSelectFences = "SELECT subject, route, fence FROM shard_fences";

constexpr const char* kSelectBootEpoch = "SELECT value FROM gateway_state WHERE key = 'boot_epoch'";
constexpr const char* kPutBootEpoch =
    "INSERT INTO gateway_state(key, value) VALUES('boot_epoch', ?1)"
    " ON CONFLICT(key) DO UPDATE SET value = excluded.value";
// Up to agent.db schema_version 1 the boot epoch was a row of the outbox store's meta table.
constexpr const char* kSelectLegacyBootEpoch = "SELECT value FROM meta WHERE key = 'boot_epoch'";
constexpr const char* kDeleteLegacyBootEpoch = "DELETE FROM meta WHERE key = 'boot_epoch'";

Status bindUnsigned(sqlite3* db, sqlite3_stmt* stmt, int index, uint64_t value, const char* op) {
  if (value > static_cast<uint64_t>(kInt64Max)) {
    return Status::invalidArgument(std::string(op) + ": value " + std::to_string(value) +
                                   " is above INT64_MAX");
  }
  return bindInt64(db, stmt, index, static_cast<int64_t>(value), op);
}

// Column `column` as an unsigned value; false if it is negative (a damaged row).
bool columnUnsigned(sqlite3_stmt* stmt, int column, uint64_t* value) {
  const int64_t raw = sqlite3_column_int64(stmt, column);
  if (raw < 0) return false;
  *value = static_cast<uint64_t>(raw);
  return true;
}

// BEGIN IMMEDIATE, `body`, COMMIT; rolls back when anything fails. With synchronous=FULL, COMMIT
// returns once the WAL holding the rows is fsync'd.
template <typename F>
Status inTransaction(sqlite3* db, const char* what, F&& body) {
  TALLY_SQLITE_RETURN_IF_ERROR(execSql(db, "BEGIN IMMEDIATE", what));
  Status status = body();
  if (status.isOk()) status = execSql(db, "COMMIT", what);
  if (!status.isOk() && sqlite3_get_autocommit(db) == 0) {
    (void)execSql(db, "ROLLBACK", what);  // `status` names the cause
  }
  return status;
}

Status putBootEpoch(sqlite3* db, int64_t epoch, const char* op) {
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db, kPutBootEpoch));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db, stmt.get(), 1, epoch, op));
  return stepDone(db, stmt.get(), op);
}

Status checkBootEpoch(int64_t epoch, const char* where) {
  if (epoch < 0 || epoch == kInt64Max) {
    return Status::corruption(std::string(where) + ": boot_epoch " + std::to_string(epoch));
  }
  return Status::ok();
}

// Moves a boot epoch of the older layout (the outbox's meta table) into gateway_state, keeping
// the larger value if both are present (a lower epoch would reuse an old one). Part of open()'s
// schema transaction: the row is moved, not copied, so the move happens once.
Status migrateLegacyBootEpoch(sqlite3* db) {
  constexpr const char* kOp = "migrate boot epoch";
  std::optional<int64_t> has_meta;
  TALLY_SQLITE_RETURN_IF_ERROR(
      queryInt(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
               kOp, &has_meta));
  if (has_meta.value_or(0) == 0) return Status::ok();
  std::optional<int64_t> legacy;
  TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db, kSelectLegacyBootEpoch, kOp, &legacy));
  if (!legacy) return Status::ok();
  TALLY_SQLITE_RETURN_IF_ERROR(checkBootEpoch(*legacy, "meta"));
  std::optional<int64_t> current;
  TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db, kSelectBootEpoch, kOp, &current));
  if (current) TALLY_SQLITE_RETURN_IF_ERROR(checkBootEpoch(*current, "gateway_state"));
  TALLY_SQLITE_RETURN_IF_ERROR(putBootEpoch(db, std::max(*legacy, current.value_or(0)), kOp));
  return execSql(db, kDeleteLegacyBootEpoch, kOp);
}

}  // namespace

Result<std::unique_ptr<ShardStore>> ShardStore::open(sqlite3* db) {
  TALLY_ASSERT(db != nullptr);
  TALLY_SQLITE_RETURN_IF_ERROR(inTransaction(db, "shard schema setup", [&]() -> Status {
    for (const char* create : kSchema) {
      TALLY_SQLITE_RETURN_IF_ERROR(execSql(db, create, "create shard tables"));
    }
    std::optional<int64_t> has_unreconcilable;
    TALLY_SQLITE_RETURN_IF_ERROR(
        queryInt(db, kHasUnreconcilable, "inspect shard table", &has_unreconcilable));
    if (has_unreconcilable.value_or(0) == 0) {
      TALLY_SQLITE_RETURN_IF_ERROR(execSql(db, kAddUnreconcilable, "add shards.unreconcilable"));
    }
    return migrateLegacyBootEpoch(db);
  }));
  return std::make_unique<ShardStore>(Key{}, db);
}

// --- shards left in a file ----------------------------------------------------------------------

Result<uint64_t> countStoredShards(sqlite3* db) {
  constexpr const char* kOp = "count stored shards";
  std::optional<int64_t> tables;
  TALLY_SQLITE_RETURN_IF_ERROR(queryInt(
      db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'shards'", kOp,
      &tables));
  if (tables.value_or(0) == 0) return uint64_t{0};
  std::optional<int64_t> shards;
  TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db, "SELECT count(*) FROM shards", kOp, &shards));
  return static_cast<uint64_t>(std::max<int64_t>(shards.value_or(0), 0));
}

// --- boot epoch ----------------------------------------------------------------------------------

Result<uint64_t> ShardStore::incrementBootEpoch() {
  constexpr const char* kOp = "increment boot epoch";
  int64_t next = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(inTransaction(db_, kOp, [&]() -> Status {
    std::optional<int64_t> current;
    TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db_, kSelectBootEpoch, kOp, &current));
    if (current) TALLY_SQLITE_RETURN_IF_ERROR(checkBootEpoch(*current, "gateway_state"));
    next = current.value_or(0) + 1;
    return putBootEpoch(db_, next, kOp);
  }));
  return static_cast<uint64_t>(next);
}

// --- writes --------------------------------------------------------------------------------------

Status ShardStore::upsertShard(const std::string& shard_id, const ShardBook::Shard& shard) {
  constexpr const char* kOp = "write shard";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kUpsertShard));
  sqlite3_stmt* s = stmt.get();
  const HeldShardRecord& record = shard.record;
  const ShardBalances& b = shard.account.balances();
  const std::vector<uint8_t> grant = encodeGrant(record.grant);
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, s, 1, shard_id, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db_, s, 2, grant, kOp));
  const uint64_t values[] = {b.allocated,
                             b.local_available,
                             b.local_reserved,
                             b.local_spent,
                             b.local_retired,
                             b.overspent,
                             shard.account.closed() ? 1u : 0u,
                             static_cast<uint64_t>(record.close_reason),
                             record.used ? 1u : 0u,
                             record.report_pending ? 1u : 0u,
                             record.ledger_known ? 1u : 0u,
                             static_cast<uint64_t>(record.ledger_state),
                             record.ledger_spent_units,
                             record.ledger_reminted_units,
                             record.ledger_debt_units,
                             record.added_at_ms,
                             record.closed_at_ms,
                             record.final_at_ms,
                             static_cast<uint64_t>(record.unreconcilable)};
  int index = 3;
  for (uint64_t value : values) {
    TALLY_SQLITE_RETURN_IF_ERROR(bindUnsigned(db_, s, index++, value, kOp));
  }
  return stepDone(db_, s, kOp);
}

Status ShardStore::upsertReservation(const Reservation& reservation) {
  constexpr const char* kOp = "write shard reservation";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kUpsertReservation));
  const std::vector<uint8_t> blob = encodeShardReservation(reservation);
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, reservation.reservation_id, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 2, reservation.origin, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db_, stmt.get(), 3, blob, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

Status ShardStore::deleteRow(const char* sql, const std::string& key) {
  constexpr const char* kOp = "delete shard row";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, sql));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, key, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

Status ShardStore::upsertFence(const SubjectRoute& subject_route, uint64_t fence) {
  constexpr const char* kOp = "write shard fence";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kUpsertFence));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, subject_route.subject, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 2, subject_route.route, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindUnsigned(db_, stmt.get(), 3, fence, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

Status ShardStore::commit(const ShardBook& book, const ShardBookChanges& changes) {
  if (changes.empty()) return Status::ok();
  return inTransaction(db_, "commit shard changes", [&]() -> Status {
    // A row named as upserted that the book no longer holds was forgotten since (changes kept
    // from a failed commit and merged with later ones): it is deleted.
    for (const std::string& id : changes.shards_upserted) {
      const ShardBook::Shard* shard = book.findShard(id);
      TALLY_SQLITE_RETURN_IF_ERROR(shard != nullptr ? upsertShard(id, *shard)
                                                    : deleteRow(kDeleteShard, id));
    }
    for (const std::string& id : changes.reservations_upserted) {
      const Reservation* reservation = book.findReservation(id);
      TALLY_SQLITE_RETURN_IF_ERROR(reservation != nullptr ? upsertReservation(*reservation)
                                                          : deleteRow(kDeleteReservation, id));
    }
    for (const std::string& id : changes.reservations_deleted) {
      if (book.findReservation(id) != nullptr) continue;  // re-created since: upserted above
      TALLY_SQLITE_RETURN_IF_ERROR(deleteRow(kDeleteReservation, id));
    }
    for (const std::string& id : changes.shards_deleted) {
      if (book.findShard(id) != nullptr) continue;
      TALLY_SQLITE_RETURN_IF_ERROR(deleteRow(kDeleteShard, id));
    }
    for (const SubjectRoute& subject_route : changes.fences) {
      TALLY_SQLITE_RETURN_IF_ERROR(upsertFence(subject_route, book.highestFence(subject_route)));
    }
    return Status::ok();
  });
}

// --- restore -------------------------------------------------------------------------------------

Status ShardStore::loadFences(ShardBook* book) {
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kSelectFences));
  for (;;) {
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return statusOf(db_, rc, "load shard fences");
    uint64_t fence = 0;
    if (!columnUnsigned(stmt.get(), 2, &fence)) return Status::corruption("negative shard fence");
    book->restoreFence({columnText(stmt.get(), 0), columnText(stmt.get(), 1)}, fence);
  }
}

Status ShardStore::loadShards(ShardBook* book) {
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kSelectShards));
  for (;;) {
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return statusOf(db_, rc, "load shards");
    sqlite3_stmt* s = stmt.get();
    StoredShard stored{.shard_id = columnText(s, 0)};
    const std::span<const uint8_t> blob = columnBlob(s, 1);
    Result<ShardGrant> grant = decodeGrant(blob);
    stored.grant_decoded = grant.isOk();
    if (grant.isOk()) stored.record.grant = std::move(grant).value();
    uint64_t v[19] = {};
    for (int i = 0; i < 19; ++i) {
      if (!columnUnsigned(s, i + 2, &v[i])) {
        return Status::corruption("shard '" + stored.shard_id + "': negative value");
      }
    }
    if (v[7] >= kShardCloseReasonCount || v[11] >= kShardStateCount ||
        v[18] >= kShardUnreconcilableCount) {
      return Status::corruption("shard '" + stored.shard_id + "': unknown enumerant");
    }
    stored.balances = ShardBalances{.allocated = v[0],
                                    .local_available = v[1],
                                    .local_reserved = v[2],
                                    .local_spent = v[3],
                                    .local_retired = v[4],
                                    .overspent = v[5]};
    stored.closed = v[6] != 0;
    HeldShardRecord& record = stored.record;
    record.close_reason = static_cast<ShardCloseReason>(v[7]);
    record.used = v[8] != 0;
    record.report_pending = v[9] != 0;
    record.ledger_known = v[10] != 0;
    record.ledger_state = static_cast<ShardState>(v[11]);
    record.ledger_spent_units = v[12];
    record.ledger_reminted_units = v[13];
    record.ledger_debt_units = v[14];
    record.added_at_ms = v[15];
    record.closed_at_ms = v[16];
    record.final_at_ms = v[17];
    record.unreconcilable = static_cast<ShardUnreconcilable>(v[18]);
    TALLY_SQLITE_RETURN_IF_ERROR(book->restoreShard(std::move(stored)));
  }
}

Status ShardStore::loadReservations(ShardBook* book) {
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kSelectReservations));
  for (;;) {
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_DONE) return Status::ok();
    if (rc != SQLITE_ROW) return statusOf(db_, rc, "load shard reservations");
    const std::string id = columnText(stmt.get(), 0);
    const std::string shard_id = columnText(stmt.get(), 1);
    Result<Reservation> reservation = decodeShardReservation(columnBlob(stmt.get(), 2));
    if (!reservation.isOk()) {
      return Status::corruption("shard reservation '" + id +
                                "': " + reservation.status().message());
    }
    if (reservation.value().reservation_id != id || reservation.value().origin != shard_id) {
      return Status::corruption("shard reservation '" + id + "': row and blob disagree");
    }
    TALLY_SQLITE_RETURN_IF_ERROR(book->restoreReservation(reservation.value()));
  }
}

Result<ShardRestoreReport> ShardStore::restore(ShardBook* book, uint64_t now_ms) {
  TALLY_SQLITE_RETURN_IF_ERROR(loadFences(book));
  TALLY_SQLITE_RETURN_IF_ERROR(loadShards(book));
  TALLY_SQLITE_RETURN_IF_ERROR(loadReservations(book));
  Result<ShardRestoreReport> report = book->finishRestore(now_ms);
  if (!report.isOk()) return report;
  // What the restore changed (shards closed at boot or quarantined) is durable before serving.
  TALLY_SQLITE_RETURN_IF_ERROR(commit(*book, book->takeChanges()));
  return report;
}

}  // namespace tally::agent
