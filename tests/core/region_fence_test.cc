#include "core/region_fence.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace tally {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kNowMs = 1'700'000'000'000;
constexpr int64_t kRetryMs = 2'000;

Policy policyFencedTo(const std::string& region) {
  return Policy{.generation = 3,
                .budgets = {Budget{.subject_pattern = "tenant-*",
                                   .route = "chat",
                                   .region = region,
                                   .unit = "tokens",
                                   .burst = 100,
                                   .max_single_reservation = 100,
                                   .hold_ttl_ms = 1'000,
                                   .hard_execution_limit_ms = 1'000}}};
}

ReserveRequest request(const std::string& region, const std::string& subject = "tenant-1") {
  return ReserveRequest{
      .reservation_id = "r", .subject = subject, .route = "chat", .units = 5, .region = region};
}

TEST(ShardRegionRefusalTest, TheShardsMayAdmitWhatTheBudgetsFenceAdmits) {
  const std::optional<Policy> eu = policyFencedTo("eu-west-1");
  EXPECT_FALSE(shardRegionRefusal(eu, request("eu-west-1"), kRetryMs, kNowMs).has_value());
  EXPECT_FALSE(shardRegionRefusal(eu, request(""), kRetryMs, kNowMs).has_value());
  const std::optional<Policy> any = policyFencedTo("");
  EXPECT_FALSE(shardRegionRefusal(any, request("us-east-1"), kRetryMs, kNowMs).has_value());
  // No budget governs the subject/route: the shard book decides (it holds no shard for it).
  EXPECT_FALSE(shardRegionRefusal(eu, request("us-east-1", "other"), kRetryMs, kNowMs).has_value());
}

TEST(ShardRegionRefusalTest, AnotherRegionIsRejectedAsNoBudgetNamingBothRegions) {
  const std::optional<ReservationReply> refused =
      shardRegionRefusal(policyFencedTo("eu-west-1"), request("us-east-1"), kRetryMs, kNowMs);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, ReplyCode::kRejected);
  EXPECT_EQ(refused->receipt.state, ReservationState::kRejected);
  EXPECT_EQ(refused->receipt.limiting_dimension, LimitingDimension::kNoBudget);
  EXPECT_EQ(refused->receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(refused->receipt.region, "us-east-1");
  EXPECT_THAT(refused->message, HasSubstr("region 'us-east-1'"));
  EXPECT_THAT(refused->message, HasSubstr("region 'eu-west-1'"));
}

TEST(ShardRegionRefusalTest, WithoutAPolicyARequestNamingARegionIsNotAdmittedFromShards) {
  const std::optional<ReservationReply> refused =
      shardRegionRefusal(std::nullopt, request("us-east-1"), kRetryMs, kNowMs);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, ReplyCode::kRejected);
  EXPECT_EQ(refused->receipt.limiting_dimension, LimitingDimension::kLedgerUnavailable);
  EXPECT_EQ(refused->receipt.retry_after_ms, kRetryMs);
  EXPECT_THAT(refused->message, HasSubstr("region 'us-east-1'"));
  // A request that names no region is admissible under any budget: the shards decide.
  EXPECT_FALSE(shardRegionRefusal(std::nullopt, request(""), kRetryMs, kNowMs).has_value());
}

}  // namespace
}  // namespace tally
