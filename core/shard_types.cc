#include "core/shard_types.h"

namespace tally {

const char* shardStateName(ShardState state) {
  switch (state) {
    case ShardState::kIssued: return "ISSUED";
    case ShardState::kRevoked: return "REVOKED";
    case ShardState::kReconciling: return "RECONCILING";
    case ShardState::kReconciled: return "RECONCILED";
    case ShardState::kConflict: return "CONFLICT";
    case ShardState::kWrittenOff: return "WRITTEN_OFF";
  }
  return "UNKNOWN";
}

bool parseShardState(const std::string& name, ShardState* state) {
  for (int i = 0; i < kShardStateCount; ++i) {
    const auto candidate = static_cast<ShardState>(i);
    if (name == shardStateName(candidate)) {
      *state = candidate;
      return true;
    }
  }
  return false;
}

}  // namespace tally
