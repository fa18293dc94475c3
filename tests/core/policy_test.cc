#include "core/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/limits.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

Budget validBudget() {
  return Budget{
      .subject_pattern = "tenant-7",
      .route = "/v1/chat",
      .region = "eu-west",
      .unit = "tokens",
      .refill_per_second = 10,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 500,
  };
}

// Asserts that `budget` is refused and that the error names `key` the way the policy file does.
void expectRefusedNaming(const Budget& budget, const std::string& key) {
  const Status status = validateBudget(budget);
  ASSERT_FALSE(status.isOk()) << "expected '" << key << "' to be refused";
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'" + key + "'"));
}

TEST(ValidateBudgetTest, ValidBudgetPasses) {
  const Status status = validateBudget(validBudget());
  EXPECT_TRUE(status.isOk()) << status.toString();
}

TEST(ValidateBudgetTest, SubjectEmptyTooLongOrStarNotLast) {
  Budget b = validBudget();
  b.subject_pattern = "";
  expectRefusedNaming(b, "subject");
  b.subject_pattern = std::string(limits::kSubjectBytesMax + 1, 's');
  expectRefusedNaming(b, "subject");
  b.subject_pattern = "ten*ant";
  expectRefusedNaming(b, "subject");
  EXPECT_THAT(validateBudget(b).message(), HasSubstr("'*' is only allowed as the last"));
  b.subject_pattern = "**";
  expectRefusedNaming(b, "subject");
  b.subject_pattern = "*tenant";
  expectRefusedNaming(b, "subject");
}

TEST(ValidateBudgetTest, SubjectPatternsThatAreAllowed) {
  Budget b = validBudget();
  for (const char* pattern : {"*", "tenant-*", "tenant-7"}) {
    b.subject_pattern = pattern;
    EXPECT_TRUE(validateBudget(b).isOk()) << pattern;
  }
  b.subject_pattern = std::string(limits::kSubjectBytesMax, 's');
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, RouteEmptyOrTooLong) {
  Budget b = validBudget();
  b.route = "";
  expectRefusedNaming(b, "route");
  b.route = std::string(limits::kRouteBytesMax + 1, 'r');
  expectRefusedNaming(b, "route");
}

TEST(ValidateBudgetTest, RegionOptionalButBounded) {
  Budget b = validBudget();
  b.region = "";
  EXPECT_TRUE(validateBudget(b).isOk());
  b.region = std::string(limits::kRegionBytesMax + 1, 'g');
  expectRefusedNaming(b, "region");
}

TEST(ValidateBudgetTest, UnitEmptyOrTooLong) {
  Budget b = validBudget();
  b.unit = "";
  expectRefusedNaming(b, "unit");
  b.unit = std::string(limits::kUnitNameBytesMax + 1, 'u');
  expectRefusedNaming(b, "unit");
}

TEST(ValidateBudgetTest, BurstZeroOrAboveLimit) {
  Budget b = validBudget();
  b.burst = 0;
  b.max_single_reservation = 0;
  expectRefusedNaming(b, "burst");
  b.burst = limits::kBurstUnitsMax + 1;
  b.max_single_reservation = 1;
  expectRefusedNaming(b, "burst");
  b.burst = limits::kBurstUnitsMax;
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, RefillAboveLimit) {
  Budget b = validBudget();
  b.refill_per_second = limits::kRefillPerSecondMax + 1;
  expectRefusedNaming(b, "refill_per_second");
  b.refill_per_second = 0;  // a budget that never refills is allowed
  EXPECT_TRUE(validateBudget(b).isOk());
}

// Every unit value of a budget is bounded by the request maximum (and refill by its own), the
// maximum itself accepted and one more refused naming the key.
TEST(ValidateBudgetTest, UnitValuesAtTheirMaximumAreAcceptedAndOneMoreRefused) {
  const Units max = limits::kUnitsPerRequestMax;
  Budget b = validBudget();
  b.burst = max;
  b.max_single_reservation = max;
  b.max_overdraft = max;
  b.refill_per_second = limits::kRefillPerSecondMax;
  b.emergency = {.enabled = true, .shard_units = max, .shard_ttl_ms = 60'000};
  EXPECT_TRUE(validateBudget(b).isOk()) << validateBudget(b).toString();
  const std::vector<std::pair<std::string, std::function<void(Budget*)>>> over = {
      {"burst", [&](Budget* x) { x->burst = max + 1; }},
      {"max_single_reservation", [&](Budget* x) { x->max_single_reservation = max + 1; }},
      {"max_overdraft", [&](Budget* x) { x->max_overdraft = max + 1; }},
      {"refill_per_second",
       [&](Budget* x) { x->refill_per_second = limits::kRefillPerSecondMax + 1; }},
      {"emergency.shard_units", [&](Budget* x) { x->emergency.shard_units = max + 1; }},
  };
  for (const auto& [key, set] : over) {
    Budget refused = b;
    set(&refused);
    expectRefusedNaming(refused, key);
  }
}

// docs/LEDGER.md "Bounds": at the maximum refill, minted stays below half the balance bound for
// a thousand years (the old 2^40/s reached 2^64 in ~194 days), and the balance bound leaves
// room for a whole request on top of any balance.
TEST(ValidateBudgetTest, RefillMaximumKeepsMintedFarFromTwoToThe64ForCenturies) {
  constexpr unsigned __int128 kThousandYearsS = 1000ull * 36525 * 24 * 3600 / 100;
  static_assert(kThousandYearsS * limits::kRefillPerSecondMax < limits::kBalanceUnitsMax / 2);
  using u128 = unsigned __int128;
  static_assert(u128{limits::kBalanceUnitsMax} * 4 == u128{1} << 64);  // sums of balances fit
  static_assert(limits::kBurstUnitsMax <= limits::kUnitsPerRequestMax);
  EXPECT_GT(static_cast<double>(limits::kBalanceUnitsMax / 2) / limits::kRefillPerSecondMax /
                (3600.0 * 24 * 365.25),
            1000.0);  // ~1,089 years
}

TEST(ValidateBudgetTest, MaxSingleReservationZeroOrAboveBurst) {
  Budget b = validBudget();
  b.max_single_reservation = 0;
  expectRefusedNaming(b, "max_single_reservation");
  b.max_single_reservation = 1001;
  expectRefusedNaming(b, "max_single_reservation");
  b.max_single_reservation = 1;
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, HoldTtlZeroOrAboveLimit) {
  Budget b = validBudget();
  b.hold_ttl_ms = 0;
  expectRefusedNaming(b, "hold_ttl_ms");
  b.hold_ttl_ms = limits::kHoldTtlMsMax + 1;
  expectRefusedNaming(b, "hold_ttl_ms");
}

TEST(ValidateBudgetTest, HardExecutionLimitZeroOrAboveLimit) {
  Budget b = validBudget();
  b.hard_execution_limit_ms = 0;
  expectRefusedNaming(b, "hard_execution_limit_ms");
  b.hard_execution_limit_ms = limits::kHardExecutionLimitMsMax + 1;
  expectRefusedNaming(b, "hard_execution_limit_ms");
}

TEST(ValidateBudgetTest, MaxOverdraftAboveLimit) {
  Budget b = validBudget();
  b.max_overdraft = limits::kBurstUnitsMax + 1;
  expectRefusedNaming(b, "max_overdraft");
  b.max_overdraft = 0;
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, WeightZeroOrAboveLimit) {
  Budget b = validBudget();
  b.weight = 0;
  expectRefusedNaming(b, "weight");
  b.weight = 1'000'001;
  expectRefusedNaming(b, "weight");
}

TEST(ValidateBudgetTest, FairnessBudgetAboveOneThousandPermille) {
  Budget b = validBudget();
  b.fairness_budget_permille = 1001;
  expectRefusedNaming(b, "fairness_budget");
  b.fairness_budget_permille = 1000;
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, RolloutPercentAboveHundred) {
  Budget b = validBudget();
  b.rollout.percent = 101;
  expectRefusedNaming(b, "rollout.percent");
  b.rollout.percent = 0;
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidateBudgetTest, EmergencyModeChecksShardSizeAndTtlOnlyWhenEnabled) {
  Budget b = validBudget();
  b.emergency = {.enabled = false, .shard_units = 0, .shard_ttl_ms = 0};
  EXPECT_TRUE(validateBudget(b).isOk());

  b.emergency = {.enabled = true, .shard_units = 0, .shard_ttl_ms = 60'000};
  expectRefusedNaming(b, "emergency.shard_units");
  b.emergency = {.enabled = true, .shard_units = 1001, .shard_ttl_ms = 60'000};
  expectRefusedNaming(b, "emergency.shard_units");
  b.emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = 0};
  expectRefusedNaming(b, "emergency.shard_ttl_ms");
  b.emergency = {
      .enabled = true, .shard_units = 100, .shard_ttl_ms = limits::kHardExecutionLimitMsMax + 1};
  expectRefusedNaming(b, "emergency.shard_ttl_ms");
  b.emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = 60'000};
  EXPECT_TRUE(validateBudget(b).isOk());
}

TEST(ValidatePolicyTest, EmptyPolicyIsRefused) {
  const Status status = validatePolicy(Policy{});
  ASSERT_FALSE(status.isOk());
  EXPECT_THAT(status.message(), HasSubstr("no [[budget]]"));
}

TEST(ValidatePolicyTest, DuplicateSubjectAndRouteIsRefused) {
  Policy policy{.budgets = {validBudget(), validBudget()}};
  const Status status = validatePolicy(policy);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("budget #2"));
  EXPECT_THAT(status.message(), HasSubstr("already have a budget"));
}

TEST(ValidatePolicyTest, SameSubjectOtherRouteOrSameRouteOtherSubjectIsFine) {
  Budget other_route = validBudget();
  other_route.route = "/v1/embed";
  Budget other_subject = validBudget();
  other_subject.subject_pattern = "tenant-*";
  const Policy policy{.budgets = {validBudget(), other_route, other_subject}};
  const Status status = validatePolicy(policy);
  EXPECT_TRUE(status.isOk()) << status.toString();
}

TEST(ValidatePolicyTest, InvalidBudgetIsReportedWithItsIndexAndKey) {
  Budget bad = validBudget();
  bad.route = "/v1/embed";
  bad.burst = 0;
  const Status status = validatePolicy(Policy{.budgets = {validBudget(), bad}});
  ASSERT_FALSE(status.isOk());
  EXPECT_THAT(status.message(), HasSubstr("budget #2"));
  EXPECT_THAT(status.message(), HasSubstr("'burst'"));
}

Budget budgetFor(const std::string& pattern, const std::string& route, Units burst) {
  Budget b = validBudget();
  b.subject_pattern = pattern;
  b.route = route;
  b.burst = burst;
  b.max_single_reservation = burst;
  return b;
}

TEST(MatchBudgetTest, ExactSubjectBeatsEveryPattern) {
  // The exact budget is listed last, after longer and shorter patterns.
  const Policy policy{.budgets = {budgetFor("*", "/r", 1), budgetFor("tenant-*", "/r", 2),
                                  budgetFor("tenant-7*", "/r", 3), budgetFor("tenant-7", "/r", 4)}};
  const Budget* match = matchBudget(policy, "tenant-7", "/r");
  ASSERT_NE(match, nullptr);
  EXPECT_EQ(match->burst, 4u);
}

TEST(MatchBudgetTest, LongestPrefixWinsAmongPatterns) {
  const Policy policy{.budgets = {budgetFor("tenant-*", "/r", 2), budgetFor("*", "/r", 1),
                                  budgetFor("tenant-7*", "/r", 3), budgetFor("ten*", "/r", 5)}};
  const Budget* match = matchBudget(policy, "tenant-77", "/r");
  ASSERT_NE(match, nullptr);
  EXPECT_EQ(match->burst, 3u);
  match = matchBudget(policy, "tenant-8", "/r");
  ASSERT_NE(match, nullptr);
  EXPECT_EQ(match->burst, 2u);
  match = matchBudget(policy, "tenx", "/r");
  ASSERT_NE(match, nullptr);
  EXPECT_EQ(match->burst, 5u);
  match = matchBudget(policy, "other", "/r");
  ASSERT_NE(match, nullptr);
  EXPECT_EQ(match->burst, 1u);
}

TEST(MatchBudgetTest, RouteMustMatch) {
  const Policy policy{.budgets = {budgetFor("tenant-7", "/a", 1), budgetFor("*", "/b", 2)}};
  EXPECT_EQ(matchBudget(policy, "tenant-7", "/b")->burst, 2u);
  EXPECT_EQ(matchBudget(policy, "tenant-7", "/a")->burst, 1u);
  EXPECT_EQ(matchBudget(policy, "tenant-7", "/c"), nullptr);
  EXPECT_EQ(matchBudget(policy, "tenant-8", "/a"), nullptr);
}

Budget inRegion(Budget budget, const std::string& region) {
  budget.region = region;
  return budget;
}

TEST(ValidatePolicyTest, ARegionDoesNotMakeASecondBudgetOfOneSubjectAndRoute) {
  // Region fences a budget, it does not key one: two budgets of one subject/route are refused
  // whatever their regions, with the way to get per-region budgets.
  for (const auto& [first, second] : std::vector<std::pair<std::string, std::string>>{
           {"eu-west", "us-east"}, {"eu-west", ""}, {"", "us-east"}}) {
    const Policy policy{
        .budgets = {inRegion(validBudget(), first), inRegion(validBudget(), second)}};
    const Status status = validatePolicy(policy);
    ASSERT_FALSE(status.isOk()) << "'" << first << "' and '" << second << "'";
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("budget #2"));
    EXPECT_THAT(status.message(), HasSubstr("already have a budget"));
    EXPECT_THAT(status.message(), HasSubstr("one ledger per region, or with distinct routes"));
  }
}

TEST(MatchBudgetTest, TheRegionPlaysNoPartInMatching) {
  // tenant-7's own budget is fenced to eu-west; it still governs tenant-7 (the fence refuses
  // other regions, it does not hand them to the pattern's budget).
  const Policy policy{.budgets = {budgetFor("tenant-*", "/r", 1),
                                  inRegion(budgetFor("tenant-7", "/r", 2), "eu-west")}};
  EXPECT_EQ(matchBudget(policy, "tenant-7", "/r")->burst, 2u);
  EXPECT_EQ(matchBudget(policy, "tenant-8", "/r")->burst, 1u);
}

TEST(RegionFenceTest, ABudgetWithoutARegionAdmitsEveryRegion) {
  const Budget any = inRegion(validBudget(), "");
  EXPECT_TRUE(regionAdmits(any, ""));
  EXPECT_TRUE(regionAdmits(any, "eu-west"));
  EXPECT_TRUE(regionAdmits(any, "us-east"));
}

TEST(RegionFenceTest, ABudgetWithARegionAdmitsItAndRequestsThatSayNone) {
  const Budget eu = inRegion(validBudget(), "eu-west");
  EXPECT_TRUE(regionAdmits(eu, "eu-west"));
  EXPECT_TRUE(regionAdmits(eu, ""));  // the gateway does not say: existing clients keep working
}

TEST(RegionFenceTest, AnotherRegionIsRefusedNamingBothRegions) {
  const Budget eu = inRegion(validBudget(), "eu-west");
  EXPECT_FALSE(regionAdmits(eu, "us-east"));
  EXPECT_FALSE(regionAdmits(eu, "eu-west-2"));  // equal, not a prefix
  EXPECT_FALSE(regionAdmits(eu, "EU-WEST"));    // bytes, not case-folded
  const std::string message = regionRefusal(eu, "us-east");
  EXPECT_THAT(message, HasSubstr("region 'us-east'"));
  EXPECT_THAT(message, HasSubstr("region 'eu-west'"));
  EXPECT_THAT(message, HasSubstr("subject 'tenant-7'"));
}

TEST(MatchBudgetTest, NoBudgetsNoMatch) {
  const Policy empty;
  EXPECT_EQ(matchBudget(empty, "tenant-7", "/a"), nullptr);
}

TEST(SubjectMatchesTest, ExactPrefixAndWildcard) {
  EXPECT_TRUE(subjectMatches("tenant-7", "tenant-7"));
  EXPECT_FALSE(subjectMatches("tenant-7", "tenant-70"));
  EXPECT_FALSE(subjectMatches("tenant-7", "tenant-"));
  EXPECT_TRUE(subjectMatches("tenant-*", "tenant-7"));
  EXPECT_TRUE(subjectMatches("tenant-*", "tenant-"));  // empty suffix
  EXPECT_FALSE(subjectMatches("tenant-*", "tenant"));
  EXPECT_FALSE(subjectMatches("tenant-*", "xtenant-7"));
  EXPECT_TRUE(subjectMatches("*", "anything"));
  EXPECT_TRUE(subjectMatches("*", ""));
  EXPECT_TRUE(subjectMatches("", ""));
  EXPECT_FALSE(subjectMatches("", "a"));
}

TEST(AccountingEpochTest, StartOfHourAndDay) {
  EXPECT_EQ(epochPeriodMs(EpochPeriod::kHour), 3'600'000u);
  EXPECT_EQ(epochPeriodMs(EpochPeriod::kDay), 86'400'000u);
  EXPECT_EQ(accountingEpochStartMs(1'700'000'000'000, EpochPeriod::kHour), 1'699'999'200'000u);
  EXPECT_EQ(accountingEpochStartMs(1'700'000'000'000, EpochPeriod::kDay), 1'699'920'000'000u);
  // On a boundary the period starts there; one ms earlier it is the previous period.
  EXPECT_EQ(accountingEpochStartMs(7'200'000, EpochPeriod::kHour), 7'200'000u);
  EXPECT_EQ(accountingEpochStartMs(7'199'999, EpochPeriod::kHour), 3'600'000u);
  EXPECT_EQ(accountingEpochStartMs(86'400'000, EpochPeriod::kDay), 86'400'000u);
  EXPECT_EQ(accountingEpochStartMs(86'399'999, EpochPeriod::kDay), 0u);
  EXPECT_EQ(accountingEpochStartMs(0, EpochPeriod::kHour), 0u);
}

TEST(PolicyNamesTest, RolloutAndEpochNames) {
  EXPECT_STREQ(rolloutModeName(RolloutMode::kOff), "off");
  EXPECT_STREQ(rolloutModeName(RolloutMode::kShadow), "shadow");
  EXPECT_STREQ(rolloutModeName(RolloutMode::kEnforce), "enforce");
  EXPECT_STREQ(epochPeriodName(EpochPeriod::kHour), "hour");
  EXPECT_STREQ(epochPeriodName(EpochPeriod::kDay), "day");
}

TEST(PolicyDefaultsTest, EmergencyOffAndEnforceByDefault) {
  const Budget b;
  EXPECT_FALSE(b.emergency.enabled);
  EXPECT_EQ(b.rollout.mode, RolloutMode::kEnforce);
  EXPECT_EQ(b.rollout.percent, 100u);
  EXPECT_EQ(b.accounting_epoch, EpochPeriod::kHour);
}

}  // namespace
}  // namespace tally
