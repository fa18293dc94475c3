#include "core/agent_policy.h"

#include <gtest/gtest.h>

// The agent's policy refresh and rollout lookup alone: no sockets, files or clocks (a time is
// just a number).

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'000'000;
constexpr uint64_t kRefreshMs = 5'000;

Policy policyWith(Generation generation, RolloutMode mode, bool emergency) {
  Budget budget{.subject_pattern = "tenant-*", .route = "chat"};
  budget.rollout.mode = mode;
  budget.emergency.enabled = emergency;
  budget.emergency.shard_units = emergency ? 10 : 0;
  return Policy{.generation = generation, .budgets = {budget}};
}

PolicyReply ok(Generation generation) {
  return PolicyReply{.code = ReplyCode::kOk, .generation = generation};
}

// One fetch at a time, only while connected, due refresh_ms after the previous one began.
TEST(AgentPolicyTest, FetchesEveryRefreshIntervalOneAtATimeWhileConnected) {
  AgentPolicy policy({.refresh_ms = kRefreshMs}, kT0);
  EXPECT_FALSE(policy.beginFetch(true, kT0)) << "not due before the first interval";
  EXPECT_FALSE(policy.beginFetch(false, kT0 + kRefreshMs)) << "never while disconnected";
  ASSERT_TRUE(policy.beginFetch(true, kT0 + kRefreshMs));
  EXPECT_TRUE(policy.fetching());
  EXPECT_FALSE(policy.beginFetch(true, kT0 + 3 * kRefreshMs)) << "one in flight at a time";
  policy.onFetchFailed();
  EXPECT_FALSE(policy.fetching());
  EXPECT_FALSE(policy.beginFetch(true, kT0 + 2 * kRefreshMs - 1));
  EXPECT_TRUE(policy.beginFetch(true, kT0 + 2 * kRefreshMs));
}

// On connect and after a publish or rollback through the agent: at once.
TEST(AgentPolicyTest, RefreshNowMakesTheNextFetchDueAtOnce) {
  AgentPolicy policy({.refresh_ms = kRefreshMs}, kT0);
  policy.refreshNow();
  ASSERT_TRUE(policy.beginFetch(true, kT0 + 1));
  (void)policy.onFetchAnswer(ok(1), policyWith(1, RolloutMode::kShadow, false));
  policy.refreshNow();
  EXPECT_TRUE(policy.beginFetch(true, kT0 + 2));
}

TEST(AgentPolicyTest, AnOkAnswerReplacesNotFoundForgetsAnythingElseKeeps) {
  AgentPolicy policy({.refresh_ms = kRefreshMs}, kT0);
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kEnforce) << "none known: enforce";

  // Generation 0 in the document means the reply's generation.
  PolicyFetchOutcome outcome = policy.onFetchAnswer(ok(7), policyWith(0, RolloutMode::kOff, false));
  EXPECT_TRUE(outcome.applied);
  EXPECT_TRUE(outcome.changed);
  EXPECT_EQ(outcome.generation, 7u);
  EXPECT_EQ(outcome.budgets, 1u);
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kOff);
  EXPECT_EQ(policy.mode("other", "chat"), RolloutMode::kEnforce) << "no budget matches";

  outcome = policy.onFetchAnswer(ok(7), policyWith(7, RolloutMode::kOff, false));
  EXPECT_TRUE(outcome.applied);
  EXPECT_FALSE(outcome.changed) << "same generation: no policy_loaded";

  outcome = policy.onFetchAnswer(PolicyReply{.code = ReplyCode::kInvalidArgument}, std::nullopt);
  EXPECT_FALSE(outcome.applied);
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kOff) << "an error changes nothing";

  outcome = policy.onFetchAnswer(PolicyReply{.code = ReplyCode::kNotFound}, std::nullopt);
  EXPECT_TRUE(outcome.applied);
  EXPECT_TRUE(outcome.changed);
  EXPECT_EQ(outcome.generation, 0u);
  EXPECT_FALSE(policy.policy().has_value());
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kEnforce);
}

// A refresh on the connection that answered the generation held names it, and an OK answer
// without a document keeps it; a new connection (perhaps another ledger store) asks again.
TEST(AgentPolicyTest, ARefreshSkipsTheDocumentOnlyForAGenerationThisConnectionAnswered) {
  AgentPolicy policy({.refresh_ms = kRefreshMs}, kT0);
  policy.onConnected();
  ASSERT_TRUE(policy.beginFetch(true, kT0));
  EXPECT_EQ(policy.unlessGeneration(), 0u) << "nothing held";
  (void)policy.onFetchAnswer(ok(3), policyWith(3, RolloutMode::kShadow, false));
  EXPECT_EQ(policy.unlessGeneration(), 3u);

  ASSERT_TRUE(policy.beginFetch(true, kT0 + kRefreshMs));
  PolicyFetchOutcome outcome = policy.onFetchAnswer(ok(3), std::nullopt);
  EXPECT_TRUE(outcome.applied);
  EXPECT_FALSE(outcome.changed);
  EXPECT_EQ(outcome.generation, 3u);
  EXPECT_EQ(outcome.budgets, 1u);
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kShadow) << "kept";

  // An OK without a document for another generation is no answer: nothing changes.
  outcome = policy.onFetchAnswer(ok(4), std::nullopt);
  EXPECT_FALSE(outcome.applied);
  EXPECT_EQ(policy.policy()->generation, 3u);

  policy.onConnected();
  EXPECT_EQ(policy.unlessGeneration(), 0u) << "a new connection asks for the document";
  EXPECT_TRUE(policy.beginFetch(true, kT0 + kRefreshMs + 1)) << "at once";
  (void)policy.onFetchAnswer(ok(3), policyWith(3, RolloutMode::kOff, false));
  EXPECT_EQ(policy.unlessGeneration(), 3u);
  EXPECT_EQ(policy.mode("tenant-1", "chat"), RolloutMode::kOff);
}

TEST(AgentPolicyTest, ShardsAreWantedOnlyWhereEmergencyModeIsOnWithAShardSize) {
  AgentPolicy policy({.refresh_ms = kRefreshMs}, kT0);
  EXPECT_FALSE(policy.wantsShards("tenant-1", "chat")) << "no policy";
  (void)policy.onFetchAnswer(ok(1), policyWith(1, RolloutMode::kEnforce, true));
  EXPECT_TRUE(policy.wantsShards("tenant-1", "chat"));
  EXPECT_FALSE(policy.wantsShards("tenant-1", "other-route"));
  (void)policy.onFetchAnswer(ok(2), policyWith(2, RolloutMode::kEnforce, false));
  EXPECT_FALSE(policy.wantsShards("tenant-1", "chat"));
}

}  // namespace
}  // namespace tally
