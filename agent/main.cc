// tally-agent: the gateway sidecar. Serves gateways on a Unix socket and forwards to the ledger.

#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "agent/agent_service.h"
#include "agent/config.h"
#include "agent/gateway_server.h"
#include "agent/metrics.h"
#include "agent/metrics_server.h"
#include "agent/outbox_store.h"
#include "central-client/ledger_link.h"
#include "common/log.h"
#include "common/sd_notify.h"
#include "common/wall_clock.h"
#include "tally/version.h"

namespace tally::agent {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitStartup = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "usage: tally-agent --data-dir DIR --ledger HOST:PORT [--socket PATH] [--config FILE]\n"
    "                   [--metrics HOST:PORT] [--ready-fd FD]\n"
    "                   [--log-level debug|info|warn|error]\n"
    "       tally-agent --version | --help\n"
    "\n"
    "The gateway sidecar: serves gateways on a Unix socket (default /run/tally/agent.sock,\n"
    "mode 0660, peer uid/gid checked) and forwards to the ledger while it is reachable. During a\n"
    "partition, reserve is rejected with retry-after, start fails retryably (UNAVAILABLE), and\n"
    "settle/release/mark-unknown/report are written to the durable outbox in DIR/agent.db\n"
    "(answered QUEUED) and delivered in order once the ledger is back.\n"
    "--metrics HOST:PORT: Prometheus endpoint (default 127.0.0.1:9464; \"\" disables).\n"
    "--ready-fd FD: write \"ready METRICS_PORT SOCKET\\n\" to FD once serving (METRICS_PORT is 0\n"
    "when metrics are disabled), then close it. Socket activation (LISTEN_FDS) and sd_notify\n"
    "(NOTIFY_SOCKET) are supported.\n"
    "Exit: 0 after SIGTERM/SIGINT drain, 1 startup failure, 2 usage.\n";

LogLevel parseLevel(const std::string& level) {
  if (level == "debug") return LogLevel::kDebug;
  if (level == "warn") return LogLevel::kWarn;
  if (level == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

// Returns kExitOk to continue, -1 to exit 0 (help/version), or an exit code.
int parseArgs(int argc, char** argv, AgentConfig* config) {
  std::string config_file, ledger, socket, level, metrics;
  bool metrics_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tally-agent: %s needs a value\n%s", name, kUsage);
        return nullptr;
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return -1;
    }
    if (arg == "--version") {
      std::printf("tally-agent %s\n", kVersion);
      return -1;
    }
    const char* v = nullptr;
    std::string* target = nullptr;
    if (arg == "--data-dir") {
      target = &config->data_dir;
    } else if (arg == "--ledger") {
      target = &ledger;
    } else if (arg == "--socket") {
      target = &socket;
    } else if (arg == "--config") {
      target = &config_file;
    } else if (arg == "--log-level") {
      target = &level;
    } else if (arg == "--metrics") {
      target = &metrics;
      metrics_given = true;
    } else if (arg == "--ready-fd") {
      if ((v = value("--ready-fd")) == nullptr) return kExitUsage;
      config->ready_fd = std::atoi(v);
      if (config->ready_fd <= 2) {
        std::fprintf(stderr, "tally-agent: --ready-fd must be a descriptor above 2\n");
        return kExitUsage;
      }
      continue;
    } else {
      std::fprintf(stderr, "tally-agent: unknown argument '%s'\n%s", argv[i], kUsage);
      return kExitUsage;
    }
    if ((v = value(argv[i])) == nullptr) return kExitUsage;
    *target = v;
  }
  if (!config_file.empty()) {
    if (Status s = applyConfigFile(config_file, config); !s.isOk()) {
      std::fprintf(stderr, "tally-agent: %s\n", s.message().c_str());
      return kExitUsage;
    }
  }
  if (ledger.empty()) {
    std::fprintf(stderr, "tally-agent: --ledger HOST:PORT is required\n%s", kUsage);
    return kExitUsage;
  }
  if (Status s = parseHostPort(ledger, &config->ledger_host, &config->ledger_port); !s.isOk()) {
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
  if (!level.empty()) config->log_level = level;
  applyDefaultPeers(config, ::getuid(), ::getgid());
  if (Status s = validateConfig(*config); !s.isOk()) {
    std::fprintf(stderr, "tally-agent: %s\n%s", s.message().c_str(), kUsage);
    return kExitUsage;
  }
  return kExitOk;
}

// The daemon's parts, in construction order; destroyed after the loop ran dry.
struct Daemon {
  Daemon(uv_loop_t* loop, const AgentConfig& config, Logger* logger, OutboxStore* store,
         int inherited_fd)
      : config(config),
        logger(logger),
        link(loop,
             central::LedgerLinkOptions{.host = config.ledger_host,
                                        .port = config.ledger_port,
                                        .request_timeout_ms = config.request_timeout_ms,
                                        .frame_bytes_max = config.frame_bytes_max,
                                        .health = config.health},
             logger),
        service(loop, &link, store, &metrics, logger,
                AgentServiceOptions{.policy_refresh_ms = config.policy_refresh_ms,
                                    .outbox_entries_max = config.outbox_entries_max}),
        server(loop, logger,
               GatewayServerOptions{.socket_path = config.socket_path,
                                    .socket_mode = config.socket_mode,
                                    .inherited_fd = inherited_fd,
                                    .allowed_uids = config.allowed_uids,
                                    .allowed_gids = config.allowed_gids,
                                    .frame_bytes_max = config.frame_bytes_max,
                                    .drain_timeout_ms = config.drain_timeout_ms},
               [this](wire::RequestBody body, Respond respond) {
                 service.handle(std::move(body), std::move(respond));
               }),
        metrics_server(loop, logger, config.metrics_host, config.metrics_port,
                       [this] { return metrics.render(service.gauges()); }) {
    term.data = this;
    interrupt.data = this;
  }

  // Stop accepting, finish in-flight, flush the outbox while the ledger is reachable, close.
  void shutdown() {
    if (shutting_down) return;
    shutting_down = true;
    if (Status s = sdNotify("STOPPING=1"); !s.isOk()) {
      logger->warn("sd_notify_failed", {{"error", s.toString()}});
    }
    logger->info("draining",
                 {{"drain_timeout_ms", config.drain_timeout_ms}, {"in_flight", server.inFlight()}});
    const uint64_t deadline_ms = monotonicClockMs() + config.drain_timeout_ms;
    server.stop([this, deadline_ms] {
      const uint64_t now_ms = monotonicClockMs();
      service.drain(deadline_ms > now_ms ? deadline_ms - now_ms : 0, [this] {
        service.stop();
        if (metrics_started) metrics_server.stop();
        link.stop([this] {
          for (uv_signal_t* handle : {&term, &interrupt}) {
            if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(handle))) {
              uv_close(reinterpret_cast<uv_handle_t*>(handle), nullptr);
            }
          }
        });
      });
    });
  }

  const AgentConfig& config;
  Logger* logger;
  AgentMetrics metrics;
  central::LedgerLink link;
  AgentService service;
  GatewayServer server;
  MetricsServer metrics_server;
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

int run(const AgentConfig& config) {
  Logger logger("agent", parseLevel(config.log_level));
  ::signal(SIGPIPE, SIG_IGN);

  Result<std::unique_ptr<OutboxStore>> opened = OutboxStore::open(config.data_dir);
  if (!opened.isOk()) {
    logger.error("store_open_failed",
                 {{"data_dir", config.data_dir}, {"error", opened.status().toString()}});
    return kExitStartup;
  }
  std::unique_ptr<OutboxStore> store = std::move(opened).value();
  // Durably, before serving (SPEC §6 rule 3): a restart never inherits an emergency shard.
  Result<uint64_t> epoch = store->incrementBootEpoch();
  if (!epoch.isOk()) {
    logger.error("boot_epoch_failed", {{"error", epoch.status().toString()}});
    return kExitStartup;
  }
  Result<std::vector<OutboxEntry>> restored = store->load();
  if (!restored.isOk()) {
    logger.error("outbox_load_failed", {{"error", restored.status().toString()}});
    return kExitStartup;
  }
  logger.info("boot", {{"boot_epoch", epoch.value()},
                       {"data_dir", config.data_dir},
                       {"outbox_entries", uint64_t{restored.value().size()}}});

  uv_loop_t loop;
  if (int rc = uv_loop_init(&loop); rc != 0) {
    logger.error("loop_init_failed", {{"error", uv_strerror(rc)}});
    return kExitStartup;
  }
  int exit_code = kExitOk;
  {
    Daemon daemon(&loop, config, &logger, store.get(), inheritedSocket(&logger));
    for (uv_signal_t* handle : {&daemon.term, &daemon.interrupt}) {
      (void)uv_signal_init(&loop, handle);
    }
    auto on_signal = [](uv_signal_t* handle, int) {
      static_cast<Daemon*>(handle->data)->shutdown();
    };
    (void)uv_signal_start(&daemon.term, on_signal, SIGTERM);
    (void)uv_signal_start(&daemon.interrupt, on_signal, SIGINT);

    Status status = daemon.link.start();
    if (status.isOk()) status = daemon.service.start(std::move(restored).value(), epoch.value());
    if (status.isOk()) status = daemon.server.start();
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
      logger.info("ready",
                  {{"socket", config.socket_path},
                   {"ledger", config.ledger_host + ":" + std::to_string(config.ledger_port)},
                   {"metrics", config.metrics_enabled
                                   ? config.metrics_host + ":" + std::to_string(metrics_port)
                                   : std::string("disabled")},
                   {"boot_epoch", epoch.value()},
                   {"version", kVersion}});
      writeReady(config, metrics_port, &logger);
      if (Status s = sdNotify("READY=1"); !s.isOk()) {
        logger.warn("sd_notify_failed", {{"error", s.toString()}});
      }
    }
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  if (int rc = uv_loop_close(&loop); rc != 0) {
    logger.error("loop_close_failed", {{"error", uv_strerror(rc)}});
  }
  logger.info("exit", {{"code", exit_code}});
  return exit_code;
}

}  // namespace
}  // namespace tally::agent

int main(int argc, char** argv) {
  tally::agent::AgentConfig config;
  const int parsed = tally::agent::parseArgs(argc, argv, &config);
  if (parsed == -1) return 0;
  if (parsed != 0) return parsed;
  return tally::agent::run(config);
}
