#include "ctl/policy_toml.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tally::ctl {
namespace {

// A one-budget policy document whose keys tests add, change or remove. Keys "emergency.X" and
// "rollout.X" go to the [budget.emergency] / [budget.rollout] sections.
class Doc {
 public:
  Doc() {
    main_ = {
        {"subject", "\"tenant-7\""}, {"route", "\"chat.generate\""},
        {"unit", "\"tokens\""},      {"refill_per_second", "10"},
        {"burst", "1000"},           {"max_single_reservation", "1000"},
        {"hold_ttl_ms", "30000"},    {"hard_execution_limit_ms", "600000"},
    };
  }

  Doc& set(const std::string& key, const std::string& value) {
    auto& [section, name] = locate(key);
    for (auto& entry : *section) {
      if (entry.first == name) {
        entry.second = value;
        return *this;
      }
    }
    section->emplace_back(name, value);
    return *this;
  }

  Doc& erase(const std::string& key) {
    auto& [section, name] = locate(key);
    std::erase_if(*section, [&wanted = name](const auto& entry) { return entry.first == wanted; });
    return *this;
  }

  std::string text() const {
    std::string out = "[[budget]]\n";
    for (const auto& [key, value] : main_) out += key + " = " + value + "\n";
    if (!emergency_.empty()) out += "[budget.emergency]\n";
    for (const auto& [key, value] : emergency_) out += key + " = " + value + "\n";
    if (!rollout_.empty()) out += "[budget.rollout]\n";
    for (const auto& [key, value] : rollout_) out += key + " = " + value + "\n";
    return out;
  }

 private:
  using Section = std::vector<std::pair<std::string, std::string>>;

  std::pair<Section*, std::string>& locate(const std::string& key) {
    located_ = {&main_, key};
    if (key.starts_with("emergency.")) located_ = {&emergency_, key.substr(10)};
    if (key.starts_with("rollout.")) located_ = {&rollout_, key.substr(8)};
    return located_;
  }

  Section main_;
  Section emergency_;
  Section rollout_;
  std::pair<Section*, std::string> located_;
};

Result<Policy> parse(const std::string& text) { return parsePolicyToml(text, "test.toml"); }

// The error message for `text`, which must not parse.
std::string errorOf(const std::string& text) {
  Result<Policy> policy = parse(text);
  EXPECT_FALSE(policy.isOk()) << text;
  if (policy.isOk()) return "";
  EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
  return policy.status().message();
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

Budget fullBudget() {
  return Budget{
      .subject_pattern = "tenant-*",
      .route = "chat.generate",
      .region = "eu-west-1",
      .unit = "tokens",
      .refill_per_second = 250,
      .burst = 10'000,
      .estimator_digest = "sha256:5f2e",
      .max_single_reservation = 4'000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 600'000,
      .max_overdraft = 2'000,
      .priority = 4,
      .weight = 3,
      .fairness_budget_permille = 50,
      .accounting_epoch = EpochPeriod::kDay,
      .emergency = {.enabled = true, .shard_units = 500, .shard_ttl_ms = 120'000},
      .rollout = {.mode = RolloutMode::kShadow, .percent = 25},
  };
}

TEST(PolicyTomlTest, ExamplePolicyParses) {
  Result<Policy> policy = parsePolicyFile(TALLY_SOURCE_DIR "/examples/policy.toml");
  ASSERT_TRUE(policy.isOk()) << policy.status().toString();
  const Policy& p = policy.value();
  EXPECT_EQ(p.generation, 0u);
  ASSERT_EQ(p.budgets.size(), 3u);

  // tenant-7's budget is fenced to eu-west-1: it governs tenant-7 whatever the region asks
  // (region is not a key), admits eu-west-1 and region-less requests, refuses the others.
  const Budget* story = matchBudget(p, "tenant-7", "chat.generate");
  ASSERT_NE(story, nullptr);
  EXPECT_EQ(story->subject_pattern, "tenant-7");
  EXPECT_EQ(story->region, "eu-west-1");
  EXPECT_TRUE(regionAdmits(*story, ""));
  EXPECT_TRUE(regionAdmits(*story, "eu-west-1"));
  EXPECT_FALSE(regionAdmits(*story, "us-east-1"));
  EXPECT_EQ(story->burst, 1000u);
  EXPECT_EQ(story->unit, "tokens");
  EXPECT_EQ(story->fairness_budget_permille, 25u);
  EXPECT_GE(story->max_single_reservation, 600u);

  const Budget* pattern = matchBudget(p, "tenant-9", "chat.generate");
  ASSERT_NE(pattern, nullptr);
  EXPECT_EQ(pattern->subject_pattern, "tenant-*");
  // Optional keys left out take their documented defaults.
  EXPECT_EQ(pattern->region, "");
  EXPECT_TRUE(regionAdmits(*pattern, "us-east-1"));
  EXPECT_EQ(pattern->max_overdraft, 0u);
  EXPECT_EQ(pattern->weight, 1u);
  EXPECT_EQ(pattern->priority, 0u);
  EXPECT_EQ(pattern->fairness_budget_permille, 0u);
  EXPECT_EQ(pattern->estimator_digest, "");
  EXPECT_EQ(pattern->accounting_epoch, EpochPeriod::kHour);
  EXPECT_EQ(pattern->emergency, EmergencyMode{});
  EXPECT_EQ(pattern->rollout.mode, RolloutMode::kEnforce);
  EXPECT_EQ(pattern->rollout.percent, 100u);

  const Budget* big = matchBudget(p, "tenant-42", "chat.generate");
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(big->emergency.enabled);
  EXPECT_EQ(big->accounting_epoch, EpochPeriod::kDay);
}

TEST(PolicyTomlTest, MinimalBudgetParses) {
  Result<Policy> policy = parse(Doc().text());
  ASSERT_TRUE(policy.isOk()) << policy.status().toString();
  EXPECT_EQ(policy.value().budgets.size(), 1u);
}

TEST(PolicyTomlTest, EveryKeyIsRead) {
  Doc doc;
  doc.set("subject", "\"tenant-*\"")
      .set("region", "\"eu-west-1\"")
      .set("refill_per_second", "250")
      .set("burst", "10000")
      .set("max_single_reservation", "4000")
      .set("max_overdraft", "2000")
      .set("weight", "3")
      .set("priority", "4")
      .set("fairness_budget", "50")
      .set("estimator_digest", "\"sha256:5f2e\"")
      .set("accounting_epoch", "\"day\"")
      .set("emergency.enabled", "true")
      .set("emergency.shard_units", "500")
      .set("emergency.shard_ttl_ms", "120000")
      .set("rollout.mode", "\"shadow\"")
      .set("rollout.percent", "25");
  Result<Policy> policy = parse(doc.text());
  ASSERT_TRUE(policy.isOk()) << policy.status().toString();
  EXPECT_EQ(policy.value().budgets.at(0), fullBudget());
}

TEST(PolicyTomlTest, MissingRequiredKeyIsNamed) {
  for (const char* key : {"subject", "route", "unit", "refill_per_second", "burst",
                          "max_single_reservation", "hold_ttl_ms", "hard_execution_limit_ms"}) {
    const std::string message = errorOf(Doc().erase(key).text());
    EXPECT_CONTAINS(message, std::string("missing required key '") + key + "'");
    EXPECT_CONTAINS(message, "budget #1");
    EXPECT_CONTAINS(message, "test.toml:1:");  // the [[budget]] header
  }
}

TEST(PolicyTomlTest, EmergencyNeedsShardSizeAndTtlWhenEnabled) {
  std::string message =
      errorOf(Doc().set("emergency.enabled", "true").set("emergency.shard_ttl_ms", "1000").text());
  EXPECT_CONTAINS(message, "missing required key 'emergency.shard_units'");
  message =
      errorOf(Doc().set("emergency.enabled", "true").set("emergency.shard_units", "10").text());
  EXPECT_CONTAINS(message, "missing required key 'emergency.shard_ttl_ms'");
  // Disabled: neither is needed.
  EXPECT_TRUE(parse(Doc().set("emergency.enabled", "false").text()).isOk());
}

TEST(PolicyTomlTest, UnknownKeysAreRefusedAtEveryLevel) {
  std::string message = errorOf(Doc().set("refil_per_second", "5").text());
  EXPECT_CONTAINS(message, "unknown key 'refil_per_second'");
  EXPECT_CONTAINS(message, "budget #1");
  EXPECT_CONTAINS(message, "test.toml:10:");

  message = errorOf(Doc().set("emergency.enable", "true").text());
  EXPECT_CONTAINS(message, "unknown key 'emergency.enable'");

  message = errorOf(Doc().set("rollout.percentage", "5").text());
  EXPECT_CONTAINS(message, "unknown key 'rollout.percentage'");

  message = errorOf("version = 1\n" + Doc().text());
  EXPECT_CONTAINS(message, "unknown top-level key 'version'");
  EXPECT_CONTAINS(message, "test.toml:1");

  message = errorOf(Doc().text() + "[budget.extra]\nx = 1\n");
  EXPECT_CONTAINS(message, "unknown key 'extra'");
}

TEST(PolicyTomlTest, WrongTypesAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"burst", "\"1000\""},
      {"refill_per_second", "1.5"},
      {"hold_ttl_ms", "true"},
      {"subject", "7"},
      {"route", "[\"a\"]"},
      {"region", "1"},
      {"accounting_epoch", "1"},
      {"weight", "\"heavy\""},
      {"fairness_budget", "0.5"},
      {"emergency.enabled", "\"yes\""},
      {"emergency.shard_units", "\"10\""},
      {"rollout.mode", "2"},
      {"rollout.percent", "50.0"},
  };
  for (const auto& [key, value] : cases) {
    const std::string message = errorOf(Doc().set(key, value).text());
    EXPECT_CONTAINS(message, std::string("key '") + key + "'");
    EXPECT_CONTAINS(message, "must be");
  }
  EXPECT_CONTAINS(errorOf(Doc().set("emergency", "5").text()), "key 'emergency'");
}

TEST(PolicyTomlTest, NegativeNumbersAreNamed) {
  for (const char* key :
       {"refill_per_second", "burst", "max_single_reservation", "hold_ttl_ms",
        "hard_execution_limit_ms", "max_overdraft", "weight", "priority", "fairness_budget",
        "emergency.shard_units", "emergency.shard_ttl_ms", "rollout.percent"}) {
    const std::string message = errorOf(Doc().set(key, "-5").text());
    EXPECT_CONTAINS(message, std::string("key '") + key + "'");
    EXPECT_CONTAINS(message, "must not be negative");
  }
}

TEST(PolicyTomlTest, ImpossibleValuesAreNamed) {
  const std::pair<Doc, const char*> cases[] = {
      {Doc().set("max_single_reservation", "2000"), "max_single_reservation"},
      {Doc().set("burst", "0"), "burst"},
      {Doc().set("burst", "1125899906842625"), "burst"},                  // 2^50 + 1
      {Doc().set("burst", "1099511627777"), "burst"},                     // 2^40 + 1
      {Doc().set("refill_per_second", "67108865"), "refill_per_second"},  // 2^26 + 1
      {Doc().set("max_overdraft", "1099511627777"), "max_overdraft"},
      {Doc().set("hold_ttl_ms", "0"), "hold_ttl_ms"},
      {Doc().set("hard_execution_limit_ms", "0"), "hard_execution_limit_ms"},
      {Doc().set("weight", "0"), "weight"},
      {Doc().set("weight", "4294967296"), "weight"},
      {Doc().set("priority", "4294967296"), "priority"},
      {Doc().set("fairness_budget", "1001"), "fairness_budget"},
      {Doc().set("subject", "\"\""), "subject"},
      {Doc().set("subject", "\"ten*ant\""), "subject"},
      {Doc().set("unit", "\"\""), "unit"},
      {Doc().set("accounting_epoch", "\"week\""), "accounting_epoch"},
      {Doc().set("rollout.mode", "\"on\""), "rollout.mode"},
      {Doc().set("rollout.percent", "101"), "rollout.percent"},
      {Doc()
           .set("emergency.enabled", "true")
           .set("emergency.shard_units", "1001")
           .set("emergency.shard_ttl_ms", "1000"),
       "emergency.shard_units"},
      {Doc()
           .set("emergency.enabled", "true")
           .set("emergency.shard_units", "100")
           .set("emergency.shard_ttl_ms", "0"),
       "emergency.shard_ttl_ms"},
      {Doc().set("estimator_digest", "\"" + std::string(300, 'a') + "\""), "estimator_digest"},
  };
  for (const auto& [doc, key] : cases) {
    const std::string message = errorOf(doc.text());
    EXPECT_CONTAINS(message, std::string("'") + key + "'");
    EXPECT_CONTAINS(message, "budget #1");
  }
}

TEST(PolicyTomlTest, ImpossibleValueErrorPointsAtItsLine) {
  // max_single_reservation is on line 7 of Doc's text.
  const std::string message = errorOf(Doc().set("max_single_reservation", "2000").text());
  EXPECT_CONTAINS(message, "test.toml:7:");
  EXPECT_CONTAINS(message, "2000");
}

TEST(PolicyTomlTest, WrongTypeErrorPointsAtItsLine) {
  const std::string message = errorOf(Doc().set("burst", "\"many\"").text());
  EXPECT_CONTAINS(message, "test.toml:6:");
}

TEST(PolicyTomlTest, SecondBudgetIsCountedInErrors) {
  const std::string text = Doc().text() + "\n" + Doc().set("route", "\"b\"").erase("unit").text();
  const std::string message = errorOf(text);
  EXPECT_CONTAINS(message, "budget #2");
  EXPECT_CONTAINS(message, "missing required key 'unit'");
  EXPECT_CONTAINS(message, "test.toml:11:");  // the second [[budget]] header
}

TEST(PolicyTomlTest, DuplicateSubjectRouteIsRefused) {
  const std::string message = errorOf(Doc().text() + "\n" + Doc().text());
  EXPECT_CONTAINS(message, "budget #2");
  EXPECT_CONTAINS(message, "already");
}

TEST(PolicyTomlTest, DocumentShapeErrors) {
  EXPECT_CONTAINS(errorOf(""), "no [[budget]]");
  EXPECT_CONTAINS(errorOf("budget = []\n"), "no [[budget]]");
  EXPECT_CONTAINS(errorOf("[budget]\nsubject = \"a\"\n"), "[[budget]]");
  EXPECT_CONTAINS(errorOf("budget = [1, 2]\n"), "[[budget]]");
}

TEST(PolicyTomlTest, SyntaxErrorsCarryLineAndColumn) {
  const std::string message = errorOf("[[budget]]\nsubject = \"tenant-7\nroute = 1\n");
  EXPECT_CONTAINS(message, "test.toml:2:");
  EXPECT_CONTAINS(message, "invalid TOML");
  EXPECT_CONTAINS(errorOf(Doc().text() + "burst = 5\n"), "invalid TOML");  // duplicate key
}

TEST(PolicyTomlTest, MissingFileIsAnIoError) {
  Result<Policy> policy = parsePolicyFile("/nonexistent/tally/policy.toml");
  ASSERT_FALSE(policy.isOk());
  EXPECT_EQ(policy.status().code(), StatusCode::kIoError);
  EXPECT_CONTAINS(policy.status().message(), "/nonexistent/tally/policy.toml");
}

TEST(PolicyTomlTest, RoundTripsThroughToml) {
  Policy policy;
  policy.generation = 9;
  policy.budgets.push_back(fullBudget());
  Budget tricky = fullBudget();
  tricky.subject_pattern = "tenant \"quoted\" \\ back\tslash ü";
  tricky.route = "route\nwith newline";
  tricky.region = "";
  tricky.emergency = {};
  tricky.rollout = {.mode = RolloutMode::kOff, .percent = 0};
  tricky.accounting_epoch = EpochPeriod::kHour;
  policy.budgets.push_back(tricky);

  const std::string text = policyToToml(policy);
  EXPECT_CONTAINS(text, "generation 9");
  Result<Policy> parsed = parse(text);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString() << "\n" << text;
  Policy expected = policy;
  expected.generation = 0;  // assigned by the ledger, never read from a file
  EXPECT_EQ(parsed.value(), expected);
}

TEST(PolicyTomlTest, ExampleRoundTrips) {
  Result<Policy> policy = parsePolicyFile(TALLY_SOURCE_DIR "/examples/policy.toml");
  ASSERT_TRUE(policy.isOk()) << policy.status().toString();
  Result<Policy> again = parse(policyToToml(policy.value()));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again.value(), policy.value());
}

}  // namespace
}  // namespace tally::ctl
