#include "ledger/config.h"

#include <arpa/inet.h>
#include <toml++/toml.h>

#include <set>

#include "common/config_parse.h"

namespace tally::ledger {

bool isLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr address{};
  if (::inet_pton(AF_INET, host.c_str(), &address) != 1) return false;
  return (ntohl(address.s_addr) >> 24) == 127;
}

Status parseListen(const std::string& text, std::string* host, uint16_t* port) {
  return parseHostPort(text, "listen address", "listen port", host, port);
}

Status applyMetricsListen(const std::string& text, LedgerConfig* config) {
  if (text.empty()) {
    config->metrics_enabled = false;
    return Status::ok();
  }
  config->metrics_enabled = true;
  return parseHostPort(text, "metrics address", "metrics port", &config->metrics_host,
                       &config->metrics_port);
}

const std::vector<std::string>& configKeys() {
  static const std::vector<std::string> kKeys = {"listen",
                                                 "frame_bytes_max",
                                                 "retention_ms",
                                                 "tick_interval_ms",
                                                 "checkpoint_log_rows",
                                                 "commit_mode",
                                                 "log_level",
                                                 "metrics",
                                                 "store",
                                                 "postgres",
                                                 "lease_ms",
                                                 "standby",
                                                 "receipt_bytes_max",
                                                 "shard_retention_ms",
                                                 "insecure",
                                                 "connections_max",
                                                 "buffered_bytes_max",
                                                 "connection_write_queue_bytes_max",
                                                 "connection_stall_timeout_ms"};
  return kKeys;
}

Status applyConfigFile(const std::string& path, LedgerConfig* config) {
  static const std::set<std::string> kKnown(configKeys().begin(), configKeys().end());
  Result<toml::table> read = readConfigTable(path, kKnown);
  if (!read.isOk()) return read.status();
  const toml::table& table = read.value();
  if (const toml::node* node = table.get("listen")) {
    const auto text = node->value<std::string>();
    if (!text) return configKeyError(path, "listen", "must be a string HOST:PORT");
    if (Status s = parseListen(*text, &config->listen_host, &config->listen_port); !s.isOk()) {
      return configKeyError(path, "listen", s.message());
    }
  }
  if (const toml::node* node = table.get("metrics")) {
    const auto text = node->value<std::string>();
    if (!text) return configKeyError(path, "metrics", "must be a string HOST:PORT or \"\"");
    if (Status s = applyMetricsListen(*text, config); !s.isOk()) {
      return configKeyError(path, "metrics", s.message());
    }
  }
  if (const toml::node* node = table.get("log_level")) {
    const auto text = node->value<std::string>();
    if (!text) return configKeyError(path, "log_level", "must be a string");
    config->log_level = *text;
  }
  if (const toml::node* node = table.get("store")) {
    const auto text = node->value<std::string>();
    if (!text) return configKeyError(path, "store", "must be a string \"sqlite\" or \"postgres\"");
    config->store = *text;
  }
  if (const toml::node* node = table.get("commit_mode")) {
    const auto text = node->value<std::string>();
    if (!text)
      return configKeyError(path, "commit_mode", "must be \"auto\", \"loop\" or \"thread\"");
    config->commit_mode = *text;
  }
  if (const toml::node* node = table.get("postgres")) {
    const auto text = node->value<std::string>();
    if (!text) return configKeyError(path, "postgres", "must be a string (a libpq conninfo)");
    config->postgres_conninfo = *text;
  }
  if (const toml::node* node = table.get("insecure")) {
    const auto flag = node->value<bool>();
    if (!flag) return configKeyError(path, "insecure", "must be true or false");
    config->insecure = *flag;
  }
  if (const toml::node* node = table.get("standby")) {
    const auto flag = node->value<bool>();
    if (!flag) return configKeyError(path, "standby", "must be true or false");
    config->standby = *flag;
  }
  if (Status s = readUnsigned(table, path, "lease_ms", kLeaseMsMin, kLeaseMsMax, &config->lease_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "frame_bytes_max", 1024, 64u << 20, &config->frame_bytes_max);
      !s.isOk()) {
    return s;
  }
  if (Status s = readUnsigned(table, path, "retention_ms", 1000, 365ull * 24 * 3600 * 1000,
                              &config->retention_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s = readUnsigned(table, path, "shard_retention_ms", kShardRetentionMsMin,
                              kShardRetentionMsMax, &config->shard_retention_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s = readUnsigned(table, path, "receipt_bytes_max", uint64_t{1} << 20,
                              uint64_t{1} << 40, &config->receipt_bytes_max);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "tick_interval_ms", 1, 60'000, &config->tick_interval_ms);
      !s.isOk()) {
    return s;
  }
  // Connections: global bounds, then per connection (docs/security.md "Connections and limits").
  if (Status s = readConnectionKeys(
          table, path,
          {.connections_max = &config->connections_max,
           .buffered_bytes_max = &config->buffered_bytes_max,
           .connection_write_queue_bytes_max = &config->connection_write_queue_bytes_max,
           .connection_stall_timeout_ms = &config->connection_stall_timeout_ms});
      !s.isOk()) {
    return s;
  }
  return readUnsigned(table, path, "checkpoint_log_rows", 1, 1'000'000,
                      &config->checkpoint_log_rows);
}

std::string signingKeyPath(const LedgerConfig& config) {
  if (!config.signing_key_file.empty()) return config.signing_key_file;
  return config.data_dir + "/ledger.key";
}

Status validateConfig(const LedgerConfig& config) {
  if (config.data_dir.empty()) return Status::invalidArgument("--data-dir is required");
  static const std::set<std::string> kLevels = {"debug", "info", "warn", "error"};
  if (!kLevels.contains(config.log_level)) {
    return Status::invalidArgument("log_level must be debug, info, warn or error");
  }
  if (config.store != "sqlite" && config.store != "postgres") {
    return Status::invalidArgument("store must be \"sqlite\" or \"postgres\", not \"" +
                                   config.store + "\"");
  }
  if (config.commit_mode != "auto" && config.commit_mode != "loop" &&
      config.commit_mode != "thread") {
    return Status::invalidArgument("commit_mode must be \"auto\", \"loop\" or \"thread\", not \"" +
                                   config.commit_mode + "\"");
  }
  if (config.store == "postgres" && config.postgres_conninfo.empty()) {
    return Status::invalidArgument(
        "store \"postgres\" needs postgres = \"CONNINFO\" (or --postgres CONNINFO)");
  }
  if (config.store == "sqlite" && !config.postgres_conninfo.empty()) {
    return Status::invalidArgument(
        "postgres is set but store is \"sqlite\": set store = \"postgres\" (or --store "
        "postgres) to use it");
  }
  if (config.store == "sqlite" && config.standby) {
    return Status::invalidArgument(
        "standby needs store = \"postgres\": a standby waits for the lease in PostgreSQL");
  }
  if (config.insecure && !isLoopbackHost(config.listen_host)) {
    return Status::invalidArgument(
        "insecure (plaintext, no authentication) is refused on the non-loopback address " +
        config.listen_host + ": listen on 127.0.0.1, or drop --insecure / insecure = true");
  }
  if (config.lease_ms < kLeaseMsMin || config.lease_ms > kLeaseMsMax) {
    return Status::invalidArgument("lease_ms must be " + std::to_string(kLeaseMsMin) + " .. " +
                                   std::to_string(kLeaseMsMax));
  }
  return Status::ok();
}

bool commitsOnLoop(const LedgerConfig& config) {
  if (config.commit_mode == "auto") return config.store == "sqlite";
  return config.commit_mode == "loop";
}

}  // namespace tally::ledger
