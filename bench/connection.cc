#include "bench/connection.h"

#include <netdb.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <utility>
#include <variant>

#include "bench/bench_limits.h"
#include "core/assert.h"

namespace tally::bench {

// One uv_write: the bytes live here until the write callback.
struct Connection::WriteRequest {
  uv_write_t request{};
  std::vector<uint8_t> bytes;
  Connection* connection = nullptr;
};

namespace {

Status uvError(const std::string& what, int rc) {
  return Status::unavailable(what + ": " + uv_strerror(rc));
}

}  // namespace

Connection::Connection(uv_loop_t* loop, ConnectionListener* listener, uint64_t index)
    : loop_(loop), listener_(listener), index_(index) {}

Connection::~Connection() { TALLY_ASSERT(closed()); }

uv_stream_t* Connection::stream() {
  return kind_ == Endpoint::Kind::kTcp ? reinterpret_cast<uv_stream_t*>(&tcp_)
                                       : reinterpret_cast<uv_stream_t*>(&pipe_);
}

Status Connection::connect(const Endpoint& endpoint) {
  TALLY_ASSERT(!initialized_);
  kind_ = endpoint.kind;
  connect_request_.data = this;
  if (int rc = uv_prepare_init(loop_, &prepare_); rc != 0) return uvError("uv_prepare_init", rc);
  initialized_ = true;
  ++open_handles_;
  prepare_.data = this;
  if (kind_ == Endpoint::Kind::kTcp) return connectTcp(endpoint);
  connectUnix(endpoint);
  return failure_;
}

Status Connection::connectTcp(const Endpoint& endpoint) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  uv_getaddrinfo_t resolve{};
  const std::string port = std::to_string(endpoint.port);
  // Synchronous (no callback): done once, before any load.
  if (int rc =
          uv_getaddrinfo(loop_, &resolve, nullptr, endpoint.host.c_str(), port.c_str(), &hints);
      rc != 0) {
    failure_ = uvError("resolve " + endpoint.name(), rc);
    close();
    return failure_;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(resolve.addrinfo, uv_freeaddrinfo);
  if (addresses == nullptr) {
    failure_ = Status::unavailable("resolve " + endpoint.name() + ": no address");
    close();
    return failure_;
  }
  if (int rc = uv_tcp_init(loop_, &tcp_); rc != 0) {
    failure_ = uvError("uv_tcp_init", rc);
    close();
    return failure_;
  }
  ++open_handles_;
  tcp_.data = this;
  if (int rc = uv_tcp_connect(&connect_request_, &tcp_, addresses->ai_addr, onConnect); rc != 0) {
    failure_ = uvError("connect " + endpoint.name(), rc);
    close();
    return failure_;
  }
  return Status::ok();
}

void Connection::connectUnix(const Endpoint& endpoint) {
  if (int rc = uv_pipe_init(loop_, &pipe_, 0); rc != 0) {
    failure_ = uvError("uv_pipe_init", rc);
    close();
    return;
  }
  ++open_handles_;
  pipe_.data = this;
  // libuv 1.44: uv_pipe_connect reports every failure through the callback.
  uv_pipe_connect(&connect_request_, &pipe_, endpoint.path.c_str(), onConnect);
}

void Connection::onConnect(uv_connect_t* request, int status) {
  auto* self = static_cast<Connection*>(request->data);
  if (self->closing_) return;  // closed while connecting (UV_ECANCELED)
  if (status != 0) {
    self->fail(uvError("connect", status));
    return;
  }
  if (self->kind_ == Endpoint::Kind::kTcp) {
    if (int rc = uv_tcp_nodelay(&self->tcp_, 1); rc != 0) {
      self->fail(uvError("uv_tcp_nodelay", rc));
      return;
    }
  }
  if (int rc = uv_read_start(self->stream(), onAlloc, onRead); rc != 0) {
    self->fail(uvError("uv_read_start", rc));
    return;
  }
  if (int rc = uv_prepare_start(&self->prepare_, onPrepare); rc != 0) {
    self->fail(uvError("uv_prepare_start", rc));
    return;
  }
  self->connected_ = true;
}

Status Connection::send(wire::RequestBody body, uint64_t tag) {
  if (!connected_ || closing_) {
    return failed() ? failure_ : Status::unavailable("connection is not open");
  }
  if (pending_.size() >= limits::kRequestsInFlightPerConnectionMax) {
    return Status::resourceExhausted("too many requests in flight on one connection");
  }
  if (output_.size() + uv_stream_get_write_queue_size(stream()) >= limits::kWriteQueueBytesMax) {
    return Status::resourceExhausted("write queue full");
  }
  const uint64_t request_id = next_request_id_++;
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = std::move(body)});
  if (!frame.isOk()) return frame.status();
  output_.insert(output_.end(), frame.value().begin(), frame.value().end());
  pending_.emplace(request_id, tag);
  return Status::ok();
}

void Connection::onPrepare(uv_prepare_t* prepare) {
  auto* self = static_cast<Connection*>(prepare->data);
  if (!self->output_.empty() && !self->closing_) self->flush();
}

void Connection::flush() {
  auto write = std::make_unique<WriteRequest>();
  write->bytes.swap(output_);
  write->connection = this;
  write->request.data = write.get();
  uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(write->bytes.data()),
                             static_cast<unsigned>(write->bytes.size()));
  if (int rc = uv_write(&write->request, stream(), &buf, 1, onWrite); rc != 0) {
    fail(uvError("write", rc));
    return;
  }
  write.release();  // owned by onWrite now
}

void Connection::onWrite(uv_write_t* request, int status) {
  std::unique_ptr<WriteRequest> write(static_cast<WriteRequest*>(request->data));
  if (status != 0 && status != UV_ECANCELED) write->connection->fail(uvError("write", status));
}

void Connection::onAlloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(handle->data);
  buf->base = self->read_buffer_.data();
  buf->len = self->read_buffer_.size();
}

void Connection::onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(stream->data);
  if (nread < 0) {
    self->fail(nread == UV_EOF ? Status::unavailable("the server closed the connection")
                               : uvError("read", static_cast<int>(nread)));
    return;
  }
  if (nread == 0 || self->closing_) return;
  self->frames_.clear();
  const Status status =
      self->decoder_.feed(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf->base),
                                                   static_cast<size_t>(nread)),
                          &self->frames_);
  self->deliver(&self->frames_);
  if (!status.isOk()) self->fail(status);
}

void Connection::deliver(std::vector<wire::Frame>* frames) {
  for (const wire::Frame& frame : *frames) {
    if (closing_) return;
    Result<wire::Response> response = wire::decodeResponse(frame);
    if (!response.isOk()) {
      fail(response.status());
      return;
    }
    auto it = pending_.find(response.value().request_id);
    if (it == pending_.end()) {
      // The server answers a request it could not read under id 0, then closes.
      const auto* error = std::get_if<wire::ErrorReply>(&response.value().body);
      fail(Status::corruption(
          "response to unknown request id " + std::to_string(response.value().request_id) +
          (error != nullptr
               ? std::string(": ") + wire::errorCodeName(error->code) + " " + error->message
               : std::string())));
      return;
    }
    const uint64_t tag = it->second;
    pending_.erase(it);
    listener_->onResponse(this, tag, std::move(response).value());
  }
}

void Connection::fail(Status status) {
  if (failed() || closing_) return;
  failure_ = std::move(status);
  std::vector<uint64_t> lost;
  lost.reserve(pending_.size());
  for (const auto& [request_id, tag] : pending_) lost.push_back(tag);
  pending_.clear();
  output_.clear();
  close();
  listener_->onFailed(this, failure_, lost);
}

void Connection::close() {
  if (closing_) return;
  closing_ = true;
  connected_ = false;
  if (!initialized_) return;
  // Handles are counted as they are initialized: prepare_ first, then the stream.
  if (open_handles_ == 2) uv_close(reinterpret_cast<uv_handle_t*>(stream()), onClose);
  uv_close(reinterpret_cast<uv_handle_t*>(&prepare_), onClose);
}

void Connection::onClose(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  TALLY_ASSERT(self->open_handles_ > 0);
  --self->open_handles_;
}

}  // namespace tally::bench
