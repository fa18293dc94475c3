#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/shard_book.h"
#include "core/shard_keeping.h"
#include "tests/sim/rng.h"

// A simulated agent's durable shard store (the ShardBookStore seam of core/shard_keeping.h,
// what shard/store.cc keeps in SQLite): full images of shards, shard reservations and fences,
// written from the book as ShardStore::commit writes them, one transaction per commit. What a
// commit accepted survives a crash of the agent; restore() rebuilds a book from it as
// ShardStore::restore does. On demand the disk is full: commit() fails and nothing is written
// (a SQLite transaction rolls back).

namespace tally::sim {

class SimShardStore : public ShardBookStore {
 public:
  [[nodiscard]] Status commit(const ShardBook& book, const ShardBookChanges& changes) override;
  // Fences, shards, reservations, finishRestore, then the changes of the restore made durable.
  Result<ShardRestoreReport> restore(ShardBook* book, uint64_t now_ms);

  void failCommits(uint64_t count) { failing_commits_ = count; }
  size_t shardRows() const { return shards_.size(); }

 private:
  uint64_t failing_commits_ = 0;
  std::map<std::string, StoredShard> shards_;
  std::map<std::string, Reservation> reservations_;
  std::map<SubjectRoute, uint64_t> fences_;
};

}  // namespace tally::sim
