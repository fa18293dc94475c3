// The shipped default configs (packaging/config/*.toml) and docs/configuration.md against the
// parsers' own key lists: the three say the same keys, so none can drift. The shipped files
// parse as they are, and with every commented key line uncommented (the examples and defaults
// they show are valid; the alternatives `ledger` and `partitions` each without the other), and
// the ledger's stays on loopback until TLS.

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/config.h"
#include "ledger/config.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string sourcePath(const std::string& relative) {
  return std::string(TALLY_SOURCE_DIR) + "/" + relative;
}

// The backticked first cells of the table rows under the "## HEADING..." section.
std::set<std::string> documentedKeys(const std::string& doc, const std::string& heading) {
  std::set<std::string> keys;
  std::istringstream lines(doc);
  std::string line;
  bool in_section = false;
  const std::regex row(R"(^\| `([a-z_.]+)` \|)");
  while (std::getline(lines, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line.rfind("## " + heading, 0) == 0;
    std::smatch match;
    if (in_section && std::regex_search(line, match, row)) keys.insert(match[1]);
  }
  return keys;
}

// The keys a TOML file shows as "# KEY = ..." or "KEY = ..." lines, dotted with the "[TABLE]"
// (or "# [TABLE]") header above them.
std::set<std::string> shownKeys(const std::string& text) {
  std::set<std::string> keys;
  std::istringstream lines(text);
  std::string line, table;
  const std::regex header(R"(^(# )?\[([a-z_]+)\]\s*$)");
  const std::regex key(R"(^(# )?([a-z_]+) = )");
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_search(line, match, header)) {
      table = match[2];
    } else if (std::regex_search(line, match, key)) {
      keys.insert(table.empty() ? std::string(match[2]) : table + "." + std::string(match[2]));
    }
  }
  return keys;
}

// `text` without its "# KEY = VALUE" line(s) of `key` (a top-level key).
std::string withoutShownKey(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("# " + key + " = ", 0) == 0) continue;
    out << line << "\n";
  }
  return out.str();
}

// `text` with every "# KEY = VALUE" and "# [TABLE]" line uncommented.
std::string uncommented(const std::string& text) {
  std::istringstream lines(text);
  std::ostringstream out;
  std::string line;
  const std::regex shown(R"(^# (([a-z_]+ = .*)|(\[[a-z_]+\]\s*))$)");
  while (std::getline(lines, line)) {
    std::smatch match;
    out << (std::regex_match(line, match, shown) ? std::string(match[1]) : line) << "\n";
  }
  return out.str();
}

std::set<std::string> asSet(const std::vector<std::string>& keys) {
  return std::set<std::string>(keys.begin(), keys.end());
}

std::string writeTemp(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigKeys, AgentDocsShippedFileAndParserAgree) {
  const std::set<std::string> parser = asSet(agent::configKeys());
  EXPECT_EQ(parser.size(), agent::configKeys().size()) << "a key is listed twice";
  EXPECT_EQ(documentedKeys(readFile(sourcePath("docs/configuration.md")), "tally-agent"), parser);
  EXPECT_EQ(shownKeys(readFile(sourcePath("packaging/config/agent.toml"))), parser);
}

TEST(ConfigKeys, LedgerDocsShippedFileAndParserAgree) {
  const std::set<std::string> parser = asSet(ledger::configKeys());
  EXPECT_EQ(parser.size(), ledger::configKeys().size()) << "a key is listed twice";
  EXPECT_EQ(documentedKeys(readFile(sourcePath("docs/configuration.md")), "tally-ledger"), parser);
  EXPECT_EQ(shownKeys(readFile(sourcePath("packaging/config/ledger.toml"))), parser);
}

TEST(ConfigKeys, TheKeyListsAreWhatTheParsersAccept) {
  // Every listed key is accepted (a wrong type names it: it is known) and an unlisted one is not.
  TempDir dir;
  for (const std::string& key : agent::configKeys()) {
    const size_t dot = key.find('.');
    const std::string text = dot == std::string::npos ? key + " = {}\n"
                                                      : "[" + key.substr(0, dot) + "]\n" +
                                                            key.substr(dot + 1) + " = {}\n";
    agent::AgentConfig config;
    const Status status = agent::applyConfigFile(writeTemp(dir, "a.toml", text), &config);
    EXPECT_FALSE(status.isOk()) << key;
    EXPECT_EQ(status.message().find("unknown key"), std::string::npos) << status.message();
  }
  for (const std::string& key : ledger::configKeys()) {
    ledger::LedgerConfig config;
    const Status status =
        ledger::applyConfigFile(writeTemp(dir, "l.toml", key + " = {}\n"), &config);
    EXPECT_FALSE(status.isOk()) << key;
    EXPECT_EQ(status.message().find("unknown key"), std::string::npos) << status.message();
  }
  agent::AgentConfig agent_config;
  EXPECT_FALSE(
      agent::applyConfigFile(writeTemp(dir, "a.toml", "no_such_key = 1\n"), &agent_config).isOk());
  ledger::LedgerConfig ledger_config;
  EXPECT_FALSE(
      ledger::applyConfigFile(writeTemp(dir, "l.toml", "no_such_key = 1\n"), &ledger_config)
          .isOk());
}

TEST(ShippedConfig, AgentParsesAsShippedAndUncommented) {
  TempDir dir;
  const std::string text = readFile(sourcePath("packaging/config/agent.toml"));
  ASSERT_FALSE(text.empty());
  agent::AgentConfig shipped;
  Status status = agent::applyConfigFile(sourcePath("packaging/config/agent.toml"), &shipped);
  EXPECT_TRUE(status.isOk()) << status.toString();
  EXPECT_EQ(shipped.socket_path, agent::kDefaultSocketPath);
  // `ledger` and `partitions` are alternatives (exclusive): each is uncommented without the other.
  agent::AgentConfig partitioned;
  status = agent::applyConfigFile(
      writeTemp(dir, "agent.toml", uncommented(withoutShownKey(text, "ledger"))), &partitioned);
  EXPECT_TRUE(status.isOk()) << status.toString();
  EXPECT_EQ(partitioned.partitions.size(), 1u);
  EXPECT_FALSE(partitioned.ledger_configured);
  agent::AgentConfig all;
  status = agent::applyConfigFile(
      writeTemp(dir, "agent.toml", uncommented(withoutShownKey(text, "partitions"))), &all);
  EXPECT_TRUE(status.isOk()) << status.toString();
  EXPECT_TRUE(all.ledger_configured);
  // The defaults it shows are the built-in ones.
  const agent::AgentConfig defaults;
  EXPECT_EQ(all.socket_path, defaults.socket_path);
  EXPECT_EQ(all.socket_mode, defaults.socket_mode);
  EXPECT_EQ(all.metrics_host, defaults.metrics_host);
  EXPECT_EQ(all.metrics_port, defaults.metrics_port);
  EXPECT_EQ(all.request_timeout_ms, defaults.request_timeout_ms);
  EXPECT_EQ(all.outbox_entries_max, defaults.outbox_entries_max);
  EXPECT_EQ(all.policy_refresh_ms, defaults.policy_refresh_ms);
  EXPECT_EQ(all.drain_timeout_ms, defaults.drain_timeout_ms);
  EXPECT_EQ(all.frame_bytes_max, defaults.frame_bytes_max);
  EXPECT_EQ(all.log_level, defaults.log_level);
  EXPECT_EQ(all.emergency.shards_on_hand, defaults.emergency.shards_on_hand);
  EXPECT_EQ(all.emergency.refresh_before_expiry_ms, defaults.emergency.refresh_before_expiry_ms);
  EXPECT_EQ(all.emergency.hold_ttl_ms, defaults.emergency.hold_ttl_ms);
  EXPECT_EQ(all.emergency.accounts_max, defaults.emergency.accounts_max);
  EXPECT_EQ(all.health.failures_to_degrade, defaults.health.failures_to_degrade);
  EXPECT_EQ(all.health.failures_to_partition, defaults.health.failures_to_partition);
  EXPECT_EQ(all.health.slow_request_us, defaults.health.slow_request_us);
  EXPECT_EQ(all.health.partition_after_ms, defaults.health.partition_after_ms);
  EXPECT_EQ(all.health.successes_to_recover, defaults.health.successes_to_recover);
}

TEST(ShippedConfig, LedgerParsesAsShippedAndUncommentedAndStaysOnLoopback) {
  TempDir dir;
  const std::string text = readFile(sourcePath("packaging/config/ledger.toml"));
  ASSERT_FALSE(text.empty());
  ledger::LedgerConfig shipped;
  Status status = ledger::applyConfigFile(sourcePath("packaging/config/ledger.toml"), &shipped);
  EXPECT_TRUE(status.isOk()) << status.toString();
  EXPECT_EQ(shipped.listen_host, "127.0.0.1");
  ledger::LedgerConfig all;
  status = ledger::applyConfigFile(writeTemp(dir, "ledger.toml", uncommented(text)), &all);
  EXPECT_TRUE(status.isOk()) << status.toString();
  const ledger::LedgerConfig defaults;
  EXPECT_EQ(all.listen_host, "127.0.0.1");  // loopback until TLS (issue 12)
  EXPECT_EQ(all.listen_port, defaults.listen_port);
  EXPECT_EQ(all.metrics_host, defaults.metrics_host);
  EXPECT_EQ(all.metrics_port, defaults.metrics_port);
  EXPECT_EQ(all.frame_bytes_max, defaults.frame_bytes_max);
  EXPECT_EQ(all.retention_ms, defaults.retention_ms);
  EXPECT_EQ(all.shard_retention_ms, defaults.shard_retention_ms);
  EXPECT_EQ(all.receipt_bytes_max, defaults.receipt_bytes_max);
  EXPECT_EQ(all.tick_interval_ms, defaults.tick_interval_ms);
  EXPECT_EQ(all.checkpoint_log_rows, defaults.checkpoint_log_rows);
  EXPECT_EQ(all.commit_mode, defaults.commit_mode);
  EXPECT_EQ(all.log_level, defaults.log_level);
}

// commit_mode: "auto" by default, which commits on the loop for sqlite and on a thread for
// postgres; "loop" and "thread" say so for either store; anything else is refused, naming the key.
TEST(LedgerConfigKeys, CommitModeResolvesByStoreAndRefusesOtherValues) {
  TempDir dir;
  ledger::LedgerConfig config{.data_dir = dir.path()};
  EXPECT_EQ(config.commit_mode, "auto");
  EXPECT_TRUE(ledger::commitsOnLoop(config));
  config.store = "postgres";
  config.postgres_conninfo = "dbname=tally";
  EXPECT_FALSE(ledger::commitsOnLoop(config));
  ASSERT_TRUE(ledger::applyConfigFile(writeTemp(dir, "l.toml", "commit_mode = \"loop\"\n"), &config)
                  .isOk());
  EXPECT_TRUE(ledger::validateConfig(config).isOk());
  EXPECT_TRUE(ledger::commitsOnLoop(config));
  config.store = "sqlite";
  config.postgres_conninfo.clear();
  ASSERT_TRUE(
      ledger::applyConfigFile(writeTemp(dir, "l.toml", "commit_mode = \"thread\"\n"), &config)
          .isOk());
  EXPECT_TRUE(ledger::validateConfig(config).isOk());
  EXPECT_FALSE(ledger::commitsOnLoop(config));

  const Status not_text =
      ledger::applyConfigFile(writeTemp(dir, "l.toml", "commit_mode = 1\n"), &config);
  EXPECT_FALSE(not_text.isOk());
  EXPECT_NE(not_text.message().find("commit_mode"), std::string::npos) << not_text.message();
  ASSERT_TRUE(
      ledger::applyConfigFile(writeTemp(dir, "l.toml", "commit_mode = \"inline\"\n"), &config)
          .isOk());
  const Status unknown = ledger::validateConfig(config);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("commit_mode"), std::string::npos) << unknown.message();
}

// shard_retention_ms: its own key, a day by default (not the receipts' 15-minute window), read
// and range-checked with an error naming the key.
TEST(LedgerConfigKeys, ShardRetentionIsReadAndRangeChecked) {
  TempDir dir;
  const ledger::LedgerConfig defaults;
  EXPECT_EQ(defaults.shard_retention_ms, 24ull * 3600 * 1000);
  EXPECT_GT(defaults.shard_retention_ms, defaults.retention_ms);
  ledger::LedgerConfig config;
  ASSERT_TRUE(
      ledger::applyConfigFile(writeTemp(dir, "l.toml", "shard_retention_ms = 5000\n"), &config)
          .isOk());
  EXPECT_EQ(config.shard_retention_ms, 5'000u);
  EXPECT_EQ(config.retention_ms, defaults.retention_ms);
  for (const char* bad : {"shard_retention_ms = 999\n", "shard_retention_ms = 31536000001\n",
                          "shard_retention_ms = -1\n", "shard_retention_ms = \"1d\"\n"}) {
    const Status status = ledger::applyConfigFile(writeTemp(dir, "l.toml", bad), &config);
    EXPECT_FALSE(status.isOk()) << bad;
    EXPECT_NE(status.message().find("shard_retention_ms"), std::string::npos) << status.message();
  }
}

}  // namespace
}  // namespace tally::testing
