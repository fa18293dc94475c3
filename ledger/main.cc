// tally-ledger: the central, durable, linearizable capacity ledger.

#include <signal.h>
#include <sys/stat.h>
#include <uv.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "common/daemon_args.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/sd_notify.h"
#include "common/sd_watchdog.h"
#include "common/wall_clock.h"
#include "core/ledger.h"
#include "ledger/backup.h"
#include "ledger/check_commands.h"
#include "ledger/config.h"
#include "ledger/link_tls.h"
#include "ledger/metrics.h"
#include "ledger/postgres_store.h"
#include "ledger/restore.h"
#include "ledger/server.h"
#include "ledger/sqlite_store.h"
#include "ledger/standby_server.h"
#include "net/metrics_server.h"
#include "shard/crypto.h"
#include "shard/identity.h"
#include "tally/version.h"

namespace tally::ledger {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitStartup = 1;
constexpr int kExitIoError = 74;  // EX_IOERR: a commit failed; restart rebuilds from disk
constexpr int kExitBadRecord = kExitCheckBadRecords;  // 65: a stored record cannot be applied
// The postgres store's lease was taken by another ledger (this one was deposed: e.g. stopped
// past its lease while a standby took over); it committed nothing after that.
constexpr int kExitDeposed = 75;

constexpr const char* kUsage =
    "usage: tally-ledger --data-dir DIR [--listen HOST:PORT] [--config FILE]\n"
    "                    [--log-level debug|info|warn|error] [--metrics HOST:PORT]\n"
    "                    [--ready-fd FD] [--signing-key-file PATH]\n"
    "                    [--store sqlite|postgres] [--postgres CONNINFO]\n"
    "                    [--lease-ms MS] [--standby] [--insecure]\n"
    "       tally-ledger --data-dir DIR [--signing-key-file PATH] identity [--json]\n"
    "       tally-ledger --data-dir DIR check | repair\n"
    "       tally-ledger --data-dir DIR backup DEST\n"
    "       tally-ledger --version | --help\n"
    "\n"
    "The central capacity ledger. Keeps accounts and reservations in memory with a commit log\n"
    "(DIR/log/: one record per batch, fdatasync before the reply) and SQLite (DIR/tables.db:\n"
    "the log folded into tables by a background thread; WAL, synchronous=FULL) as the durable\n"
    "record; no reply leaves before its change is on disk. Default listen address\n"
    "127.0.0.1:7411 (port 0 picks one).\n"
    "--store postgres --postgres CONNINFO: keep the durable record in PostgreSQL instead (the\n"
    "schema tally of the database the libpq connection string names; one transaction per\n"
    "batch, synchronous_commit on; docs/scale-out.md). DIR still holds the lock and the key;\n"
    "check, repair and backup are for the SQLite store only.\n"
    "--lease-ms MS (postgres): the writer's lease in tally.lease (default 3000); every commit\n"
    "is fenced by its epoch. --standby (postgres): when another ledger holds the lease, wait\n"
    "for it to lapse, meanwhile answering every request on --listen with NOT_PRIMARY naming\n"
    "the primary, then take over on the same socket; without it such a start is refused.\n"
    "Deposed (another ledger took the lease), a ledger answers what it holds NOT_PRIMARY and\n"
    "stops serving; with --standby it then waits as a standby on the same socket.\n"
    "The link is TLS 1.3: the ledger presents its signing key and admits enrolled, enabled\n"
    "gateway keys and the operator key DIR/operator.key (created 0600 at first start; tallyctl\n"
    "--key). --insecure: plaintext without authentication (today's protocol, for local demos\n"
    "and tests), refused unless --listen is a loopback address (exit 2); logged as a warning.\n"
    "--metrics HOST:PORT: Prometheus endpoint, GET /metrics (default 127.0.0.1:9465; port 0\n"
    "picks one; \"\" disables).\n"
    "--ready-fd FD: write \"ready PORT METRICS_PORT\\n\" to FD once serving (METRICS_PORT 0 when\n"
    "metrics are disabled), then close it.\n"
    "--signing-key-file PATH: the Ed25519 key that signs emergency shard grants (default\n"
    "DIR/ledger.key, created with mode 0600 at first start if absent).\n"
    "identity: print the signing key's id and public key (creating the key if absent), as\n"
    "\"keyId HEX16\" and \"publicKey BASE64\" lines, or with --json as\n"
    "{\"keyId\":\"HEX16\",\"publicKey\":\"BASE64\"}; agents trust the public key\n"
    "(--ledger-public-key). Exit 0.\n"
    "check: list every stored record the ledger cannot apply (table, key, field, value, why),\n"
    "without starting; exit 0 if there is none, 65 otherwise. Run it with the ledger stopped.\n"
    "repair: quarantine what check lists, with a correcting entry that keeps every account's\n"
    "equation, each appended to DIR/quarantine.jsonl (docs/RUNBOOK.md); exit 0 once the store\n"
    "restores cleanly, 65 if something cannot be repaired (nothing is written then).\n"
    "backup DEST: an online, consistent copy of the store (SQLite's backup API; the ledger may\n"
    "be serving: the copy never takes its lock) into DEST, a new or empty directory, with the\n"
    "signing key; the copy is checked to restore. DEST is a ready data dir: restore by stopping\n"
    "the ledger and using a copy of DEST as its --data-dir (docs/operations.md). Exit 0, or 1\n"
    "(nothing is left in DEST).\n"
    "Exit: 0 after SIGTERM/SIGINT drain, 1 startup failure, 2 usage, 65 a stored record cannot\n"
    "be applied (see check), 74 storage failure, 75 deposed (postgres, without --standby:\n"
    "another ledger took the lease; nothing more was committed).\n"
    "Under systemd (Type=notify): READY=1 once serving, STOPPING=1 at SIGTERM/SIGINT, and\n"
    "WATCHDOG=1 every half $WATCHDOG_USEC (WatchdogSec=) to $NOTIFY_SOCKET.\n";

struct Command {
  bool identity = false;  // `identity`: print the signing key and exit
  bool json = false;
  bool check = false;       // `check`: list the records a restore cannot apply, and exit
  bool repair = false;      // `repair`: quarantine them, and exit
  std::string backup_dest;  // `backup DEST`: copy the store into DEST, and exit
};

// Returns kExitOk to continue, or an exit code.
int parseArgs(int argc, char** argv, LedgerConfig* config, Command* command) {
  std::string config_file;
  std::string listen;
  std::string level;
  std::string metrics;
  bool metrics_given = false;
  std::string store;
  std::string postgres;
  bool postgres_given = false;
  std::string lease_ms;
  bool standby = false;
  DaemonArgs args(argc, argv, "tally-ledger", kUsage);
  while (args.next()) {
    const std::string_view arg = args.current();
    if (args.printedHelpOrVersion(kVersion)) return -1;
    const char* v = nullptr;
    if (arg == "--data-dir") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      config->data_dir = v;
    } else if (arg == "--listen") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      listen = v;
    } else if (arg == "--config") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      config_file = v;
    } else if (arg == "--log-level") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      level = v;
    } else if (arg == "--metrics") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      metrics = v;
      metrics_given = true;
    } else if (arg == "--signing-key-file") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      config->signing_key_file = v;
    } else if (arg == "--store") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      store = v;
    } else if (arg == "--postgres") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      postgres = v;
      postgres_given = true;
    } else if (arg == "--lease-ms") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      lease_ms = v;
    } else if (arg == "--standby") {
      standby = true;
    } else if (arg == "--insecure") {
      config->insecure = true;
    } else if (arg == "identity") {
      command->identity = true;
    } else if (arg == "check") {
      command->check = true;
    } else if (arg == "repair") {
      command->repair = true;
    } else if (arg == "backup") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      command->backup_dest = v;
    } else if (arg == "--json" && command->identity) {
      command->json = true;
    } else if (arg == "--ready-fd") {
      if ((v = args.value()) == nullptr) return kExitUsage;
      config->ready_fd = std::atoi(v);
      if (config->ready_fd <= 2) {
        std::fprintf(stderr, "tally-ledger: --ready-fd must be a descriptor above 2\n");
        return kExitUsage;
      }
    } else {
      std::fprintf(stderr, "tally-ledger: unknown argument '%s'\n%s", args.current(), kUsage);
      return kExitUsage;
    }
  }
  // Flags override the file.
  if (!config_file.empty()) {
    if (Status s = applyConfigFile(config_file, config); !s.isOk()) {
      std::fprintf(stderr, "tally-ledger: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (!listen.empty()) {
    if (Status s = parseListen(listen, &config->listen_host, &config->listen_port); !s.isOk()) {
      std::fprintf(stderr, "tally-ledger: --listen: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (metrics_given) {
    if (Status s = applyMetricsListen(metrics, config); !s.isOk()) {
      std::fprintf(stderr, "tally-ledger: --metrics: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (!level.empty()) config->log_level = level;
  if (!store.empty()) config->store = store;
  if (postgres_given) config->postgres_conninfo = postgres;
  if (standby) config->standby = true;
  if (!lease_ms.empty()) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long value = std::strtoull(lease_ms.c_str(), &end, 10);
    if (errno != 0 || end == lease_ms.c_str() || *end != '\0' || lease_ms[0] == '-') {
      std::fprintf(stderr, "tally-ledger: --lease-ms must be a number of milliseconds\n");
      return kExitUsage;
    }
    config->lease_ms = value;
  }
  if (Status s = validateConfig(*config); !s.isOk()) {
    std::fprintf(stderr, "tally-ledger: %s\n%s", s.message().c_str(), kUsage);
    return kExitUsage;
  }
  return kExitOk;
}

// What the durable record cost this run: per-commit bytes, the log's segments, and the fold
// thread's work.
void logSqliteStoreStats(const SqliteStore& store, Logger* logger) {
  const SqliteStoreStats stats = store.stats();
  logger->info("store_stats", {{"commits", stats.commits},
                               {"commit_ms", stats.commit_us / 1000},
                               {"encode_ms", stats.encode_us / 1000},
                               {"log_bytes", stats.log_bytes},
                               {"log_segments_created", stats.log_segments_created},
                               {"log_segments_recycled", stats.log_segments_recycled},
                               {"log_segments_deleted", stats.log_segments_deleted},
                               {"log_disk_bytes", store.logDiskBytes()},
                               {"folds", stats.folds},
                               {"folded_rows", stats.folded_rows},
                               {"fold_ms", stats.fold_us / 1000},
                               {"fold_cpu_ms", stats.fold_cpu_us / 1000},
                               {"pending_log_rows", store.pendingLogRows()},
                               {"fold_status", store.foldStatus().toString()}});
}

// The signing key, created if absent (its directory too: the data dir may not exist yet).
// Per connection: the frame size, the replies owed before a client is paused, the stall deadline.
net::StreamLimits connectionLimitsOf(const LedgerConfig& config) {
  return {.frame_bytes_max = config.frame_bytes_max,
          .write_queue_bytes_max = config.connection_write_queue_bytes_max,
          .stall_timeout_ms = config.connection_stall_timeout_ms};
}

Result<identity::KeyPair> signingKey(const LedgerConfig& config) {
  const std::string path = signingKeyPath(config);
  if (config.signing_key_file.empty() && ::mkdir(config.data_dir.c_str(), 0750) != 0 &&
      errno != EEXIST) {
    return Status::ioError("mkdir " + config.data_dir + ": " + std::strerror(errno));
  }
  return identity::loadOrCreateKeyPair(path);
}

int printIdentity(const LedgerConfig& config, bool json) {
  Result<identity::KeyPair> key = signingKey(config);
  if (!key.isOk()) {
    std::fprintf(stderr, "tally-ledger: signing key %s: %s\n", signingKeyPath(config).c_str(),
                 key.status().toString().c_str());
    return kExitStartup;
  }
  const std::string key_id = identity::keyIdOf(key.value().public_key);
  const std::string public_key = identity::encodePublicKey(key.value().public_key);
  if (json) {
    std::printf("{\"keyId\":\"%s\",\"publicKey\":\"%s\"}\n", key_id.c_str(), public_key.c_str());
  } else {
    std::printf("keyId %s\npublicKey %s\n", key_id.c_str(), public_key.c_str());
  }
  return kExitOk;
}

// What the durable record occupies: every regular file in the data directory and below it (the
// log's segments are in DIR/log).
uint64_t storeBytes(const std::string& data_dir) {
  uint64_t total = 0;
  std::error_code error;
  for (std::filesystem::recursive_directory_iterator it(data_dir, error), end; !error && it != end;
       it.increment(error)) {
    std::error_code size_error;
    const uintmax_t size = it->is_regular_file(size_error) ? it->file_size(size_error) : 0;
    if (!size_error) total += size;
  }
  return total;
}

void logPostgresStoreStats(const PostgresStore& store, Logger* logger) {
  const PostgresStoreStats stats = store.stats();
  logger->info("store_stats", {{"store", "postgres"},
                               {"commits", stats.commits},
                               {"commit_ms", stats.commit_us / 1000},
                               {"statements", stats.statements},
                               {"param_bytes", stats.param_bytes}});
}

// The store `config` selects, opened, with what logs its costs at exit.
struct OpenedStore {
  std::unique_ptr<Store> store;
  std::function<void(Logger*)> log_stats;

  PostgresStore* postgres = nullptr;  // when store = "postgres": its lease
};

// Unique per process: a restarted ledger is a new holder of the lease.
std::string leaseHolder() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(host) + ":" + std::to_string(::getpid()) + ":" + std::to_string(wallClockMs());
}

// `listen` is the address the lease names (the bound one: a port 0 is resolved before);
// `on_standby` is called at each poll while a standby waits for the lease (on this thread).
Result<OpenedStore> openStore(const LedgerConfig& config, const std::string& listen,
                              std::function<void(const LeaseState&)> on_standby, Logger* logger) {
  if (config.store == "postgres") {
    PostgresStoreOptions options{.lease_ms = config.lease_ms,
                                 .holder = leaseHolder(),
                                 .address = listen,
                                 .standby = config.standby,
                                 .on_standby = std::move(on_standby)};
    Result<std::unique_ptr<PostgresStore>> opened =
        PostgresStore::open(config.data_dir, config.postgres_conninfo, options);
    if (!opened.isOk()) return opened.status();
    PostgresStore* raw = opened.value().get();
    logger->info(
        "lease_taken",
        {{"epoch", raw->epoch()}, {"holder", options.holder}, {"lease_ms", config.lease_ms}});
    return OpenedStore{.store = std::move(opened).value(),
                       .log_stats = [raw](Logger* logger) { logPostgresStoreStats(*raw, logger); },
                       .postgres = raw};
  }
  // A data dir whose record is in PostgreSQL would otherwise start an empty SQLite store.
  const std::string marker = config.data_dir + "/" + PostgresStore::kMarkerFileName;
  if (struct stat marker_stat{}; ::stat(marker.c_str(), &marker_stat) == 0) {
    return Status::failedPrecondition(marker +
                                      " exists: this data dir's record is in PostgreSQL; "
                                      "start with --store postgres (docs/scale-out.md)");
  }
  Result<std::unique_ptr<SqliteStore>> opened = SqliteStore::open(
      config.data_dir, SqliteStoreOptions{.checkpoint_log_rows = config.checkpoint_log_rows});
  if (!opened.isOk()) return opened.status();
  SqliteStore* raw = opened.value().get();
  return OpenedStore{.store = std::move(opened).value(),
                     .log_stats = [raw](Logger* logger) { logSqliteStoreStats(*raw, logger); }};
}

// A standby (postgres, --standby): listens on `*listen_fd` (adopted) and answers every request
// with NOT_PRIMARY naming the lease's address (ledger/standby_server.h), serves a standby's
// /metrics and tells systemd READY=1, while another thread waits for the lease in
// PostgresStore::open. Once it is taken (or the open failed) every handle is closed and the
// listening socket is handed back in *listen_fd, still listening, with the metrics port bound in
// *metrics_port. SIGTERM meanwhile ends the process (nothing to drain).
// `primary` is the address it names until the first poll ("": not known yet).
Result<OpenedStore> waitAsStandby(const LedgerConfig& config, const std::string& listen,
                                  const std::string& primary, int* listen_fd,
                                  uint16_t* metrics_port, Logger* logger) {
  uv_loop_t loop;
  if (int rc = uv_loop_init(&loop); rc != 0) {
    ::close(*listen_fd);
    *listen_fd = -1;
    return Status::ioError(std::string("uv_loop_init: ") + uv_strerror(rc));
  }
  // TLS as the primary speaks it (agents pin the ledger key, which the standby shares), so a
  // client is told NOT_PRIMARY rather than refused for speaking TLS.
  std::function<Result<std::unique_ptr<net::TlsSession>>()> tls;
  Status status = Status::ok();
  if (!config.insecure) {
    Result<identity::KeyPair> key = signingKey(config);
    if (key.isOk()) {
      tls = standbyTlsSessions(key.value());
    } else {
      status = Status::ioError(signingKeyPath(config) + ": " + key.status().message());
    }
  }
  StandbyServer standby(&loop, logger,
                        StandbyServerOptions{.listen_fd = std::exchange(*listen_fd, -1),
                                             .stream = connectionLimitsOf(config),
                                             .connections_max = net::connectionsMaxForThisProcess(
                                                 config.connections_max, logger),
                                             .buffered_bytes_max = config.buffered_bytes_max,
                                             .tls = std::move(tls)});
  standby.setPrimary(primary);
  if (status.isOk()) status = standby.start();
  struct Shared {
    std::mutex mutex;
    std::optional<LeaseState> lease;  // the latest poll's, not yet seen by the loop
    std::optional<Result<OpenedStore>> opened;
  } shared;
  net::MetricsServer metrics(&loop, logger, config.metrics_host, config.metrics_port,
                             [&standby] { return renderStandbyMetrics(standby); });
  if (status.isOk() && config.metrics_enabled) status = metrics.start();
  SdWatchdog watchdog(&loop, sdWatchdogIntervalMs(), [logger](const std::string& error) {
    logger->warn("sd_notify_failed", {{"error", error}});
  });
  struct Context {
    Shared* shared;
    StandbyServer* standby;
    net::MetricsServer* metrics;
    SdWatchdog* watchdog;
    const LedgerConfig* config;
    const std::string* listen;
    Logger* logger;
    bool told = false;
    int handed_fd = -1;
    uint16_t metrics_port = 0;
  } context{&shared, &standby, &metrics, &watchdog, &config, &listen, logger};
  uv_async_t async{};
  (void)uv_async_init(&loop, &async, [](uv_async_t* handle) {
    auto* c = static_cast<Context*>(handle->data);
    std::optional<LeaseState> lease;
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(c->shared->mutex);
      lease = std::exchange(c->shared->lease, std::nullopt);
      done = c->shared->opened.has_value();
    }
    if (lease.has_value()) {
      c->standby->setPrimary(lease->address);
      if (!c->told) {
        c->told = true;
        c->logger->info("standby",
                        {{"data_dir", c->config->data_dir},
                         {"listen", *c->listen},
                         {"epoch", lease->epoch},
                         {"holder", lease->holder},
                         {"primary", lease->address},
                         {"lapses_in_ms", lease->expires_in_ms},
                         {"action", "answering NOT_PRIMARY; taking over once the lease lapses"}});
        if (Status s = sdNotify("READY=1\nSTATUS=standby: answering NOT_PRIMARY"); !s.isOk()) {
          c->logger->warn("sd_notify_failed", {{"error", s.toString()}});
        }
        (void)c->watchdog->start();
      }
    }
    if (!done) return;
    c->metrics_port = c->config->metrics_enabled ? c->metrics->port() : 0;
    c->handed_fd = c->standby->handOver();
    if (c->config->metrics_enabled) c->metrics->stop();
    c->watchdog->stop();
    uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
  });
  async.data = &context;
  if (!status.isOk()) {
    standby.stop();
    if (config.metrics_enabled) metrics.stop();
    uv_close(reinterpret_cast<uv_handle_t*>(&async), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    (void)uv_loop_close(&loop);
    return status;
  }
  std::thread opener([&config, &listen, &shared, &async, logger] {
    Result<OpenedStore> opened = openStore(
        config, listen,
        [&shared, &async](const LeaseState& held) {
          {
            std::lock_guard<std::mutex> lock(shared.mutex);
            shared.lease = held;
          }
          (void)uv_async_send(&async);
        },
        logger);
    {
      std::lock_guard<std::mutex> lock(shared.mutex);
      shared.opened.emplace(std::move(opened));
    }
    (void)uv_async_send(&async);
  });
  uv_run(&loop, UV_RUN_DEFAULT);
  opener.join();
  (void)uv_loop_close(&loop);
  *listen_fd = context.handed_fd;
  *metrics_port = context.metrics_port;
  if (shared.opened->isOk() && context.handed_fd < 0) {
    return Status::ioError("standby: the listening socket could not be handed over");
  }
  return std::move(*shared.opened);
}

// TLS on the link (ledger/link_tls.h): the factory of server sessions, or none with
// --insecure (logged loudly). Loads or creates DIR/operator.key; its public half goes to
// `operator_public_key` (the server's ServerOptions::operator_key).
Result<std::function<Result<std::unique_ptr<net::TlsSession>>()>> linkTls(
    const LedgerConfig& config, const identity::KeyPair& ledger_key, const Ledger* ledger,
    Logger* logger, std::optional<PublicKey>* operator_public_key) {
  if (config.insecure) {
    logger->warn("insecure",
                 {{"listen", config.listen_host},
                  {"effect",
                   "plaintext link WITHOUT authentication: any local process can reserve, "
                   "settle, publish policies and enroll gateways; for demos and tests only"}});
    return std::function<Result<std::unique_ptr<net::TlsSession>>()>();
  }
  Result<identity::KeyPair> operator_key = loadOrCreateOperatorKey(config.data_dir, logger);
  if (!operator_key.isOk()) {
    return Status::ioError(operatorKeyPath(config.data_dir) + ": " +
                           operator_key.status().message());
  }
  logger->info("tls", {{"ledger_key_id", identity::keyIdOf(ledger_key.public_key)},
                       {"operator_key", operatorKeyPath(config.data_dir)},
                       {"admits", "enrolled, enabled gateway keys and the operator key"}});
  *operator_public_key = operator_key.value().public_key;
  return serverTlsSessions(ledger_key, ledger, operator_key.value().public_key);
}

struct Signals {
  uv_signal_t term{};
  uv_signal_t interrupt{};
};

// The postgres store binds its listening socket before it takes the lease, so that the lease
// names the bound port (port 0 in tests) and a standby can listen while it waits. Returns
// kExitOk, or kExitStartup (logged).
int bindBeforeTheLease(LedgerConfig* config, int* listen_fd, std::string* listen, Logger* logger) {
  *listen = config->listen_host + ":" + std::to_string(config->listen_port);
  if (config->store != "postgres") return kExitOk;
  uint16_t bound_port = 0;
  Result<int> bound = bindListeningSocket(config->listen_host, config->listen_port, &bound_port);
  if (!bound.isOk()) {
    logger->error("listen_failed", {{"error", bound.status().toString()}});
    return kExitStartup;
  }
  *listen_fd = bound.value();
  *listen = config->listen_host + ":" + std::to_string(bound_port);
  return kExitOk;
}

// NOT_PRIMARY naming who holds the lease now, once `store` is deposed; nullopt otherwise.
std::optional<wire::ErrorReply> notPrimaryAnswer(const PostgresStore* store) {
  if (store == nullptr || !store->deposed()) return std::nullopt;
  return wire::ErrorReply{.code = wire::ErrorCode::kNotPrimary,
                          .message = notPrimaryMessage(store->deposedBy().address)};
}

// Serves as the primary on `opened` until it stops: SIGTERM/SIGINT (kExitOk), a failed commit
// (kExitIoError), or, on the postgres store, being deposed (kExitDeposed: the requests it held
// and those waiting in its sockets are answered NOT_PRIMARY naming the new holder, whose address
// is left in *primary). A ledger that may wait as a standby (config.standby) leaves in *kept_fd
// a descriptor of its listening socket, still listening, for the standby it becomes; -1
// otherwise. Updates config.ready_fd (written once) and config.metrics_port (the bound one).
int serve(LedgerConfig* config_in, OpenedStore opened, int listen_fd, int* kept_fd,
          std::string* primary, Logger& logger) {
  LedgerConfig& config = *config_in;
  std::unique_ptr<Store> store = std::move(opened.store);

  Result<identity::KeyPair> key = signingKey(config);
  if (!key.isOk()) {
    logger.error("signing_key_failed",
                 {{"path", signingKeyPath(config)}, {"error", key.status().toString()}});
    return kExitStartup;
  }
  const std::string key_id = identity::keyIdOf(key.value().public_key);
  const wire::WireShardCrypto crypto(key.value(), {});

  Ledger ledger(LedgerOptions{.retention_ms = config.retention_ms,
                              .receipt_bytes_max = config.receipt_bytes_max,
                              .shard_retention_ms = config.shard_retention_ms});
  ledger.setShardCrypto(&crypto);
  std::vector<BadRecord> bad_records;
  Result<RestoreSummary> restored =
      restoreLedger(store.get(), &ledger, wallClockMs(), &bad_records);
  if (!restored.isOk()) {
    for (const BadRecord& bad : bad_records) {
      logger.error("bad_record", {{"table", bad.table},
                                  {"key", bad.key},
                                  {"field", bad.field},
                                  {"value", bad.value},
                                  {"why", bad.why}});
    }
    logger.error(
        "restore_failed",
        {{"data_dir", config.data_dir},
         {"error", restored.status().toString()},
         {"hint", bad_records.empty() ? std::string()
                                      : "tally-ledger --data-dir " + config.data_dir +
                                            " check lists them; docs/RUNBOOK.md has the way out"}});
    return bad_records.empty() ? kExitStartup : kExitBadRecord;
  }
  const RestoreSummary& summary = restored.value();
  logger.info("restored", {{"data_dir", config.data_dir},
                           {"store", config.store},
                           {"policies", summary.policies},
                           {"accounts", summary.accounts},
                           {"reservations", summary.reservations},
                           {"gateways", summary.gateways},
                           {"shards", summary.shards},
                           {"ledger_clock_ms", summary.ledger_clock_ms},
                           {"load_ms", summary.load_ms},
                           {"apply_ms", summary.apply_ms},
                           {"finish_ms", summary.finish_ms}});

  std::optional<PublicKey> operator_public_key;
  Result<std::function<Result<std::unique_ptr<net::TlsSession>>()>> tls =
      linkTls(config, key.value(), &ledger, &logger, &operator_public_key);
  if (!tls.isOk()) {
    logger.error("tls_setup_failed", {{"error", tls.status().toString()}});
    return kExitStartup;
  }

  LedgerClock clock(summary.ledger_clock_ms);
  uv_loop_t loop;
  if (int rc = uv_loop_init(&loop); rc != 0) {
    logger.error("loop_init_failed", {{"error", uv_strerror(rc)}});
    return kExitStartup;
  }
  LedgerMetrics metrics;
  const Server* serving = nullptr;
  net::MetricsServer metrics_server(&loop, &logger, config.metrics_host, config.metrics_port,
                                    [&ledger, &metrics, &clock, &config, &serving] {
                                      LedgerGauges gauges = ledgerGauges(ledger, clock.nowMs());
                                      gauges.store_bytes = storeBytes(config.data_dir);
                                      gauges.connections =
                                          serving != nullptr ? serving->connections() : 0;
                                      return metrics.render(gauges);
                                    });
  bool metrics_started = false;
  SdWatchdog watchdog(&loop, sdWatchdogIntervalMs(), [&logger](const std::string& error) {
    logger.warn("sd_notify_failed", {{"error", error}});
  });
  Signals signals;
  // The postgres store's lease, renewed from the loop every lease_ms / 3 between commits.
  uv_timer_t lease_timer{};
  PostgresStore* const lease_store = opened.postgres;
  if (lease_store != nullptr) (void)uv_timer_init(&loop, &lease_timer);
  auto close_signals = [&signals, &metrics_server, &metrics_started, &watchdog, &lease_timer,
                        lease_store] {
    watchdog.stop();
    if (lease_store != nullptr && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&lease_timer))) {
      uv_close(reinterpret_cast<uv_handle_t*>(&lease_timer), nullptr);
    }
    for (uv_signal_t* handle : {&signals.term, &signals.interrupt}) {
      if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(handle))) {
        uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
      }
    }
    if (metrics_started) metrics_server.stop();
  };
  // A ledger that may wait as a standby keeps its listening socket past the server (which
  // closes its own), so that once deposed it answers NOT_PRIMARY on the same port.
  if (lease_store != nullptr && config.standby) *kept_fd = ::dup(listen_fd);
  const bool commit_on_loop = commitsOnLoop(config);
  Server server(
      &loop, &ledger, store.get(), &clock, &logger,
      ServerOptions{
          .listen_host = config.listen_host,
          .listen_port = config.listen_port,
          .listen_fd = listen_fd,
          .stream = connectionLimitsOf(config),
          .tick_interval_ms = config.tick_interval_ms,
          .commit_on_loop = commit_on_loop,
          .connections_max = net::connectionsMaxForThisProcess(config.connections_max, &logger),
          .buffered_bytes_max = config.buffered_bytes_max,
          .on_stopped = close_signals,
          .metrics = &metrics,
          .tls = tls.value(),
          .refused_answer = [lease_store](const Status&) { return notPrimaryAnswer(lease_store); },
          .operator_key = operator_public_key});
  serving = &server;
  auto on_signal = [](uv_signal_t* handle, int signum) {
    auto* srv = static_cast<Server*>(handle->data);
    (void)signum;
    // Told before the drain, as the agent does: systemd shows "deactivating" from here on.
    (void)sdNotify("STOPPING=1");
    srv->stop();
  };
  for (uv_signal_t* handle : {&signals.term, &signals.interrupt}) {
    (void)uv_signal_init(&loop, handle);
    handle->data = &server;
  }
  (void)uv_signal_start(&signals.term, on_signal, SIGTERM);
  (void)uv_signal_start(&signals.interrupt, on_signal, SIGINT);

  int exit_code = kExitOk;
  Status status = server.start();
  if (!status.isOk()) {
    logger.error("listen_failed", {{"error", status.toString()}});
  } else if (config.metrics_enabled) {
    metrics_started = true;
    status = metrics_server.start();
    if (!status.isOk()) logger.error("metrics_listen_failed", {{"error", status.toString()}});
  }
  if (!status.isOk()) {
    exit_code = kExitStartup;
    server.stop();
  } else {
    const uint16_t metrics_port = config.metrics_enabled ? metrics_server.port() : 0;
    const std::string addr = config.listen_host + ":" + std::to_string(server.port());
    logger.info("ready", {{"listen", addr},
                          {"data_dir", config.data_dir},
                          {"metrics", config.metrics_enabled
                                          ? config.metrics_host + ":" + std::to_string(metrics_port)
                                          : std::string("off")},
                          {"version", kVersion},
                          {"commits_on", commit_on_loop ? "loop" : "thread"},
                          {"signing_key_id", key_id},
                          {"active_generation", ledger.accounts().activeGeneration()}});
    if (config.ready_fd > 2) {
      const std::string line =
          "ready " + std::to_string(server.port()) + " " + std::to_string(metrics_port) + "\n";
      if (::write(config.ready_fd, line.data(), line.size()) < 0) {
        logger.warn("ready_fd_write_failed", {{"error", std::strerror(errno)}});
      }
      ::close(config.ready_fd);
      config.ready_fd = -1;  // once: a ledger that serves again after a standby says nothing
    }
    if (config.metrics_enabled) config.metrics_port = metrics_port;  // a standby's, later
    if (Status s = sdNotify("READY=1"); !s.isOk()) {
      logger.warn("sd_notify_failed", {{"error", s.toString()}});
    }
    if (!watchdog.start()) logger.warn("watchdog_start_failed");
    if (lease_store != nullptr) {
      struct LeaseRenewal {
        PostgresStore* store;
        Server* server;
        Logger* logger;
      };
      static LeaseRenewal renewal;  // one run() per process
      renewal = {lease_store, &server, &logger};
      lease_timer.data = &renewal;
      const uint64_t every_ms = std::max<uint64_t>(config.lease_ms / 3, 1);
      (void)uv_timer_start(
          &lease_timer,
          [](uv_timer_t* timer) {
            auto* r = static_cast<LeaseRenewal*>(timer->data);
            const Status renewed = r->store->renewLease();
            if (renewed.isOk()) return;
            if (r->store->deposed()) {
              (void)uv_timer_stop(timer);
              // Its commits are refused from now on: what it holds and what waits in its
              // sockets is answered NOT_PRIMARY, naming the new holder; then it stops.
              if (std::optional<wire::ErrorReply> answer = notPrimaryAnswer(r->store)) {
                r->server->refuse(*answer);
              }
              return;
            }
            r->logger->warn("lease_renew_failed", {{"error", renewed.toString()}});
          },
          every_ms, every_ms);
    }
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  if (server.fatal()) exit_code = kExitIoError;
  if (lease_store != nullptr && lease_store->deposed()) {
    exit_code = kExitDeposed;
    *primary = lease_store->deposedBy().address;
    logger.error("deposed",
                 {{"epoch", lease_store->epoch()},
                  {"primary", *primary},
                  {"action", config.standby
                                 ? "serving stopped: another tally-ledger took the lease; nothing "
                                   "was committed after it, its requests were answered "
                                   "NOT_PRIMARY; waiting as a standby"
                                 : "stopped: another tally-ledger took the lease; nothing was "
                                   "committed after it, its requests were answered NOT_PRIMARY"}});
  }
  opened.log_stats(&logger);
  if (int rc = uv_loop_close(&loop); rc != 0) {
    logger.error("loop_close_failed", {{"error", uv_strerror(rc)}});
  }
  return exit_code;
}

int run(LedgerConfig config, int huge_page_reexec_errno) {
  Logger logger("ledger", parseLogLevel(config.log_level));
  ::signal(SIGPIPE, SIG_IGN);
  if (huge_page_reexec_errno != 0) {
    logger.warn("malloc_tunables_not_set", {{"tunables", kHugePageMallocTunables},
                                            {"error", std::strerror(huge_page_reexec_errno)},
                                            {"effect", "restarts take longer (page faults)"}});
  }
  logFdLimit(raiseFdLimit(), &logger);  // every connection is a descriptor
  if (!fixMallocMmapThreshold()) logger.warn("mallopt_failed", {{"option", "M_MMAP_THRESHOLD"}});

  int listen_fd = -1;
  std::string listen;
  if (int rc = bindBeforeTheLease(&config, &listen_fd, &listen, &logger); rc != kExitOk) return rc;
  // Once deposed, a ledger that may be a standby waits as one on the same socket (answering
  // NOT_PRIMARY, naming who deposed it) and serves again once the lease is its again.
  std::string primary;
  for (bool deposed = false;; deposed = true) {
    uint16_t standby_metrics_port = 0;
    Result<OpenedStore> opened =
        config.store == "postgres" && config.standby
            ? waitAsStandby(config, listen, primary, &listen_fd, &standby_metrics_port, &logger)
            : openStore(config, listen, nullptr, &logger);
    // The metrics port the standby served on (port 0 picked one) stays the primary's.
    if (config.metrics_enabled && standby_metrics_port != 0) {
      config.metrics_port = standby_metrics_port;
    }
    if (!opened.isOk()) {
      if (listen_fd >= 0) ::close(listen_fd);
      logger.error("store_open_failed", {{"data_dir", config.data_dir},
                                         {"store", config.store},
                                         {"error", opened.status().toString()}});
      logger.info("exit", {{"code", deposed ? kExitDeposed : kExitStartup}});
      return deposed ? kExitDeposed : kExitStartup;
    }
    int kept_fd = -1;
    const int exit_code =
        serve(&config, std::move(opened).value(), listen_fd, &kept_fd, &primary, logger);
    listen_fd = kept_fd;
    if (exit_code != kExitDeposed || listen_fd < 0) {
      if (listen_fd >= 0) ::close(listen_fd);
      logger.info("exit", {{"code", exit_code}});
      return exit_code;
    }
  }
}

}  // namespace
}  // namespace tally::ledger

int main(int argc, char** argv) {
  const int huge_page_reexec_errno = tally::reexecWithHugePageMalloc(argv);
  tally::ledger::LedgerConfig config;
  tally::ledger::Command command;
  const int parsed = tally::ledger::parseArgs(argc, argv, &config, &command);
  if (parsed == -1) return 0;
  if (parsed != 0) return parsed;
  if (command.identity) return tally::ledger::printIdentity(config, command.json);
  struct stat marker_stat {};
  const bool postgres_data_dir =
      ::stat((config.data_dir + "/" + tally::ledger::PostgresStore::kMarkerFileName).c_str(),
             &marker_stat) == 0;
  if ((command.check || command.repair || !command.backup_dest.empty()) &&
      (config.store != "sqlite" || postgres_data_dir)) {
    std::fprintf(stderr,
                 "tally-ledger: check, repair and backup work on the SQLite store only; for the "
                 "postgres store use pg_dump and psql (docs/scale-out.md)\n");
    return 2;
  }
  if (command.check) return tally::ledger::runCheck(config.data_dir, tally::wallClockMs());
  if (command.repair) return tally::ledger::runRepair(config.data_dir, tally::wallClockMs());
  if (!command.backup_dest.empty()) {
    return tally::ledger::runBackup(config.data_dir, command.backup_dest, tally::wallClockMs());
  }
  return tally::ledger::run(config, huge_page_reexec_errno);
}
