#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/fair_scheduler.h"
#include "core/limits.h"
#include "core/link_health.h"
#include "core/status.h"
#include "net/connection_limits.h"

// tally-agent's configuration: defaults, then the TOML file (--config), then flags.
//
//   socket = "/run/tally/agent.sock"
//   socket_mode = 0o660                # or the string "0660"
//   allowed_uids = [1000]              # replaces the default (own uid and root)
//   allowed_gids = [1000]              # replaces the default (own gid and root's group)
//   metrics_listen = "127.0.0.1:9464"  # "" disables the metrics endpoint
//   http_socket = "/run/tally/agent-http.sock"  # HTTP/JSON; default: the socket's path with
//                                      # "-http" before ".sock"; "" disables it
//   http_listen = "127.0.0.1:8080"     # HTTP/JSON over loopback TCP; default "" (disabled)
//   http_header_timeout_ms = 10000     # an HTTP request not complete this long: closed
//   http_idle_timeout_ms = 60000       # an HTTP connection idle this long: closed
//   http_linger_ms = 5000              # an HTTP close waits this long for the peer's EOF
//   request_timeout_ms = 2000          # per ledger request
//   busy_poll_us = 0                   # 0..1000: poll this long after each wake-up (off: 0)
//   outbox_entries_max = 1000000
//   policy_refresh_ms = 5000
//   drain_timeout_ms = 5000
//   log_level = "info"
//   gateway_name = "gw-eu-1"           # first start only: DIR/gateway.name keeps it after
//   identity_file = "/var/lib/tally-agent/gateway.key"   # default DIR/gateway.key
//   ledger_public_keys = ["BASE64", …] # ledger keys whose shard grants are trusted
//   insecure = false                   # plaintext link to the ledger (demos and tests)
//   [emergency]                        # emergency shards (docs/SHARDS.md)
//   accounts = ["tenant-a chat.generate"]  # "subject route": shards kept on hand while healthy
//   shards_on_hand = 1                 # usable shards kept per account
//   refresh_before_expiry_ms = 30000   # a shard this close to expiry is closed and replaced
//   hold_ttl_ms = 30000                # local RESERVED of a shard reservation expires after this
//   accounts_max = 1000                # recently reserved accounts (emergency mode on) also kept
//   [scheduling]                       # fair scheduling of starts (docs/AGENT.md)
//   started_max = { "chat.generate" = 8 }  # admitted, unfinished starts per route at once
//   fairness_window = 1000             # admissions per fairness-error window
//   [health]                           # core/link_health.h thresholds
//   failures_to_degrade = 1
//   failures_to_partition = 3
//   slow_request_us = 100000
//   partition_after_ms = 3000
//   successes_to_recover = 3
//
// A peer is served if its uid is in allowed_uids or its gid in allowed_gids. Unknown keys, wrong
// types and impossible values are errors naming the key.

namespace tally::agent {

inline constexpr const char* kDefaultSocketPath = "/run/tally/agent.sock";
// Above a millisecond a poll window would be a core spent per wake-up for nothing a gateway sees.
inline constexpr uint64_t kBusyPollUsMax = 1000;

struct EmergencyConfig {
  std::vector<std::pair<std::string, std::string>> accounts;  // (subject, route)
  uint64_t shards_on_hand = 1;
  uint64_t refresh_before_expiry_ms = 30'000;
  uint64_t hold_ttl_ms = 30'000;
  uint64_t accounts_max = 1'000;
};

// Fair scheduling (core/fair_scheduler.h): a route listed has at most N admitted, unfinished
// starts at once; more wait and are admitted by priority and tenant weight.
struct SchedulingConfig {
  std::map<std::string, uint64_t> started_max;  // by route
  uint64_t fairness_window = limits::kFairnessWindowAdmissionsDefault;
};

struct AgentConfig {
  std::string data_dir;
  std::string ledger_host = "127.0.0.1";
  uint16_t ledger_port = 7411;
  // The ledger's other addresses (`--ledger H:P,H:P`, config `ledger`): its standbys, tried
  // after ledger_host:ledger_port (central-client/ledger_addresses.h).
  std::vector<client::Endpoint> ledger_also;
  bool ledger_configured = false;  // the file's `ledger` key was given
  // Partitioned subjects (`--partitions 'A1,A2;B1,B2'`, config `partitions = [["A1","A2"],
  // ["B1","B2"]]`; docs/scale-out.md "Partitioned subjects"): partition i's addresses (its primary
  // and standbys), in partition order. Empty: unpartitioned (ledger_host and ledger_also).
  // Exclusive with `ledger` / `--ledger`.
  std::vector<std::vector<client::Endpoint>> partitions;
  bool partitions_configured = false;  // the file's `partitions` key was given
  std::string socket_path = kDefaultSocketPath;
  uint32_t socket_mode = 0660;
  std::vector<uint32_t> allowed_uids;  // empty after parsing means: the defaults
  std::vector<uint32_t> allowed_gids;
  bool allowed_ids_configured = false;
  std::string metrics_host = "127.0.0.1";
  uint16_t metrics_port = 9464;
  bool metrics_enabled = true;
  uint64_t request_timeout_ms = 2'000;
  // After each wake-up the loop polls without sleeping for this long (net/run_loop.h,
  // docs/AGENT.md "Busy polling"); 0: it sleeps whenever nothing is ready.
  uint64_t busy_poll_us = 0;
  LinkHealthThresholds health;
  uint64_t outbox_entries_max = 1'000'000;
  uint64_t policy_refresh_ms = 5'000;
  uint64_t drain_timeout_ms = 5'000;
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  // The gateway socket's connections (docs/security.md "Connections and limits"), as the
  // ledger's: global bounds, then per connection.
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t buffered_bytes_max = net::kBufferedBytesMaxDefault;
  uint64_t connection_write_queue_bytes_max = limits::kWriteQueueBytesPerConnectionMax;
  uint64_t connection_stall_timeout_ms = net::kStallTimeoutMsDefault;
  std::string log_level = "info";
  std::string gateway_name;   // empty: the host name (used only when DIR/gateway.name is absent)
  std::string identity_file;  // empty: DIR/gateway.key
  std::vector<std::string> ledger_public_keys;  // base64; flags add to the file's
  // Plaintext link to the ledger without authentication (`--insecure`, for demos and tests).
  // Otherwise TLS 1.3 with gateway.key, pinning ledger_public_keys (required then).
  bool insecure = false;
  EmergencyConfig emergency;
  SchedulingConfig scheduling;
  int ready_fd = -1;  // write "ready METRICS_PORT SOCKET\n" here once serving, then close it
  // The HTTP/JSON listener (agent/http_server.h). Unset: httpSocketPath() derives it from
  // socket_path; "": no HTTP socket. Same mode and peer checks as the native socket.
  std::optional<std::string> http_socket_path;
  bool http_tcp_enabled = false;  // loopback TCP (http_listen / --http)
  std::string http_tcp_host = "127.0.0.1";
  uint16_t http_tcp_port = 0;
  // Timeouts of an HTTP connection (agent/http_server.h): a request must be complete within
  // http_header_timeout_ms of its first byte (of the accept, for the first); a connection with
  // nothing owed sits idle at most http_idle_timeout_ms; a close lingers at most http_linger_ms.
  uint64_t http_header_timeout_ms = 10'000;
  uint64_t http_idle_timeout_ms = 60'000;
  uint64_t http_linger_ms = 5'000;
};

// The HTTP socket's path: http_socket_path if set (maybe "": disabled), else socket_path with
// "-http" before its ".sock" ("/run/tally/agent.sock" -> "/run/tally/agent-http.sock"; a path
// not ending in ".sock" gets "-http" appended).
std::string httpSocketPath(const AgentConfig& config);
// http_listen / --http: "" disables, otherwise a loopback HOST:PORT (127.0.0.0/8 or ::1).
Status applyHttpListen(const std::string& text, AgentConfig* config);

// "HOST:PORT" with a numeric port (0 allowed: pick a free one).
Status parseHostPort(const std::string& text, std::string* host, uint16_t* port);

// `--ledger` / `ledger`: "HOST:PORT" (parsed as always) or "HOST:PORT,HOST:PORT,...": the first
// into ledger_host/ledger_port, the others into ledger_also.
Status applyLedgerAddresses(const std::string& text, AgentConfig* config);
// `--partitions` / `partitions`: "A1,A2;B1,B2" (parsePartitionMap, as tallyctl reads it), each
// partition's addresses parsed as `--ledger`'s; into partitions.
Status applyPartitions(const std::string& text, AgentConfig* config);
// metrics_listen: "" disables, otherwise HOST:PORT.
Status applyMetricsListen(const std::string& text, AgentConfig* config);
Status applyConfigFile(const std::string& path, AgentConfig* config);
// Every key applyConfigFile() accepts, a table's keys dotted ("health.slow_request_us"): a test
// holds docs/configuration.md and packaging/config/agent.toml to exactly these.
const std::vector<std::string>& configKeys();
// Fills the default allowed ids (own uid/gid and root) unless the file set them.
void applyDefaultPeers(AgentConfig* config, uid_t own_uid, gid_t own_gid);
Status validateConfig(const AgentConfig& config);

}  // namespace tally::agent
