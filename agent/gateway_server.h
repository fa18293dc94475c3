#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "core/limits.h"
#include "core/status.h"
#include "net/connection_set.h"
#include "net/framed_stream.h"
#include "wire/codec.h"
#include "wire/frame.h"

// tally-agent's gateway-facing shell: a libuv pipe server on a Unix socket (SPEC §7).
//
//  * Listens on `socket_path` (a stale socket file nobody listens on is removed first; the file
//    is chmod'ed to `socket_mode`), or on an inherited descriptor (systemd socket activation).
//  * Each accepted peer's credentials (SO_PEERCRED) are checked: a uid in allowed_uids or a gid
//    in allowed_gids is served; anyone else gets a warn log line and, at its first request, one
//    ErrorReply (permissionDenied) under that request's id; then the connection is closed.
//  * Frames are decoded as in the ledger server: pipelined requests, each answered under its
//    own id (answers may come back in any order); a request that does not decode gets an
//    ErrorReply; a framing error gets one ErrorReply and the connection is closed after it.
//  * Back-pressure (net/framed_stream.h): a connection with pending_replies_per_connection_max
//    unanswered requests, or more than write_queue_bytes_max unsent reply bytes, is neither read
//    nor served until it drains; one that takes none of its replies for stall_timeout_ms
//    meanwhile is closed (warn "connection_stalled").
//  * Global bounds (net/connection_set.h): past connections_max connections, or while the
//    connections hold buffered_bytes_max bytes, a new connection gets one ErrorReply UNAVAILABLE
//    (request id 0) and is closed.
//
// Every decoded request is handed to the RequestHandler with a Respond callback that must be
// called exactly once, on the loop thread, possibly later; answering a connection that has gone
// is a no-op. Owns its handles and connections; borrows `loop` and `logger`, which must outlive
// it. Single-threaded (the loop thread).

namespace tally::agent {

struct GatewayServerOptions {
  std::string socket_path;
  uint32_t socket_mode = 0660;
  int inherited_fd = -1;  // >= 0: listen on this descriptor (socket activation) instead
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t pending_replies_per_connection_max = limits::kRequestsInFlightPerConnectionMax;
  uint64_t write_queue_bytes_max = limits::kWriteQueueBytesPerConnectionMax;
  uint64_t stall_timeout_ms = net::kStallTimeoutMsDefault;
  uint64_t buffered_bytes_max = net::kBufferedBytesMaxDefault;
  uint64_t drain_timeout_ms = 5'000;  // on stop, connections get this long for their answers
};

// The answer is passed by rvalue reference: each layer of handlers hands it on without moving
// it (a reservation reply's move, eight strings and a variant, cost the agent more than its
// decode).
using Respond = std::function<void(wire::ResponseBody&& body)>;
// Whether the requester is still there to hear the answer (its connection open): lets the
// handler drop a request whose requester is gone before doing anything for it. Callable until
// the server is destroyed, on the loop thread.
using Alive = std::function<bool()>;
// The request, too, is handed on by rvalue reference, down to the ledger link's encoder.
using RequestHandler = std::function<void(wire::RequestBody&& body, Respond respond, Alive alive)>;

// Pure: whether a peer with these credentials may talk to the agent.
bool peerAllowed(uint32_t uid, uint32_t gid, const std::vector<uint32_t>& allowed_uids,
                 const std::vector<uint32_t>& allowed_gids);

// Binds `pipe` to the socket file `path` (a stale socket file nobody listens on is removed first)
// and chmods it to `mode`; `*bound` is set once the file exists (the caller removes it on stop).
// Shared with the HTTP listener (agent/http_server.h).
[[nodiscard]] Status bindSocketPath(uv_pipe_t* pipe, const std::string& path, uint32_t mode,
                                    Logger* logger, bool* bound);

class GatewayServer : private net::StreamHandler {
 public:
  GatewayServer(uv_loop_t* loop, Logger* logger, GatewayServerOptions options,
                RequestHandler handler);
  ~GatewayServer();
  GatewayServer(const GatewayServer&) = delete;
  GatewayServer& operator=(const GatewayServer&) = delete;

  [[nodiscard]] Status start();
  // Stops accepting and reading; once every request handed out has been answered (or after
  // drain_timeout_ms), closes every connection after its queued answers and every handle, then
  // calls `on_stopped` on the loop thread.
  void stop(std::function<void()> on_stopped);

  uint64_t inFlight() const { return in_flight_; }
  uint64_t connections() const { return connections_.served(); }

  class Connection;

 private:
  static void onConnection(uv_stream_t* listener, int status);
  static void onFlushPrepare(uv_prepare_t* handle);
  static void onFlushCheck(uv_check_t* handle);
  static void onDrainDeadline(uv_timer_t* timer);
  Status listenOnPath();
  void accept();
  bool checkPeer(Connection* connection);
  // net::StreamHandler, for every connection.
  void onFrame(net::FramedStream* stream, wire::Frame&& frame) override;
  void onBadFrame(net::FramedStream* stream, const Status& status) override;
  void onLost(net::FramedStream* stream, const Status& status) override;
  void onClosed(net::FramedStream* stream) override;
  void onPaused(net::FramedStream* stream) override;
  void refuse(Connection* connection, uint64_t request_id);
  void answer(uint64_t connection_id, uint64_t request_id, wire::ResponseBody&& body);
  void queueReply(Connection* connection, const wire::Response& response);
  void flushAll();
  void flush(Connection* connection);
  void closeHandle(uv_handle_t* handle);
  void maybeFinishStop();
  void finishStop();

  uv_loop_t* loop_;
  Logger* logger_;
  GatewayServerOptions options_;
  RequestHandler handler_;

  uv_pipe_t listener_{};
  uv_prepare_t prepare_{};
  uv_check_t check_{};
  uv_timer_t drain_timer_{};
  bool listener_open_ = false;
  bool prepare_open_ = false;
  bool check_open_ = false;
  bool drain_timer_open_ = false;
  bool bound_path_ = false;  // we created the socket file (and remove it on stop)
  int open_handles_ = 0;     // the listener, prepare, check and timer (not the connections)

  net::ConnectionSet connections_;  // every Connection, from accept to its close callback
  std::vector<uint64_t> dirty_;     // connections with unsent reply bytes
  wire::EncodeScratch scratch_;     // first segment of every reply's encoding
  uint64_t in_flight_ = 0;
  bool stopping_ = false;
  bool closing_connections_ = false;
  bool drain_expired_ = false;
  bool stopped_ = false;
  std::function<void()> on_stopped_;
};

}  // namespace tally::agent
