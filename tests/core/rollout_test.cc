#include "core/rollout.h"

#include <gtest/gtest.h>

#include <string>

namespace tally {
namespace {

TEST(RolloutTest, StableHashIsPinned) {
  // FNV-1a 64 reference values: agents on different machines and versions must agree.
  EXPECT_EQ(stableRouteHash(""), 14695981039346656037ull);
  EXPECT_EQ(stableRouteHash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(stableRouteHash("foobar"), 0x85944171f73967e8ull);
}

TEST(RolloutTest, OffAndShadowApplyToEveryRoute) {
  EXPECT_EQ(effectiveRolloutMode({.mode = RolloutMode::kOff, .percent = 100}, "chat"),
            RolloutMode::kOff);
  EXPECT_EQ(effectiveRolloutMode({.mode = RolloutMode::kShadow, .percent = 0}, "chat"),
            RolloutMode::kShadow);
}

TEST(RolloutTest, EnforcePercentPicksAStableShareOfRoutes) {
  int enforced_at_1 = 0;
  int enforced_at_50 = 0;
  for (int i = 0; i < 10'000; ++i) {
    const std::string route = "route-" + std::to_string(i);
    const RolloutMode at_1 = effectiveRolloutMode({RolloutMode::kEnforce, 1}, route);
    const RolloutMode at_50 = effectiveRolloutMode({RolloutMode::kEnforce, 50}, route);
    enforced_at_1 += at_1 == RolloutMode::kEnforce;
    enforced_at_50 += at_50 == RolloutMode::kEnforce;
    // Monotone: a route enforced at 1% stays enforced at 50%.
    if (at_1 == RolloutMode::kEnforce) {
      EXPECT_EQ(at_50, RolloutMode::kEnforce);
    }
    EXPECT_EQ(at_50, effectiveRolloutMode({RolloutMode::kEnforce, 50}, route));  // stable
  }
  EXPECT_NEAR(enforced_at_1, 100, 40);
  EXPECT_NEAR(enforced_at_50, 5'000, 250);
  EXPECT_EQ(effectiveRolloutMode({RolloutMode::kEnforce, 0}, "any"), RolloutMode::kShadow);
  EXPECT_EQ(effectiveRolloutMode({RolloutMode::kEnforce, 100}, "any"), RolloutMode::kEnforce);
}

}  // namespace
}  // namespace tally
