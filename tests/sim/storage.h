#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ledger/store.h"
#include "tests/sim/rng.h"

// The ledger's simulated durable storage: the ledger::Store contract of ledger/store.h, kept in
// memory. What commit() accepted survives a crash of the ledger process; the rows the ledger
// has not committed yet are lost with it. On demand the disk is full: commit() fails, and the
// batch may or may not have reached the disk (the contract allows both; the seed decides).

namespace tally::sim {

class SimStore : public ledger::Store {
 public:
  explicit SimStore(Rng rng) : rng_(rng) {}

  [[nodiscard]] Status commit(const ledger::StoreBatch& batch) override;
  [[nodiscard]] Result<ledger::StoreContents> load() override;

  // The next `count` commits fail.
  void failCommits(uint64_t count) { failing_commits_ = count; }

  // Reservations deleted (compacted) by durable commits since the last call, with their last
  // durable image (only the id for one that was never durable): the checker keeps their
  // consumption in its per-account sums.
  std::vector<Reservation> takeDeleted();
  // Shards deleted (compacted) by durable commits since the last call, as last durable.
  std::vector<ShardRecord> takeDeletedShards() { return std::exchange(deleted_shards_, {}); }

  uint64_t commits() const { return commits_; }
  uint64_t failedCommits() const { return failed_commits_; }
  size_t reservationRows() const { return reservations_.size(); }

 private:
  void apply(const ledger::StoreBatch& batch);

  Rng rng_;
  uint64_t failing_commits_ = 0;
  uint64_t commits_ = 0;
  uint64_t failed_commits_ = 0;
  std::map<Generation, ledger::PolicyRecord> policies_;
  std::map<AccountKey, ledger::AccountRecord> accounts_;
  std::map<std::string, Reservation> reservations_;
  std::map<std::string, GatewayRecord> gateways_;
  std::map<std::string, ShardRecord> shards_;
  std::map<SubjectRoute, FenceRecord> fences_;
  std::map<PeriodKey, PeriodSnapshot> period_snapshots_;
  uint64_t ledger_clock_ms_ = 0;
  uint64_t shard_sequence_ = 0;
  std::vector<Reservation> deleted_;
  std::vector<ShardRecord> deleted_shards_;
};

}  // namespace tally::sim
