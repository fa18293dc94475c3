#include "tests/sim/shard_store.h"

namespace tally::sim {

Status SimShardStore::commit(const ShardBook& book, const ShardBookChanges& changes) {
  if (changes.empty()) return Status::ok();
  if (failing_commits_ > 0) {
    --failing_commits_;
    return Status::ioError("simulated disk full (shard store)");
  }
  // As ShardStore::commit: a row named as upserted that the book no longer holds is deleted.
  for (const std::string& id : changes.shards_upserted) {
    const ShardBook::Shard* shard = book.findShard(id);
    if (shard == nullptr) {
      shards_.erase(id);
      continue;
    }
    shards_[id] = StoredShard{.shard_id = id,
                              .grant_decoded = true,
                              .record = shard->record,
                              .balances = shard->account.balances(),
                              .closed = shard->account.closed()};
  }
  for (const std::string& id : changes.reservations_upserted) {
    const Reservation* reservation = book.findReservation(id);
    if (reservation == nullptr) {
      reservations_.erase(id);
    } else {
      reservations_[id] = *reservation;
    }
  }
  for (const std::string& id : changes.reservations_deleted) {
    if (book.findReservation(id) == nullptr) reservations_.erase(id);
  }
  for (const std::string& id : changes.shards_deleted) {
    if (book.findShard(id) == nullptr) shards_.erase(id);
  }
  for (const SubjectRoute& key : changes.fences) fences_[key] = book.highestFence(key);
  return Status::ok();
}

Result<ShardRestoreReport> SimShardStore::restore(ShardBook* book, uint64_t now_ms) {
  for (const auto& [key, fence] : fences_) book->restoreFence(key, fence);
  for (const auto& [id, stored] : shards_) {
    if (Status s = book->restoreShard(stored); !s.isOk()) return s;
  }
  for (const auto& [id, reservation] : reservations_) {
    if (Status s = book->restoreReservation(reservation); !s.isOk()) return s;
  }
  Result<ShardRestoreReport> report = book->finishRestore(now_ms);
  if (!report.isOk()) return report;
  const uint64_t failing = failing_commits_;
  failing_commits_ = 0;  // the restore's own write (the disk is checked at boot)
  Status written = commit(*book, book->takeChanges());
  failing_commits_ = failing;
  if (!written.isOk()) return written;
  return report;
}

}  // namespace tally::sim
