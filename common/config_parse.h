#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "core/status.h"

// Parsing shared by the daemons' config files and flags: HOST:PORT addresses and bounded
// unsigned TOML integers, with errors that name the file, key or address.

namespace tally {

// "HOST:PORT" with a numeric port (0 allowed: pick a free one). Errors name `what` ("address",
// "listen address") and its port ("port", "listen port").
Status parseHostPort(const std::string& text, std::string_view what, std::string_view what_port,
                     std::string* host, uint16_t* port);

// Parses the TOML file `path`; kInvalidArgument for a syntax error or a top-level key not in
// `known`.
Result<toml::table> readConfigTable(const std::string& path, const std::set<std::string>& known);

// kInvalidArgument "PATH: key 'KEY': WHY".
Status configKeyError(const std::string& path, const std::string& key, const std::string& why);

// Reads `key` of `table` (file `path`) into `*out` when present: an integer in [min, max].
Status readUnsigned(const toml::table& table, const std::string& path, const std::string& key,
                    uint64_t min, uint64_t max, uint64_t* out);

// The connection bounds both daemons read (docs/security.md "Connections and limits"), each
// when present and within its range.
struct ConnectionKeys {
  uint64_t* connections_max;
  uint64_t* buffered_bytes_max;
  uint64_t* connection_write_queue_bytes_max;
  uint64_t* connection_stall_timeout_ms;
};
Status readConnectionKeys(const toml::table& table, const std::string& path, ConnectionKeys keys);

}  // namespace tally
