#include "core/rollout.h"

namespace tally {

uint64_t stableRouteHash(std::string_view route) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char ch : route) {
    hash ^= ch;
    hash *= 1099511628211ull;
  }
  return hash;
}

RolloutMode effectiveRolloutMode(const Rollout& rollout, std::string_view route) {
  if (rollout.mode != RolloutMode::kEnforce) return rollout.mode;
  if (rollout.percent >= 100) return RolloutMode::kEnforce;
  return stableRouteHash(route) % 100 < rollout.percent ? RolloutMode::kEnforce
                                                        : RolloutMode::kShadow;
}

}  // namespace tally
