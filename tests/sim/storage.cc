#include "tests/sim/storage.h"

#include <algorithm>
#include <utility>

namespace tally::sim {

Status SimStore::commit(const ledger::StoreBatch& batch) {
  if (failing_commits_ > 0) {
    --failing_commits_;
    ++failed_commits_;
    if (rng_.chance(500)) apply(batch);  // written, but the caller cannot know
    return Status::ioError("simulated disk full");
  }
  apply(batch);
  ++commits_;
  return Status::ok();
}

void SimStore::apply(const ledger::StoreBatch& batch) {
  for (const ledger::PolicyRecord& record : batch.policies) {
    policies_[record.policy.generation] = record;
  }
  for (const ledger::AccountRecord& record : batch.accounts) accounts_[record.key] = record;
  for (const std::string& id : batch.deleted_reservations) {
    auto it = reservations_.find(id);
    if (it == reservations_.end()) {
      // Admitted and compacted within one batch: never durable. Reported by id alone.
      deleted_.push_back(Reservation{.reservation_id = id});
      continue;
    }
    deleted_.push_back(std::move(it->second));
    reservations_.erase(it);
  }
  for (const Reservation& reservation : batch.reservations) {
    reservations_[reservation.reservation_id] = reservation;
  }
  for (const GatewayRecord& gateway : batch.gateways) gateways_[gateway.gateway_name] = gateway;
  for (const ShardRecord& shard : batch.shards) shards_[shard.grant.shard_id] = shard;
  for (const std::string& id : batch.deleted_shards) {
    if (auto it = shards_.find(id); it != shards_.end()) {
      deleted_shards_.push_back(std::move(it->second));
      shards_.erase(it);
    }
  }
  for (const FenceRecord& fence : batch.fences) fences_[fence.key] = fence;
  for (const PeriodSnapshot& snapshot : batch.period_snapshots) {
    period_snapshots_[PeriodKey{snapshot.key, snapshot.epoch_first}] = snapshot;
  }
  for (const PeriodKey& key : batch.deleted_period_snapshots) period_snapshots_.erase(key);
  shard_sequence_ = std::max(shard_sequence_, batch.shard_sequence);
  ledger_clock_ms_ = std::max(ledger_clock_ms_, batch.ledger_clock_ms);
}

Result<ledger::StoreContents> SimStore::load() {
  ledger::StoreContents contents;
  for (const auto& [generation, record] : policies_) contents.policies.push_back(record);
  for (const auto& [key, record] : accounts_) contents.accounts.push_back(record);
  for (const auto& [id, reservation] : reservations_) contents.reservations.push_back(reservation);
  for (const auto& [name, gateway] : gateways_) contents.gateways.push_back(gateway);
  for (const auto& [id, shard] : shards_) contents.shards.push_back(shard);
  for (const auto& [key, fence] : fences_) contents.fences.push_back(fence);
  for (const auto& [key, snapshot] : period_snapshots_)
    contents.period_snapshots.push_back(snapshot);
  contents.ledger_clock_ms = ledger_clock_ms_;
  contents.shard_sequence = shard_sequence_;
  return contents;
}

std::vector<Reservation> SimStore::takeDeleted() { return std::exchange(deleted_, {}); }

}  // namespace tally::sim
