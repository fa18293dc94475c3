#include "core/shard_types.h"

namespace tally {

bool isIdentityName(std::string_view name, uint64_t bytes_max) {
  if (name.empty() || name.size() > bytes_max) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

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
