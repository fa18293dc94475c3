#include "agent/gateway_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/assert.h"

namespace tally::agent {

// One gateway connection. Lives in GatewayServer::connections_ from accept to its close callback.
class GatewayServer::Connection {
 public:
  Connection(GatewayServer* server, uint64_t id, uint64_t frame_bytes_max)
      : server_(server), id_(id), decoder_({.frame_bytes_max = frame_bytes_max}) {
    pipe_.data = this;
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&pipe_); }

  GatewayServer* server_;
  uint64_t id_;
  uv_pipe_t pipe_{};
  wire::FrameDecoder decoder_;
  std::vector<uint8_t> out_;  // framed replies not yet handed to uv_write
  uint64_t unanswered_ = 0;   // requests handed to the handler, not answered yet
  bool reading_ = false;
  bool closing_ = false;
  bool shutting_down_ = false;
  bool close_after_flush_ = false;
  std::string refusal_;  // non-empty: the peer is not allowed
  uint32_t uid_ = 0;
  uint32_t gid_ = 0;
  int32_t pid_ = 0;
};

namespace {

struct WriteRequest {
  uv_write_t req{};
  std::vector<uint8_t> bytes;
  GatewayServer* server = nullptr;
  uint64_t connection_id = 0;
};

constexpr size_t kReadBufferBytes = 64 * 1024;
std::array<char, kReadBufferBytes>& readBuffer() {
  static std::array<char, kReadBufferBytes> buffer;
  return buffer;
}

// Whether some process accepts connections on the socket file at `path`.
bool someoneListens(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), std::min(path.size(), sizeof(address.sun_path) - 1));
  const bool listening =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return listening;
}

}  // namespace

bool peerAllowed(uint32_t uid, uint32_t gid, const std::vector<uint32_t>& allowed_uids,
                 const std::vector<uint32_t>& allowed_gids) {
  return std::find(allowed_uids.begin(), allowed_uids.end(), uid) != allowed_uids.end() ||
         std::find(allowed_gids.begin(), allowed_gids.end(), gid) != allowed_gids.end();
}

GatewayServer::GatewayServer(uv_loop_t* loop, Logger* logger, GatewayServerOptions options,
                             RequestHandler handler)
    : loop_(loop), logger_(logger), options_(std::move(options)), handler_(std::move(handler)) {
  listener_.data = this;
  prepare_.data = this;
  check_.data = this;
  drain_timer_.data = this;
}

GatewayServer::~GatewayServer() { TALLY_ASSERT(open_handles_ == 0); }

Status GatewayServer::listenOnPath() {
  const std::string& path = options_.socket_path;
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0) {
    if (!S_ISSOCK(info.st_mode)) {
      return Status::failedPrecondition("'" + path + "' exists and is not a socket");
    }
    if (someoneListens(path)) {
      return Status::failedPrecondition("another process is listening on '" + path + "'");
    }
    if (::unlink(path.c_str()) != 0) {
      return Status::ioError("removing stale socket '" + path + "': " + std::strerror(errno));
    }
    logger_->info("stale_socket_removed", {{"socket", path}});
  }
  if (int rc = uv_pipe_bind(&listener_, path.c_str()); rc != 0) {
    return Status::ioError("bind '" + path + "': " + uv_strerror(rc));
  }
  bound_path_ = true;
  if (::chmod(path.c_str(), static_cast<mode_t>(options_.socket_mode)) != 0) {
    return Status::ioError("chmod '" + path + "': " + std::strerror(errno));
  }
  return Status::ok();
}

Status GatewayServer::start() {
  if (int rc = uv_pipe_init(loop_, &listener_, 0); rc != 0) {
    return Status::ioError(std::string("uv_pipe_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  listener_open_ = true;
  if (options_.inherited_fd >= 0) {
    if (int rc = uv_pipe_open(&listener_, options_.inherited_fd); rc != 0) {
      return Status::ioError("socket activation: uv_pipe_open(" +
                             std::to_string(options_.inherited_fd) + "): " + uv_strerror(rc));
    }
  } else if (Status s = listenOnPath(); !s.isOk()) {
    return s;
  }
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 511, onConnection); rc != 0) {
    return Status::ioError(std::string("listen: ") + uv_strerror(rc));
  }
  if (int rc = uv_prepare_init(loop_, &prepare_); rc != 0) {
    return Status::ioError(std::string("uv_prepare_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  prepare_open_ = true;
  if (int rc = uv_check_init(loop_, &check_); rc != 0) {
    return Status::ioError(std::string("uv_check_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  check_open_ = true;
  if (int rc = uv_timer_init(loop_, &drain_timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  drain_timer_open_ = true;
  if (int rc = uv_prepare_start(&prepare_, onFlushPrepare); rc != 0) {
    return Status::ioError(std::string("uv_prepare_start: ") + uv_strerror(rc));
  }
  if (int rc = uv_check_start(&check_, onFlushCheck); rc != 0) {
    return Status::ioError(std::string("uv_check_start: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void GatewayServer::onConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<GatewayServer*>(listener->data);
  if (status != 0) {
    server->logger_->warn("accept_failed", {{"error", uv_strerror(status)}});
    return;
  }
  server->accept();
}

void GatewayServer::accept() {
  const uint64_t id = next_connection_id_++;
  auto connection = std::make_unique<Connection>(this, id, options_.frame_bytes_max);
  if (int rc = uv_pipe_init(loop_, &connection->pipe_, 0); rc != 0) {
    logger_->error("accept_failed", {{"error", uv_strerror(rc)}});
    return;
  }
  Connection* raw = connection.get();
  connections_.emplace(id, std::move(connection));
  ++open_handles_;
  if (int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&listener_), raw->stream()); rc != 0) {
    logger_->warn("accept_failed", {{"error", uv_strerror(rc)}});
    closeConnection(raw);
    return;
  }
  if (stopping_ || connections_.size() > options_.connections_max) {
    logger_->warn("connection_refused", {{"reason", stopping_ ? "stopping" : "connections_max"},
                                         {"connections_max", options_.connections_max}});
    closeConnection(raw);
    return;
  }
  if (!checkPeer(raw)) return;  // refused: reading only to answer with the refusal
  logger_->debug("connection_opened",
                 {{"connection", id}, {"uid", raw->uid_}, {"gid", raw->gid_}, {"pid", raw->pid_}});
  startReading(raw);
}

bool GatewayServer::checkPeer(Connection* connection) {
  uv_os_fd_t fd = -1;
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&connection->pipe_), &fd) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    logger_->warn("peer_credentials_unavailable",
                  {{"connection", connection->id_}, {"error", std::strerror(errno)}});
    closeConnection(connection);
    return false;
  }
  connection->uid_ = credentials.uid;
  connection->gid_ = credentials.gid;
  connection->pid_ = credentials.pid;
  if (peerAllowed(credentials.uid, credentials.gid, options_.allowed_uids, options_.allowed_gids)) {
    return true;
  }
  const std::string message = "peer uid " + std::to_string(credentials.uid) + " gid " +
                              std::to_string(credentials.gid) + " not allowed";
  logger_->warn("peer_refused", {{"connection", connection->id_},
                                 {"uid", connection->uid_},
                                 {"gid", connection->gid_},
                                 {"pid", connection->pid_},
                                 {"reason", message}});
  // Answered at its first request (under that request's id, so the client sees a clean
  // error rather than a reset), then closed; nothing it sends is dispatched.
  connection->refusal_ = message;
  startReading(connection);
  return false;
}

void GatewayServer::startReading(Connection* connection) {
  if (connection->reading_ || connection->closing_ || connection->shutting_down_ ||
      connection->close_after_flush_ || stopping_) {
    return;
  }
  auto on_alloc = [](uv_handle_t*, size_t, uv_buf_t* buf) {
    buf->base = readBuffer().data();
    buf->len = readBuffer().size();
  };
  auto on_read = [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* conn = static_cast<Connection*>(stream->data);
    GatewayServer* server = conn->server_;
    if (nread < 0) {
      if (nread != UV_EOF) {
        server->logger_->debug("connection_error",
                               {{"connection", conn->id_}, {"error", uv_strerror(nread)}});
      }
      server->closeConnection(conn);
      return;
    }
    if (nread == 0) return;
    if (!conn->refusal_.empty()) {
      server->refuse(conn, buf, nread);
      return;
    }
    std::vector<wire::Frame> frames;
    const Status status =
        conn->decoder_.feed(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf->base),
                                                     static_cast<size_t>(nread)),
                            &frames);
    server->onFrames(conn, &frames);
    if (!status.isOk() && !conn->closing_) {
      // Framing is lost: answer once, then close this connection only.
      server->logger_->warn(
          "bad_frame",
          {{"connection", conn->id_}, {"uid", conn->uid_}, {"error", status.toString()}});
      server->queueReply(conn,
                         wire::Response{.request_id = 0, .body = wire::errorReplyFor(status)});
      (void)uv_read_stop(stream);
      conn->reading_ = false;
      conn->close_after_flush_ = true;
    }
  };
  if (int rc = uv_read_start(connection->stream(), on_alloc, on_read); rc != 0) {
    logger_->warn("read_start_failed", {{"error", uv_strerror(rc)}});
    closeConnection(connection);
    return;
  }
  connection->reading_ = true;
}

void GatewayServer::refuse(Connection* connection, const uv_buf_t* buf, ssize_t nread) {
  std::vector<wire::Frame> frames;
  (void)connection->decoder_.feed(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf->base),
                               static_cast<size_t>(nread)),
      &frames);
  uint64_t request_id = 0;
  if (!frames.empty()) request_id = wire::decodeRequest(frames.front()).request_id.value_or(0);
  queueReply(connection,
             wire::Response{.request_id = request_id,
                            .body = wire::ErrorReply{.code = wire::ErrorCode::kPermissionDenied,
                                                     .message = connection->refusal_}});
  (void)uv_read_stop(connection->stream());
  connection->reading_ = false;
  connection->close_after_flush_ = true;
}

void GatewayServer::onFrames(Connection* connection, std::vector<wire::Frame>* frames) {
  const uint64_t connection_id = connection->id_;
  for (const wire::Frame& frame : *frames) {
    wire::DecodedRequest decoded = wire::decodeRequest(frame);
    const uint64_t request_id = decoded.request_id.value_or(0);
    if (!decoded.body.isOk()) {
      logger_->warn("bad_request", {{"connection", connection_id},
                                    {"uid", connection->uid_},
                                    {"error", decoded.body.status().toString()}});
      queueReply(connection, wire::Response{.request_id = request_id,
                                            .body = wire::errorReplyFor(decoded.body.status())});
      continue;
    }
    ++in_flight_;
    ++connection->unanswered_;
    // The handler may answer synchronously; the connection outlives this loop (it is closed
    // only from callbacks of later loop phases).
    handler_(
        std::move(decoded.body).value(),
        [this, connection_id, request_id, answered = false](wire::ResponseBody body) mutable {
          TALLY_ASSERT(!answered);
          answered = true;
          answer(connection_id, request_id, std::move(body));
        },
        [this, connection_id] {
          auto it = connections_.find(connection_id);
          return it != connections_.end() && !it->second->closing_;
        });
  }
  if (connection->unanswered_ >= options_.pending_replies_per_connection_max &&
      connection->reading_) {
    (void)uv_read_stop(connection->stream());  // push back until answers drain
    connection->reading_ = false;
  }
}

void GatewayServer::answer(uint64_t connection_id, uint64_t request_id, wire::ResponseBody body) {
  TALLY_ASSERT(in_flight_ > 0);
  --in_flight_;
  auto it = connections_.find(connection_id);
  if (it != connections_.end() && !it->second->closing_) {
    Connection* connection = it->second.get();
    TALLY_ASSERT(connection->unanswered_ > 0);
    --connection->unanswered_;
    queueReply(connection, wire::Response{.request_id = request_id, .body = std::move(body)});
  }
  if (stopping_) maybeFinishStop();
}

void GatewayServer::queueReply(Connection* connection, const wire::Response& response) {
  if (connection->out_.empty()) dirty_.push_back(connection->id_);
  // Encoded straight into the connection's buffer (unchanged if the reply is too large).
  const Status status = wire::encodeResponseFrameInto(response, &connection->out_,
                                                      limits::kFrameBytesMaxDefault, &scratch_);
  if (!status.isOk()) {
    const Status fallback = wire::encodeResponseFrameInto(
        wire::Response{.request_id = response.request_id,
                       .body = wire::ErrorReply{.code = wire::ErrorCode::kInternal,
                                                .message = "reply too large: " + status.message()}},
        &connection->out_, limits::kFrameBytesMaxDefault, &scratch_);
    TALLY_ASSERT(fallback.isOk());
  }
}

void GatewayServer::onFlushPrepare(uv_prepare_t* handle) {
  static_cast<GatewayServer*>(handle->data)->flushAll();
}

void GatewayServer::onFlushCheck(uv_check_t* handle) {
  static_cast<GatewayServer*>(handle->data)->flushAll();
}

void GatewayServer::flushAll() {
  std::vector<uint64_t> dirty = std::exchange(dirty_, {});
  for (uint64_t id : dirty) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    flush(it->second.get());
  }
}

void GatewayServer::flush(Connection* connection) {
  if (connection->closing_) return;
  if (!connection->out_.empty()) {
    // Straight to the socket when nothing is queued before it: no write request, no callback
    // and no epoll_ctl in the next iteration. What does not fit goes through uv_write.
    uv_buf_t direct = uv_buf_init(reinterpret_cast<char*>(connection->out_.data()),
                                  static_cast<unsigned>(connection->out_.size()));
    const int written = uv_try_write(connection->stream(), &direct, 1);
    if (written < 0 && written != UV_EAGAIN) {
      closeConnection(connection);
      return;
    }
    if (written > 0) {
      connection->out_.erase(connection->out_.begin(), connection->out_.begin() + written);
    }
  }
  if (connection->out_.empty()) {
    maybeResume(connection);
  } else {
    auto request = std::make_unique<WriteRequest>();
    request->bytes = std::exchange(connection->out_, {});
    request->server = this;
    request->connection_id = connection->id_;
    request->req.data = request.get();
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(request->bytes.data()),
                               static_cast<unsigned>(request->bytes.size()));
    auto on_written = [](uv_write_t* req, int status) {
      std::unique_ptr<WriteRequest> owned(static_cast<WriteRequest*>(req->data));
      GatewayServer* server = owned->server;
      auto found = server->connections_.find(owned->connection_id);
      if (found == server->connections_.end()) return;
      Connection* conn = found->second.get();
      if (status != 0) {
        server->closeConnection(conn);
        return;
      }
      server->maybeResume(conn);
    };
    if (int rc = uv_write(&request->req, connection->stream(), &buf, 1, on_written); rc != 0) {
      closeConnection(connection);
      return;
    }
    request.release();  // owned by the write callback now
    if (uv_stream_get_write_queue_size(connection->stream()) >= options_.write_queue_bytes_max &&
        connection->reading_) {
      (void)uv_read_stop(connection->stream());
      connection->reading_ = false;
    }
  }
  if (connection->close_after_flush_) shutdownThenClose(connection);
}

void GatewayServer::maybeResume(Connection* connection) {
  if (!connection->reading_ && !connection->closing_ &&
      connection->unanswered_ < options_.pending_replies_per_connection_max &&
      uv_stream_get_write_queue_size(connection->stream()) < options_.write_queue_bytes_max) {
    startReading(connection);
  }
}

void GatewayServer::closeConnection(Connection* connection) {
  if (connection->closing_) return;
  connection->closing_ = true;
  connection->reading_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&connection->pipe_), [](uv_handle_t* handle) {
    auto* conn = static_cast<Connection*>(handle->data);
    GatewayServer* server = conn->server_;
    server->logger_->debug("connection_closed", {{"connection", conn->id_}});
    --server->open_handles_;
    server->connections_.erase(conn->id_);  // frees conn
    server->maybeFinishStop();
  });
}

void GatewayServer::shutdownThenClose(Connection* connection) {
  if (connection->closing_ || connection->shutting_down_) return;
  connection->shutting_down_ = true;
  if (connection->reading_) {
    (void)uv_read_stop(connection->stream());
    connection->reading_ = false;
  }
  auto shutdown = std::make_unique<uv_shutdown_t>();
  shutdown->data = connection;
  const int rc = uv_shutdown(shutdown.get(), connection->stream(), [](uv_shutdown_t* req, int) {
    std::unique_ptr<uv_shutdown_t> owned(req);
    auto* conn = static_cast<Connection*>(owned->data);
    conn->server_->closeConnection(conn);
  });
  if (rc != 0) {
    closeConnection(connection);
    return;
  }
  (void)shutdown.release();  // owned by the shutdown callback now
}

void GatewayServer::closeHandle(uv_handle_t* handle) {
  uv_close(handle, [](uv_handle_t* closed) {
    auto* server = static_cast<GatewayServer*>(closed->data);
    --server->open_handles_;
    server->maybeFinishStop();
  });
}

void GatewayServer::stop(std::function<void()> on_stopped) {
  if (stopping_) return;
  stopping_ = true;
  on_stopped_ = std::move(on_stopped);
  if (listener_open_) {
    listener_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&listener_));
    if (bound_path_) {
      (void)::unlink(options_.socket_path.c_str());
      bound_path_ = false;
    }
  }
  for (auto& [id, connection] : connections_) {
    if (connection->reading_) {
      (void)uv_read_stop(connection->stream());
      connection->reading_ = false;
    }
  }
  if (drain_timer_open_) {
    (void)uv_timer_start(&drain_timer_, onDrainDeadline, options_.drain_timeout_ms, 0);
  }
  maybeFinishStop();
}

void GatewayServer::onDrainDeadline(uv_timer_t* timer) {
  auto* server = static_cast<GatewayServer*>(timer->data);
  server->logger_->warn("gateway_drain_deadline",
                        {{"unanswered", server->in_flight_},
                         {"connections", uint64_t{server->connections_.size()}},
                         {"drain_timeout_ms", server->options_.drain_timeout_ms}});
  server->drain_expired_ = true;  // late answers are dropped: their connections are gone
  server->closing_connections_ = true;
  std::vector<Connection*> open;
  for (auto& [id, connection] : server->connections_) open.push_back(connection.get());
  for (Connection* connection : open) server->closeConnection(connection);
  server->maybeFinishStop();
}

void GatewayServer::maybeFinishStop() {
  if (!stopping_ || stopped_) return;
  if (in_flight_ > 0 && !drain_expired_) return;
  if (!closing_connections_) {
    closing_connections_ = true;
    flushAll();
    std::vector<Connection*> open;
    for (auto& [id, connection] : connections_) open.push_back(connection.get());
    for (Connection* connection : open) shutdownThenClose(connection);
  }
  if (!connections_.empty()) return;
  finishStop();
}

void GatewayServer::finishStop() {
  // Handles close once; their callbacks re-enter maybeFinishStop, which is then a no-op.
  stopped_ = true;
  for (auto [open, handle] :
       {std::pair{&prepare_open_, reinterpret_cast<uv_handle_t*>(&prepare_)},
        std::pair{&check_open_, reinterpret_cast<uv_handle_t*>(&check_)},
        std::pair{&drain_timer_open_, reinterpret_cast<uv_handle_t*>(&drain_timer_)}}) {
    if (*open) {
      *open = false;
      closeHandle(handle);
    }
  }
  logger_->info("gateway_server_stopped");
  if (on_stopped_) {
    auto callback = std::exchange(on_stopped_, nullptr);
    callback();
  }
}

}  // namespace tally::agent
