#include "agent/gateway_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/assert.h"

namespace tally::agent {

// One gateway connection: a framed pipe stream and its peer's credentials. Lives in
// GatewayServer::connections_ from accept to its close callback.
class GatewayServer::Connection final : public net::FramedStream {
 public:
  using FramedStream::FramedStream;

  bool dirty_ = false;              // listed in dirty_: has reply bytes to flush
  bool close_after_flush_ = false;  // shut down once the queued replies are flushed
  bool pause_logged_ = false;       // connection_paused is logged once per connection
  std::string refusal_;             // non-empty: the peer is not allowed
  uint32_t uid_ = 0;
  uint32_t gid_ = 0;
  int32_t pid_ = 0;
};

namespace {

// Whether some process accepts connections on the socket file at `path`.
net::StreamLimits streamLimitsOf(const GatewayServerOptions& options) {
  return {.frame_bytes_max = options.frame_bytes_max,
          .write_queue_bytes_max = options.write_queue_bytes_max,
          .pending_replies_max = options.pending_replies_per_connection_max,
          .stall_timeout_ms = options.stall_timeout_ms};
}

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
    : loop_(loop),
      logger_(logger),
      options_(std::move(options)),
      handler_(std::move(handler)),
      connections_(loop, logger, streamLimitsOf(options_),
                   {.connections_max = options_.connections_max,
                    .buffered_bytes_max = options_.buffered_bytes_max}) {
  listener_.data = this;
  prepare_.data = this;
  check_.data = this;
  drain_timer_.data = this;
}

GatewayServer::~GatewayServer() {
  TALLY_ASSERT(open_handles_ == 0);
  TALLY_ASSERT(connections_.empty());
}

Status bindSocketPath(uv_pipe_t* pipe, const std::string& path, uint32_t mode, Logger* logger,
                      bool* bound) {
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
    logger->info("stale_socket_removed", {{"socket", path}});
  }
  if (int rc = uv_pipe_bind(pipe, path.c_str()); rc != 0) {
    return Status::ioError("bind '" + path + "': " + uv_strerror(rc));
  }
  *bound = true;
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    return Status::ioError("chmod '" + path + "': " + std::strerror(errno));
  }
  return Status::ok();
}

Status GatewayServer::listenOnPath() {
  return bindSocketPath(&listener_, options_.socket_path, options_.socket_mode, logger_,
                        &bound_path_);
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
  net::StreamHandler* handler = this;  // a private base: converted here, not in make_unique
  auto* raw = static_cast<Connection*>(connections_.accept(
      reinterpret_cast<uv_stream_t*>(&listener_),
      [this, handler](uint64_t id, const net::StreamLimits& limits) {
        return std::make_unique<Connection>(loop_, net::StreamKind::kPipe, handler, limits, id);
      },
      stopping_));
  if (raw == nullptr) return;  // refused or failed: logged, and closing
  const uint64_t id = raw->id();
  if (!checkPeer(raw)) return;  // refused: reading only to answer with the refusal
  logger_->debug("connection_opened",
                 {{"connection", id}, {"uid", raw->uid_}, {"gid", raw->gid_}, {"pid", raw->pid_}});
  raw->startReading();
}

bool GatewayServer::checkPeer(Connection* connection) {
  uv_os_fd_t fd = -1;
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (uv_fileno(connection->handle(), &fd) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    logger_->warn("peer_credentials_unavailable",
                  {{"connection", connection->id()}, {"error", std::strerror(errno)}});
    connection->close();
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
  logger_->warn("peer_refused", {{"connection", connection->id()},
                                 {"uid", connection->uid_},
                                 {"gid", connection->gid_},
                                 {"pid", connection->pid_},
                                 {"reason", message}});
  // Answered at its first request (under that request's id, so the client sees a clean
  // error rather than a reset), then closed; nothing it sends is dispatched.
  connection->refusal_ = message;
  if (!stopping_) connection->startReading();
  return false;
}

void GatewayServer::refuse(Connection* connection, uint64_t request_id) {
  queueReply(connection,
             wire::Response{.request_id = request_id,
                            .body = wire::ErrorReply{.code = wire::ErrorCode::kPermissionDenied,
                                                     .message = connection->refusal_}});
  connection->stopReading();
  connection->close_after_flush_ = true;
}

void GatewayServer::onFrame(net::FramedStream* stream, wire::Frame&& frame) {
  auto* connection = static_cast<Connection*>(stream);
  wire::DecodedRequest decoded = wire::decodeRequest(frame);
  const uint64_t request_id = decoded.request_id.value_or(0);
  if (!connection->refusal_.empty()) {
    refuse(connection, request_id);  // nothing a refused peer sends is dispatched
    return;
  }
  if (!decoded.body.isOk()) {
    logger_->warn("bad_request", {{"connection", connection->id()},
                                  {"uid", connection->uid_},
                                  {"error", decoded.body.status().toString()}});
    queueReply(connection, wire::Response{.request_id = request_id,
                                          .body = wire::errorReplyFor(decoded.body.status())});
    return;
  }
  ++in_flight_;
  connection->addPending(1, 0);
  // The handler may answer synchronously; the connection outlives this call (it is freed only
  // by its close callback, in a later loop phase).
  const uint64_t connection_id = connection->id();
  handler_(
      std::move(decoded.body).value(),
      [this, connection_id, request_id, answered = false](wire::ResponseBody&& body) mutable {
        TALLY_ASSERT(!answered);
        answered = true;
        answer(connection_id, request_id, std::move(body));
      },
      [this, connection_id] {
        const net::FramedStream* connection = connections_.find(connection_id);
        return connection != nullptr && !connection->closing();
      });
}

void GatewayServer::onBadFrame(net::FramedStream* stream, const Status& status) {
  auto* connection = static_cast<Connection*>(stream);
  if (!connection->refusal_.empty()) {
    refuse(connection, 0);
    return;
  }
  // Framing is lost (the stream has stopped reading): answer once, then close this connection.
  logger_->warn(
      "bad_frame",
      {{"connection", connection->id()}, {"uid", connection->uid_}, {"error", status.toString()}});
  queueReply(connection, wire::Response{.request_id = 0, .body = wire::errorReplyFor(status)});
  connection->close_after_flush_ = true;
}

void GatewayServer::onLost(net::FramedStream* stream, const Status& status) {
  if (status.message().starts_with("stalled: ")) {  // paused, and it read nothing for too long
    const auto* connection = static_cast<Connection*>(stream);
    logger_->warn("connection_stalled", {{"connection", stream->id()},
                                         {"uid", connection->uid_},
                                         {"pid", connection->pid_},
                                         {"reason", status.message()}});
    return;
  }
  if (status.code() != StatusCode::kUnavailable) {  // unavailable: the peer closed
    logger_->debug("connection_error",
                   {{"connection", stream->id()}, {"error", status.toString()}});
  }
}

void GatewayServer::onPaused(net::FramedStream* stream) {
  auto* connection = static_cast<Connection*>(stream);
  if (std::exchange(connection->pause_logged_, true)) return;
  logger_->info("connection_paused", {{"connection", connection->id()},
                                      {"uid", connection->uid_},
                                      {"pid", connection->pid_},
                                      {"owed_bytes", connection->queuedBytes()},
                                      {"stall_timeout_ms", options_.stall_timeout_ms}});
}

void GatewayServer::onClosed(net::FramedStream* stream) {
  logger_->debug("connection_closed", {{"connection", stream->id()}});
  std::erase(dirty_, stream->id());
  connections_.erase(stream->id());  // frees the stream
  maybeFinishStop();
}

void GatewayServer::answer(uint64_t connection_id, uint64_t request_id, wire::ResponseBody&& body) {
  TALLY_ASSERT(in_flight_ > 0);
  --in_flight_;
  auto* connection = static_cast<Connection*>(connections_.find(connection_id));
  if (connection != nullptr && !connection->closing()) {
    TALLY_ASSERT(connection->pendingReplies() > 0);
    queueReply(connection, wire::Response{.request_id = request_id, .body = std::move(body)});
    connection->settlePending(1, 0);  // after queueing: the reply's bytes count from now on
  }
  if (stopping_) maybeFinishStop();
}

void GatewayServer::queueReply(Connection* connection, const wire::Response& response) {
  if (!connection->dirty_) {
    connection->dirty_ = true;
    dirty_.push_back(connection->id());
  }
  // Encoded straight into the connection's buffer (unchanged if the reply is too large).
  const Status status = wire::encodeResponseFrameInto(response, connection->output(),
                                                      limits::kFrameBytesMaxDefault, &scratch_);
  if (!status.isOk()) {
    const Status fallback = wire::encodeResponseFrameInto(
        wire::replyTooLarge(response.request_id, status), connection->output(),
        limits::kFrameBytesMaxDefault, &scratch_);
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
    auto* connection = static_cast<Connection*>(connections_.find(id));
    if (connection == nullptr) continue;
    flush(connection);
  }
}

void GatewayServer::flush(Connection* connection) {
  connection->dirty_ = false;
  if (connection->closing()) return;
  connection->flush();
  if (connection->close_after_flush_) connection->shutdownThenClose();
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
  for (net::FramedStream* connection : connections_.all()) connection->stopReading();
  if (drain_timer_open_) {
    (void)uv_timer_start(&drain_timer_, onDrainDeadline, options_.drain_timeout_ms, 0);
  }
  maybeFinishStop();
}

void GatewayServer::onDrainDeadline(uv_timer_t* timer) {
  auto* server = static_cast<GatewayServer*>(timer->data);
  server->logger_->warn("gateway_drain_deadline",
                        {{"unanswered", server->in_flight_},
                         {"connections", server->connections_.served()},
                         {"drain_timeout_ms", server->options_.drain_timeout_ms}});
  server->drain_expired_ = true;  // late answers are dropped: their connections are gone
  server->closing_connections_ = true;
  for (net::FramedStream* connection : server->connections_.all()) connection->close();
  server->maybeFinishStop();
}

void GatewayServer::maybeFinishStop() {
  if (!stopping_ || stopped_) return;
  if (in_flight_ > 0 && !drain_expired_) return;
  if (!closing_connections_) {
    closing_connections_ = true;
    flushAll();
    for (net::FramedStream* connection : connections_.all()) connection->shutdownThenClose();
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
