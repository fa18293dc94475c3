#include "net/metrics_server.h"

#include <arpa/inet.h>

#include <array>
#include <utility>
#include <vector>

#include "core/assert.h"

namespace tally::net {

struct MetricsServer::Connection {
  MetricsServer* server = nullptr;
  uint64_t id = 0;
  uv_tcp_t tcp{};
  std::string head;
  std::string response;  // lives until the write callback
  uv_write_t write{};
  bool closing = false;
  bool responded = false;
};

namespace {

std::string httpResponse(const char* status, const char* content_type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

}  // namespace

std::string httpResponseFor(std::string_view request_head, const std::string& metrics_body) {
  const size_t line_end = request_head.find("\r\n");
  const std::string_view line = request_head.substr(0, line_end);
  const size_t first_space = line.find(' ');
  const size_t second_space =
      first_space == std::string_view::npos ? first_space : line.find(' ', first_space + 1);
  if (first_space == std::string_view::npos || second_space == std::string_view::npos) {
    return httpResponse("400 Bad Request", "text/plain", "bad request\n");
  }
  const std::string_view method = line.substr(0, first_space);
  std::string_view target = line.substr(first_space + 1, second_space - first_space - 1);
  if (const size_t query = target.find('?'); query != std::string_view::npos) {
    target = target.substr(0, query);
  }
  if (method != "GET" && method != "HEAD") {
    return httpResponse("405 Method Not Allowed", "text/plain", "only GET\n");
  }
  if (target != "/metrics") return httpResponse("404 Not Found", "text/plain", "not found\n");
  std::string response =
      httpResponse("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics_body);
  if (method == "HEAD") response.resize(response.size() - metrics_body.size());
  return response;
}

MetricsServer::MetricsServer(uv_loop_t* loop, Logger* logger, std::string host, uint16_t port,
                             std::function<std::string()> render)
    : loop_(loop),
      logger_(logger),
      host_(std::move(host)),
      port_(port),
      render_(std::move(render)) {
  listener_.data = this;
}

MetricsServer::~MetricsServer() { TALLY_ASSERT(open_handles_ == 0); }

Status MetricsServer::start() {
  sockaddr_in address{};
  if (int rc = uv_ip4_addr(host_.c_str(), port_, &address); rc != 0) {
    return Status::invalidArgument("metrics address '" + host_ + "' is not an IPv4 address");
  }
  if (int rc = uv_tcp_init(loop_, &listener_); rc != 0) {
    return Status::ioError(std::string("uv_tcp_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  listener_open_ = true;
  if (int rc = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&address), 0); rc != 0) {
    return Status::ioError("metrics bind " + host_ + ":" + std::to_string(port_) + ": " +
                           uv_strerror(rc));
  }
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 64, onConnection); rc != 0) {
    return Status::ioError(std::string("metrics listen: ") + uv_strerror(rc));
  }
  sockaddr_in bound{};
  int length = sizeof(bound);
  if (int rc = uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &length);
      rc != 0) {
    return Status::ioError(std::string("getsockname: ") + uv_strerror(rc));
  }
  port_ = ntohs(bound.sin_port);
  return Status::ok();
}

void MetricsServer::onConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<MetricsServer*>(listener->data);
  if (status != 0) return;
  auto connection = std::make_unique<Connection>();
  connection->server = server;
  connection->id = server->next_id_++;
  connection->tcp.data = connection.get();
  if (uv_tcp_init(server->loop_, &connection->tcp) != 0) return;
  ++server->open_handles_;
  Connection* raw = connection.get();
  server->connections_.emplace(raw->id, std::move(connection));
  if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(&raw->tcp)) != 0 ||
      server->connections_.size() > kConnectionsMax) {
    server->close(raw);
    return;
  }
  auto on_alloc = [](uv_handle_t*, size_t, uv_buf_t* buf) {
    static std::array<char, 4096> buffer;
    buf->base = buffer.data();
    buf->len = buffer.size();
  };
  auto on_read = [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* conn = static_cast<Connection*>(stream->data);
    if (nread < 0) {
      conn->server->close(conn);
      return;
    }
    conn->server->onData(conn, buf->base, static_cast<size_t>(nread));
  };
  if (uv_read_start(reinterpret_cast<uv_stream_t*>(&raw->tcp), on_alloc, on_read) != 0) {
    server->close(raw);
  }
}

void MetricsServer::onData(Connection* connection, const char* data, size_t length) {
  if (connection->responded || connection->closing) return;
  connection->head.append(data, length);
  if (connection->head.find("\r\n\r\n") != std::string::npos) {
    respond(connection, httpResponseFor(connection->head, render_()));
  } else if (connection->head.size() > kRequestBytesMax) {
    respond(connection,
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n");
  }
}

void MetricsServer::respond(Connection* connection, std::string response) {
  connection->responded = true;
  (void)uv_read_stop(reinterpret_cast<uv_stream_t*>(&connection->tcp));
  connection->response = std::move(response);
  connection->write.data = connection;
  uv_buf_t buf =
      uv_buf_init(connection->response.data(), static_cast<unsigned>(connection->response.size()));
  const int rc = uv_write(&connection->write, reinterpret_cast<uv_stream_t*>(&connection->tcp),
                          &buf, 1, [](uv_write_t* req, int) {
                            auto* conn = static_cast<Connection*>(req->data);
                            conn->server->close(conn);
                          });
  if (rc != 0) close(connection);
}

void MetricsServer::close(Connection* connection) {
  if (connection->closing) return;
  connection->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&connection->tcp), [](uv_handle_t* handle) {
    auto* conn = static_cast<Connection*>(handle->data);
    MetricsServer* server = conn->server;
    --server->open_handles_;
    server->connections_.erase(conn->id);
  });
}

void MetricsServer::stop() {
  if (listener_open_) {
    listener_open_ = false;
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), [](uv_handle_t* handle) {
      --static_cast<MetricsServer*>(handle->data)->open_handles_;
    });
  }
  std::vector<Connection*> open;
  for (auto& [id, connection] : connections_) open.push_back(connection.get());
  for (Connection* connection : open) close(connection);
}

}  // namespace tally::net
