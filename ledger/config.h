#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/limits.h"
#include "core/status.h"
#include "net/connection_limits.h"

// tally-ledger's configuration: defaults, then the TOML file (--config), then flags.
//
//   listen = "127.0.0.1:7411"
//   frame_bytes_max = 1048576
//   retention_ms = 900000            # idempotency window for terminal reservations
//   receipt_bytes_max = 4294967296   # memory for the window's packed receipts
//   shard_retention_ms = 86400000    # a reconciled shard is kept this long after its expiry
//   tick_interval_ms = 10            # expiry / hard-limit / compaction pulse
//   checkpoint_log_rows = 1024       # fold thread: fold the log into tables.db at this many rows
//   log_level = "info"               # debug | info | warn | error
//   metrics = "127.0.0.1:9465"       # Prometheus endpoint; "" disables
//   store = "sqlite"                 # sqlite (files under the data dir) | postgres
//   postgres = "host=/run/postgresql dbname=tally"  # libpq conninfo; store = "postgres" only
//   lease_ms = 3000                  # postgres: the writer lease (failover after a lapse)
//   standby = false                  # postgres: wait for the lease instead of refusing
//   insecure = false                 # plaintext link, no authentication: loopback only
//   connections_max = 4096           # connections served at once; more are refused
//   buffered_bytes_max = 1073741824  # bytes all connections may hold before new ones are refused
//   connection_write_queue_bytes_max = 16777216  # replies owed one client before it is paused
//   connection_stall_timeout_ms = 30000          # a paused client reading nothing is closed
//
// Unknown keys, wrong types and impossible values are errors naming the key.

namespace tally::ledger {

// lease_ms: its default and bounds.
inline constexpr uint64_t kLeaseMsDefault = 3'000;
inline constexpr uint64_t kLeaseMsMin = 100;
inline constexpr uint64_t kLeaseMsMax = 600'000;

// shard_retention_ms: its bounds (the default is limits::kShardRetentionMsDefault, a day).
inline constexpr uint64_t kShardRetentionMsMin = 1'000;
inline constexpr uint64_t kShardRetentionMsMax = 365ull * 24 * 3600 * 1000;

struct LedgerConfig {
  std::string data_dir;
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 7411;
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  uint64_t retention_ms = limits::kRetentionMsDefault;
  uint64_t receipt_bytes_max = limits::kReceiptBytesMaxDefault;
  // How long after its expiry a RECONCILED shard is kept before compaction (docs/LEDGER.md
  // "Retention"): separate from retention_ms so that an agent that missed its report's answer
  // finds the shard when it reports again.
  uint64_t shard_retention_ms = limits::kShardRetentionMsDefault;
  uint64_t tick_interval_ms = 10;
  uint64_t checkpoint_log_rows = 1024;
  // Where commits run (ServerOptions::commit_on_loop): "loop", "thread", or "auto" (the default:
  // "loop" for the sqlite store, whose commit is a local fdatasync shorter than the two thread
  // wake-ups it would cost, "thread" for postgres, whose commit is a network round trip).
  std::string commit_mode = "auto";
  std::string log_level = "info";
  bool metrics_enabled = true;  // GET /metrics on metrics_host:metrics_port (port 0: pick one)
  std::string metrics_host = "127.0.0.1";
  uint16_t metrics_port = 9465;
  int ready_fd = -1;  // write "ready PORT METRICS_PORT\n" here once serving, then close it
  // The ledger's Ed25519 signing key for shard grants; empty: DIR/ledger.key. Created (0600) at
  // first start if absent.
  std::string signing_key_file;
  // The durable record: "sqlite" (DIR/ledger.db, DIR/tables.db) or "postgres" (the database
  // `postgres_conninfo` names, a libpq connection string or URI; docs/scale-out.md).
  std::string store = "sqlite";
  std::string postgres_conninfo;
  // The writer's lease in PostgreSQL (docs/scale-out.md): held this long after each commit or
  // renewal (every lease_ms / 3 when idle); a standby takes over once it lapses.
  uint64_t lease_ms = kLeaseMsDefault;
  // With the lease held by another live ledger: wait for it (event=standby, not listening)
  // instead of refusing to start.
  bool standby = false;
  // Plaintext link without authentication (today's protocol; `--insecure`): refused unless
  // listen_host is a loopback address. Otherwise every connection is TLS (ledger/link_tls.h).
  bool insecure = false;
  // Connections (docs/security.md "Connections and limits"): global bounds past which new
  // connections are refused, and per connection the replies owed before the client is paused
  // and how long a paused client that reads nothing is kept.
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t buffered_bytes_max = net::kBufferedBytesMaxDefault;
  uint64_t connection_write_queue_bytes_max = limits::kWriteQueueBytesPerConnectionMax;
  uint64_t connection_stall_timeout_ms = net::kStallTimeoutMsDefault;
};

// The signing key file `config` names: signing_key_file, else DIR/ledger.key.
std::string signingKeyPath(const LedgerConfig& config);

// 127.0.0.0/8 or "localhost": where `insecure` may listen.
bool isLoopbackHost(const std::string& host);

// "HOST:PORT" with a numeric port (0 allowed: pick a free one).
Status parseListen(const std::string& text, std::string* host, uint16_t* port);
// The metrics endpoint's "HOST:PORT", or "" to disable it.
Status applyMetricsListen(const std::string& text, LedgerConfig* config);
Status applyConfigFile(const std::string& path, LedgerConfig* config);
// Every key applyConfigFile() accepts, in the order docs/configuration.md lists them (a test
// holds the two, and packaging/config/ledger.toml, equal).
const std::vector<std::string>& configKeys();
Status validateConfig(const LedgerConfig& config);
// Whether `config` (validated) commits on the loop thread: commit_mode resolved for its store.
bool commitsOnLoop(const LedgerConfig& config);

}  // namespace tally::ledger
