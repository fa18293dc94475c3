#include "ledger/sqlite_store_files.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "ledger/store_codec.h"

namespace tally::ledger::store_files {

using sqlite::bindBlob;
using sqlite::bindInt64;
using sqlite::bindText;
using sqlite::columnBlob;
using sqlite::columnText;
using sqlite::forEachRow;
using sqlite::ResetOnExit;
using sqlite::stepDone;

namespace {

Status checkBodySize(std::span<const uint8_t> body, uint64_t bytes_max, const std::string& where) {
  if (body.size() <= bytes_max) return Status::ok();
  return Status::corruption(where + ": body of " + std::to_string(body.size()) +
                            " bytes is above batch_bytes_max");
}

// Capacity readReservations() leaves beyond the table's rows for the reservations the log's
// tail adds (mergeReservations() appends them): address space only, never touched unless used;
// a longer tail reallocates once.
size_t reservationSlack(size_t rows) { return std::max<size_t>(rows / 8, 4096); }

bool byId(const Reservation& a, const Reservation& b) {
  return a.reservation_id < b.reservation_id;
}

// The table's reservations with the log's changes applied (nullopt: deleted), sorted by id, in
// place: a replaced image is moved over the old one, deletions are compacted out, and only ids
// new since the fold are merged in (std::inplace_merge). load() never holds the table twice,
// and a restart whose log is short moves almost nothing.
std::vector<Reservation> mergeReservations(
    std::vector<Reservation> table,
    std::unordered_map<std::string, std::optional<Reservation>> changes) {
  if (!std::is_sorted(table.begin(), table.end(), byId)) {
    std::sort(table.begin(), table.end(), byId);
  }
  if (changes.empty()) return table;
  std::vector<std::pair<std::string, std::optional<Reservation>>> sorted_changes(
      std::make_move_iterator(changes.begin()), std::make_move_iterator(changes.end()));
  std::sort(sorted_changes.begin(), sorted_changes.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  bool deleted = false;
  std::vector<Reservation> added;
  auto cursor = table.begin();  // ids below it are before every change still to come
  for (auto& [id, change] : sorted_changes) {
    auto at = std::lower_bound(
        cursor, table.end(), id,
        [](const Reservation& r, const std::string& key) { return r.reservation_id < key; });
    cursor = at;
    if (at != table.end() && at->reservation_id == id) {
      if (change) {
        *at = std::move(*change);
      } else {
        at->reservation_id.clear();  // compacted out below (ids are never empty)
        deleted = true;
      }
    } else if (change) {
      added.push_back(std::move(*change));
    }
  }
  if (deleted) {
    std::erase_if(table, [](const Reservation& r) { return r.reservation_id.empty(); });
  }
  if (!added.empty()) {  // already in id order
    const auto middle = static_cast<std::ptrdiff_t>(table.size());
    table.insert(table.end(), std::make_move_iterator(added.begin()),
                 std::make_move_iterator(added.end()));
    std::inplace_merge(table.begin(), table.begin() + middle, table.end(), byId);
  }
  return table;
}

Status readPolicies(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                    std::map<Generation, PolicyRecord>* out) {
  return forEachRow(db, stmt, "read policies", [&](sqlite3_stmt* row) -> Status {
    const auto generation = static_cast<Generation>(sqlite3_column_int64(row, 0));
    const std::string where = "policies generation " + std::to_string(generation);
    std::span<const uint8_t> body = columnBlob(row, 1);
    TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
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
    TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<AccountRecord> record = decodeAccountRecord(body);
    if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
    if (record.value().key != key) return Status::corruption(where + ": body holds another key");
    (*out)[std::move(key)] = std::move(record).value();
    return Status::ok();
  });
}

// Appends in id order (the statement sorts; SQLite's BINARY collation is std::string's order).
// Builds no per-row strings unless a row is refused. `out` is reserved to the row count first
// (SQLite counts a table's B-tree without decoding a row: ~50 ms for a million), with room for
// the ids the log adds (see reservationSlack), so the vector is written once and never moved.
Status readReservations(sqlite3* db, sqlite3_stmt* count, sqlite3_stmt* stmt, uint64_t bytes_max,
                        std::vector<Reservation>* out) {
  int64_t rows = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(forEachRow(db, count, "count reservations", [&](sqlite3_stmt* row) {
    rows = sqlite3_column_int64(row, 0);
    return Status::ok();
  }));
  if (rows > 0) {
    const auto n = static_cast<size_t>(rows);
    out->reserve(n + reservationSlack(n));
  }
  return forEachRow(db, stmt, "read reservations", [&](sqlite3_stmt* row) -> Status {
    const auto* id_text = reinterpret_cast<const char*>(sqlite3_column_text(row, 0));
    const std::string_view id(id_text == nullptr ? "" : id_text,
                              static_cast<size_t>(sqlite3_column_bytes(row, 0)));
    const auto where = [&] { return "reservations id '" + std::string(id) + "'"; };
    std::span<const uint8_t> body = columnBlob(row, 1);
    if (body.size() > bytes_max) return checkBodySize(body, bytes_max, where());
    Result<Reservation> record = decodeReservationRecord(body);
    if (!record.isOk()) return Status::corruption(where() + ": " + record.status().message());
    if (record.value().reservation_id != id) {
      return Status::corruption(where() + ": body holds id '" + record.value().reservation_id +
                                "'");
    }
    out->push_back(std::move(record).value());
    return Status::ok();
  });
}

// Reads `table`'s (key, body) rows, decoding each body with `decode`; `key_of` names the key a
// body holds, which must equal the row's key.
template <typename T, typename Decode, typename KeyOf>
Status readKeyedBodies(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max, const char* table,
                       Decode&& decode, KeyOf&& key_of, std::map<std::string, T>* out) {
  return forEachRow(db, stmt, (std::string("read ") + table).c_str(),
                    [&](sqlite3_stmt* row) -> Status {
                      const std::string key = columnText(row, 0);
                      const std::string where = std::string(table) + " '" + key + "'";
                      std::span<const uint8_t> body = columnBlob(row, 1);
                      TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
                      Result<T> record = decode(body);
                      if (!record.isOk()) {
                        return Status::corruption(where + ": " + record.status().message());
                      }
                      if (key_of(record.value()) != key) {
                        return Status::corruption(where + ": body holds another key");
                      }
                      (*out)[key] = std::move(record).value();
                      return Status::ok();
                    });
}

Status readFences(sqlite3* db, sqlite3_stmt* stmt, std::map<SubjectRoute, FenceRecord>* out) {
  return forEachRow(db, stmt, "read fences", [&](sqlite3_stmt* row) -> Status {
    FenceRecord record{.key = {.subject = columnText(row, 0), .route = columnText(row, 1)}};
    const int64_t fence = sqlite3_column_int64(row, 2);
    if (fence < 1) {
      return Status::corruption("fences (" + record.key.subject + ", " + record.key.route +
                                "): fence " + std::to_string(fence));
    }
    record.fence = static_cast<uint64_t>(fence);
    (*out)[record.key] = std::move(record);
    return Status::ok();
  });
}

Status writeShardRows(const sqlite::Connection& tables, const StoreBatch& net) {
  sqlite3* db = tables.db();
  for (const GatewayRecord& record : net.gateways) {
    const Blob blob = encodeGatewayRecord(record);
    sqlite3_stmt* stmt = tables[kTablesUpsertGateway];
    ResetOnExit reset(stmt);
    const char* op = "fold gateway";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, record.gateway_name, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  for (const ShardRecord& record : net.shards) {
    const Blob blob = encodeShardRecord(record);
    sqlite3_stmt* stmt = tables[kTablesUpsertShard];
    ResetOnExit reset(stmt);
    const char* op = "fold shard";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, record.grant.shard_id, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  for (const std::string& id : net.deleted_shards) {
    sqlite3_stmt* stmt = tables[kTablesDeleteShard];
    ResetOnExit reset(stmt);
    const char* op = "fold shard deletion";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, id, op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  for (const FenceRecord& record : net.fences) {
    sqlite3_stmt* stmt = tables[kTablesUpsertFence];
    ResetOnExit reset(stmt);
    const char* op = "fold fence";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, record.key.subject, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 2, record.key.route, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db, stmt, 3, static_cast<int64_t>(record.fence), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

// Drops first: the fold's appends are above its kept_from.
Status writeOperatorRows(const sqlite::Connection& tables, const StoreBatch& net) {
  sqlite3* db = tables.db();
  for (const OperatorRecord& record : net.operators) {
    const Blob blob = encodeOperatorRecord(record);
    sqlite3_stmt* stmt = tables[kTablesUpsertOperator];
    ResetOnExit reset(stmt);
    const char* op = "fold operator";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, record.name, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  if (net.audit_log_kept_from > 0) {
    sqlite3_stmt* stmt = tables[kTablesDeleteAuditLogBelow];
    ResetOnExit reset(stmt);
    const char* op = "fold audit log drop";
    TALLY_SQLITE_RETURN_IF_ERROR(
        bindInt64(db, stmt, 1, static_cast<int64_t>(net.audit_log_kept_from), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  for (const AuditLogEntry& entry : net.audit_log) {
    const Blob blob = encodeAuditLogEntry(entry);
    sqlite3_stmt* stmt = tables[kTablesInsertAuditLog];
    ResetOnExit reset(stmt);
    const char* op = "fold audit log entry";
    TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db, stmt, 1, static_cast<int64_t>(entry.sequence), op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

Status readAuditLog(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                    std::map<uint64_t, AuditLogEntry>* out) {
  return forEachRow(db, stmt, "read audit log", [&](sqlite3_stmt* row) -> Status {
    const auto seq = static_cast<uint64_t>(sqlite3_column_int64(row, 0));
    const std::string where = "audit_log seq " + std::to_string(seq);
    std::span<const uint8_t> body = columnBlob(row, 1);
    TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<AuditLogEntry> entry = decodeAuditLogEntry(body);
    if (!entry.isOk()) return Status::corruption(where + ": " + entry.status().message());
    if (entry.value().sequence != seq) return Status::corruption(where + ": body holds another");
    (*out)[seq] = std::move(entry).value();
    return Status::ok();
  });
}

Status bindPeriodKey(sqlite3* db, sqlite3_stmt* stmt, const AccountKey& key, uint64_t epoch_first,
                     const char* op) {
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, key.subject, op));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 2, key.route, op));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db, stmt, 3, static_cast<int64_t>(key.generation), op));
  return bindInt64(db, stmt, 4, static_cast<int64_t>(epoch_first), op);
}

// Deletions first: within one fold they never name an upserted key (BatchFolder).
Status writePeriodSnapshots(const sqlite::Connection& tables, const StoreBatch& net) {
  sqlite3* db = tables.db();
  for (const PeriodKey& key : net.deleted_period_snapshots) {
    sqlite3_stmt* stmt = tables[kTablesDeletePeriodSnapshot];
    ResetOnExit reset(stmt);
    const char* op = "fold period snapshot deletion";
    TALLY_SQLITE_RETURN_IF_ERROR(bindPeriodKey(db, stmt, key.key, key.epoch_first, op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  for (const PeriodSnapshot& snapshot : net.period_snapshots) {
    const Blob blob = encodePeriodSnapshotRecord(snapshot);
    sqlite3_stmt* stmt = tables[kTablesUpsertPeriodSnapshot];
    ResetOnExit reset(stmt);
    const char* op = "fold period snapshot";
    TALLY_SQLITE_RETURN_IF_ERROR(bindPeriodKey(db, stmt, snapshot.key, snapshot.epoch_first, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 5, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

Status readPeriodSnapshots(sqlite3* db, sqlite3_stmt* stmt, uint64_t bytes_max,
                           std::map<PeriodKey, PeriodSnapshot>* out) {
  return forEachRow(db, stmt, "read period snapshots", [&](sqlite3_stmt* row) -> Status {
    PeriodKey key{.key = {.subject = columnText(row, 0),
                          .route = columnText(row, 1),
                          .generation = static_cast<Generation>(sqlite3_column_int64(row, 2))},
                  .epoch_first = static_cast<uint64_t>(sqlite3_column_int64(row, 3))};
    const std::string where = "period_snapshots (" + key.key.subject + ", " + key.key.route + ", " +
                              std::to_string(key.key.generation) + ", " +
                              std::to_string(key.epoch_first) + ")";
    std::span<const uint8_t> body = columnBlob(row, 4);
    TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
    Result<PeriodSnapshot> record = decodePeriodSnapshotRecord(body);
    if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
    if (record.value().key != key.key || record.value().epoch_first != key.epoch_first) {
      return Status::corruption(where + ": body holds another key");
    }
    (*out)[std::move(key)] = std::move(record).value();
    return Status::ok();
  });
}

Status writePolicies(const sqlite::Connection& tables, const StoreBatch& net) {
  sqlite3* db = tables.db();
  sqlite3_stmt* stmt = tables[kTablesUpsertPolicy];
  const char* op = "fold policy";
  for (const PolicyRecord& record : net.policies) {
    const Blob blob = encodePolicyRecord(record);
    ResetOnExit reset(stmt);
    TALLY_SQLITE_RETURN_IF_ERROR(
        bindInt64(db, stmt, 1, static_cast<int64_t>(record.policy.generation), op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

Status writeAccounts(const sqlite::Connection& tables, const StoreBatch& net) {
  sqlite3* db = tables.db();
  sqlite3_stmt* stmt = tables[kTablesUpsertAccount];
  const char* op = "fold account";
  for (const AccountRecord& record : net.accounts) {
    const Blob blob = encodeAccountRecord(record);
    ResetOnExit reset(stmt);
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, record.key.subject, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 2, record.key.route, op));
    TALLY_SQLITE_RETURN_IF_ERROR(
        bindInt64(db, stmt, 3, static_cast<int64_t>(record.key.generation), op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 4, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

Status writeReservations(const sqlite::Connection& tables, StoreBatch* net) {
  sqlite3* db = tables.db();
  std::sort(net->deleted_reservations.begin(), net->deleted_reservations.end());
  for (const std::string& id : net->deleted_reservations) {
    sqlite3_stmt* stmt = tables[kTablesDeleteReservation];
    ResetOnExit reset(stmt);
    const char* op = "fold reservation deletion";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, id, op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  // In id order, by pointer: sorting the records themselves moved every field of each.
  std::vector<const Reservation*> in_id_order;
  in_id_order.reserve(net->reservations.size());
  for (const Reservation& reservation : net->reservations) in_id_order.push_back(&reservation);
  std::sort(in_id_order.begin(), in_id_order.end(),
            [](const Reservation* a, const Reservation* b) { return byId(*a, *b); });
  for (const Reservation* record : in_id_order) {
    const Reservation& reservation = *record;
    const Blob blob = encodeReservationRecord(reservation);
    sqlite3_stmt* stmt = tables[kTablesUpsertReservation];
    ResetOnExit reset(stmt);
    const char* op = "fold reservation";
    TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, stmt, 1, reservation.reservation_id, op));
    TALLY_SQLITE_RETURN_IF_ERROR(bindBlob(db, stmt, 2, blobBytes(blob), op));
    TALLY_SQLITE_RETURN_IF_ERROR(stepDone(db, stmt, op));
  }
  return Status::ok();
}

}  // namespace

// --- Folding ------------------------------------------------------------------------------------

void LogFold::apply(StoreBatch&& batch) {
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
  for (GatewayRecord& record : batch.gateways) {
    std::string name = record.gateway_name;
    gateways[std::move(name)] = std::move(record);
  }
  for (std::string& id : batch.deleted_shards) shards[std::move(id)] = std::nullopt;
  for (ShardRecord& record : batch.shards) {
    std::string id = record.grant.shard_id;
    shards[std::move(id)] = std::move(record);
  }
  for (FenceRecord& record : batch.fences) {
    SubjectRoute key = record.key;
    fences[std::move(key)] = std::move(record);
  }
  for (PeriodKey& key : batch.deleted_period_snapshots) {
    period_snapshots[std::move(key)] = std::nullopt;
  }
  for (PeriodSnapshot& snapshot : batch.period_snapshots) {
    PeriodKey key{.key = snapshot.key, .epoch_first = snapshot.epoch_first};
    period_snapshots[std::move(key)] = std::move(snapshot);
  }
  for (OperatorRecord& record : batch.operators) {
    std::string name = record.name;
    operators[std::move(name)] = std::move(record);
  }
  if (batch.audit_log_kept_from > audit_log_kept_from) {
    audit_log_kept_from = batch.audit_log_kept_from;
    audit_log.erase(audit_log.begin(), audit_log.lower_bound(audit_log_kept_from));
  }
  for (AuditLogEntry& entry : batch.audit_log) {
    const uint64_t sequence = entry.sequence;
    audit_log[sequence] = std::move(entry);
  }
  ledger_clock_ms = std::max(ledger_clock_ms, batch.ledger_clock_ms);
  shard_sequence = std::max(shard_sequence, batch.shard_sequence);
}

Status foldLogRow(int64_t seq, std::span<const uint8_t> body, uint64_t bytes_max, LogFold* fold) {
  const std::string where = "log seq " + std::to_string(seq);
  if (fold->rows > 0 && seq != fold->last_seq + 1) {
    return Status::corruption(where + " follows log seq " + std::to_string(fold->last_seq) +
                              ": log rows are missing");
  }
  TALLY_SQLITE_RETURN_IF_ERROR(checkBodySize(body, bytes_max, where));
  Result<StoreBatch> batch = decodeBatch(body);
  if (!batch.isOk()) return Status::corruption(where + ": " + batch.status().message());
  fold->apply(std::move(batch).value());
  if (fold->rows == 0) fold->first_seq = seq;
  fold->last_seq = seq;
  ++fold->rows;
  return Status::ok();
}

// --- Meta and schema ----------------------------------------------------------------------------

Status readMeta(sqlite3* db, sqlite3_stmt* get, const char* key, std::optional<int64_t>* value) {
  ResetOnExit reset(get);
  const std::string op = std::string("read meta ") + key;
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, get, 1, key, op.c_str()));
  int rc = sqlite3_step(get);
  if (rc == SQLITE_DONE) {
    *value = std::nullopt;
    return Status::ok();
  }
  if (rc != SQLITE_ROW) return sqlite::statusOf(db, rc, op);
  if (sqlite3_column_type(get, 0) != SQLITE_INTEGER) {
    return Status::corruption("meta " + std::string(key) + " is not an integer");
  }
  *value = sqlite3_column_int64(get, 0);
  return Status::ok();
}

Status setMetaMax(sqlite3* db, sqlite3_stmt* set_max, const char* key, int64_t value) {
  ResetOnExit reset(set_max);
  const std::string op = std::string("write meta ") + key;
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db, set_max, 1, key, op.c_str()));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db, set_max, 2, value, op.c_str()));
  return stepDone(db, set_max, op.c_str());
}

Status readCounter(sqlite3* db, sqlite3_stmt* get, const std::string& path, const char* key,
                   int64_t* value) {
  std::optional<int64_t> read;
  TALLY_SQLITE_RETURN_IF_ERROR(readMeta(db, get, key, &read));
  if (read.value_or(0) < 0) return Status::corruption(path + ": negative " + key);
  *value = read.value_or(0);
  return Status::ok();
}

Status readFoldedSeq(sqlite3* db, sqlite3_stmt* get, const std::string& path, int64_t* folded_seq) {
  return readCounter(db, get, path, kMetaFoldedSeq, folded_seq);
}

Status createOrCheckSchema(const sqlite::Connection& connection,
                           std::span<const char* const> schema, const char* marker_table,
                           std::span<const Migration> migrations) {
  sqlite3* db = connection.db();
  const std::string& path = connection.path();
  TALLY_SQLITE_RETURN_IF_ERROR(sqlite::execSql(db, "BEGIN IMMEDIATE", "begin schema setup"));
  Status status = [&]() -> Status {
    int64_t tables = 0;
    bool has_meta = false;
    bool has_marker = false;
    const std::string sql = std::string("SELECT count(*), sum(name = 'meta'), sum(name = '") +
                            marker_table + "') FROM sqlite_master WHERE type = 'table'";
    TALLY_SQLITE_RETURN_IF_ERROR(
        sqlite::queryOnce(db, sql.c_str(), "read schema", [&](sqlite3_stmt* row) {
          if (row == nullptr) return Status::ok();
          tables = sqlite3_column_int64(row, 0);
          has_meta = sqlite3_column_int64(row, 1) > 0;
          has_marker = sqlite3_column_int64(row, 2) > 0;
          return Status::ok();
        }));
    if (!has_meta && tables > 0) {
      return Status::failedPrecondition(path + " is not a tally ledger database");
    }
    if (has_meta) {
      std::optional<int64_t> version;
      TALLY_SQLITE_RETURN_IF_ERROR(
          sqlite::queryOnce(db, "SELECT value FROM meta WHERE key = 'schema_version'",
                            "read schema_version", [&](sqlite3_stmt* row) {
                              if (row != nullptr && sqlite3_column_type(row, 0) == SQLITE_INTEGER) {
                                version = sqlite3_column_int64(row, 0);
                              }
                              return Status::ok();
                            }));
      if (version && *version >= kOldestMigratedSchemaVersion && *version < kSchemaVersion &&
          has_marker) {
        for (const Migration& step : migrations) {
          if (step.from_version < *version) continue;
          for (const char* statement : step.statements) {
            TALLY_SQLITE_RETURN_IF_ERROR(sqlite::execSql(db, statement, statement));
          }
        }
        const std::string bump = std::string("UPDATE meta SET value = ") +
                                 std::to_string(kSchemaVersion) + " WHERE key = '" +
                                 kMetaSchemaVersion + "'";
        return sqlite::execSql(db, bump.c_str(), "migrate schema_version");
      }
      if (version != kSchemaVersion) {
        std::string found = version ? std::to_string(*version) : std::string("(none)");
        std::string why = version == 1 ? " (version 1 kept the folded tables inside ledger.db; "
                                         "there is no migration: start from an empty data dir)"
                                       : "";
        return Status::failedPrecondition(path + " has schema_version " + found +
                                          "; this build reads only " +
                                          std::to_string(kSchemaVersion) + why);
      }
      if (!has_marker) {
        return Status::failedPrecondition(path + " has no table '" + marker_table +
                                          "': it is not this file of a tally data dir");
      }
      return Status::ok();
    }
    for (const char* create : schema) {
      TALLY_SQLITE_RETURN_IF_ERROR(sqlite::execSql(db, create, create));
    }
    const std::string insert_version = std::string("INSERT INTO meta(key, value) VALUES('") +
                                       kMetaSchemaVersion + "', " + std::to_string(kSchemaVersion) +
                                       ")";
    return sqlite::execSql(db, insert_version.c_str(), "write schema_version");
  }();
  if (!status.isOk()) return connection.rollbackIfOpen(status);
  return sqlite::execSql(db, "COMMIT", "commit schema setup");
}

// --- tables.db ----------------------------------------------------------------------------------

Status writeFold(const sqlite::Connection& tables, StoreBatch* net, int64_t last_seq) {
  TALLY_SQLITE_RETURN_IF_ERROR(writePolicies(tables, *net));
  TALLY_SQLITE_RETURN_IF_ERROR(writeAccounts(tables, *net));
  TALLY_SQLITE_RETURN_IF_ERROR(writeReservations(tables, net));
  TALLY_SQLITE_RETURN_IF_ERROR(writeShardRows(tables, *net));
  TALLY_SQLITE_RETURN_IF_ERROR(writePeriodSnapshots(tables, *net));
  TALLY_SQLITE_RETURN_IF_ERROR(writeOperatorRows(tables, *net));
  sqlite3* db = tables.db();
  sqlite3_stmt* set_max = tables[kTablesSetMetaMax];
  TALLY_SQLITE_RETURN_IF_ERROR(
      setMetaMax(db, set_max, kMetaShardSequence, static_cast<int64_t>(net->shard_sequence)));
  TALLY_SQLITE_RETURN_IF_ERROR(
      setMetaMax(db, set_max, kMetaLedgerClockMs, static_cast<int64_t>(net->ledger_clock_ms)));
  return setMetaMax(db, set_max, kMetaFoldedSeq, last_seq);
}

Status readTables(const sqlite::Connection& tables, uint64_t bytes_max, TablesImage* image) {
  sqlite3* db = tables.db();
  TALLY_SQLITE_RETURN_IF_ERROR(
      readPolicies(db, tables[kTablesSelectPolicies], bytes_max, &image->policies));
  TALLY_SQLITE_RETURN_IF_ERROR(
      readAccounts(db, tables[kTablesSelectAccounts], bytes_max, &image->accounts));
  TALLY_SQLITE_RETURN_IF_ERROR(readReservations(db, tables[kTablesCountReservations],
                                                tables[kTablesSelectReservations], bytes_max,
                                                &image->reservations));
  TALLY_SQLITE_RETURN_IF_ERROR(readKeyedBodies(
      db, tables[kTablesSelectGateways], bytes_max, "gateways", decodeGatewayRecord,
      [](const GatewayRecord& record) { return record.gateway_name; }, &image->gateways));
  TALLY_SQLITE_RETURN_IF_ERROR(readKeyedBodies(
      db, tables[kTablesSelectShards], bytes_max, "shards", decodeShardRecord,
      [](const ShardRecord& record) { return record.grant.shard_id; }, &image->shards));
  TALLY_SQLITE_RETURN_IF_ERROR(readFences(db, tables[kTablesSelectFences], &image->fences));
  TALLY_SQLITE_RETURN_IF_ERROR(readPeriodSnapshots(db, tables[kTablesSelectPeriodSnapshots],
                                                   bytes_max, &image->period_snapshots));
  TALLY_SQLITE_RETURN_IF_ERROR(readKeyedBodies(
      db, tables[kTablesSelectOperators], bytes_max, "operators", decodeOperatorRecord,
      [](const OperatorRecord& record) { return record.name; }, &image->operators));
  TALLY_SQLITE_RETURN_IF_ERROR(
      readAuditLog(db, tables[kTablesSelectAuditLog], bytes_max, &image->audit_log));
  sqlite3_stmt* get = tables[kTablesGetMeta];
  int64_t shard_sequence = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(
      readCounter(db, get, tables.path(), kMetaShardSequence, &shard_sequence));
  image->shard_sequence = static_cast<uint64_t>(shard_sequence);
  int64_t clock_ms = 0;
  TALLY_SQLITE_RETURN_IF_ERROR(readCounter(db, get, tables.path(), kMetaLedgerClockMs, &clock_ms));
  image->ledger_clock_ms = static_cast<uint64_t>(clock_ms);
  return readFoldedSeq(db, get, tables.path(), &image->folded_seq);
}

StoreContents mergeContents(TablesImage image, LogFold fold) {
  for (auto& [generation, record] : fold.policies) image.policies[generation] = std::move(record);
  for (auto& [key, record] : fold.accounts) image.accounts[key] = std::move(record);
  StoreContents contents;
  contents.policies.reserve(image.policies.size());
  for (auto& [generation, record] : image.policies) contents.policies.push_back(std::move(record));
  contents.accounts.reserve(image.accounts.size());
  for (auto& [key, record] : image.accounts) contents.accounts.push_back(std::move(record));
  contents.reservations =
      mergeReservations(std::move(image.reservations), std::move(fold.reservations));
  contents.ledger_clock_ms = std::max(image.ledger_clock_ms, fold.ledger_clock_ms);
  for (auto& [name, record] : fold.gateways) image.gateways[name] = std::move(record);
  for (auto& [id, record] : fold.shards) {
    if (record) {
      image.shards[id] = std::move(*record);
    } else {
      image.shards.erase(id);
    }
  }
  for (auto& [key, record] : fold.fences) image.fences[key] = std::move(record);
  for (auto& [name, record] : image.gateways) contents.gateways.push_back(std::move(record));
  for (auto& [id, record] : image.shards) contents.shards.push_back(std::move(record));
  for (auto& [key, record] : image.fences) contents.fences.push_back(std::move(record));
  contents.shard_sequence = std::max(image.shard_sequence, fold.shard_sequence);
  for (auto& [key, record] : fold.period_snapshots) {
    if (record) {
      image.period_snapshots[key] = std::move(*record);
    } else {
      image.period_snapshots.erase(key);
    }
  }
  contents.period_snapshots.reserve(image.period_snapshots.size());
  for (auto& [key, record] : image.period_snapshots) {
    contents.period_snapshots.push_back(std::move(record));
  }
  for (auto& [name, record] : fold.operators) image.operators[name] = std::move(record);
  for (auto& [name, record] : image.operators) contents.operators.push_back(std::move(record));
  image.audit_log.erase(image.audit_log.begin(),
                        image.audit_log.lower_bound(fold.audit_log_kept_from));
  for (auto& [sequence, entry] : fold.audit_log) image.audit_log[sequence] = std::move(entry);
  contents.audit_log.reserve(image.audit_log.size());
  for (auto& [sequence, entry] : image.audit_log) contents.audit_log.push_back(std::move(entry));
  return contents;
}

}  // namespace tally::ledger::store_files
