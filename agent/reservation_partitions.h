#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "core/status.h"

struct sqlite3;

// A partitioned agent's record of which partition each reservation was reserved on
// (docs/scale-out.md "Partitioned subjects"): a follow-up (start, settle, release, …) names only
// the reservation id, and goes to the partition its reserve went to (agentPartitionRoute,
// core/agent_partitions.h). Written at the reserve, before it is sent, so that it survives kill
// -9 and power loss: a follow-up after an agent restart still finds its partition.
//
// Table reservation_partitions(reservation_id TEXT PRIMARY KEY, partition_index INTEGER) in
// agent.db, on the OutboxStore's connection (same file, pragmas, lock and thread; created if
// missing). Errors as OutboxStore's: kIoError naming the operation, kResourceExhausted for a full
// disk, kCorruption for a row this build cannot read.
//
// Borrows the connection, which must outlive it. Not thread-safe (the agent's loop thread).

namespace tally::agent {

class ReservationPartitions {
 public:
  static Result<std::unique_ptr<ReservationPartitions>> open(sqlite3* db);

  // Durable on return (fsync'd). Recording an id again replaces its partition.
  Status record(std::string_view reservation_id, uint32_t partition);
  // Once the reservation is final: its follow-ups are answered by the partition anyway, and the
  // table stays as small as the live reservations. Forgetting an id not recorded is not an error.
  Status forget(std::string_view reservation_id);
  // The partition recorded for `reservation_id`, if any.
  Result<std::optional<uint32_t>> find(std::string_view reservation_id);
  Result<uint64_t> size();
  // Drops the oldest records (first recorded) until at most `keep_max` remain.
  Status trim(uint64_t keep_max);

  struct Key {
    explicit Key() = default;
  };
  // Only open() can make a Key: use open().
  ReservationPartitions(Key, sqlite3* db) : db_(db) {}

 private:
  sqlite3* db_;
};

}  // namespace tally::agent
