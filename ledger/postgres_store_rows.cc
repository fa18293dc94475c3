#include "ledger/postgres_store_rows.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>

#include "ledger/postgres_store_schema.h"
#include "ledger/store_codec.h"

namespace tally::ledger::postgres_rows {

namespace schema = postgres_schema;
using pg::ArrayParam;
using pg::kOidBytea;
using pg::kOidInt8;
using pg::kOidText;
using pg::Rows;
using pg::Step;

namespace {

int64_t asInt8(uint64_t value) { return static_cast<int64_t>(value); }

// A readable units column: NULL when the value does not fit int8 (the body still holds it).
void addUnits(ArrayParam* array, Units units) {
  if (units > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    array->addNull();
  } else {
    array->addInt8(static_cast<int64_t>(units));
  }
}

// The indices of `rows` whose key no later row repeats, in order: the last image of each key.
template <typename T, typename KeyOf>
std::vector<size_t> lastOfEachKey(const std::vector<T>& rows, KeyOf&& key_of) {
  std::vector<size_t> kept;
  kept.reserve(rows.size());
  using Key = std::decay_t<decltype(key_of(rows.front()))>;
  std::map<Key, size_t> last;
  for (size_t i = 0; i < rows.size(); ++i) last[key_of(rows[i])] = i;
  if (last.size() == rows.size()) {
    for (size_t i = 0; i < rows.size(); ++i) kept.push_back(i);
    return kept;
  }
  for (const auto& [key, index] : last) kept.push_back(index);
  std::sort(kept.begin(), kept.end());
  return kept;
}

std::string bytesOf(const Blob& blob) {
  return std::string(reinterpret_cast<const char*>(blob.begin()), blob.size());
}

void addPolicies(const StoreBatch& batch, std::vector<Step>* steps) {
  if (batch.policies.empty()) return;
  ArrayParam generations(kOidInt8);
  ArrayParam bodies(kOidBytea);
  for (size_t i :
       lastOfEachKey(batch.policies, [](const PolicyRecord& r) { return r.policy.generation; })) {
    const PolicyRecord& record = batch.policies[i];
    generations.addInt8(asInt8(record.policy.generation));
    bodies.add(bytesOf(encodePolicyRecord(record)));
  }
  steps->push_back({schema::kUpsertPolicies.name, {generations.finish(), bodies.finish()}});
}

void addAccounts(const StoreBatch& batch, std::vector<Step>* steps) {
  if (batch.accounts.empty()) return;
  ArrayParam subjects(kOidText);
  ArrayParam routes(kOidText);
  ArrayParam generations(kOidInt8);
  ArrayParam available(kOidInt8);
  ArrayParam reserved(kOidInt8);
  ArrayParam spent(kOidInt8);
  ArrayParam bodies(kOidBytea);
  for (size_t i : lastOfEachKey(batch.accounts, [](const AccountRecord& r) { return r.key; })) {
    const AccountRecord& record = batch.accounts[i];
    subjects.add(record.key.subject);
    routes.add(record.key.route);
    generations.addInt8(asInt8(record.key.generation));
    addUnits(&available, record.balances.available);
    addUnits(&reserved, record.balances.reserved);
    addUnits(&spent, record.balances.spent);
    bodies.add(bytesOf(encodeAccountRecord(record)));
  }
  steps->push_back({schema::kUpsertAccounts.name,
                    {subjects.finish(), routes.finish(), generations.finish(), available.finish(),
                     reserved.finish(), spent.finish(), bodies.finish()}});
}

void addIdDeletions(const std::vector<std::string>& ids, const char* statement,
                    std::vector<Step>* steps) {
  if (ids.empty()) return;
  ArrayParam array(kOidText);
  for (const std::string& id : ids) array.add(id);
  steps->push_back({statement, {array.finish()}});
}

void addReservations(const StoreBatch& batch, std::vector<Step>* steps) {
  addIdDeletions(batch.deleted_reservations, schema::kDeleteReservations.name, steps);
  if (batch.reservations.empty()) return;
  ArrayParam ids(kOidText);
  ArrayParam subjects(kOidText);
  ArrayParam routes(kOidText);
  ArrayParam states(kOidText);
  ArrayParam bodies(kOidBytea);
  for (size_t i :
       lastOfEachKey(batch.reservations, [](const Reservation& r) { return r.reservation_id; })) {
    const Reservation& reservation = batch.reservations[i];
    ids.add(reservation.reservation_id);
    subjects.add(reservation.subject);
    routes.add(reservation.route);
    states.add(std::string_view(reservationStateName(reservation.state)));
    bodies.add(bytesOf(encodeReservationRecord(reservation)));
  }
  steps->push_back(
      {schema::kUpsertReservations.name,
       {ids.finish(), subjects.finish(), routes.finish(), states.finish(), bodies.finish()}});
}

void addShardRows(const StoreBatch& batch, std::vector<Step>* steps) {
  if (!batch.gateways.empty()) {
    ArrayParam names(kOidText);
    ArrayParam bodies(kOidBytea);
    for (size_t i :
         lastOfEachKey(batch.gateways, [](const GatewayRecord& r) { return r.gateway_name; })) {
      names.add(batch.gateways[i].gateway_name);
      bodies.add(bytesOf(encodeGatewayRecord(batch.gateways[i])));
    }
    steps->push_back({schema::kUpsertGateways.name, {names.finish(), bodies.finish()}});
  }
  addIdDeletions(batch.deleted_shards, schema::kDeleteShards.name, steps);
  if (!batch.shards.empty()) {
    ArrayParam ids(kOidText);
    ArrayParam bodies(kOidBytea);
    for (size_t i :
         lastOfEachKey(batch.shards, [](const ShardRecord& r) { return r.grant.shard_id; })) {
      ids.add(batch.shards[i].grant.shard_id);
      bodies.add(bytesOf(encodeShardRecord(batch.shards[i])));
    }
    steps->push_back({schema::kUpsertShards.name, {ids.finish(), bodies.finish()}});
  }
  if (!batch.fences.empty()) {
    ArrayParam subjects(kOidText);
    ArrayParam routes(kOidText);
    ArrayParam fences(kOidInt8);
    for (size_t i : lastOfEachKey(batch.fences, [](const FenceRecord& r) { return r.key; })) {
      subjects.add(batch.fences[i].key.subject);
      routes.add(batch.fences[i].key.route);
      fences.addInt8(asInt8(batch.fences[i].fence));
    }
    steps->push_back(
        {schema::kUpsertFences.name, {subjects.finish(), routes.finish(), fences.finish()}});
  }
}

void addPeriodSnapshots(const StoreBatch& batch, std::vector<Step>* steps) {
  if (!batch.deleted_period_snapshots.empty()) {
    ArrayParam subjects(kOidText);
    ArrayParam routes(kOidText);
    ArrayParam generations(kOidInt8);
    ArrayParam epochs(kOidInt8);
    for (const PeriodKey& key : batch.deleted_period_snapshots) {
      subjects.add(key.key.subject);
      routes.add(key.key.route);
      generations.addInt8(asInt8(key.key.generation));
      epochs.addInt8(asInt8(key.epoch_first));
    }
    steps->push_back({schema::kDeletePeriodSnapshots.name,
                      {subjects.finish(), routes.finish(), generations.finish(), epochs.finish()}});
  }
  if (batch.period_snapshots.empty()) return;
  ArrayParam subjects(kOidText);
  ArrayParam routes(kOidText);
  ArrayParam generations(kOidInt8);
  ArrayParam epochs(kOidInt8);
  ArrayParam bodies(kOidBytea);
  for (size_t i : lastOfEachKey(batch.period_snapshots, [](const PeriodSnapshot& s) {
         return PeriodKey{.key = s.key, .epoch_first = s.epoch_first};
       })) {
    const PeriodSnapshot& snapshot = batch.period_snapshots[i];
    subjects.add(snapshot.key.subject);
    routes.add(snapshot.key.route);
    generations.addInt8(asInt8(snapshot.key.generation));
    epochs.addInt8(asInt8(snapshot.epoch_first));
    bodies.add(bytesOf(encodePeriodSnapshotRecord(snapshot)));
  }
  steps->push_back({schema::kUpsertPeriodSnapshots.name,
                    {subjects.finish(), routes.finish(), generations.finish(), epochs.finish(),
                     bodies.finish()}});
}

// --- Reading ------------------------------------------------------------------------------------

Status checkBody(std::span<const uint8_t> body, uint64_t bytes_max, const std::string& where) {
  if (body.size() <= bytes_max) return Status::ok();
  return Status::corruption(where + ": body of " + std::to_string(body.size()) +
                            " bytes is above the store's batch_bytes_max");
}

// Runs `sql` and hands each row to `each` (row index, rows).
template <typename Each>
Status forEachRow(pg::Connection& connection, const char* sql, const char* op, Each&& each) {
  Result<Rows> rows = connection.query(sql, {}, op);
  if (!rows.isOk()) return rows.status();
  for (int row = 0; row < rows.value().count(); ++row) {
    if (Status status = each(rows.value(), row); !status.isOk()) return status;
  }
  return Status::ok();
}

template <typename T, typename Decode>
Status decodeChecked(std::span<const uint8_t> body, uint64_t bytes_max, const std::string& where,
                     Decode&& decode, T* out) {
  if (Status status = checkBody(body, bytes_max, where); !status.isOk()) return status;
  Result<T> record = decode(body);
  if (!record.isOk()) return Status::corruption(where + ": " + record.status().message());
  *out = std::move(record).value();
  return Status::ok();
}

Status readInt8(const Rows& rows, int row, int column, const std::string& where, int64_t* value) {
  if (Status status = rows.int8(row, column, value); !status.isOk()) {
    return Status::corruption(where + ": " + status.message());
  }
  return Status::ok();
}

Status readMeta(pg::Connection& connection, StoreContents* out) {
  bool saw_version = false;
  TALLY_PG_RETURN_IF_ERROR(forEachRow(
      connection, schema::kSelectMeta, "read meta", [&](const Rows& rows, int row) -> Status {
        const std::string key = rows.text(row, 0);
        int64_t value = 0;
        TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 1, "tally.meta '" + key + "'", &value));
        if (key == schema::kMetaLedgerClockMs) out->ledger_clock_ms = static_cast<uint64_t>(value);
        if (key == schema::kMetaShardSequence) out->shard_sequence = static_cast<uint64_t>(value);
        if (key == schema::kMetaSchemaVersion) saw_version = true;
        return Status::ok();
      }));
  if (!saw_version) return Status::corruption("tally.meta has no schema_version row");
  return Status::ok();
}

Status readPolicies(pg::Connection& connection, uint64_t bytes_max, StoreContents* out) {
  std::map<Generation, PolicyRecord> policies;
  TALLY_PG_RETURN_IF_ERROR(forEachRow(
      connection, schema::kSelectPolicies, "read policies",
      [&](const Rows& rows, int row) -> Status {
        int64_t generation = 0;
        TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 0, "tally.policies", &generation));
        const std::string where = "tally.policies generation " + std::to_string(generation);
        PolicyRecord record;
        TALLY_PG_RETURN_IF_ERROR(
            decodeChecked(rows.bytes(row, 1), bytes_max, where, decodePolicyRecord, &record));
        if (record.policy.generation != static_cast<Generation>(generation)) {
          return Status::corruption(where + ": body holds generation " +
                                    std::to_string(record.policy.generation));
        }
        policies[record.policy.generation] = std::move(record);
        return Status::ok();
      }));
  for (auto& [generation, record] : policies) out->policies.push_back(std::move(record));
  return Status::ok();
}

Status readAccounts(pg::Connection& connection, uint64_t bytes_max, StoreContents* out) {
  std::map<AccountKey, AccountRecord> accounts;
  TALLY_PG_RETURN_IF_ERROR(
      forEachRow(connection, schema::kSelectAccounts, "read accounts",
                 [&](const Rows& rows, int row) -> Status {
                   int64_t generation = 0;
                   TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 2, "tally.accounts", &generation));
                   AccountKey key{.subject = rows.text(row, 0),
                                  .route = rows.text(row, 1),
                                  .generation = static_cast<Generation>(generation)};
                   const std::string where = "tally.accounts (" + key.subject + ", " + key.route +
                                             ", " + std::to_string(key.generation) + ")";
                   AccountRecord record;
                   TALLY_PG_RETURN_IF_ERROR(decodeChecked(rows.bytes(row, 3), bytes_max, where,
                                                          decodeAccountRecord, &record));
                   if (record.key != key)
                     return Status::corruption(where + ": body holds another key");
                   accounts[std::move(key)] = std::move(record);
                   return Status::ok();
                 }));
  out->accounts.reserve(accounts.size());
  for (auto& [key, record] : accounts) out->accounts.push_back(std::move(record));
  return Status::ok();
}

Status readReservations(pg::Connection& connection, uint64_t bytes_max, StoreContents* out) {
  TALLY_PG_RETURN_IF_ERROR(forEachRow(
      connection, schema::kSelectReservations, "read reservations",
      [&](const Rows& rows, int row) -> Status {
        const std::string id = rows.text(row, 0);
        const std::string where = "tally.reservations id '" + id + "'";
        Reservation record;
        TALLY_PG_RETURN_IF_ERROR(
            decodeChecked(rows.bytes(row, 1), bytes_max, where, decodeReservationRecord, &record));
        if (record.reservation_id != id) {
          return Status::corruption(where + ": body holds id '" + record.reservation_id + "'");
        }
        out->reservations.push_back(std::move(record));
        return Status::ok();
      }));
  auto by_id = [](const Reservation& a, const Reservation& b) {
    return a.reservation_id < b.reservation_id;
  };
  if (!std::is_sorted(out->reservations.begin(), out->reservations.end(), by_id)) {
    std::sort(out->reservations.begin(), out->reservations.end(), by_id);
  }
  return Status::ok();
}

// A (key text, body) table whose body names its key with `key_of`.
template <typename T, typename Decode, typename KeyOf>
Status readKeyed(pg::Connection& connection, const char* sql, const char* table, uint64_t bytes_max,
                 Decode&& decode, KeyOf&& key_of, std::vector<T>* out) {
  std::map<std::string, T> records;
  TALLY_PG_RETURN_IF_ERROR(
      forEachRow(connection, sql, table, [&](const Rows& rows, int row) -> Status {
        std::string key = rows.text(row, 0);
        const std::string where = std::string(table) + " '" + key + "'";
        T record;
        TALLY_PG_RETURN_IF_ERROR(
            decodeChecked(rows.bytes(row, 1), bytes_max, where, decode, &record));
        if (key_of(record) != key) return Status::corruption(where + ": body holds another key");
        records[std::move(key)] = std::move(record);
        return Status::ok();
      }));
  for (auto& [key, record] : records) out->push_back(std::move(record));
  return Status::ok();
}

Status readFences(pg::Connection& connection, StoreContents* out) {
  std::map<SubjectRoute, FenceRecord> fences;
  TALLY_PG_RETURN_IF_ERROR(forEachRow(
      connection, schema::kSelectFences, "read fences", [&](const Rows& rows, int row) -> Status {
        FenceRecord record{.key = {.subject = rows.text(row, 0), .route = rows.text(row, 1)}};
        const std::string where =
            "tally.fences (" + record.key.subject + ", " + record.key.route + ")";
        int64_t fence = 0;
        TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 2, where, &fence));
        if (fence < 1) {
          return Status::corruption(where + ": fence " + std::to_string(fence));
        }
        record.fence = static_cast<uint64_t>(fence);
        SubjectRoute key = record.key;
        fences[std::move(key)] = std::move(record);
        return Status::ok();
      }));
  for (auto& [key, record] : fences) out->fences.push_back(std::move(record));
  return Status::ok();
}

Status readPeriodSnapshots(pg::Connection& connection, uint64_t bytes_max, StoreContents* out) {
  std::map<PeriodKey, PeriodSnapshot> snapshots;
  TALLY_PG_RETURN_IF_ERROR(forEachRow(
      connection, schema::kSelectPeriodSnapshots, "read period snapshots",
      [&](const Rows& rows, int row) -> Status {
        int64_t generation = 0;
        int64_t epoch_first = 0;
        TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 2, "tally.period_snapshots", &generation));
        TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 3, "tally.period_snapshots", &epoch_first));
        PeriodKey key{.key = {.subject = rows.text(row, 0),
                              .route = rows.text(row, 1),
                              .generation = static_cast<Generation>(generation)},
                      .epoch_first = static_cast<uint64_t>(epoch_first)};
        const std::string where = "tally.period_snapshots (" + key.key.subject + ", " +
                                  key.key.route + ", " + std::to_string(key.key.generation) + ", " +
                                  std::to_string(key.epoch_first) + ")";
        PeriodSnapshot record;
        TALLY_PG_RETURN_IF_ERROR(decodeChecked(rows.bytes(row, 4), bytes_max, where,
                                               decodePeriodSnapshotRecord, &record));
        if (record.key != key.key || record.epoch_first != key.epoch_first) {
          return Status::corruption(where + ": body holds another key");
        }
        snapshots[std::move(key)] = std::move(record);
        return Status::ok();
      }));
  out->period_snapshots.reserve(snapshots.size());
  for (auto& [key, record] : snapshots) out->period_snapshots.push_back(std::move(record));
  return Status::ok();
}

void addOperatorRows(const StoreBatch& batch, std::vector<Step>* steps) {
  if (!batch.operators.empty()) {
    ArrayParam names(kOidText);
    ArrayParam bodies(kOidBytea);
    for (size_t i :
         lastOfEachKey(batch.operators, [](const OperatorRecord& r) { return r.name; })) {
      names.add(batch.operators[i].name);
      bodies.add(bytesOf(encodeOperatorRecord(batch.operators[i])));
    }
    steps->push_back({schema::kUpsertOperators.name, {names.finish(), bodies.finish()}});
  }
  if (batch.audit_log_kept_from > 0) {
    steps->push_back(
        {schema::kDeleteAuditLogBelow.name, {pg::int8Param(asInt8(batch.audit_log_kept_from))}});
  }
  if (batch.audit_log.empty()) return;
  ArrayParam sequences(kOidInt8);
  ArrayParam times(kOidInt8);
  ArrayParam actors(kOidText);
  ArrayParam actions(kOidText);
  ArrayParam outcomes(kOidText);
  ArrayParam bodies(kOidBytea);
  for (const AuditLogEntry& entry : batch.audit_log) {
    sequences.addInt8(asInt8(entry.sequence));
    times.addInt8(asInt8(entry.at_ms));
    actors.add(entry.actor);
    actions.add(entry.action);
    outcomes.add(entry.outcome);
    bodies.add(bytesOf(encodeAuditLogEntry(entry)));
  }
  steps->push_back({schema::kInsertAuditLog.name,
                    {sequences.finish(), times.finish(), actors.finish(), actions.finish(),
                     outcomes.finish(), bodies.finish()}});
}

Status readAuditLog(pg::Connection& connection, uint64_t bytes_max, StoreContents* out) {
  return forEachRow(connection, schema::kSelectAuditLog, "read audit log",
                    [&](const Rows& rows, int row) -> Status {
                      int64_t seq = 0;
                      TALLY_PG_RETURN_IF_ERROR(readInt8(rows, row, 0, "tally.audit_log", &seq));
                      const std::string where = "tally.audit_log seq " + std::to_string(seq);
                      AuditLogEntry entry;
                      TALLY_PG_RETURN_IF_ERROR(decodeChecked(rows.bytes(row, 1), bytes_max, where,
                                                             decodeAuditLogEntry, &entry));
                      if (entry.sequence != static_cast<uint64_t>(seq)) {
                        return Status::corruption(where + ": body holds another");
                      }
                      out->audit_log.push_back(std::move(entry));
                      return Status::ok();
                    });
}

}  // namespace

std::vector<Step> batchSteps(const StoreBatch& batch) {
  std::vector<Step> steps;
  addPolicies(batch, &steps);
  addAccounts(batch, &steps);
  addReservations(batch, &steps);
  addShardRows(batch, &steps);
  addPeriodSnapshots(batch, &steps);
  addOperatorRows(batch, &steps);
  steps.push_back({schema::kRaiseMeta.name,
                   {pg::int8Param(asInt8(batch.ledger_clock_ms)),
                    pg::int8Param(asInt8(batch.shard_sequence))}});
  return steps;
}

Status readContents(pg::Connection& connection, uint64_t body_bytes_max, StoreContents* out) {
  StoreContents contents;
  TALLY_PG_RETURN_IF_ERROR(readMeta(connection, &contents));
  TALLY_PG_RETURN_IF_ERROR(readPolicies(connection, body_bytes_max, &contents));
  TALLY_PG_RETURN_IF_ERROR(readAccounts(connection, body_bytes_max, &contents));
  TALLY_PG_RETURN_IF_ERROR(readReservations(connection, body_bytes_max, &contents));
  TALLY_PG_RETURN_IF_ERROR(readKeyed(
      connection, schema::kSelectGateways, "tally.gateways", body_bytes_max, decodeGatewayRecord,
      [](const GatewayRecord& r) -> const std::string& { return r.gateway_name; },
      &contents.gateways));
  TALLY_PG_RETURN_IF_ERROR(readKeyed(
      connection, schema::kSelectShards, "tally.shards", body_bytes_max, decodeShardRecord,
      [](const ShardRecord& r) -> const std::string& { return r.grant.shard_id; },
      &contents.shards));
  TALLY_PG_RETURN_IF_ERROR(readFences(connection, &contents));
  TALLY_PG_RETURN_IF_ERROR(readPeriodSnapshots(connection, body_bytes_max, &contents));
  TALLY_PG_RETURN_IF_ERROR(readKeyed(
      connection, schema::kSelectOperators, "tally.operators", body_bytes_max, decodeOperatorRecord,
      [](const OperatorRecord& r) -> const std::string& { return r.name; }, &contents.operators));
  TALLY_PG_RETURN_IF_ERROR(readAuditLog(connection, body_bytes_max, &contents));
  *out = std::move(contents);
  return Status::ok();
}

}  // namespace tally::ledger::postgres_rows
