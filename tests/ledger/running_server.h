#pragma once

#include <gtest/gtest.h>
#include <uv.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "central-client/blocking_client.h"
#include "common/log.h"
#include "common/wall_clock.h"
#include "core/ledger.h"
#include "ledger/server.h"
#include "ledger/store.h"

// A real Server on its own loop thread over a test's Store (any port on 127.0.0.1), and
// BlockingClients to it. The loop runs until the server stops: by itself (a refused or failed
// commit) or through stopFromTest().
namespace tally::testing {

inline constexpr uint64_t kServerTimeoutMs = 10'000;

// Test names for suites parameterized on ServerOptions::commit_on_loop.
inline std::string commitOnName(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "Loop" : "Thread";
}

struct RunningServer {
  using Server = ledger::Server;
  using ServerOptions = ledger::ServerOptions;
  using Store = ledger::Store;

  uv_loop_t loop{};
  uv_async_t stop_request{};
  Ledger ledger;
  LedgerClock clock{0};
  Logger logger{"ledger", LogLevel::kError};
  std::unique_ptr<Server> server;
  std::thread thread;

  RunningServer(Store* store, ServerOptions options) {
    EXPECT_EQ(uv_loop_init(&loop), 0);
    stop_request.data = this;
    EXPECT_EQ(uv_async_init(&loop, &stop_request,
                            [](uv_async_t* handle) {
                              static_cast<RunningServer*>(handle->data)->server->stop();
                            }),
              0);
    options.listen_port = 0;
    options.on_stopped = [this] {
      uv_close(reinterpret_cast<uv_handle_t*>(&stop_request), nullptr);
    };
    server = std::make_unique<Server>(&loop, &ledger, store, &clock, &logger, std::move(options));
    EXPECT_TRUE(server->start().isOk());
    thread = std::thread([this] { uv_run(&loop, UV_RUN_DEFAULT); });
  }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;
  ~RunningServer() {
    if (thread.joinable()) {
      stopFromTest();
      join();
    }
  }

  // Asks the loop thread to stop the server (a drain, as SIGTERM does).
  void stopFromTest() { (void)uv_async_send(&stop_request); }
  // Waits for the loop to run dry once the server has stopped.
  void join() {
    thread.join();
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
  std::unique_ptr<client::BlockingClient> connect() {
    Result<std::unique_ptr<client::BlockingClient>> connected = client::BlockingClient::connect(
        client::Endpoint{
            .kind = client::Endpoint::Kind::kTcp, .host = "127.0.0.1", .port = server->port()},
        kServerTimeoutMs);
    EXPECT_TRUE(connected.isOk()) << connected.status().toString();
    return connected.isOk() ? std::move(connected).value() : nullptr;
  }
};

}  // namespace tally::testing
