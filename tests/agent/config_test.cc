#include "agent/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/agent/config_text.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

using test_support::applyText;

TEST(AgentConfigTest, EmergencyDefaults) {
  const AgentConfig config;
  EXPECT_TRUE(config.emergency.accounts.empty());
  EXPECT_EQ(config.emergency.shards_on_hand, 1u);
  EXPECT_EQ(config.emergency.refresh_before_expiry_ms, 30'000u);
  EXPECT_EQ(config.emergency.hold_ttl_ms, 30'000u);
  EXPECT_EQ(config.emergency.accounts_max, 1'000u);
  EXPECT_TRUE(config.ledger_public_keys.empty());
}

TEST(AgentConfigTest, ReadsIdentityKeysAndTheEmergencySection) {
  TempDir dir;
  AgentConfig config;
  const Status status = applyText(dir,
                                  "gateway_name = \"gw-7\"\n"
                                  "identity_file = \"/etc/tally/gw.key\"\n"
                                  "ledger_public_keys = [\"AAAA\", \"BBBB\"]\n"
                                  "[emergency]\n"
                                  "accounts = [\"tenant-a chat.generate\", \"tenant-b embed\"]\n"
                                  "shards_on_hand = 2\n"
                                  "refresh_before_expiry_ms = 5000\n"
                                  "hold_ttl_ms = 7000\n"
                                  "accounts_max = 9\n",
                                  &config);
  ASSERT_TRUE(status.isOk()) << status.toString();
  EXPECT_EQ(config.gateway_name, "gw-7");
  EXPECT_EQ(config.identity_file, "/etc/tally/gw.key");
  EXPECT_EQ(config.ledger_public_keys, (std::vector<std::string>{"AAAA", "BBBB"}));
  ASSERT_EQ(config.emergency.accounts.size(), 2u);
  EXPECT_EQ(config.emergency.accounts[0].first, "tenant-a");
  EXPECT_EQ(config.emergency.accounts[0].second, "chat.generate");
  EXPECT_EQ(config.emergency.shards_on_hand, 2u);
  EXPECT_EQ(config.emergency.refresh_before_expiry_ms, 5'000u);
  EXPECT_EQ(config.emergency.hold_ttl_ms, 7'000u);
  EXPECT_EQ(config.emergency.accounts_max, 9u);
}

// `ledger`: one address (parsed as --ledger always was), a comma list or a TOML list: a
// primary and its standbys (docs/scale-out.md).
TEST(AgentConfigTest, ReadsTheLedgerAddressOrAListOfThem) {
  TempDir dir;
  AgentConfig one;
  ASSERT_TRUE(applyText(dir, "ledger = \"10.0.0.5:7411\"\n", &one).isOk());
  EXPECT_TRUE(one.ledger_configured);
  EXPECT_EQ(one.ledger_host, "10.0.0.5");
  EXPECT_EQ(one.ledger_port, 7411);
  EXPECT_TRUE(one.ledger_also.empty());
  for (const char* text : {"ledger = [\"10.0.0.5:7411\", \"10.0.0.6:7412\"]\n",
                           "ledger = \"10.0.0.5:7411,10.0.0.6:7412\"\n"}) {
    AgentConfig list;
    const Status status = applyText(dir, text, &list);
    ASSERT_TRUE(status.isOk()) << text << status.toString();
    EXPECT_EQ(list.ledger_host, "10.0.0.5");
    EXPECT_EQ(list.ledger_port, 7411);
    ASSERT_EQ(list.ledger_also.size(), 1u) << text;
    EXPECT_EQ(list.ledger_also[0].host, "10.0.0.6");
    EXPECT_EQ(list.ledger_also[0].port, 7412);
  }
  // The flag's form replaces the file's list.
  AgentConfig replaced;
  ASSERT_TRUE(applyText(dir, "ledger = [\"a:1\", \"b:2\"]\n", &replaced).isOk());
  ASSERT_TRUE(applyLedgerAddresses("c:3", &replaced).isOk());
  EXPECT_EQ(replaced.ledger_host, "c");
  EXPECT_TRUE(replaced.ledger_also.empty());
  for (const char* bad :
       {"ledger = 7411\n", "ledger = []\n", "ledger = [1]\n", "ledger = \"a:1,,b:2\"\n",
        "ledger = [\"a:1\", \"a:1\"]\n", "ledger = \"nohost\"\n"}) {
    AgentConfig config;
    const Status status = applyText(dir, bad, &config);
    EXPECT_FALSE(status.isOk()) << bad;
    EXPECT_NE(status.message().find("'ledger'"), std::string::npos) << bad << status.toString();
  }
}

// `partitions`: a list of partitions, each a list of addresses, as tallyctl's --partitions text;
// exclusive with `ledger`.
TEST(AgentConfigTest, ReadsPartitionsAndRefusesThemBesideLedger) {
  TempDir dir;
  AgentConfig config;
  ASSERT_TRUE(applyText(dir,
                        "partitions = [[\"10.0.0.5:7411\", \"10.0.0.6:7411\"], "
                        "[\"10.0.1.5:7411\"]]\n",
                        &config)
                  .isOk());
  EXPECT_TRUE(config.partitions_configured);
  EXPECT_FALSE(config.ledger_configured);
  ASSERT_EQ(config.partitions.size(), 2u);
  ASSERT_EQ(config.partitions[0].size(), 2u);
  EXPECT_EQ(config.partitions[0][1].host, "10.0.0.6");
  ASSERT_EQ(config.partitions[1].size(), 1u);
  EXPECT_EQ(config.partitions[1][0].host, "10.0.1.5");
  EXPECT_EQ(config.partitions[1][0].port, 7411);

  AgentConfig flag;
  ASSERT_TRUE(applyPartitions("a:1, a:2 ; b:3", &flag).isOk());
  ASSERT_EQ(flag.partitions.size(), 2u);
  EXPECT_EQ(flag.partitions[0][1].port, 2);
  EXPECT_EQ(flag.partitions[1][0].host, "b");
  for (const char* bad : {"", "a:1;;b:2", "a:1;nohost", "a:1,a:1;b:2"}) {
    AgentConfig refused;
    EXPECT_FALSE(applyPartitions(bad, &refused).isOk()) << bad;
    EXPECT_TRUE(refused.partitions.empty()) << bad;
  }

  for (const char* bad : {"partitions = \"a:1;b:2\"\n", "partitions = []\n", "partitions = [[]]\n",
                          "partitions = [[\"a:1\"], \"b:2\"]\n", "partitions = [[\"a:1;b:2\"]]\n",
                          "partitions = [[\"nohost\"]]\n",
                          "ledger = \"a:1\"\npartitions = [[\"b:2\"], [\"c:3\"]]\n"}) {
    AgentConfig refused;
    const Status status = applyText(dir, bad, &refused);
    EXPECT_FALSE(status.isOk()) << bad;
    EXPECT_NE(status.message().find("'partitions'"), std::string::npos) << bad << status.toString();
  }
}

TEST(AgentConfigTest, RefusesMalformedEmergencySettingsNamingTheKey) {
  TempDir dir;
  const std::pair<const char*, const char*> cases[] = {
      {"[emergency]\naccounts = [\"no-route\"]\n", "emergency.accounts"},
      {"[emergency]\naccounts = [\"a b c\"]\n", "emergency.accounts"},
      {"[emergency]\nshards_on_hand = 17\n", "shards_on_hand"},
      {"[emergency]\nhold_ttl_ms = 0\n", "hold_ttl_ms"},
      {"[emergency]\nbogus = 1\n", "emergency.bogus"},
      {"ledger_public_keys = \"AAAA\"\n", "ledger_public_keys"},
      {"gateway_name = 3\n", "gateway_name"},
  };
  for (const auto& [text, key] : cases) {
    AgentConfig config;
    const Status status = applyText(dir, text, &config);
    EXPECT_FALSE(status.isOk()) << text;
    EXPECT_NE(status.message().find(key), std::string::npos) << status.message();
  }
}

// busy_poll_us (docs/AGENT.md "Busy polling"): off by default, at most a millisecond.
TEST(AgentConfigTest, BusyPollIsOffByDefaultAndBoundedToAMillisecond) {
  TempDir dir;
  EXPECT_EQ(AgentConfig{}.busy_poll_us, 0u);
  AgentConfig config;
  ASSERT_TRUE(applyText(dir, "busy_poll_us = 1000\n", &config).isOk());
  EXPECT_EQ(config.busy_poll_us, 1000u);
  for (const char* text :
       {"busy_poll_us = 1001\n", "busy_poll_us = -1\n", "busy_poll_us = 2.5\n"}) {
    AgentConfig refused;
    const Status status = applyText(dir, text, &refused);
    EXPECT_FALSE(status.isOk()) << text;
    EXPECT_NE(status.message().find("busy_poll_us"), std::string::npos) << status.message();
  }
}

// [scheduling] (docs/AGENT.md "Fair scheduling"): per-route limits on started work.
TEST(AgentConfigTest, ReadsTheSchedulingSection) {
  TempDir dir;
  AgentConfig config;
  EXPECT_TRUE(config.scheduling.started_max.empty());
  EXPECT_EQ(config.scheduling.fairness_window, 1'000u);
  const Status status = applyText(dir,
                                  "[scheduling]\n"
                                  "started_max = { \"chat.generate\" = 8, search = 2 }\n"
                                  "fairness_window = 50\n",
                                  &config);
  ASSERT_TRUE(status.isOk()) << status.toString();
  EXPECT_EQ(config.scheduling.started_max,
            (std::map<std::string, uint64_t>{{"chat.generate", 8}, {"search", 2}}));
  EXPECT_EQ(config.scheduling.fairness_window, 50u);
}

TEST(AgentConfigTest, RefusesMalformedSchedulingSettingsNamingTheKey) {
  TempDir dir;
  for (const char* text :
       {"[scheduling]\nstarted_max = {}\n", "[scheduling]\nstarted_max = { chat = 0 }\n",
        "[scheduling]\nstarted_max = { chat = \"8\" }\n",
        "[scheduling]\nstarted_max = [\"chat 8\"]\n", "[scheduling]\nfairness_window = 0\n",
        "[scheduling]\nno_such = 1\n"}) {
    AgentConfig config;
    const Status status = applyText(dir, text, &config);
    EXPECT_FALSE(status.isOk()) << text;
    const std::string& message = status.message();  // names the key
    EXPECT_TRUE(message.find("scheduling") != std::string::npos ||
                message.find("fairness_window") != std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace tally::agent
