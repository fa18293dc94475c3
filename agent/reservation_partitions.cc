#include "agent/reservation_partitions.h"

#include <sqlite3.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/sqlite_support.h"

namespace tally::agent {

using namespace sqlite;  // statusOf, execSql, bind*, stepDone, forEachRow, ...

namespace {

constexpr const char* kCreate =
    "CREATE TABLE IF NOT EXISTS reservation_partitions ("
    "reservation_id TEXT PRIMARY KEY NOT NULL, partition_index INTEGER NOT NULL) STRICT";
constexpr const char* kUpsert =
    "INSERT INTO reservation_partitions(reservation_id, partition_index) VALUES (?1, ?2)"
    " ON CONFLICT(reservation_id) DO UPDATE SET partition_index = excluded.partition_index";
constexpr const char* kDelete = "DELETE FROM reservation_partitions WHERE reservation_id = ?1";
constexpr const char* kSelect =
    "SELECT partition_index FROM reservation_partitions WHERE reservation_id = ?1";
constexpr const char* kCount = "SELECT COUNT(*) FROM reservation_partitions";
// Rowids grow with each new id (an id recorded again keeps its row): the oldest are the lowest.
constexpr const char* kTrim =
    "DELETE FROM reservation_partitions WHERE rowid IN (SELECT rowid FROM reservation_partitions"
    " ORDER BY rowid LIMIT max(0, (SELECT COUNT(*) FROM reservation_partitions) - ?1))";

}  // namespace

Result<std::unique_ptr<ReservationPartitions>> ReservationPartitions::open(sqlite3* db) {
  if (db == nullptr) return Status::invalidArgument("no agent.db connection");
  TALLY_SQLITE_RETURN_IF_ERROR(execSql(db, kCreate, "create reservation_partitions"));
  return std::make_unique<ReservationPartitions>(Key{}, db);
}

Status ReservationPartitions::record(std::string_view reservation_id, uint32_t partition) {
  constexpr const char* kOp = "record reservation partition";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kUpsert));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, reservation_id, kOp));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt.get(), 2, partition, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

Status ReservationPartitions::forget(std::string_view reservation_id) {
  constexpr const char* kOp = "forget reservation partition";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kDelete));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, reservation_id, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

Result<std::optional<uint32_t>> ReservationPartitions::find(std::string_view reservation_id) {
  constexpr const char* kOp = "find reservation partition";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kSelect));
  TALLY_SQLITE_RETURN_IF_ERROR(bindText(db_, stmt.get(), 1, reservation_id, kOp));
  std::optional<uint32_t> found;
  TALLY_SQLITE_RETURN_IF_ERROR(forEachRow(db_, stmt.get(), kOp, [&](sqlite3_stmt* row) -> Status {
    const int64_t value = sqlite3_column_int64(row, 0);
    if (value < 0 || value > std::numeric_limits<uint32_t>::max()) {
      return Status::corruption("reservation_partitions: partition " + std::to_string(value) +
                                " of '" + std::string(reservation_id) + "' is out of range");
    }
    found = static_cast<uint32_t>(value);
    return Status::ok();
  }));
  return found;
}

Result<uint64_t> ReservationPartitions::size() {
  std::optional<int64_t> count;
  TALLY_SQLITE_RETURN_IF_ERROR(queryInt(db_, kCount, "count reservation partitions", &count));
  return static_cast<uint64_t>(count.value_or(0));
}

Status ReservationPartitions::trim(uint64_t keep_max) {
  constexpr const char* kOp = "trim reservation partitions";
  Statement stmt;
  TALLY_SQLITE_RETURN_IF_ERROR(stmt.prepare(db_, kTrim));
  const auto keep = static_cast<int64_t>(
      std::min<uint64_t>(keep_max, static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
  TALLY_SQLITE_RETURN_IF_ERROR(bindInt64(db_, stmt.get(), 1, keep, kOp));
  return stepDone(db_, stmt.get(), kOp);
}

}  // namespace tally::agent
