#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/log.h"
#include "core/status.h"

// A minimal HTTP/1.1 server for Prometheus scrapes: `GET /metrics` → 200 with the text that
// `render` returns; any other request → 404 (405 for other methods); a request head above
// kRequestBytesMax → 431. One request per connection, closed after the response.
//
// Serves tally-agent's and tally-ledger's /metrics. It does not sit on net::FramedStream: an
// HTTP request head is not a length-prefixed frame, and one request per connection needs no
// write queue or back-pressure (the response is one buffer, written once, then the connection
// closes). Owns its handles; borrows `loop` and `logger`. Single-threaded (the loop thread).

namespace tally::net {

// Pure: the full HTTP response for a complete request head.
std::string httpResponseFor(std::string_view request_head, const std::string& metrics_body);

class MetricsServer {
 public:
  static constexpr size_t kRequestBytesMax = 8 * 1024;
  static constexpr size_t kConnectionsMax = 64;

  MetricsServer(uv_loop_t* loop, Logger* logger, std::string host, uint16_t port,
                std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  [[nodiscard]] Status start();
  uint16_t port() const { return port_; }
  // Closes the listener and every connection.
  void stop();

  struct Connection;

 private:
  static void onConnection(uv_stream_t* listener, int status);
  void onData(Connection* connection, const char* data, size_t length);
  void respond(Connection* connection, std::string response);
  void close(Connection* connection);

  uv_loop_t* loop_;
  [[maybe_unused]] Logger* logger_;  // kept for the constructor's contract; nothing logs yet
  std::string host_;
  uint16_t port_;
  std::function<std::string()> render_;
  uv_tcp_t listener_{};
  bool listener_open_ = false;
  int open_handles_ = 0;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
};

}  // namespace tally::net
