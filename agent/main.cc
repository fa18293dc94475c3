// tally-agent: the gateway sidecar. Serves gateways on a Unix socket and forwards to the ledger.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_service.h"
#include "agent/config.h"
#include "agent/gateway_server.h"
#include "agent/http_server.h"
#include "agent/metrics.h"
#include "agent/metrics_server.h"
#include "agent/outbox_store.h"
#include "agent/partition_router.h"
#include "agent/reservation_partitions.h"
#include "agent/shard_keeper.h"
#include "central-client/ledger_link.h"
#include "common/daemon_args.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/sd_notify.h"
#include "common/sd_watchdog.h"
#include "common/wall_clock.h"
#include "core/assert.h"
#include "core/partition_map.h"
#include "net/run_loop.h"
#include "net/tls_session.h"
#include "shard/crypto.h"
#include "shard/identity.h"
#include "shard/store.h"
#include "tally/version.h"

namespace tally::agent {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitStartup = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "usage: tally-agent --data-dir DIR --ledger HOST:PORT|--partitions MAP [--socket PATH]\n"
    "                   [--config FILE]\n"
    "                   [--http-socket PATH] [--http HOST:PORT]\n"
    "                   [--metrics HOST:PORT] [--ready-fd FD]\n"
    "                   [--log-level debug|info|warn|error]\n"
    "                   [--identity-file PATH] [--gateway-name NAME]\n"
    "                   [--ledger-public-key BASE64]... [--insecure]\n"
    "       tally-agent --data-dir DIR [--identity-file PATH] [--gateway-name NAME]\n"
    "                   identity [--json]\n"
    "       tally-agent --version | --help\n"
    "\n"
    "The gateway sidecar: serves gateways on a Unix socket (default /run/tally/agent.sock,\n"
    "mode 0660, peer uid/gid checked) and forwards to the ledger while it is reachable. During a\n"
    "partition, reserve is rejected with retry-after, start fails retryably (UNAVAILABLE), and\n"
    "settle/release/mark-unknown/report are written to the durable outbox in DIR/agent.db\n"
    "(answered QUEUED) and delivered in order once the ledger is back.\n"
    "--ledger HOST:PORT,HOST:PORT: the ledger and its standbys (or the config's ledger key):\n"
    "tried in turn, moving to the primary a standby names (NOT_PRIMARY, docs/AGENT.md).\n"
    "--partitions 'A1,A2;B1,B2': partitioned subjects (docs/scale-out.md), instead of --ledger:\n"
    "each partition's ledger and standbys, in partition order. With more than one, each\n"
    "partition has its own link, outbox and emergency shards (DIR/partition-I/agent.db); a\n"
    "reserve goes to its subject's partition (recorded durably in DIR/agent.db first), a\n"
    "follow-up to its reserve's, health/audit/policy to every partition (answers merged).\n"
    "--metrics HOST:PORT: Prometheus endpoint (default 127.0.0.1:9464; \"\" disables).\n"
    "--http-socket PATH: HTTP/1.1 + JSON on a second Unix socket (docs/protocol.md \"HTTP\"),\n"
    "same mode and peer checks (default: the socket's path with -http before .sock,\n"
    "/run/tally/agent-http.sock; \"\" disables). --http HOST:PORT: the same over loopback TCP\n"
    "(default off).\n"
    "--ready-fd FD: write \"ready METRICS_PORT SOCKET\\n\" to FD once serving (METRICS_PORT is 0\n"
    "when metrics are disabled), then close it. Socket activation (LISTEN_FDS) and sd_notify\n"
    "(NOTIFY_SOCKET: READY=1, STOPPING=1, and WATCHDOG=1 every half $WATCHDOG_USEC) are\n"
    "supported.\n"
    "Emergency shards (docs/SHARDS.md): while the ledger is healthy the agent keeps signed shards\n"
    "for the config's [emergency] accounts and recently reserved ones; while it is partitioned,\n"
    "enforce-mode reserves are admitted from them (persisted in DIR/agent.db), and they are\n"
    "reported and reconciled when it is back. Grants are trusted only under --ledger-public-key\n"
    "(repeatable; or the config's ledger_public_keys).\n"
    "The link to the ledger is TLS 1.3: the agent presents its gateway key (enrolled with\n"
    "`tallyctl gateway enroll`) and accepts only a ledger key given with --ledger-public-key\n"
    "(required). --insecure: plaintext without authentication, for a ledger started with\n"
    "--insecure (local demos and tests); logged as a warning.\n"
    "identity: print (creating if absent) this gateway's name and public key, for\n"
    "`tallyctl gateway enroll`; --json prints {\"gatewayId\":NAME,\"publicKey\":BASE64}. The key "
    "is\n"
    "DIR/gateway.key (or --identity-file), the name DIR/gateway.name (created from\n"
    "--gateway-name, the config's gateway_name, or the host name).\n"
    "Exit: 0 after SIGTERM/SIGINT drain, 1 startup failure, 2 usage.\n";

// What to do: serve (the default), or print the gateway identity.
struct Command {
  bool identity = false;
  bool json = false;  // identity --json
};

// Returns kExitOk to continue, -1 to exit 0 (help/version), or an exit code.
int parseArgs(int argc, char** argv, AgentConfig* config, Command* command) {
  std::string config_file, ledger, partitions, socket, level, metrics, identity_file, gateway_name;
  std::string http_socket, http_listen;
  std::vector<std::string> ledger_keys;
  bool metrics_given = false, http_socket_given = false, http_listen_given = false;
  DaemonArgs args(argc, argv, "tally-agent", kUsage);
  while (args.next()) {
    const std::string_view arg = args.current();
    if (args.printedHelpOrVersion(kVersion)) return -1;
    const char* v = nullptr;
    std::string* target = nullptr;
    if (arg == "--data-dir") {
      target = &config->data_dir;
    } else if (arg == "--ledger") {
      target = &ledger;
    } else if (arg == "--partitions") {
      target = &partitions;
    } else if (arg == "--socket") {
      target = &socket;
    } else if (arg == "--config") {
      target = &config_file;
    } else if (arg == "--log-level") {
      target = &level;
    } else if (arg == "--metrics") {
      target = &metrics;
      metrics_given = true;
    } else if (arg == "--http-socket") {
      target = &http_socket;
      http_socket_given = true;
    } else if (arg == "--http") {
      target = &http_listen;
      http_listen_given = true;
    } else if (arg == "--identity-file") {
      target = &identity_file;
    } else if (arg == "--gateway-name") {
      target = &gateway_name;
    } else if (arg == "--ledger-public-key") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      ledger_keys.push_back(v);
      continue;
    } else if (arg == "--insecure") {
      config->insecure = true;
      continue;
    } else if (arg == "identity") {
      command->identity = true;
      continue;
    } else if (arg == "--json" && command->identity) {
      command->json = true;
      continue;
    } else if (arg == "--ready-fd") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      config->ready_fd = std::atoi(v);
      if (config->ready_fd <= 2) {
        std::fprintf(stderr, "tally-agent: --ready-fd must be a descriptor above 2\n");
        return kExitUsage;
      }
      continue;
    } else {
      std::fprintf(stderr, "tally-agent: unknown argument '%s'\n%s", args.current(), kUsage);
      return kExitUsage;
    }
    if ((v = args.value()) == nullptr) return kExitUsage;
    *target = v;
  }
  if (!config_file.empty()) {
    if (Status s = applyConfigFile(config_file, config); !s.isOk()) {
      std::fprintf(stderr, "tally-agent: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (!identity_file.empty()) config->identity_file = identity_file;
  if (!gateway_name.empty()) config->gateway_name = gateway_name;
  config->ledger_public_keys.insert(config->ledger_public_keys.end(), ledger_keys.begin(),
                                    ledger_keys.end());
  if (command->identity) {
    if (config->data_dir.empty()) {
      std::fprintf(stderr, "tally-agent: identity needs --data-dir DIR\n%s", kUsage);
      return kExitUsage;
    }
    return kExitOk;
  }
  const bool ledger_given = !ledger.empty() || config->ledger_configured;
  const bool partitions_given = !partitions.empty() || config->partitions_configured;
  if (ledger_given && partitions_given) {
    std::fprintf(stderr,
                 "tally-agent: --partitions (or the config's partitions) and --ledger (or the "
                 "config's ledger) are exclusive: give every partition with --partitions, or one "
                 "ledger with --ledger\n");
    return kExitUsage;
  }
  if (!partitions.empty()) {
    if (Status s = applyPartitions(partitions, config); !s.isOk()) {
      std::fprintf(stderr, "tally-agent: --partitions: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (partitions_given && config->partitions.size() == 1) {
    // One partition is a plain ledger: its primary and standbys.
    const std::vector<client::Endpoint>& only = config->partitions.front();
    config->ledger_host = only.front().host;
    config->ledger_port = only.front().port;
    config->ledger_also.assign(only.begin() + 1, only.end());
  } else if (!partitions_given && ledger.empty() && !config->ledger_configured) {
    std::fprintf(stderr, "tally-agent: --ledger HOST:PORT (or --partitions MAP) is required\n%s",
                 kUsage);
    return kExitUsage;
  }
  if (Status s = ledger.empty() ? Status::ok() : applyLedgerAddresses(ledger, config); !s.isOk()) {
    std::fprintf(stderr, "tally-agent: --ledger: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (!socket.empty()) config->socket_path = socket;
  if (metrics_given) {
    if (Status s = applyMetricsListen(metrics, config); !s.isOk()) {
      std::fprintf(stderr, "tally-agent: --metrics: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (http_socket_given) config->http_socket_path = http_socket;
  if (http_listen_given) {
    if (Status s = applyHttpListen(http_listen, config); !s.isOk()) {
      std::fprintf(stderr, "tally-agent: --http: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (!level.empty()) config->log_level = level;
  applyDefaultPeers(config, ::getuid(), ::getgid());
  if (Status s = validateConfig(*config); !s.isOk()) {
    std::fprintf(stderr, "tally-agent: %s\n%s", s.message().c_str(), kUsage);
    return kExitUsage;
  }
  return kExitOk;
}

EmergencyOptions emergencyOptions(const AgentConfig& config) {
  EmergencyOptions options{.shards_on_hand = config.emergency.shards_on_hand,
                           .refresh_before_expiry_ms = config.emergency.refresh_before_expiry_ms,
                           .hold_ttl_ms = config.emergency.hold_ttl_ms,
                           .accounts_max = config.emergency.accounts_max};
  for (const auto& [subject, route] : config.emergency.accounts) {
    options.accounts.push_back({subject, route});
  }
  return options;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "gateway";
  return name;
}

// Creates `dir` and its missing parents (0750).
Status makeDirs(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0750) != 0 && errno != EEXIST) {
      return Status::ioError("create " + prefix + ": " + std::strerror(errno));
    }
  }
  return Status::ok();
}

struct GatewayIdentity {
  identity::KeyPair key;
  std::string name;
};

// DIR/gateway.key (or --identity-file) and DIR/gateway.name, created if absent.
Result<GatewayIdentity> loadIdentity(const AgentConfig& config) {
  if (Status s = makeDirs(config.data_dir); !s.isOk()) return s;
  const std::string key_path =
      config.identity_file.empty() ? config.data_dir + "/gateway.key" : config.identity_file;
  Result<identity::KeyPair> key = identity::loadOrCreateKeyPair(key_path);
  if (!key.isOk()) {
    return Status::invalidArgument(key_path + ": " + key.status().message());
  }
  Result<std::string> name = identity::loadOrCreateGatewayName(
      config.data_dir, config.gateway_name.empty() ? hostName() : config.gateway_name);
  if (!name.isOk()) return name.status();
  return GatewayIdentity{.key = key.value(), .name = name.value()};
}

int printIdentity(const AgentConfig& config, bool json) {
  Result<GatewayIdentity> loaded = loadIdentity(config);
  if (!loaded.isOk()) {
    std::fprintf(stderr, "tally-agent: identity: %s\n", loaded.status().message().c_str());
    return kExitStartup;
  }
  const std::string public_key = identity::encodePublicKey(loaded.value().key.public_key);
  if (json) {
    // Gateway names are [A-Za-z0-9._-] and base64 needs no escaping either.
    std::printf("{\"gatewayId\":\"%s\",\"publicKey\":\"%s\"}\n", loaded.value().name.c_str(),
                public_key.c_str());
  } else {
    std::printf("gateway %s\npublic key %s\nkey id %s\n", loaded.value().name.c_str(),
                public_key.c_str(), identity::keyIdOf(loaded.value().key.public_key).c_str());
  }
  return kExitOk;
}

Result<std::vector<PublicKey>> trustedLedgerKeys(const AgentConfig& config) {
  std::vector<PublicKey> keys;
  for (const std::string& text : config.ledger_public_keys) {
    Result<PublicKey> key = identity::decodePublicKey(text);
    if (!key.isOk()) {
      return Status::invalidArgument("ledger public key '" + text + "': " + key.status().message());
    }
    keys.push_back(key.value());
  }
  return keys;
}

using LinkTls = std::function<Result<std::unique_ptr<net::TlsSession>>()>;

// TLS on the link to the ledger: client sessions with the gateway key, pinning the configured
// ledger keys; none with --insecure (logged loudly). kInvalidArgument without a ledger key.
Result<LinkTls> linkTls(const AgentConfig& config, const identity::KeyPair& gateway_key,
                        const std::vector<PublicKey>& ledger_keys, Logger* logger) {
  if (config.insecure) {
    logger->warn("insecure", {{"effect",
                               "plaintext link to the ledger WITHOUT authentication; for demos "
                               "and tests only"}});
    return LinkTls();
  }
  if (ledger_keys.empty()) {
    return Status::invalidArgument(
        "the TLS link pins the ledger's key: give --ledger-public-key BASE64 (or the config's "
        "ledger_public_keys; `tally-ledger identity` prints it), or --insecure for a plaintext "
        "ledger");
  }
  const std::set<PublicKey> pinned(ledger_keys.begin(), ledger_keys.end());
  return LinkTls([gateway_key, pinned]() {
    return net::TlsSession::create(net::TlsOptions{
        .role = net::TlsRole::kClient,
        .key = gateway_key,
        .accept_peer = [pinned](const PublicKey& key) { return pinned.contains(key); }});
  });
}

// Each partition's ledger addresses (its primary and standbys), in partition order: one for an
// unpartitioned agent (--ledger, or --partitions with one partition).
std::vector<std::vector<client::Endpoint>> partitionAddresses(const AgentConfig& config) {
  if (config.partitions.size() > 1) return config.partitions;
  std::vector<client::Endpoint> addresses{client::Endpoint{.kind = client::Endpoint::Kind::kTcp,
                                                           .host = config.ledger_host,
                                                           .port = config.ledger_port}};
  addresses.insert(addresses.end(), config.ledger_also.begin(), config.ledger_also.end());
  return {addresses};
}

// "H:P" or "H:P,H:P" (its standbys), partitions separated by ';', for the ready line.
std::string ledgerAddressesOf(const AgentConfig& config) {
  if (config.partitions.size() <= 1 && config.ledger_also.empty()) {
    return config.ledger_host + ":" + std::to_string(config.ledger_port);
  }
  std::string text;
  for (const std::vector<client::Endpoint>& partition : partitionAddresses(config)) {
    if (!text.empty()) text += ';';
    text += client::ledgerAddressesName(partition);
  }
  return text;
}

// Partition i's store: DIR itself for an unpartitioned agent (as before partitions existed),
// DIR/partition-I with more than one.
std::string partitionDataDir(const AgentConfig& config, size_t partition, size_t count) {
  if (count == 1) return config.data_dir;
  return config.data_dir + "/partition-" + std::to_string(partition);
}

// The [emergency] accounts partition i keeps shards for: those of its subjects (a shard is
// issued by the partition that holds the account).
EmergencyOptions partitionEmergencyOptions(const AgentConfig& config, uint32_t partition,
                                           uint32_t count) {
  EmergencyOptions options = emergencyOptions(config);
  std::erase_if(options.accounts, [&](const SubjectRoute& account) {
    return partitionOf(account.subject, count) != partition;
  });
  return options;
}

// One partition's durable state, opened before the loop: its agent.db (outbox, boot epoch,
// shards), the boot epoch this start took and the outbox entries it restores.
struct PartitionStore {
  std::string data_dir;
  std::unique_ptr<OutboxStore> store;
  std::unique_ptr<ShardStore> shard_store;
  uint64_t boot_epoch = 0;
  std::vector<OutboxEntry> restored;
};

// Opens `opened->data_dir`; on failure *event names the step that failed, for the log.
Status openPartitionStore(PartitionStore* opened, const char** event) {
  *event = "store_open_failed";
  Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(opened->data_dir);
  if (!store.isOk()) return store.status();
  opened->store = std::move(store).value();
  *event = "shard_store_open_failed";
  Result<std::unique_ptr<ShardStore>> shard_store = ShardStore::open(opened->store->connection());
  if (!shard_store.isOk()) return shard_store.status();
  opened->shard_store = std::move(shard_store).value();
  // Durably, before serving (SPEC §6 rule 3): a restart never inherits an emergency shard.
  *event = "boot_epoch_failed";
  Result<uint64_t> epoch = opened->shard_store->incrementBootEpoch();
  if (!epoch.isOk()) return epoch.status();
  opened->boot_epoch = epoch.value();
  *event = "outbox_load_failed";
  Result<std::vector<OutboxEntry>> restored = opened->store->load();
  if (!restored.isOk()) return restored.status();
  opened->restored = std::move(restored).value();
  return Status::ok();
}

// How long after drain_timeout_ms the gateway server still waits for the answers the service
// gives at that deadline before it closes connections regardless.
constexpr uint64_t kGatewayDrainGraceMs = 1'000;

// One partition's parts: its ledger link, shard keeper and service (with its own health, outbox
// and emergency shards). Borrows the store, metrics and logger, which outlive it.
struct Partition {
  Partition(uv_loop_t* loop, const AgentConfig& config, const std::vector<client::Endpoint>& at,
            PartitionStore* store, const ShardCrypto* crypto, GatewaySigner signer,
            EmergencyOptions emergency, LinkTls link_tls, AgentMetrics* metrics, Logger* logger)
      : link(loop,
             central::LedgerLinkOptions{.host = at.front().host,
                                        .port = at.front().port,
                                        .also = {at.begin() + 1, at.end()},
                                        .request_timeout_ms = config.request_timeout_ms,
                                        .frame_bytes_max = config.frame_bytes_max,
                                        .health = config.health,
                                        .tls = std::move(link_tls)},
             logger),
        keeper(loop, &link, store->shard_store.get(), crypto, std::move(signer), metrics, logger,
               std::move(emergency), store->boot_epoch, /*seed=*/0),
        service(loop, &link, store->store.get(), metrics, logger,
                AgentServiceOptions{
                    .policy_refresh_ms = config.policy_refresh_ms,
                    .outbox_entries_max = config.outbox_entries_max,
                    .fair = {.started_max = config.scheduling.started_max,
                             .fairness_window_admissions = config.scheduling.fairness_window}}) {
    service.setShardKeeper(&keeper);
  }

  central::LedgerLink link;
  ShardKeeper keeper;
  AgentService service;
};

// The daemon's parts, in construction order; destroyed after the loop ran dry.
struct Daemon {
  Daemon(uv_loop_t* loop, const AgentConfig& config, Logger* logger,
         std::vector<PartitionStore>* stores, ReservationPartitions* records, int inherited_fd,
         const ShardCrypto* crypto, const GatewaySigner& signer, uint64_t watchdog_interval_ms,
         const LinkTls& link_tls)
      : config(config),
        logger(logger),
        partitions(makePartitions(loop, config, stores, crypto, signer, link_tls)),
        router(handlers(), records, logger),
        server(loop, logger,
               GatewayServerOptions{
                   .socket_path = config.socket_path,
                   .socket_mode = config.socket_mode,
                   .inherited_fd = inherited_fd,
                   .allowed_uids = config.allowed_uids,
                   .allowed_gids = config.allowed_gids,
                   .frame_bytes_max = config.frame_bytes_max,
                   .connections_max =
                       net::connectionsMaxForThisProcess(config.connections_max, logger),
                   .write_queue_bytes_max = config.connection_write_queue_bytes_max,
                   .stall_timeout_ms = config.connection_stall_timeout_ms,
                   .buffered_bytes_max = config.buffered_bytes_max,
                   .drain_timeout_ms = config.drain_timeout_ms + kGatewayDrainGraceMs},
               [this](wire::RequestBody&& body, Respond respond, Alive alive) {
                 router.handle(std::move(body), std::move(respond), std::move(alive));
               }),
        http_server(
            loop, logger,
            HttpServerOptions{.socket_path = httpSocketPath(config),
                              .socket_mode = config.socket_mode,
                              .allowed_uids = config.allowed_uids,
                              .allowed_gids = config.allowed_gids,
                              .tcp_enabled = config.http_tcp_enabled,
                              .tcp_host = config.http_tcp_host,
                              .tcp_port = config.http_tcp_port,
                              .header_timeout_ms = config.http_header_timeout_ms,
                              .idle_timeout_ms = config.http_idle_timeout_ms,
                              .linger_ms = config.http_linger_ms,
                              .drain_timeout_ms = config.drain_timeout_ms + kGatewayDrainGraceMs},
            [this](wire::RequestBody&& body, Respond respond, Alive alive) {
              router.handle(std::move(body), std::move(respond), std::move(alive));
            }),
        metrics_server(loop, logger, config.metrics_host, config.metrics_port,
                       [this] { return metrics.render(gauges()); }),
        watchdog(loop, watchdog_interval_ms, [logger](const std::string& error) {
          logger->warn("sd_notify_failed", {{"error", error}});
        }) {
    term.data = this;
    interrupt.data = this;
  }

  std::vector<std::unique_ptr<Partition>> makePartitions(uv_loop_t* loop, const AgentConfig& config,
                                                         std::vector<PartitionStore>* stores,
                                                         const ShardCrypto* crypto,
                                                         const GatewaySigner& signer,
                                                         const LinkTls& link_tls) {
    const std::vector<std::vector<client::Endpoint>> addresses = partitionAddresses(config);
    TALLY_ASSERT(addresses.size() == stores->size());
    const auto count = static_cast<uint32_t>(addresses.size());
    std::vector<std::unique_ptr<Partition>> made;
    for (uint32_t i = 0; i < count; ++i) {
      made.push_back(std::make_unique<Partition>(
          loop, config, addresses[i], &(*stores)[i], crypto, signer,
          partitionEmergencyOptions(config, i, count), link_tls, &metrics, logger));
    }
    return made;
  }

  std::vector<RequestHandler> handlers() {
    std::vector<RequestHandler> each;
    for (const std::unique_ptr<Partition>& partition : partitions) {
      each.push_back(
          [service = &partition->service](wire::RequestBody&& body, Respond respond, Alive alive) {
            service->handle(std::move(body), std::move(respond), std::move(alive));
          });
    }
    return each;
  }

  std::vector<GaugeSnapshot> gauges() const {
    std::vector<GaugeSnapshot> each;
    for (const std::unique_ptr<Partition>& partition : partitions) {
      each.push_back(partition->service.gauges());
    }
    return each;
  }

  // Starts every partition: its link, its shards (restored, those of earlier boot epochs closed,
  // durably, before serving) and its service.
  Status startPartitions(std::vector<PartitionStore>* stores) {
    for (size_t i = 0; i < partitions.size(); ++i) {
      Partition& partition = *partitions[i];
      if (Status s = partition.link.start(); !s.isOk()) return s;
      if (Status s = partition.keeper.start(wallClockMs()); !s.isOk()) return s;
      PartitionStore& store = (*stores)[i];
      if (Status s = partition.service.start(std::move(store.restored), store.boot_epoch);
          !s.isOk()) {
        return s;
      }
    }
    return Status::ok();
  }

  // Stop accepting, finish in-flight, flush the outboxes while their ledgers are reachable,
  // close.
  void shutdown() {
    if (shutting_down) return;
    shutting_down = true;
    if (Status s = sdNotify("STOPPING=1"); !s.isOk()) {
      logger->warn("sd_notify_failed", {{"error", s.toString()}});
    }
    logger->info("draining",
                 {{"drain_timeout_ms", config.drain_timeout_ms}, {"in_flight", server.inFlight()}});
    const uint64_t deadline_ms = monotonicClockMs() + config.drain_timeout_ms;
    // Each service answers every waiting requester at the deadline (queued durably or "retry
    // with the same id"); the server's own deadline, a grace later, only backs that up.
    for (const std::unique_ptr<Partition>& partition : partitions) {
      partition->service.beginShutdown(config.drain_timeout_ms);
    }
    // Both gateway listeners stop (answering what they handed out); then the outboxes drain.
    auto listener_stopped = [this, deadline_ms, stopped = std::make_shared<int>(0)] {
      if (++*stopped < 2) return;
      const uint64_t now_ms = monotonicClockMs();
      auto drained = std::make_shared<size_t>(0);
      for (const std::unique_ptr<Partition>& partition : partitions) {
        partition->service.drain(deadline_ms > now_ms ? deadline_ms - now_ms : 0, [this, drained] {
          if (++*drained == partitions.size()) closeAll();
        });
      }
    };
    server.stop(listener_stopped);
    http_server.stop(listener_stopped);
  }

  // Once every outbox drained (or ran out of time): the services, keepers, links, then the rest.
  void closeAll() {
    for (const std::unique_ptr<Partition>& partition : partitions) {
      partition->service.stop();
      partition->keeper.stop();
    }
    if (metrics_started) metrics_server.stop();
    auto links_stopped = std::make_shared<size_t>(0);
    for (const std::unique_ptr<Partition>& partition : partitions) {
      partition->link.stop([this, links_stopped] {
        if (++*links_stopped < partitions.size()) return;
        watchdog.stop();
        for (uv_signal_t* handle : {&term, &interrupt}) {
          if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(handle))) {
            uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
          }
        }
      });
    }
  }

  const AgentConfig& config;
  Logger* logger;
  AgentMetrics metrics;
  std::vector<std::unique_ptr<Partition>> partitions;
  PartitionRouter router;
  GatewayServer server;
  HttpServer http_server;
  MetricsServer metrics_server;
  SdWatchdog watchdog;
  bool metrics_started = false;
  bool shutting_down = false;
  uv_signal_t term{};
  uv_signal_t interrupt{};
};

int inheritedSocket(Logger* logger) {
  const int count = sdListenFds();
  if (count <= 0) return -1;
  if (count > 1) logger->warn("socket_activation_extra_fds", {{"fds", count}});
  return 3;  // SD_LISTEN_FDS_START
}

void writeReady(const AgentConfig& config, uint16_t metrics_port, Logger* logger) {
  if (config.ready_fd <= 2) return;
  const std::string line =
      "ready " + std::to_string(metrics_port) + " " + config.socket_path + "\n";
  if (::write(config.ready_fd, line.data(), line.size()) < 0) {
    logger->warn("ready_fd_write_failed", {{"error", std::strerror(errno)}});
  }
  ::close(config.ready_fd);
}

// True (and logged as `event`) when DIR/agent.db still holds `count` things of an unpartitioned
// agent (`what`: what they are and what to do), or when counting them failed.
bool unpartitionedLeftOver(Logger* logger, const AgentConfig& config, const char* event,
                           const Result<uint64_t>& count, const char* what) {
  if (count.isOk() && count.value() == 0) return false;
  logger->error(event, {{"data_dir", config.data_dir},
                        {"error", count.isOk() ? std::to_string(count.value()) + " " + what
                                               : count.status().toString()}});
  return true;
}

int run(const AgentConfig& config) {
  Logger logger("agent", parseLogLevel(config.log_level));
  ::signal(SIGPIPE, SIG_IGN);
  logFdLimit(raiseFdLimit(), &logger);  // every connection is a descriptor
  if (!fixMallocMmapThreshold()) logger.warn("mallopt_failed", {{"option", "M_MMAP_THRESHOLD"}});

  const size_t count = partitionAddresses(config).size();
  // With partitions, DIR/agent.db holds only the record of each reservation's partition (and
  // DIR's lock); each partition's outbox, boot epoch and shards are in DIR/partition-I.
  std::unique_ptr<OutboxStore> top_store;
  std::unique_ptr<ReservationPartitions> records;
  if (count > 1) {
    Result<std::unique_ptr<OutboxStore>> opened = OutboxStore::open(config.data_dir);
    if (!opened.isOk()) {
      logger.error("store_open_failed",
                   {{"data_dir", config.data_dir}, {"error", opened.status().toString()}});
      return kExitStartup;
    }
    top_store = std::move(opened).value();
    // An unpartitioned agent's outbox and emergency shards in DIR/agent.db belong to its one
    // ledger: started with partitions they would never be sent. Refused until drained with
    // --ledger.
    Result<std::vector<OutboxEntry>> outbox = top_store->load();
    if (unpartitionedLeftOver(
            &logger, config, "unpartitioned_outbox_left",
            outbox.isOk() ? Result<uint64_t>(outbox.value().size()) : outbox.status(),
            "outbox entries of an unpartitioned agent are in agent.db: start it with --ledger "
            "until its outbox is empty, then with --partitions") ||
        unpartitionedLeftOver(
            &logger, config, "unpartitioned_shards_left",
            countStoredShards(top_store->connection()),
            "emergency shards of an unpartitioned agent are in agent.db: start it with --ledger "
            "until they are reconciled (tally_agent_shards is 0), then with --partitions")) {
      return kExitStartup;
    }
    Result<std::unique_ptr<ReservationPartitions>> opened_records =
        ReservationPartitions::open(top_store->connection());
    if (!opened_records.isOk()) {
      logger.error("reservation_partitions_open_failed",
                   {{"error", opened_records.status().toString()}});
      return kExitStartup;
    }
    records = std::move(opened_records).value();
  }
  std::vector<PartitionStore> stores(count);
  for (size_t i = 0; i < count; ++i) {
    stores[i].data_dir = partitionDataDir(config, i, count);
    const char* event = "";
    if (Status s = openPartitionStore(&stores[i], &event); !s.isOk()) {
      logger.error(event, {{"data_dir", stores[i].data_dir}, {"error", s.toString()}});
      return kExitStartup;
    }
  }
  Result<GatewayIdentity> gateway = loadIdentity(config);
  if (!gateway.isOk()) {
    logger.error("identity_failed", {{"error", gateway.status().toString()}});
    return kExitStartup;
  }
  Result<std::vector<PublicKey>> ledger_keys = trustedLedgerKeys(config);
  if (!ledger_keys.isOk()) {
    logger.error("ledger_public_key_invalid", {{"error", ledger_keys.status().toString()}});
    return kExitStartup;
  }
  if (ledger_keys.value().empty()) {
    logger.warn("no_ledger_public_keys",
                {{"effect", "no shard grant verifies: emergency shards are never used"}});
  }
  Result<LinkTls> link_tls = linkTls(config, gateway.value().key, ledger_keys.value(), &logger);
  if (!link_tls.isOk()) {
    logger.error("tls_setup_failed", {{"error", link_tls.status().message()}});
    return kExitStartup;
  }
  const wire::WireShardCrypto crypto(std::nullopt, ledger_keys.value());
  const identity::KeyPair gateway_key = gateway.value().key;
  const GatewaySigner signer{
      .gateway_name = gateway.value().name,
      .public_key = gateway_key.public_key,
      .sign_issue =
          [gateway_key](ShardIssueRequest* request) {
            wire::signIssueRequest(gateway_key, request);
          },
      .sign_report = [gateway_key](ShardReport* report) { wire::signReport(gateway_key, report); }};
  for (size_t i = 0; i < count; ++i) {
    std::vector<LogField> fields = {{"boot_epoch", stores[i].boot_epoch},
                                    {"data_dir", stores[i].data_dir},
                                    {"gateway", gateway.value().name},
                                    {"gateway_key_id", identity::keyIdOf(gateway_key.public_key)},
                                    {"ledger_keys", uint64_t{ledger_keys.value().size()}},
                                    {"outbox_entries", uint64_t{stores[i].restored.size()}}};
    if (count > 1) fields.push_back({"partition", uint64_t{i}});
    logger.log(LogLevel::kInfo, "boot", fields);
  }

  uv_loop_t loop;
  if (int rc = uv_loop_init(&loop); rc != 0) {
    logger.error("loop_init_failed", {{"error", uv_strerror(rc)}});
    return kExitStartup;
  }
  int exit_code = kExitOk;
  net::LoopRunStats loop_stats;
  {
    Daemon daemon(&loop, config, &logger, &stores, records.get(), inheritedSocket(&logger), &crypto,
                  signer, sdWatchdogIntervalMs(), link_tls.value());
    for (uv_signal_t* handle : {&daemon.term, &daemon.interrupt}) {
      (void)uv_signal_init(&loop, handle);
    }
    auto on_signal = [](uv_signal_t* handle, int) {
      static_cast<Daemon*>(handle->data)->shutdown();
    };
    (void)uv_signal_start(&daemon.term, on_signal, SIGTERM);
    (void)uv_signal_start(&daemon.interrupt, on_signal, SIGINT);

    Status status = daemon.startPartitions(&stores);
    if (status.isOk()) status = daemon.server.start();
    if (status.isOk()) status = daemon.http_server.start();
    if (status.isOk() && config.metrics_enabled) {
      daemon.metrics_started = true;
      status = daemon.metrics_server.start();
    }
    if (!status.isOk()) {
      logger.error("start_failed", {{"error", status.toString()}});
      exit_code = kExitStartup;
      daemon.shutdown();
    } else {
      const uint16_t metrics_port = config.metrics_enabled ? daemon.metrics_server.port() : 0;
      logger.info(
          "ready",
          {{"socket", config.socket_path},
           {"http_socket",
            httpSocketPath(config).empty() ? std::string("disabled") : httpSocketPath(config)},
           {"http", config.http_tcp_enabled
                        ? config.http_tcp_host + ":" + std::to_string(daemon.http_server.tcpPort())
                        : std::string("disabled")},
           {"ledger", ledgerAddressesOf(config)},
           {"metrics", config.metrics_enabled
                           ? config.metrics_host + ":" + std::to_string(metrics_port)
                           : std::string("disabled")},
           {"boot_epoch", stores.front().boot_epoch},
           {"version", kVersion}});
      writeReady(config, metrics_port, &logger);
      if (Status s = sdNotify("READY=1"); !s.isOk()) {
        logger.warn("sd_notify_failed", {{"error", s.toString()}});
      }
      if (!daemon.watchdog.start()) logger.warn("watchdog_start_failed");
    }
    loop_stats = net::runLoop(&loop, config.busy_poll_us);
  }
  if (int rc = uv_loop_close(&loop); rc != 0) {
    logger.error("loop_close_failed", {{"error", uv_strerror(rc)}});
  }
  logger.info("exit", {{"code", exit_code},
                       {"busy_poll_us", config.busy_poll_us},
                       {"loop_sleeps", loop_stats.sleeps},
                       {"loop_polls", loop_stats.polls}});
  return exit_code;
}

}  // namespace
}  // namespace tally::agent

int main(int argc, char** argv) {
  tally::agent::AgentConfig config;
  tally::agent::Command command;
  const int parsed = tally::agent::parseArgs(argc, argv, &config, &command);
  if (parsed == -1) return 0;
  if (parsed != 0) return parsed;
  if (command.identity) return tally::agent::printIdentity(config, command.json);
  return tally::agent::run(config);
}
