#include "agent/config.h"
#include "central-client/ledger_addresses.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string_view>

#include "common/config_parse.h"
#include "core/partition_map.h"

namespace tally::agent {
namespace {

// The keys of the file: top level, then the [health] and [emergency] tables.
const std::vector<std::string> kTopKeys = {"socket",
                                           "socket_mode",
                                           "allowed_uids",
                                           "allowed_gids",
                                           "metrics_listen",
                                           "request_timeout_ms",
                                           "busy_poll_us",
                                           "health",
                                           "outbox_entries_max",
                                           "policy_refresh_ms",
                                           "drain_timeout_ms",
                                           "frame_bytes_max",
                                           "log_level",
                                           "gateway_name",
                                           "identity_file",
                                           "ledger_public_keys",
                                           "emergency",
                                           "http_socket",
                                           "http_listen",
                                           "scheduling",
                                           "insecure",
                                           "connections_max",
                                           "buffered_bytes_max",
                                           "connection_write_queue_bytes_max",
                                           "connection_stall_timeout_ms"};
const std::vector<std::string> kHealthKeys = {"failures_to_degrade", "failures_to_partition",
                                              "slow_request_us", "partition_after_ms",
                                              "successes_to_recover"};
const std::vector<std::string> kEmergencyKeys = {
    "accounts", "shards_on_hand", "refresh_before_expiry_ms", "hold_ttl_ms", "accounts_max"};
const std::vector<std::string> kSchedulingKeys = {"started_max", "fairness_window"};

Status readIdList(const toml::table& table, const std::string& path, const char* key,
                  std::vector<uint32_t>* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return Status::ok();
  const toml::array* array = node->as_array();
  if (array == nullptr) return configKeyError(path, key, "must be a list of integers");
  out->clear();
  for (const toml::node& element : *array) {
    // Type first: value<int64_t>() would convert a float, out of range is UB.
    const int64_t value = element.is_integer() ? element.as_integer()->get() : -1;
    if (value < 0 || value > 0xFFFFFFFFll) {
      return configKeyError(path, key, "must be a list of integers in [0, 4294967295]");
    }
    out->push_back(static_cast<uint32_t>(value));
  }
  return Status::ok();
}

Status readMode(const toml::table& table, const std::string& path, uint32_t* out) {
  const toml::node* node = table.get("socket_mode");
  if (node == nullptr) return Status::ok();
  uint64_t mode = 0;
  if (node->is_integer()) {
    const int64_t value = *node->value<int64_t>();
    if (value < 0) return configKeyError(path, "socket_mode", "must be in [0, 0777]");
    mode = static_cast<uint64_t>(value);
  } else if (const auto text = node->value<std::string>()) {
    const char* begin = text->data();
    const char* end = begin + text->size();
    auto [ptr, ec] = std::from_chars(begin, end, mode, 8);
    if (text->empty() || ec != std::errc() || ptr != end) {
      return configKeyError(path, "socket_mode", "must be an octal string such as \"0660\"");
    }
  } else {
    return configKeyError(path, "socket_mode", "must be an integer (0o660) or an octal string");
  }
  if (mode > 0777) return configKeyError(path, "socket_mode", "must be in [0, 0777]");
  *out = static_cast<uint32_t>(mode);
  return Status::ok();
}

Status readHealth(const toml::table& root, const std::string& path, LinkHealthThresholds* out) {
  const toml::node* node = root.get("health");
  if (node == nullptr) return Status::ok();
  const toml::table* table = node->as_table();
  if (table == nullptr) return configKeyError(path, "health", "must be a table");
  static const std::set<std::string> kKnown(kHealthKeys.begin(), kHealthKeys.end());
  for (const auto& [key, value] : *table) {
    if (!kKnown.contains(std::string(key.str()))) {
      return configKeyError(path, "health." + std::string(key.str()), "unknown key");
    }
  }
  uint64_t value = out->failures_to_degrade;
  if (Status s = readUnsigned(*table, path, "failures_to_degrade", 1, 1'000'000, &value);
      !s.isOk()) {
    return s;
  }
  out->failures_to_degrade = static_cast<uint32_t>(value);
  value = out->failures_to_partition;
  if (Status s = readUnsigned(*table, path, "failures_to_partition", 1, 1'000'000, &value);
      !s.isOk()) {
    return s;
  }
  out->failures_to_partition = static_cast<uint32_t>(value);
  value = out->successes_to_recover;
  if (Status s = readUnsigned(*table, path, "successes_to_recover", 1, 1'000'000, &value);
      !s.isOk()) {
    return s;
  }
  out->successes_to_recover = static_cast<uint32_t>(value);
  if (Status s =
          readUnsigned(*table, path, "slow_request_us", 1, 3'600'000'000ull, &out->slow_request_us);
      !s.isOk()) {
    return s;
  }
  return readUnsigned(*table, path, "partition_after_ms", 1, 3'600'000, &out->partition_after_ms);
}

Status readStringList(const toml::table& table, const std::string& path, const std::string& key,
                      std::vector<std::string>* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return Status::ok();
  const toml::array* array = node->as_array();
  if (array == nullptr) return configKeyError(path, key, "must be a list of strings");
  for (const toml::node& element : *array) {
    const auto text = element.value<std::string>();
    if (!element.is_string() || !text || text->empty()) {
      return configKeyError(path, key, "must be a list of non-empty strings");
    }
    out->push_back(*text);
  }
  return Status::ok();
}

Status readEmergency(const toml::table& root, const std::string& path, EmergencyConfig* out) {
  const toml::node* node = root.get("emergency");
  if (node == nullptr) return Status::ok();
  const toml::table* table = node->as_table();
  if (table == nullptr) return configKeyError(path, "emergency", "must be a table");
  static const std::set<std::string> kKnown(kEmergencyKeys.begin(), kEmergencyKeys.end());
  for (const auto& [key, value] : *table) {
    if (!kKnown.contains(std::string(key.str()))) {
      return configKeyError(path, "emergency." + std::string(key.str()), "unknown key");
    }
  }
  std::vector<std::string> accounts;
  if (Status s = readStringList(*table, path, "accounts", &accounts); !s.isOk()) return s;
  for (const std::string& account : accounts) {
    const size_t space = account.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == account.size() ||
        account.find(' ', space + 1) != std::string::npos) {
      return configKeyError(path, "emergency.accounts",
                            "'" + account + "' is not \"SUBJECT ROUTE\" (one space)");
    }
    out->accounts.emplace_back(account.substr(0, space), account.substr(space + 1));
  }
  if (Status s = readUnsigned(*table, path, "shards_on_hand", 0, 16, &out->shards_on_hand);
      !s.isOk()) {
    return s;
  }
  if (Status s = readUnsigned(*table, path, "refresh_before_expiry_ms", 0, 86'400'000,
                              &out->refresh_before_expiry_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(*table, path, "hold_ttl_ms", 1, limits::kHoldTtlMsMax, &out->hold_ttl_ms);
      !s.isOk()) {
    return s;
  }
  return readUnsigned(*table, path, "accounts_max", 0, 1'000'000, &out->accounts_max);
}

Status readScheduling(const toml::table& root, const std::string& path, SchedulingConfig* out) {
  const toml::node* node = root.get("scheduling");
  if (node == nullptr) return Status::ok();
  const toml::table* table = node->as_table();
  if (table == nullptr) return configKeyError(path, "scheduling", "must be a table");
  static const std::set<std::string> kKnown(kSchedulingKeys.begin(), kSchedulingKeys.end());
  for (const auto& [key, value] : *table) {
    if (!kKnown.contains(std::string(key.str()))) {
      return configKeyError(path, "scheduling." + std::string(key.str()), "unknown key");
    }
  }
  if (const toml::node* limits_node = table->get("started_max")) {
    const toml::table* routes = limits_node->as_table();
    if (routes == nullptr || routes->empty() || routes->size() > limits::kFairRoutesMax) {
      return configKeyError(path, "scheduling.started_max",
                            "must be a table of 1 .. " + std::to_string(limits::kFairRoutesMax) +
                                " routes: { \"ROUTE\" = N, … }");
    }
    for (const auto& [route, limit] : *routes) {
      const int64_t value = limit.is_integer() ? limit.as_integer()->get() : 0;
      if (route.str().empty() || route.str().size() > limits::kRouteBytesMax || value < 1 ||
          value > 1'000'000) {
        return configKeyError(path, "scheduling.started_max",
                              "'" + std::string(route.str()) +
                                  "' needs a route of 1 .. 256 bytes and a limit in [1, 1000000]");
      }
      out->started_max[std::string(route.str())] = static_cast<uint64_t>(value);
    }
  }
  return readUnsigned(*table, path, "fairness_window", 1, limits::kFairnessWindowAdmissionsMax,
                      &out->fairness_window);
}

}  // namespace

Status parseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  return tally::parseHostPort(text, "address", "port", host, port);
}

Status applyLedgerAddresses(const std::string& text, AgentConfig* config) {
  config->ledger_also.clear();
  if (text.find(',') == std::string::npos) {
    return parseHostPort(text, &config->ledger_host, &config->ledger_port);
  }
  Result<std::vector<client::Endpoint>> parsed = client::parseLedgerAddresses(text);
  if (!parsed.isOk()) return parsed.status();
  std::vector<client::Endpoint>& addresses = parsed.value();
  config->ledger_host = addresses.front().host;
  config->ledger_port = addresses.front().port;
  config->ledger_also.assign(addresses.begin() + 1, addresses.end());
  return Status::ok();
}

// `ledger = "H:P"`, `ledger = "H:P,H:P"` or `ledger = ["H:P", "H:P"]`.
static Status readLedgerAddresses(const toml::table& table, const std::string& path,
                                  AgentConfig* config) {
  const toml::node* node = table.get("ledger");
  if (node == nullptr) return Status::ok();
  std::string text;
  if (const auto single = node->value<std::string>(); node->is_string() && single) {
    text = *single;
  } else if (const toml::array* list = node->as_array(); list != nullptr && !list->empty()) {
    for (const toml::node& item : *list) {
      const auto address = item.value<std::string>();
      if (!item.is_string() || !address) {
        return configKeyError(path, "ledger", "must be \"HOST:PORT\" or a list of them");
      }
      text += (text.empty() ? "" : ",") + *address;
    }
  } else {
    return configKeyError(path, "ledger", "must be \"HOST:PORT\" or a list of them");
  }
  if (Status s = applyLedgerAddresses(text, config); !s.isOk()) {
    return configKeyError(path, "ledger", s.message());
  }
  config->ledger_configured = true;
  return Status::ok();
}

Status applyPartitions(const std::string& text, AgentConfig* config) {
  Result<PartitionMap> map = parsePartitionMap(text);
  if (!map.isOk()) return map.status();
  std::vector<std::vector<client::Endpoint>> partitions;
  for (size_t i = 0; i < map.value().partitions.size(); ++i) {
    std::string addresses;
    for (const std::string& address : map.value().partitions[i]) {
      addresses += (addresses.empty() ? "" : ",") + address;
    }
    Result<std::vector<client::Endpoint>> parsed = client::parseLedgerAddresses(addresses);
    if (!parsed.isOk()) {
      return Status::invalidArgument("partition " + std::to_string(i) + ": " +
                                     parsed.status().message());
    }
    partitions.push_back(std::move(parsed).value());
  }
  config->partitions = std::move(partitions);
  return Status::ok();
}

// `partitions = [["A1", "A2"], ["B1", "B2"]]`: a list of partitions, each a list of addresses.
static Status readPartitions(const toml::table& table, const std::string& path,
                             AgentConfig* config) {
  const toml::node* node = table.get("partitions");
  if (node == nullptr) return Status::ok();
  constexpr const char* kShape = "must be a list of partitions, each a list of \"HOST:PORT\"";
  const toml::array* list = node->as_array();
  if (list == nullptr || list->empty()) return configKeyError(path, "partitions", kShape);
  std::string text;
  for (const toml::node& partition : *list) {
    const toml::array* addresses = partition.as_array();
    if (addresses == nullptr || addresses->empty()) {
      return configKeyError(path, "partitions", kShape);
    }
    std::string one;
    for (const toml::node& item : *addresses) {
      const auto address = item.value<std::string>();
      if (!item.is_string() || !address || address->empty() ||
          address->find_first_of(",;") != std::string::npos) {
        return configKeyError(path, "partitions", kShape);
      }
      one += (one.empty() ? "" : ",") + *address;
    }
    text += (text.empty() ? "" : ";") + one;
  }
  if (Status s = applyPartitions(text, config); !s.isOk()) {
    return configKeyError(path, "partitions", s.message());
  }
  config->partitions_configured = true;
  return Status::ok();
}

Status applyMetricsListen(const std::string& text, AgentConfig* config) {
  if (text.empty()) {
    config->metrics_enabled = false;
    return Status::ok();
  }
  config->metrics_enabled = true;
  return parseHostPort(text, &config->metrics_host, &config->metrics_port);
}

std::string httpSocketPath(const AgentConfig& config) {
  if (config.http_socket_path.has_value()) return *config.http_socket_path;
  const std::string& native = config.socket_path;
  constexpr std::string_view kSuffix = ".sock";
  if (native.ends_with(kSuffix)) {
    return native.substr(0, native.size() - kSuffix.size()) + "-http" + std::string(kSuffix);
  }
  return native + "-http";
}

Status applyHttpListen(const std::string& text, AgentConfig* config) {
  if (text.empty()) {
    config->http_tcp_enabled = false;
    return Status::ok();
  }
  std::string host;
  uint16_t port = 0;
  if (Status s = parseHostPort(text, &host, &port); !s.isOk()) return s;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:PORT
  }
  // No peer credentials on TCP: only this host's own processes may reach it.
  if (!host.starts_with("127.") && host != "::1") {
    return Status::invalidArgument("'" + host + "' is not a loopback address (127.0.0.0/8 or ::1)");
  }
  config->http_tcp_enabled = true;
  config->http_tcp_host = host;
  config->http_tcp_port = port;
  return Status::ok();
}

// Top-level keys of the HTTP listener's timeouts (agent/http_server.h).
const std::vector<std::string> kHttpTimeoutKeys = {"http_header_timeout_ms", "http_idle_timeout_ms",
                                                   "http_linger_ms"};

// The ledger's addresses (applyLedgerAddresses), also --ledger.
const std::vector<std::string> kLedgerKeys = {"ledger", "partitions"};

const std::vector<std::string>& configKeys() {
  static const std::vector<std::string> kKeys = [] {
    std::vector<std::string> keys;
    for (const std::string& key : kTopKeys) {
      if (key != "health" && key != "emergency" && key != "scheduling") keys.push_back(key);
    }
    for (const std::string& key : kEmergencyKeys) keys.push_back("emergency." + key);
    for (const std::string& key : kSchedulingKeys) keys.push_back("scheduling." + key);
    for (const std::string& key : kHealthKeys) keys.push_back("health." + key);
    keys.insert(keys.end(), kHttpTimeoutKeys.begin(), kHttpTimeoutKeys.end());
    keys.insert(keys.end(), kLedgerKeys.begin(), kLedgerKeys.end());
    return keys;
  }();
  return kKeys;
}

Status applyConfigFile(const std::string& path, AgentConfig* config) {
  static const std::set<std::string> kKnown = [] {
    std::set<std::string> known(kTopKeys.begin(), kTopKeys.end());
    known.insert(kHttpTimeoutKeys.begin(), kHttpTimeoutKeys.end());
    known.insert(kLedgerKeys.begin(), kLedgerKeys.end());
    return known;
  }();
  Result<toml::table> read = readConfigTable(path, kKnown);
  if (!read.isOk()) return read.status();
  const toml::table& table = read.value();
  if (const toml::node* node = table.get("socket")) {
    const auto text = node->value<std::string>();
    if (!node->is_string() || !text || text->empty()) {
      return configKeyError(path, "socket", "must be a non-empty path");
    }
    config->socket_path = *text;
  }
  if (const toml::node* node = table.get("metrics_listen")) {
    const auto text = node->value<std::string>();
    if (!node->is_string() || !text) {
      return configKeyError(path, "metrics_listen", "must be a string");
    }
    if (Status s = applyMetricsListen(*text, config); !s.isOk()) {
      return configKeyError(path, "metrics_listen", s.message());
    }
  }
  if (const toml::node* node = table.get("http_socket")) {
    const auto text = node->value<std::string>();
    if (!node->is_string() || !text) {
      return configKeyError(path, "http_socket", "must be a path, or \"\" to disable it");
    }
    config->http_socket_path = *text;
  }
  if (const toml::node* node = table.get("http_listen")) {
    const auto text = node->value<std::string>();
    if (!node->is_string() || !text) return configKeyError(path, "http_listen", "must be a string");
    if (Status s = applyHttpListen(*text, config); !s.isOk()) {
      return configKeyError(path, "http_listen", s.message());
    }
  }
  if (const toml::node* node = table.get("log_level")) {
    const auto text = node->value<std::string>();
    if (!node->is_string() || !text) return configKeyError(path, "log_level", "must be a string");
    config->log_level = *text;
  }
  for (const char* key : {"gateway_name", "identity_file"}) {
    if (const toml::node* node = table.get(key)) {
      const auto text = node->value<std::string>();
      if (!node->is_string() || !text || text->empty()) {
        return configKeyError(path, key, "must be a non-empty string");
      }
      (std::string_view(key) == "gateway_name" ? config->gateway_name : config->identity_file) =
          *text;
    }
  }
  if (Status s = readStringList(table, path, "ledger_public_keys", &config->ledger_public_keys);
      !s.isOk()) {
    return s;
  }
  if (const toml::node* node = table.get("insecure")) {
    const auto flag = node->value<bool>();
    if (!node->is_boolean() || !flag)
      return configKeyError(path, "insecure", "must be true or false");
    config->insecure = *flag;
  }
  if (Status s = readEmergency(table, path, &config->emergency); !s.isOk()) return s;
  if (Status s = readLedgerAddresses(table, path, config); !s.isOk()) return s;
  if (Status s = readPartitions(table, path, config); !s.isOk()) return s;
  if (config->ledger_configured && config->partitions_configured) {
    return configKeyError(path, "partitions",
                          "is exclusive with 'ledger' (give one partition's addresses with "
                          "'ledger', or every partition with 'partitions')");
  }
  if (Status s = readScheduling(table, path, &config->scheduling); !s.isOk()) return s;
  if (Status s = readMode(table, path, &config->socket_mode); !s.isOk()) return s;
  if (table.contains("allowed_uids") || table.contains("allowed_gids")) {
    config->allowed_ids_configured = true;
  }
  if (Status s = readIdList(table, path, "allowed_uids", &config->allowed_uids); !s.isOk()) {
    return s;
  }
  if (Status s = readIdList(table, path, "allowed_gids", &config->allowed_gids); !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "request_timeout_ms", 1, 600'000, &config->request_timeout_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "busy_poll_us", 0, kBusyPollUsMax, &config->busy_poll_us);
      !s.isOk()) {
    return s;
  }
  if (Status s = readUnsigned(table, path, "outbox_entries_max", 1, 100'000'000,
                              &config->outbox_entries_max);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "policy_refresh_ms", 10, 3'600'000, &config->policy_refresh_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "drain_timeout_ms", 0, 600'000, &config->drain_timeout_ms);
      !s.isOk()) {
    return s;
  }
  if (Status s =
          readUnsigned(table, path, "frame_bytes_max", 1024, 64u << 20, &config->frame_bytes_max);
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
  for (auto [key, target] : {std::pair{"http_header_timeout_ms", &config->http_header_timeout_ms},
                             std::pair{"http_idle_timeout_ms", &config->http_idle_timeout_ms},
                             std::pair{"http_linger_ms", &config->http_linger_ms}}) {
    if (Status s = readUnsigned(table, path, key, 1, 3'600'000, target); !s.isOk()) return s;
  }
  return readHealth(table, path, &config->health);
}

void applyDefaultPeers(AgentConfig* config, uid_t own_uid, gid_t own_gid) {
  if (config->allowed_ids_configured) return;
  config->allowed_uids = {static_cast<uint32_t>(own_uid)};
  if (own_uid != 0) config->allowed_uids.push_back(0);
  config->allowed_gids = {static_cast<uint32_t>(own_gid)};
  if (own_gid != 0) config->allowed_gids.push_back(0);
}

Status validateConfig(const AgentConfig& config) {
  if (config.data_dir.empty()) return Status::invalidArgument("--data-dir is required");
  if (config.socket_path.empty()) return Status::invalidArgument("socket path is empty");
  if (config.socket_path.size() >= 108) {
    return Status::invalidArgument("socket path '" + config.socket_path +
                                   "' is longer than 107 bytes");
  }
  if (const std::string http = httpSocketPath(config); http.size() >= 108) {
    return Status::invalidArgument("http socket path '" + http + "' is longer than 107 bytes");
  } else if (!http.empty() && http == config.socket_path) {
    return Status::invalidArgument("the http socket and the socket are the same path '" + http +
                                   "'");
  }
  static const std::set<std::string> kLevels = {"debug", "info", "warn", "error"};
  if (!kLevels.contains(config.log_level)) {
    return Status::invalidArgument("log_level must be debug, info, warn or error");
  }
  if (config.health.failures_to_partition < config.health.failures_to_degrade) {
    return Status::invalidArgument(
        "health.failures_to_partition must be >= health.failures_to_degrade");
  }
  return Status::ok();
}

}  // namespace tally::agent
