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

namespace {

Status uvError(const std::string& what, int rc) {
  return Status::unavailable(what + ": " + uv_strerror(rc));
}

}  // namespace

Connection::Connection(uv_loop_t* loop, ConnectionListener* listener, uint64_t index)
    : loop_(loop), listener_(listener), index_(index) {}

Connection::~Connection() { TALLY_ASSERT(closed()); }

Status Connection::openStream(net::StreamKind kind) {
  net::StreamHandler* handler = this;  // a private base: converted here, not in make_unique
  stream_ = std::make_unique<net::FramedStream>(loop_, kind, handler,
                                                net::StreamLimits{.backpressure = false}, index_);
  if (Status s = stream_->init(); !s.isOk()) return Status::unavailable(s.message());
  ++open_handles_;
  return Status::ok();
}

Status Connection::connect(const Endpoint& endpoint) {
  TALLY_ASSERT(!initialized_);
  if (int rc = uv_prepare_init(loop_, &prepare_); rc != 0) return uvError("uv_prepare_init", rc);
  initialized_ = true;
  ++open_handles_;
  prepare_.data = this;
  if (endpoint.kind == Endpoint::Kind::kTcp) return connectTcp(endpoint);
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
  if (Status s = openStream(net::StreamKind::kTcp); !s.isOk()) {
    failure_ = std::move(s);
    close();
    return failure_;
  }
  if (Status s = stream_->connect(addresses->ai_addr); !s.isOk()) {
    failure_ = Status::unavailable(s.message() + " (" + endpoint.name() + ")");
    close();
    return failure_;
  }
  return Status::ok();
}

void Connection::connectUnix(const Endpoint& endpoint) {
  if (Status s = openStream(net::StreamKind::kPipe); !s.isOk()) {
    failure_ = std::move(s);
    close();
    return;
  }
  stream_->connectPipe(endpoint.path.c_str());  // every failure comes through onConnected
}

void Connection::onConnected(net::FramedStream*, const Status& status) {
  if (closing_) return;
  if (!status.isOk()) {
    fail(Status::unavailable(status.message()));
    return;
  }
  if (stream_->handle()->type == UV_TCP) {
    if (int rc = uv_tcp_nodelay(stream_->tcp(), 1); rc != 0) {
      fail(uvError("uv_tcp_nodelay", rc));
      return;
    }
  }
  stream_->startReading();  // a failure comes back through onLost
  if (closing_) return;
  if (int rc = uv_prepare_start(&prepare_, onPrepare); rc != 0) {
    fail(uvError("uv_prepare_start", rc));
    return;
  }
  connected_ = true;
}

Status Connection::send(wire::RequestBody body, uint64_t tag) {
  if (!connected_ || closing_) {
    return failed() ? failure_ : Status::unavailable("connection is not open");
  }
  if (pending_.size() >= limits::kRequestsInFlightPerConnectionMax) {
    return Status::resourceExhausted("too many requests in flight on one connection");
  }
  if (stream_->queuedBytes() >= limits::kWriteQueueBytesMax) {
    return Status::resourceExhausted("write queue full");
  }
  const uint64_t request_id = next_request_id_++;
  // Straight into the stream's output, which the prepare handle flushes once per loop turn.
  if (Status encoded = wire::encodeRequestFrameInto(
          wire::Request{.request_id = request_id, .body = std::move(body)}, stream_->output(),
          tally::limits::kFrameBytesMaxDefault, &scratch_);
      !encoded.isOk()) {
    return encoded;
  }
  pending_.emplace(request_id, tag);
  return Status::ok();
}

void Connection::onPrepare(uv_prepare_t* prepare) {
  auto* self = static_cast<Connection*>(prepare->data);
  if (!self->closing_) self->stream_->flush();  // a write error comes back through onLost
}

void Connection::onFrame(net::FramedStream*, wire::Frame&& frame) {
  if (closing_) return;
  if (Status decoded = wire::decodeResponse(frame, &response_); !decoded.isOk()) {
    fail(decoded);
    return;
  }
  auto it = pending_.find(response_.request_id);
  if (it == pending_.end()) {
    // The server answers a request it could not read under id 0, then closes.
    const auto* error = std::get_if<wire::ErrorReply>(&response_.body);
    fail(Status::corruption(
        "response to unknown request id " + std::to_string(response_.request_id) +
        (error != nullptr
             ? std::string(": ") + wire::errorCodeName(error->code) + " " + error->message
             : std::string())));
    return;
  }
  const uint64_t tag = it->second;
  pending_.erase(it);
  listener_->onResponse(this, tag, response_);
}

void Connection::onBadFrame(net::FramedStream*, const Status& status) { fail(status); }

void Connection::onLost(net::FramedStream*, const Status& status) {
  fail(status.code() == StatusCode::kUnavailable
           ? Status::unavailable("the server closed the connection")
           : Status::unavailable(status.message()));
}

void Connection::onClosed(net::FramedStream*) {
  TALLY_ASSERT(open_handles_ > 0);
  --open_handles_;
}

void Connection::fail(Status status) {
  if (failed() || closing_) return;
  failure_ = std::move(status);
  std::vector<uint64_t> lost;
  lost.reserve(pending_.size());
  for (const auto& [request_id, tag] : pending_) lost.push_back(tag);
  pending_.clear();
  close();
  listener_->onFailed(this, failure_, lost);
}

void Connection::close() {
  if (closing_) return;
  closing_ = true;
  connected_ = false;
  if (!initialized_) return;
  // Handles are counted as they are initialized: prepare_ first, then the stream.
  if (stream_ != nullptr) stream_->close();  // a no-op if it never initialized
  uv_close(reinterpret_cast<uv_handle_t*>(&prepare_), onClose);
}

void Connection::onClose(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  TALLY_ASSERT(self->open_handles_ > 0);
  --self->open_handles_;
}

}  // namespace tally::bench
