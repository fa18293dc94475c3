#include "agent/http_server.h"

#include <http_parser.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <utility>

#include "agent/http_api.h"
#include "core/assert.h"

namespace tally::agent {

namespace {
constexpr size_t kReadBufferBytes = 64 << 10;
}  // namespace

// One HTTP connection: its handle, its parser and the request being parsed, and its answers
// in request order. Lives in HttpServer::connections_ from accept to its close callback.
class HttpServer::Connection {
 public:
  // An answer's place in the connection's order: filled when the answer comes, sent once every
  // earlier one has been.
  struct Slot {
    bool ready = false;
    bool close = false;  // the last answer on this connection
    std::string bytes;
  };

  Connection(HttpServer* server, uint64_t id, bool is_pipe, uint64_t header_bytes_max,
             uint64_t body_bytes_max)
      : server_(server),
        id_(id),
        is_pipe_(is_pipe),
        header_bytes_max_(header_bytes_max),
        body_bytes_max_(body_bytes_max) {
    handle_.handle.data = this;
    http_parser_init(&parser_, HTTP_REQUEST);
    parser_.data = this;
  }

  // What the connection's timer waits on (HttpServer::updateTimer()).
  enum class TimerFor : uint8_t { kNothing, kRequest, kIdle, kLinger };

  uv_stream_t* stream() { return &handle_.stream; }
  uv_handle_t* handle() { return &handle_.handle; }

  HttpServer* server_;
  uint64_t id_;
  bool is_pipe_;
  uint64_t header_bytes_max_;
  uint64_t body_bytes_max_;
  uv_any_handle handle_{};
  uv_timer_t timer_{};
  bool timer_open_ = false;
  TimerFor timer_for_ = TimerFor::kNothing;
  int handles_open_ = 0;  // the stream's and the timer's, until their close callbacks
  http_parser parser_{};

  std::string input_;  // read, not parsed yet
  // The request being parsed.
  std::string url_;
  std::string body_;
  uint64_t header_bytes_ = 0;
  int refuse_status_ = 0;  // 431 or 413, set by a parser callback that stopped the parse
  bool message_complete_ = false;
  bool in_message_ = false;  // the parser has taken bytes of a request not complete yet
  bool served_ = false;      // a complete request was read on this connection

  std::deque<Slot> slots_;
  uint64_t first_sequence_ = 0;  // the sequence number of slots_.front()

  bool reading_ = false;
  bool parsing_ = false;       // in parse(): a nested call (a synchronous answer) returns at once
  bool done_parsing_ = false;  // no further request is read: close once the answers are sent
  bool shutdown_sent_ = false;
  bool shutdown_done_ = false;  // our writes are out and FIN sent: lingering
  bool peer_ended_ = false;     // the peer's end of stream was read
  bool closing_ = false;
  std::string refusal_;  // non-empty: the peer is not allowed
  uint32_t uid_ = 0;
  uint32_t gid_ = 0;
  int32_t pid_ = 0;
};

namespace {

using Connection = HttpServer::Connection;

Connection* of(http_parser* parser) { return static_cast<Connection*>(parser->data); }

int onMessageBegin(http_parser* parser) {
  Connection* c = of(parser);
  c->url_.clear();
  c->body_.clear();
  c->header_bytes_ = 0;
  c->in_message_ = true;
  return 0;
}

// Counts request-line and header bytes against header_bytes_max (a callback per piece).
int countHeader(Connection* c, size_t length, uint64_t header_bytes_max) {
  c->header_bytes_ += length;
  if (c->header_bytes_ > header_bytes_max) {
    c->refuse_status_ = 431;
    return -1;
  }
  return 0;
}

struct WriteRequest {
  uv_write_t request{};
  std::string bytes;
  HttpServer* server = nullptr;
};

struct ShutdownRequest {
  uv_shutdown_t request{};
};

}  // namespace

namespace {

const http_parser_settings& parserSettings();

}  // namespace

HttpServer::HttpServer(uv_loop_t* loop, Logger* logger, HttpServerOptions options,
                       RequestHandler handler)
    : loop_(loop),
      logger_(logger),
      options_(std::move(options)),
      handler_(std::move(handler)),
      read_buffer_(kReadBufferBytes) {
  pipe_listener_.data = this;
  tcp_listener_.data = this;
  drain_timer_.data = this;
}

HttpServer::~HttpServer() { TALLY_ASSERT(open_handles_ == 0); }

Status HttpServer::start() {
  if (!enabled()) return Status::ok();
  if (int rc = uv_timer_init(loop_, &drain_timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  drain_timer_open_ = true;
  if (!options_.socket_path.empty()) {
    if (int rc = uv_pipe_init(loop_, &pipe_listener_, 0); rc != 0) {
      return Status::ioError(std::string("uv_pipe_init: ") + uv_strerror(rc));
    }
    ++open_handles_;
    pipe_open_ = true;
    if (Status s = bindSocketPath(&pipe_listener_, options_.socket_path, options_.socket_mode,
                                  logger_, &bound_path_);
        !s.isOk()) {
      return s;
    }
    if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&pipe_listener_), 511, onPipeConnection);
        rc != 0) {
      return Status::ioError("listen '" + options_.socket_path + "': " + uv_strerror(rc));
    }
  }
  if (options_.tcp_enabled) {
    if (Status s = listenTcp(); !s.isOk()) return s;
  }
  logger_->info(
      "http_listening",
      {{"socket", options_.socket_path.empty() ? std::string("disabled") : options_.socket_path},
       {"tcp", options_.tcp_enabled ? options_.tcp_host + ":" + std::to_string(bound_tcp_port_)
                                    : std::string("disabled")}});
  return Status::ok();
}

Status HttpServer::listenTcp() {
  if (int rc = uv_tcp_init(loop_, &tcp_listener_); rc != 0) {
    return Status::ioError(std::string("uv_tcp_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  tcp_open_ = true;
  sockaddr_storage address{};
  const std::string& host = options_.tcp_host;
  if (uv_ip4_addr(host.c_str(), options_.tcp_port, reinterpret_cast<sockaddr_in*>(&address)) != 0 &&
      uv_ip6_addr(host.c_str(), options_.tcp_port, reinterpret_cast<sockaddr_in6*>(&address)) !=
          0) {
    return Status::invalidArgument("http listen address '" + host + "' is not an IP literal");
  }
  const std::string where = host + ":" + std::to_string(options_.tcp_port);
  if (int rc = uv_tcp_bind(&tcp_listener_, reinterpret_cast<const sockaddr*>(&address), 0);
      rc != 0) {
    return Status::ioError("bind " + where + ": " + uv_strerror(rc));
  }
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&tcp_listener_), 511, onTcpConnection);
      rc != 0) {
    return Status::ioError("listen " + where + ": " + uv_strerror(rc));
  }
  sockaddr_storage bound{};
  int length = sizeof(bound);
  if (uv_tcp_getsockname(&tcp_listener_, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
    bound_tcp_port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  return Status::ok();
}

void HttpServer::onPipeConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<HttpServer*>(listener->data);
  if (status != 0) {
    server->logger_->warn("http_accept_failed", {{"error", uv_strerror(status)}});
    return;
  }
  server->accept(listener, /*is_pipe=*/true);
}

void HttpServer::onTcpConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<HttpServer*>(listener->data);
  if (status != 0) {
    server->logger_->warn("http_accept_failed", {{"error", uv_strerror(status)}});
    return;
  }
  server->accept(listener, /*is_pipe=*/false);
}

void HttpServer::accept(uv_stream_t* listener, bool is_pipe) {
  const uint64_t id = next_connection_id_++;
  auto owned = std::make_unique<Connection>(this, id, is_pipe, options_.header_bytes_max,
                                            options_.body_bytes_max);
  Connection* c = owned.get();
  const int init_rc =
      is_pipe ? uv_pipe_init(loop_, &c->handle_.pipe, 0) : uv_tcp_init(loop_, &c->handle_.tcp);
  if (init_rc != 0) {
    logger_->error("http_accept_failed", {{"error", uv_strerror(init_rc)}});
    return;
  }
  connections_.emplace(id, std::move(owned));
  ++open_handles_;
  c->handles_open_ = 1;
  if (uv_timer_init(loop_, &c->timer_) == 0) {
    c->timer_.data = c;
    c->timer_open_ = true;
    ++open_handles_;
    ++c->handles_open_;
  } else {
    logger_->error("http_accept_failed", {{"error", "uv_timer_init"}});
    closeConnection(c);
    return;
  }
  if (int rc = uv_accept(listener, c->stream()); rc != 0) {
    logger_->warn("http_accept_failed", {{"error", uv_strerror(rc)}});
    closeConnection(c);
    return;
  }
  if (stopping_ || connections_.size() > options_.connections_max) {
    logger_->warn("http_connection_refused",
                  {{"reason", stopping_ ? "stopping" : "connections_max"},
                   {"connections_max", options_.connections_max}});
    closeConnection(c);
    return;
  }
  if (!is_pipe) (void)uv_tcp_nodelay(&c->handle_.tcp, 1);
  if (is_pipe && !checkPeer(c)) return;
  updateReading(c);
}

bool HttpServer::checkPeer(Connection* c) {
  uv_os_fd_t fd = -1;
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (uv_fileno(c->handle(), &fd) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    logger_->warn("peer_credentials_unavailable",
                  {{"connection", c->id_}, {"error", std::strerror(errno)}});
    closeConnection(c);
    return false;
  }
  c->uid_ = credentials.uid;
  c->gid_ = credentials.gid;
  c->pid_ = credentials.pid;
  if (peerAllowed(credentials.uid, credentials.gid, options_.allowed_uids, options_.allowed_gids)) {
    return true;
  }
  c->refusal_ = "peer uid " + std::to_string(credentials.uid) + " gid " +
                std::to_string(credentials.gid) + " not allowed";
  logger_->warn("peer_refused", {{"connection", c->id_},
                                 {"uid", c->uid_},
                                 {"gid", c->gid_},
                                 {"pid", c->pid_},
                                 {"reason", c->refusal_},
                                 {"listener", "http"}});
  // Read on, to answer its first request with 403 (dispatch()), then close.
  updateReading(c);
  return false;
}

int HttpServer::startReading(Connection* c) {
  return uv_read_start(
      c->stream(),
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        auto* connection = static_cast<Connection*>(handle->data);
        std::vector<char>& buffer = connection->server_->read_buffer_;
        *buf = uv_buf_init(buffer.data(), static_cast<unsigned>(buffer.size()));
      },
      [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
        auto* connection = static_cast<Connection*>(stream->data);
        connection->server_->onRead(connection, nread, buf);
      });
}

void HttpServer::updateReading(Connection* c) {
  if (c->closing_ || c->shutdown_sent_) return;
  const bool should_read =
      !stopping_ && !c->done_parsing_ &&
      c->slots_.size() < options_.requests_in_flight_per_connection_max &&
      uv_stream_get_write_queue_size(c->stream()) <= options_.write_queue_bytes_max;
  if (should_read != c->reading_) {
    if (should_read) {
      if (startReading(c) != 0) {
        closeConnection(c);
        return;
      }
    } else {
      (void)uv_read_stop(c->stream());
    }
    c->reading_ = should_read;
  }
  updateTimer(c);
}

void HttpServer::updateTimer(Connection* c) {
  using TimerFor = Connection::TimerFor;
  if (c->closing_ || !c->timer_open_ || c->shutdown_sent_) return;  // lingering: its own bound
  TimerFor wanted = TimerFor::kNothing;
  if (!c->done_parsing_ && c->slots_.empty()) {
    // Owed nothing: the wait is the peer's. The first request, and any request begun, must be
    // complete within header_timeout_ms (not reset by its bytes); otherwise idle_timeout_ms.
    wanted = (!c->served_ || c->in_message_ || !c->input_.empty()) ? TimerFor::kRequest
                                                                   : TimerFor::kIdle;
  }
  if (wanted == c->timer_for_) return;  // already running since the wait began
  c->timer_for_ = wanted;
  if (wanted == TimerFor::kNothing) {
    (void)uv_timer_stop(&c->timer_);
    return;
  }
  const uint64_t ms =
      wanted == TimerFor::kRequest ? options_.header_timeout_ms : options_.idle_timeout_ms;
  (void)uv_timer_start(
      &c->timer_,
      [](uv_timer_t* timer) {
        auto* connection = static_cast<Connection*>(timer->data);
        connection->server_->onTimer(connection);
      },
      ms, 0);
}

void HttpServer::onTimer(Connection* c) {
  using TimerFor = Connection::TimerFor;
  if (c->closing_) return;
  switch (c->timer_for_) {
    case TimerFor::kLinger:
      logger_->debug("http_linger_deadline",
                     {{"connection", c->id_}, {"linger_ms", options_.linger_ms}});
      break;
    case TimerFor::kRequest:
      logger_->warn("http_connection_timeout",
                    {{"connection", c->id_},
                     {"reason", c->served_ || c->in_message_ || !c->input_.empty()
                                    ? "request not complete within header_timeout_ms"
                                    : "no request within header_timeout_ms"},
                     {"header_timeout_ms", options_.header_timeout_ms}});
      break;
    case TimerFor::kIdle:
      logger_->info("http_connection_timeout", {{"connection", c->id_},
                                                {"reason", "idle above idle_timeout_ms"},
                                                {"idle_timeout_ms", options_.idle_timeout_ms}});
      break;
    case TimerFor::kNothing: return;
  }
  closeConnection(c);  // nothing is owed to the peer: no answer, no linger
}

void HttpServer::onReadWhileLingering(Connection* c, ssize_t nread) {
  if (c->closing_ || nread >= 0) return;  // input after our last answer is discarded
  if (nread != UV_EOF) {
    closeConnection(c);  // the peer is gone: nothing more reaches it
    return;
  }
  c->peer_ended_ = true;
  (void)uv_read_stop(c->stream());
  c->reading_ = false;
  if (c->shutdown_done_) closeConnection(c);
}

void HttpServer::onRead(Connection* c, ssize_t nread, const uv_buf_t* buf) {
  if (c->shutdown_sent_) {
    onReadWhileLingering(c, nread);
    return;
  }
  if (nread == 0) return;
  if (nread < 0) {
    if (nread != UV_EOF) {
      logger_->debug("http_connection_error",
                     {{"connection", c->id_}, {"error", uv_strerror(static_cast<int>(nread))}});
      closeConnection(c);
      return;
    }
    // The peer sent all it will (it may still read): answer what was asked, then close.
    c->done_parsing_ = true;
    c->peer_ended_ = true;
    (void)uv_read_stop(c->stream());
    c->reading_ = false;
    if (c->slots_.empty()) {
      shutdownConnection(c);
    } else {
      updateTimer(c);
    }
    return;
  }
  c->input_.append(buf->base, static_cast<size_t>(nread));
  parse(c);
}

void HttpServer::parse(Connection* c) {
  if (c->parsing_) return;  // the outer call goes on
  c->parsing_ = true;
  while (!c->closing_ && !c->done_parsing_ && !c->input_.empty() &&
         c->slots_.size() < options_.requests_in_flight_per_connection_max) {
    const size_t parsed =
        http_parser_execute(&c->parser_, &parserSettings(), c->input_.data(), c->input_.size());
    const auto error = static_cast<http_errno>(c->parser_.http_errno);
    if (error == HPE_PAUSED) http_parser_pause(&c->parser_, 0);
    c->input_.erase(0, parsed);
    if (c->message_complete_) {
      c->message_complete_ = false;
      c->in_message_ = false;
      c->served_ = true;
      // A wait ended: the next one (idle, or the next request) is timed from now.
      c->timer_for_ = Connection::TimerFor::kNothing;
      if (c->timer_open_) (void)uv_timer_stop(&c->timer_);
      dispatch(c);
      continue;
    }
    if (error != HPE_OK && error != HPE_PAUSED) {
      if (!c->refusal_.empty()) {  // a refused peer hears the refusal, whatever it sent
        c->done_parsing_ = true;
        c->input_.clear();
        fillSlot(c, openSlot(c),
                 renderHttpResponse(httpError(403, "PERMISSION_DENIED", c->refusal_), true), true);
        break;
      }
      const int status = c->refuse_status_ != 0 ? c->refuse_status_ : 400;
      std::string message;
      if (status == 431) {
        message = "request line and headers above " + std::to_string(options_.header_bytes_max) +
                  " bytes";
      } else if (status == 413) {
        message = "body above " + std::to_string(options_.body_bytes_max) + " bytes";
      } else {
        message = std::string("malformed HTTP request: ") + http_errno_description(error);
      }
      logger_->warn("http_bad_request",
                    {{"connection", c->id_}, {"status", status}, {"error", message}});
      const uint64_t sequence = openSlot(c);
      c->done_parsing_ = true;
      c->input_.clear();
      const char* code = status == 431   ? "HEADERS_TOO_LARGE"
                         : status == 413 ? "BODY_TOO_LARGE"
                                         : "MALFORMED_REQUEST";
      fillSlot(c, sequence, renderHttpResponse(httpError(status, code, message), true), true);
      break;
    }
    // Everything buffered was consumed by an incomplete request: wait for more bytes.
  }
  c->parsing_ = false;
  updateReading(c);
}

uint64_t HttpServer::openSlot(Connection* c) {
  c->slots_.emplace_back();
  return c->first_sequence_ + c->slots_.size() - 1;
}

void HttpServer::dispatch(Connection* c) {
  HttpRequest request{.method = http_method_str(static_cast<http_method>(c->parser_.method)),
                      .target = std::move(c->url_),
                      .body = std::move(c->body_)};
  const bool close =
      http_should_keep_alive(&c->parser_) == 0 || c->parser_.upgrade != 0 || stopping_;
  if (close) c->done_parsing_ = true;  // nothing after this request is read
  const uint64_t sequence = openSlot(c);
  if (!c->refusal_.empty()) {
    c->done_parsing_ = true;
    fillSlot(c, sequence,
             renderHttpResponse(httpError(403, "PERMISSION_DENIED", c->refusal_), true), true);
    return;
  }
  std::variant<HttpCall, HttpReply> routed = routeHttpRequest(request);
  if (auto* reply = std::get_if<HttpReply>(&routed)) {
    fillSlot(c, sequence, renderHttpResponse(*reply, close), close);
    return;
  }
  HttpCall call = std::move(std::get<HttpCall>(routed));
  wire::RequestBody body = std::move(call.body);
  call.body = wire::HealthRequest{};  // only kind and id are needed for the answer
  ++in_flight_;
  const uint64_t connection_id = c->id_;
  handler_(
      std::move(body),
      [this, connection_id, sequence, call = std::move(call), close,
       answered = false](wire::ResponseBody&& answer_body) mutable {
        TALLY_ASSERT(!answered);
        answered = true;
        std::string bytes = renderHttpResponse(httpReplyFor(call, answer_body), close);
        TALLY_ASSERT(in_flight_ > 0);
        --in_flight_;
        auto it = connections_.find(connection_id);
        if (it != connections_.end() && !it->second->closing_) {
          Connection* connection = it->second.get();
          fillSlot(connection, sequence, std::move(bytes), close);
          parse(connection);
        }
        if (stopping_) maybeFinishStop();
      },
      [this, connection_id] {
        auto it = connections_.find(connection_id);
        return it != connections_.end() && !it->second->closing_;
      });
}

void HttpServer::fillSlot(Connection* c, uint64_t sequence, std::string bytes, bool close) {
  TALLY_ASSERT(sequence >= c->first_sequence_ && sequence - c->first_sequence_ < c->slots_.size());
  Connection::Slot& slot = c->slots_[sequence - c->first_sequence_];
  slot.ready = true;
  slot.close = close;
  slot.bytes = std::move(bytes);
  flush(c);
}

void HttpServer::flush(Connection* c) {
  while (!c->closing_ && !c->slots_.empty() && c->slots_.front().ready) {
    Connection::Slot slot = std::move(c->slots_.front());
    c->slots_.pop_front();
    ++c->first_sequence_;
    auto* write = new WriteRequest{.bytes = std::move(slot.bytes), .server = this};
    write->request.data = write;
    uv_buf_t buf = uv_buf_init(write->bytes.data(), static_cast<unsigned>(write->bytes.size()));
    const int rc = uv_write(&write->request, c->stream(), &buf, 1, [](uv_write_t* request, int) {
      auto* done = static_cast<WriteRequest*>(request->data);
      auto* connection = static_cast<Connection*>(request->handle->data);
      HttpServer* server = done->server;
      delete done;
      // Fewer unsent bytes: the connection may be read again.
      if (!connection->closing_) {
        server->updateReading(connection);
        server->parse(connection);
      }
    });
    if (rc != 0) {
      delete write;
      closeConnection(c);
      return;
    }
    if (slot.close) {
      c->done_parsing_ = true;
      break;
    }
  }
  // Every answer owed is written: shut down once the queued writes are out.
  if (c->done_parsing_ && c->slots_.empty()) shutdownConnection(c);
}

void HttpServer::shutdownConnection(Connection* c) {
  if (c->closing_ || c->shutdown_sent_) return;
  c->shutdown_sent_ = true;
  c->done_parsing_ = true;
  c->input_.clear();
  // Linger: read and discard until the peer's end of stream, at most linger_ms (writes
  // included), so that no unread input turns our close into an RST that drops the answer.
  c->timer_for_ = Connection::TimerFor::kLinger;
  if (!c->timer_open_ || uv_timer_start(
                             &c->timer_,
                             [](uv_timer_t* timer) {
                               auto* connection = static_cast<Connection*>(timer->data);
                               connection->server_->onTimer(connection);
                             },
                             options_.linger_ms, 0) != 0) {
    closeConnection(c);  // no bound on the wait: do not wait
    return;
  }
  if (!c->peer_ended_ && !c->reading_) {
    if (startReading(c) != 0) {
      closeConnection(c);
      return;
    }
    c->reading_ = true;
  }
  auto* request = new ShutdownRequest;
  request->request.data = c;
  const int rc =
      uv_shutdown(&request->request, c->stream(), [](uv_shutdown_t* shutdown, int status) {
        auto* connection = static_cast<Connection*>(shutdown->data);
        delete reinterpret_cast<ShutdownRequest*>(shutdown);
        if (connection->closing_) return;  // closed meanwhile (UV_ECANCELED)
        connection->shutdown_done_ = true;
        // FIN follows our last byte; wait for the peer's end of stream unless it came already.
        if (status != 0 || connection->peer_ended_)
          connection->server_->closeConnection(connection);
      });
  if (rc != 0) {
    delete request;
    closeConnection(c);
  }
}

void HttpServer::closeConnection(Connection* c) {
  if (c->closing_) return;
  c->closing_ = true;
  const auto on_closed = [](uv_handle_t* handle) {
    auto* connection = static_cast<Connection*>(handle->data);
    HttpServer* server = connection->server_;
    --server->open_handles_;
    if (--connection->handles_open_ > 0) return;  // the stream's and the timer's
    server->connections_.erase(connection->id_);  // frees the connection
    server->maybeFinishStop();
  };
  if (c->timer_open_) {
    c->timer_open_ = false;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->timer_), on_closed);
  }
  uv_close(c->handle(), on_closed);
}

void HttpServer::closeHandle(uv_handle_t* handle) {
  uv_close(handle, [](uv_handle_t* closed) {
    auto* server = static_cast<HttpServer*>(closed->data);
    --server->open_handles_;
    server->maybeFinishStop();
  });
}

void HttpServer::stop(std::function<void()> on_stopped) {
  if (stopping_) return;
  stopping_ = true;
  on_stopped_ = std::move(on_stopped);
  if (pipe_open_) {
    pipe_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&pipe_listener_));
  }
  if (bound_path_) {
    (void)::unlink(options_.socket_path.c_str());
    bound_path_ = false;
  }
  if (tcp_open_) {
    tcp_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&tcp_listener_));
  }
  for (auto& [id, connection] : connections_) updateReading(connection.get());
  if (drain_timer_open_) {
    (void)uv_timer_start(&drain_timer_, onDrainDeadline, options_.drain_timeout_ms, 0);
  }
  maybeFinishStop();
}

void HttpServer::onDrainDeadline(uv_timer_t* timer) {
  auto* server = static_cast<HttpServer*>(timer->data);
  server->logger_->warn("http_drain_deadline", {{"unanswered", server->in_flight_}});
  server->drain_expired_ = true;
  server->maybeFinishStop();
}

void HttpServer::maybeFinishStop() {
  if (!stopping_ || stopped_) return;
  if (in_flight_ > 0 && !drain_expired_) return;
  if (!closing_connections_) {
    closing_connections_ = true;
    std::vector<Connection*> open;
    for (auto& [id, connection] : connections_) open.push_back(connection.get());
    for (Connection* connection : open) {
      if (drain_expired_) {
        closeConnection(connection);
      } else {
        shutdownConnection(connection);  // after its queued answers
      }
    }
  }
  if (!connections_.empty()) return;
  stopped_ = true;
  if (drain_timer_open_) {
    drain_timer_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&drain_timer_));
  }
  logger_->info("http_server_stopped");
  if (on_stopped_) {
    auto callback = std::exchange(on_stopped_, nullptr);
    callback();
  }
}

namespace {

const http_parser_settings& parserSettings() {
  static const http_parser_settings settings = [] {
    http_parser_settings s;
    http_parser_settings_init(&s);
    s.on_message_begin = onMessageBegin;
    s.on_url = [](http_parser* parser, const char* at, size_t length) {
      Connection* c = of(parser);
      if (countHeader(c, length, of(parser)->header_bytes_max_) != 0) return -1;
      c->url_.append(at, length);
      return 0;
    };
    s.on_header_field = [](http_parser* parser, const char*, size_t length) {
      return countHeader(of(parser), length, of(parser)->header_bytes_max_);
    };
    s.on_header_value = [](http_parser* parser, const char*, size_t length) {
      return countHeader(of(parser), length, of(parser)->header_bytes_max_);
    };
    s.on_headers_complete = [](http_parser* parser) {
      // ULLONG_MAX: no Content-Length (chunked, or no body); on_body bounds those.
      if (parser->content_length != ULLONG_MAX &&
          parser->content_length > of(parser)->body_bytes_max_) {
        of(parser)->refuse_status_ = 413;
        return -1;
      }
      return 0;
    };
    s.on_body = [](http_parser* parser, const char* at, size_t length) {
      Connection* c = of(parser);
      if (c->body_.size() + length > of(parser)->body_bytes_max_) {
        c->refuse_status_ = 413;
        return -1;
      }
      c->body_.append(at, length);
      return 0;
    };
    s.on_message_complete = [](http_parser* parser) {
      of(parser)->message_complete_ = true;
      http_parser_pause(parser, 1);  // one request per http_parser_execute: see parse()
      return 0;
    };
    return s;
  }();
  return settings;
}

}  // namespace

}  // namespace tally::agent
