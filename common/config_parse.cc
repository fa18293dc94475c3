#include "common/config_parse.h"

#include <charconv>

namespace tally {

Status parseHostPort(const std::string& text, std::string_view what, std::string_view what_port,
                     std::string* host, uint16_t* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::invalidArgument(std::string(what) + " '" + text + "' is not HOST:PORT");
  }
  unsigned value = 0;
  const char* begin = text.data() + colon + 1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || value > 65535) {
    return Status::invalidArgument(std::string(what_port) + " in '" + text +
                                   "' is not a number 0..65535");
  }
  *host = text.substr(0, colon);
  *port = static_cast<uint16_t>(value);
  return Status::ok();
}

Status configKeyError(const std::string& path, const std::string& key, const std::string& why) {
  return Status::invalidArgument(path + ": key '" + key + "': " + why);
}

Result<toml::table> readConfigTable(const std::string& path, const std::set<std::string>& known) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& error) {
    return Status::invalidArgument(path + ": " + std::string(error.description()));
  }
  for (const auto& [key, node] : table) {
    if (!known.contains(std::string(key.str()))) {
      return configKeyError(path, std::string(key.str()), "unknown key");
    }
  }
  return table;
}

Status readUnsigned(const toml::table& table, const std::string& path, const std::string& key,
                    uint64_t min, uint64_t max, uint64_t* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return Status::ok();
  // Type first: value<int64_t>() converts a float node, and a float out of int64's range is UB.
  if (!node->is_integer()) return configKeyError(path, key, "must be an integer");
  const int64_t value = node->as_integer()->get();
  if (value < 0 || static_cast<uint64_t>(value) < min || static_cast<uint64_t>(value) > max) {
    return configKeyError(path, key,
                          "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = static_cast<uint64_t>(value);
  return Status::ok();
}

Status readConnectionKeys(const toml::table& table, const std::string& path, ConnectionKeys keys) {
  struct Bounded {
    const char* key;
    uint64_t min;
    uint64_t max;
    uint64_t* target;
  };
  for (const Bounded& bounded :
       {Bounded{"connections_max", 1, 1'000'000, keys.connections_max},
        Bounded{"buffered_bytes_max", uint64_t{1} << 20, uint64_t{1} << 40,
                keys.buffered_bytes_max},
        Bounded{"connection_write_queue_bytes_max", uint64_t{64} << 10, uint64_t{1} << 30,
                keys.connection_write_queue_bytes_max},
        Bounded{"connection_stall_timeout_ms", 0, 3'600'000, keys.connection_stall_timeout_ms}}) {
    if (Status s = readUnsigned(table, path, bounded.key, bounded.min, bounded.max, bounded.target);
        !s.isOk()) {
      return s;
    }
  }
  return Status::ok();
}

}  // namespace tally
