#include "ledger/standby_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "ledger/link_tls.h"

namespace tally::ledger {

class StandbyServer::Connection final : public net::FramedStream {
 public:
  using FramedStream::FramedStream;
};

namespace {
constexpr int kBacklog = 511;  // as the Server's
}  // namespace

StandbyServer::StandbyServer(uv_loop_t* loop, Logger* logger, StandbyServerOptions options)
    : loop_(loop),
      logger_(logger),
      options_(std::move(options)),
      connections_(loop, logger, options_.stream,
                   {.connections_max = options_.connections_max,
                    .buffered_bytes_max = options_.buffered_bytes_max,
                    .refusal_frame = !options_.tls}) {
  listener_.data = this;
}

StandbyServer::~StandbyServer() {
  if (!listener_open_ && options_.listen_fd >= 0) ::close(options_.listen_fd);
}

Status StandbyServer::start() {
  if (options_.listen_fd < 0) return Status::invalidArgument("standby: no listening socket");
  if (int rc = uv_tcp_init(loop_, &listener_); rc != 0) {
    return Status::ioError(std::string("uv_tcp_init: ") + uv_strerror(rc));
  }
  listener_open_ = true;
  if (int rc = uv_tcp_open(&listener_, options_.listen_fd); rc != 0) {
    ::close(options_.listen_fd);
    return Status::ioError(std::string("uv_tcp_open: ") + uv_strerror(rc));
  }
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), kBacklog, onConnection);
      rc != 0) {
    return Status::ioError(std::string("listen: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void StandbyServer::onConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<StandbyServer*>(listener->data);
  if (status != 0) {
    server->logger_->warn("accept_failed", {{"error", uv_strerror(status)}});
    return;
  }
  server->accept();
}

void StandbyServer::accept() {
  net::StreamHandler* handler = this;  // a private base: converted here, not in make_unique
  net::FramedStream* raw = connections_.accept(
      reinterpret_cast<uv_stream_t*>(&listener_),
      [this, handler](uint64_t id, const net::StreamLimits& limits) {
        return std::make_unique<Connection>(loop_, net::StreamKind::kTcp, handler, limits, id);
      },
      false);
  if (raw == nullptr) return;  // refused or failed: logged, and closing
  (void)uv_tcp_nodelay(raw->tcp(), 1);
  if (options_.tls && !startServerTls(raw, options_.tls, logger_)) return;
  raw->startReading();
}

void StandbyServer::onFrame(net::FramedStream* stream, wire::Frame&& frame) {
  const wire::DecodedRequest decoded = wire::decodeRequest(frame);
  wire::Response response{.request_id = decoded.request_id.value_or(0)};
  response.body = decoded.body.isOk() ? wire::ErrorReply{.code = wire::ErrorCode::kNotPrimary,
                                                         .message = notPrimaryMessage(primary_)}
                                      : wire::errorReplyFor(decoded.body.status());
  answer(stream, response);
}

void StandbyServer::answer(net::FramedStream* stream, const wire::Response& response) {
  if (Status s =
          wire::encodeResponseFrameInto(response, stream->output(), limits::kFrameBytesMaxDefault);
      !s.isOk()) {
    stream->close();
    return;
  }
  ++answered_;
  stream->flush();
}

void StandbyServer::onBadFrame(net::FramedStream* stream, const Status& status) {
  answer(stream, wire::Response{.request_id = 0, .body = wire::errorReplyFor(status)});
  stream->shutdownThenClose();
}

void StandbyServer::onLost(net::FramedStream* stream, const Status& status) {
  if (status.message().starts_with("TLS: ")) {  // a bad record, a plaintext client
    logger_->warn("tls_refused", {{"connection", stream->id()}, {"error", status.toString()}});
  } else if (status.message().starts_with("stalled: ")) {  // paused, and read nothing for long
    logger_->warn("connection_stalled",
                  {{"connection", stream->id()}, {"reason", status.message()}});
  }
}

void StandbyServer::onClosed(net::FramedStream* stream) {
  connections_.erase(stream->id());  // frees the stream
}

int StandbyServer::handOver() {
  int fd = -1;
  uv_os_fd_t own = -1;
  if (listener_open_ && uv_fileno(reinterpret_cast<uv_handle_t*>(&listener_), &own) == 0) {
    fd = ::dup(own);
  }
  stop();
  return fd;
}

void StandbyServer::stop() {
  for (net::FramedStream* connection : connections_.all()) connection->close();
  if (listener_open_ && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&listener_))) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
  }
}

Result<int> bindListeningSocket(const std::string& host, uint16_t port, uint16_t* bound_port) {
  sockaddr_in address{};
  if (int rc = uv_ip4_addr(host.c_str(), port, &address); rc != 0) {
    return Status::invalidArgument("listen address '" + host +
                                   "' is not an IPv4 address: " + uv_strerror(rc));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::ioError(std::string("socket: ") + std::strerror(errno));
  const int on = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));  // as libuv's bind
  const std::string where = host + ":" + std::to_string(port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    ::close(fd);
    return Status::ioError("bind " + where + ": " + std::strerror(error));
  }
  if (::listen(fd, kBacklog) != 0) {
    const int error = errno;
    ::close(fd);
    return Status::ioError("listen " + where + ": " + std::strerror(error));
  }
  sockaddr_in bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    const int error = errno;
    ::close(fd);
    return Status::ioError(std::string("getsockname: ") + std::strerror(error));
  }
  *bound_port = ntohs(bound.sin_port);
  return fd;
}

std::string renderStandbyMetrics(const StandbyServer& standby) {
  return "# HELP tally_ledger_standby 1 while this ledger is a standby (it answers NOT_PRIMARY)\n"
         "# TYPE tally_ledger_standby gauge\n"
         "tally_ledger_standby 1\n"
         "# HELP tally_ledger_connections Open client connections\n"
         "# TYPE tally_ledger_connections gauge\n"
         "tally_ledger_connections " +
         std::to_string(standby.connections()) +
         "\n"
         "# HELP tally_ledger_not_primary_answers_total Requests answered NOT_PRIMARY\n"
         "# TYPE tally_ledger_not_primary_answers_total counter\n"
         "tally_ledger_not_primary_answers_total " +
         std::to_string(standby.answered()) + "\n";
}

}  // namespace tally::ledger
