#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/gateway_server.h"
#include "common/log.h"
#include "core/limits.h"
#include "core/status.h"

// tally-agent's HTTP/1.1 + JSON listener (docs/protocol.md "HTTP"): a second door to the same
// request path as the native socket. Requests are parsed with Node's http_parser, translated by
// agent/http_api.h and handed to the same RequestHandler the GatewayServer uses; nothing is
// decided here.
//
//  * A Unix socket at `socket_path` ("" : none), bound like the native one (stale file removed,
//    chmod `socket_mode`), whose peers are checked the same way (SO_PEERCRED against
//    allowed_uids / allowed_gids; a refused peer gets one 403 and the connection is closed);
//    and optionally a loopback TCP listener (`tcp_enabled`: no peer credentials there, so
//    only a loopback address is accepted by the config).
//  * Keep-alive and pipelining: each connection's answers go out in request order; at most
//    requests_in_flight_per_connection_max requests are parsed ahead of their answers, and
//    while that many are open, or more than write_queue_bytes_max answer bytes are unsent, the
//    connection is not read.
//  * Bounds per request: header_bytes_max (request line and headers; above it 431),
//    body_bytes_max (above it 413). A request http_parser refuses gets 400. After any of
//    those the connection is closed (once the answers before it are sent): the stream can no
//    longer be trusted to be in step.
//  * Timeouts: a request must be complete within header_timeout_ms of its first byte (of the
//    accept, for a connection's first request), whatever it trickles in; a connection owed
//    nothing and holding no partial request is closed after idle_timeout_ms without a byte.
//    While answers are owed the connection is not timed (the wait is ours). Either close is
//    logged (http_connection_timeout, with the reason) and sends no answer.
//  * Lingering close: a connection closed after its last answer (Connection: close, an error
//    answer such as 413/431 with the body unread, stop()) sends FIN once its writes are out,
//    then reads and discards until the peer's end of stream, at most linger_ms, and only then
//    closes: closing a TCP socket with unread input sends RST, which can drop the answer still
//    in the kernel's send queue (the rule of net/framed_stream.h).
//  * stop(): stops accepting and reading, waits for the answers handed out (at most
//    drain_timeout_ms), sends them, closes every connection and handle, then `on_stopped`.
//
// Owns its handles and connections; borrows `loop` and `logger`, which must outlive it.
// Single-threaded (the loop thread).

namespace tally::agent {

struct HttpServerOptions {
  std::string socket_path;  // "": no Unix listener
  uint32_t socket_mode = 0660;
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  bool tcp_enabled = false;
  std::string tcp_host = "127.0.0.1";
  uint16_t tcp_port = 0;  // 0: any free port (tcpPort() tells which)
  uint64_t header_bytes_max = limits::kHttpHeaderBytesMax;
  uint64_t body_bytes_max = limits::kHttpBodyBytesMax;
  uint64_t requests_in_flight_per_connection_max = limits::kHttpRequestsInFlightPerConnectionMax;
  uint64_t write_queue_bytes_max = limits::kHttpWriteQueueBytesPerConnectionMax;
  uint64_t header_timeout_ms = limits::kHttpHeaderTimeoutMsDefault;
  uint64_t idle_timeout_ms = limits::kHttpIdleTimeoutMsDefault;
  uint64_t linger_ms = limits::kLingerMsDefault;
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t drain_timeout_ms = 5'000;
};

class HttpServer {
 public:
  HttpServer(uv_loop_t* loop, Logger* logger, HttpServerOptions options, RequestHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens as configured; with neither listener configured it does nothing.
  [[nodiscard]] Status start();
  void stop(std::function<void()> on_stopped);

  bool enabled() const { return !options_.socket_path.empty() || options_.tcp_enabled; }
  uint16_t tcpPort() const { return bound_tcp_port_; }
  uint64_t inFlight() const { return in_flight_; }

  class Connection;

 private:
  static void onPipeConnection(uv_stream_t* listener, int status);
  static void onTcpConnection(uv_stream_t* listener, int status);
  static void onDrainDeadline(uv_timer_t* timer);
  Status listenTcp();
  void accept(uv_stream_t* listener, bool is_pipe);
  bool checkPeer(Connection* connection);
  void onRead(Connection* connection, ssize_t nread, const uv_buf_t* buf);
  // Parses what is buffered while the connection may take more requests.
  void parse(Connection* connection);
  void dispatch(Connection* connection);
  void answer(uint64_t connection_id, uint64_t sequence, std::string bytes);
  // Queues a reply for the request at the end of the parsed ones; `close`: the last one.
  uint64_t openSlot(Connection* connection);
  void fillSlot(Connection* connection, uint64_t sequence, std::string bytes, bool close);
  void flush(Connection* connection);
  void updateReading(Connection* connection);
  static int startReading(Connection* connection);
  void closeConnection(Connection* connection);
  // Arms the connection's timer for what it waits on now (see "Timeouts" above).
  void updateTimer(Connection* connection);
  void onTimer(Connection* connection);
  void onReadWhileLingering(Connection* connection, ssize_t nread);
  void shutdownConnection(Connection* connection);
  void closeHandle(uv_handle_t* handle);
  void maybeFinishStop();

  uv_loop_t* loop_;
  Logger* logger_;
  HttpServerOptions options_;
  RequestHandler handler_;

  uv_pipe_t pipe_listener_{};
  uv_tcp_t tcp_listener_{};
  uv_timer_t drain_timer_{};
  bool pipe_open_ = false;
  bool tcp_open_ = false;
  bool drain_timer_open_ = false;
  bool bound_path_ = false;
  uint16_t bound_tcp_port_ = 0;
  int open_handles_ = 0;

  std::vector<char> read_buffer_;  // every read lands here, then is copied to its connection
  uint64_t next_connection_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t in_flight_ = 0;  // requests handed to the handler and not answered yet
  bool stopping_ = false;
  bool closing_connections_ = false;
  bool drain_expired_ = false;
  bool stopped_ = false;
  std::function<void()> on_stopped_;
};

}  // namespace tally::agent
