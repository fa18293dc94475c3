// ShardRegistry: rebuilding from the durable record and naming what changed for it
// (core/shard_record.h). The rest of the registry is in shard_registry.cc.

#include <charconv>
#include <string_view>
#include <utility>

#include "core/limits.h"
#include "core/shard_registry.h"

namespace tally {
namespace {

bool validName(const std::string& name, uint64_t bytes_max) {
  return !name.empty() && name.size() <= bytes_max;
}

}  // namespace

uint64_t shardSequenceOf(const std::string& shard_id) {
  constexpr std::string_view kPrefix = "shard-";
  if (shard_id.size() <= kPrefix.size() || shard_id.compare(0, kPrefix.size(), kPrefix) != 0) {
    return 0;
  }
  uint64_t value = 0;
  const char* first = shard_id.data() + kPrefix.size();
  const char* last = shard_id.data() + shard_id.size();
  auto [end, error] = std::from_chars(first, last, value);
  return error == std::errc() && end == last ? value : 0;
}

Status ShardRegistry::restoreGateway(const GatewayRecord& gateway) {
  if (!validName(gateway.gateway_name, limits::kGatewayNameBytesMax)) {
    return Status::corruption("stored gateway has an invalid name");
  }
  if (!gateways_.emplace(gateway.gateway_name, gateway).second) {
    return Status::corruption("gateway '" + gateway.gateway_name + "' stored twice");
  }
  return Status::ok();
}

Status ShardRegistry::restoreShard(const ShardRecord& record) {
  const std::string& id = record.grant.shard_id;
  if (shardSequenceOf(id) == 0)
    return Status::corruption("stored shard has an invalid id '" + id + "'");
  if (!isShardConserved(record)) {
    return Status::corruption("shard '" + id + "' does not conserve");
  }
  if (record.remint_due_at_ms != 0 && record.state != ShardState::kReconciling &&
      record.state != ShardState::kReconciled) {
    return Status::corruption("shard '" + id + "' has a deferred remint in state " +
                              shardStateName(record.state));
  }
  if (!shards_.emplace(id, record).second) {
    return Status::corruption("shard '" + id + "' stored twice");
  }
  if (!by_request_id_.emplace(record.issue_request.request_id, id).second) {
    return Status::corruption("two shards stored for issue request '" +
                              record.issue_request.request_id + "'");
  }
  const ShardRecord& stored = shards_.at(id);
  if (stored.remint_due_at_ms != 0) deferred_.insert({stored.remint_due_at_ms, id});
  maybeQueueCompaction(stored);
  return Status::ok();
}

Status ShardRegistry::restoreFence(const FenceRecord& fence) {
  if (fence.fence == 0) return Status::corruption("stored fence 0");
  if (!fences_.emplace(fence.key, fence.fence).second) {
    return Status::corruption("fence of " + fence.key.subject + "/" + fence.key.route +
                              " stored twice");
  }
  return Status::ok();
}

void ShardRegistry::restoreShardSequence(uint64_t shard_sequence) {
  shard_sequence_ = shard_sequence;
}

Status ShardRegistry::finishRestore() {
  for (const auto& [id, record] : shards_) {
    const ShardGrant& grant = record.grant;
    if (accounts_->find(grant.subject, grant.route, grant.policy_generation) == nullptr) {
      return Status::corruption("shard '" + id + "' was carved from a missing account");
    }
    if (shardSequenceOf(id) > shard_sequence_) {
      return Status::corruption("shard '" + id + "' is above the stored shard sequence " +
                                std::to_string(shard_sequence_));
    }
  }
  return Status::ok();
}

ShardChangedRows ShardRegistry::takeChangedRows() {
  ShardChangedRows rows;
  for (const std::string& name : changed_gateways_) rows.gateways.push_back(&gateways_.at(name));
  for (const std::string& id : changed_shards_) rows.shards.push_back(&shards_.at(id));
  rows.deleted_shards.assign(deleted_shards_.begin(), deleted_shards_.end());
  deleted_shards_.clear();
  for (const SubjectRoute& key : changed_fences_) {
    rows.fences.push_back(FenceRecord{.key = key, .fence = fenceOf(key.subject, key.route)});
  }
  rows.shard_sequence_changed = std::exchange(sequence_changed_, false);
  rows.shard_sequence = shard_sequence_;
  changed_gateways_.clear();
  changed_shards_.clear();
  changed_fences_.clear();
  return rows;
}

}  // namespace tally
