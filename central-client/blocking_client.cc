#include "central-client/blocking_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <span>
#include <utility>

namespace tally::client {
namespace {

constexpr size_t kReadChunkBytes = 64 * 1024;

using Clock = std::chrono::steady_clock;

Clock::time_point deadlineAfter(uint64_t timeout_ms) {
  // Capped far beyond any real timeout so that the addition cannot overflow.
  constexpr uint64_t kCapMs = 100ull * 365 * 24 * 3600 * 1000;
  return Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kCapMs));
}

std::string errnoText(int error) { return std::strerror(error); }

// Closes a descriptor on every path that does not hand it to a BlockingClient.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Waits for `events` on `fd` until `deadline`. kUnavailable on timeout or poll failure.
Status waitFor(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return Status::unavailable(std::string("timed out ") + what);
    // Rounded up, so that a wait never ends before the deadline.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    const int wait_ms = static_cast<int>(std::min<int64_t>(left, INT_MAX));
    pollfd pfd{.fd = fd, .events = events, .revents = 0};
    const int rc = ::poll(&pfd, 1, wait_ms);
    if (rc > 0) return Status::ok();  // readiness or an error condition: the syscall tells
    if (rc < 0 && errno != EINTR) {
      return Status::unavailable(std::string("poll failed ") + what + ": " + errnoText(errno));
    }
  }
}

// Completes a non-blocking connect() that returned EINPROGRESS/EAGAIN.
Status finishConnect(int fd, Clock::time_point deadline) {
  if (Status s = waitFor(fd, POLLOUT, deadline, "connecting"); !s.isOk()) return s;
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
  if (error != 0) return Status::unavailable(errnoText(error));
  return Status::ok();
}

Status connectAddress(int fd, const sockaddr* address, socklen_t length,
                      Clock::time_point deadline) {
  if (::connect(fd, address, length) == 0) return Status::ok();
  if (errno == EINPROGRESS || errno == EAGAIN || errno == EINTR) {
    return finishConnect(fd, deadline);
  }
  if (errno == EACCES || errno == EPERM) return Status::failedPrecondition(errnoText(errno));
  return Status::unavailable(errnoText(errno));
}

Result<int> connectTcp(const Endpoint& endpoint, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  addrinfo* addresses = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &addresses); rc != 0) {
    return Status::unavailable("cannot resolve '" + endpoint.host + "': " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(addresses, &::freeaddrinfo);
  Status last = Status::unavailable("no address for '" + endpoint.host + "'");
  for (const addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    FdGuard fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      last = Status::unavailable("socket: " + errnoText(errno));
      continue;
    }
    Status status = connectAddress(fd.get(), ai->ai_addr, ai->ai_addrlen, deadline);
    if (!status.isOk()) {
      last = status;
      continue;
    }
    // Requests are small and latency-bound: never wait for Nagle.
    const int one = 1;
    if (::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
      return Status::unavailable("setsockopt(TCP_NODELAY): " + errnoText(errno));
    }
    return fd.release();
  }
  return last;
}

Result<int> connectUnix(const Endpoint& endpoint, Clock::time_point deadline) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (endpoint.path.empty() || endpoint.path.size() >= sizeof(address.sun_path)) {
    return Status::invalidArgument("unix socket path '" + endpoint.path + "' is empty or too long");
  }
  std::memcpy(address.sun_path, endpoint.path.data(), endpoint.path.size());
  FdGuard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Status::unavailable("socket: " + errnoText(errno));
  Status status = connectAddress(fd.get(), reinterpret_cast<const sockaddr*>(&address),
                                 sizeof(address), deadline);
  if (!status.isOk()) return status;
  return fd.release();
}

}  // namespace

Result<Endpoint> parseTcpEndpoint(std::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string_view::npos) {
    return Status::invalidArgument("'" + std::string(host_port) + "' is not HOST:PORT");
  }
  std::string_view host = host_port.substr(0, colon);
  const std::string_view port_text = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return Status::invalidArgument("'" + std::string(host_port) +
                                   "': write IPv6 addresses as [ADDRESS]:PORT");
  }
  if (host.empty()) {
    return Status::invalidArgument("'" + std::string(host_port) + "' has no host");
  }
  uint32_t port = 0;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() ||
      port == 0 || port > 65535) {
    return Status::invalidArgument("'" + std::string(host_port) + "' has no valid port (1-65535)");
  }
  return Endpoint{
      .kind = Endpoint::Kind::kTcp, .host = std::string(host), .port = static_cast<uint16_t>(port)};
}

Result<Endpoint> unixEndpoint(std::string_view path) {
  if (path.empty()) return Status::invalidArgument("empty unix socket path");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::invalidArgument("unix socket path '" + std::string(path) + "' is longer than " +
                                   std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
  }
  return Endpoint{.kind = Endpoint::Kind::kUnix, .path = std::string(path)};
}

std::string endpointName(const Endpoint& endpoint) {
  if (endpoint.kind == Endpoint::Kind::kUnix) return "unix:" + endpoint.path;
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  return (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

Result<std::unique_ptr<BlockingClient>> BlockingClient::connect(const Endpoint& endpoint,
                                                                uint64_t timeout_ms,
                                                                BlockingClientOptions options) {
  const Clock::time_point deadline = deadlineAfter(timeout_ms);
  Result<int> fd = endpoint.kind == Endpoint::Kind::kTcp ? connectTcp(endpoint, deadline)
                                                         : connectUnix(endpoint, deadline);
  if (!fd.isOk()) {
    const Status& s = fd.status();
    const std::string message = "cannot connect to " + endpointName(endpoint) + ": " + s.message();
    if (s.code() == StatusCode::kInvalidArgument) return Status::invalidArgument(message);
    if (s.code() == StatusCode::kFailedPrecondition) {  // EACCES, EPERM
      return Status::failedPrecondition(std::string(kPermissionDeniedPrefix) + message +
                                        " (the socket's mode or owner, or allowed peers: is this "
                                        "user in the agent's socket group?)");
    }
    return Status::unavailable(message);
  }
  std::unique_ptr<BlockingClient> client(new BlockingClient(fd.value(), endpoint, options));
  if (client->options_.tls) {
    Result<std::unique_ptr<LinkSession>> session = client->options_.tls();
    if (!session.isOk()) return session.status();
    client->tls_ = std::move(session).value();
    if (Status s = client->handshake(deadline); !s.isOk()) return s;
  }
  return client;
}

Status BlockingClient::handshake(Clock::time_point deadline) {
  if (Status s = tls_->start(); !s.isOk())
    return fail(Status::failedPrecondition("TLS: " + s.message()));
  uint8_t buffer[kReadChunkBytes];
  std::vector<wire::Frame> frames;
  for (;;) {
    if (Status s = sendRaw(tls_->takeCiphertext(), deadline); !s.isOk()) return s;
    if (tls_->handshakeDone()) return Status::ok();
    if (Status s = waitFor(fd_, POLLIN, deadline, "the TLS handshake"); !s.isOk()) return s;
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n == 0) {
      return fail(Status::failedPrecondition(
          "TLS: " + endpointName(endpoint_) +
          " closed the connection during the TLS handshake (does it run with --insecure?)"));
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return fail(Status::unavailable("receive from " + endpointName(endpoint_) +
                                      " failed: " + errnoText(errno)));
    }
    if (Status s = received(std::span<const uint8_t>(buffer, static_cast<size_t>(n)), &frames);
        !s.isOk()) {
      return s;
    }
    for (wire::Frame& frame : frames) frames_.push_back(std::move(frame));
    frames.clear();
  }
}

Status BlockingClient::received(std::span<const uint8_t> bytes, std::vector<wire::Frame>* frames) {
  const bool first = std::exchange(first_bytes_, false);
  // A TLS record's first byte is 0x16 (handshake) or 0x15 (alert), then 0x03; a frame's length
  // is a whole number of words, so its first byte is a multiple of 8.
  const bool looks_tls =
      bytes.size() >= 2 && (bytes[0] == 0x16 || bytes[0] == 0x15) && bytes[1] == 0x03;
  std::vector<uint8_t> plaintext;
  if (tls_ != nullptr) {
    const Status fed = tls_->feed(bytes);
    (void)sendRaw(tls_->takeCiphertext(), deadlineAfter(100));  // alerts, key updates
    if (!fed.isOk()) {
      std::string why = fed.message();
      if (first && !looks_tls) {
        why = "the peer does not speak TLS (does it run with --insecure?)";
      } else if (tls_->peerRefused()) {
        why = "the peer's key is not the pinned one (" + fed.message() + ")";
      } else if (tls_->peerAlert().has_value()) {
        why = "the peer refused the session (alert: " + *tls_->peerAlert() +
              "): it does not accept our key";
      }
      return fail(Status::failedPrecondition("TLS: " + endpointName(endpoint_) + ": " + why));
    }
    plaintext = tls_->takePlaintext();
    bytes = plaintext;
  } else if (first && looks_tls) {
    return fail(Status::failedPrecondition("TLS: " + endpointName(endpoint_) +
                                           " speaks TLS and this client runs with --insecure"));
  }
  Status fed = decoder_.feed(bytes, frames);
  if (!fed.isOk()) {
    return fail(Status::corruption("malformed frame from " + endpointName(endpoint_) + ": " +
                                   fed.message()));
  }
  return Status::ok();
}

BlockingClient::BlockingClient(int fd, Endpoint endpoint, BlockingClientOptions options)
    : fd_(fd),
      endpoint_(std::move(endpoint)),
      options_(options),
      decoder_(wire::FrameDecoderOptions{.frame_bytes_max = options.frame_bytes_max}) {}

BlockingClient::~BlockingClient() { ::close(fd_); }

Status BlockingClient::fail(Status status) {
  broken_ = status;
  return status;
}

Status BlockingClient::writeAll(const std::vector<uint8_t>& bytes, Clock::time_point deadline) {
  if (tls_ == nullptr) return sendRaw(bytes, deadline);
  if (Status s = tls_->write(bytes); !s.isOk()) {
    return fail(Status::failedPrecondition("TLS: " + s.message()));
  }
  return sendRaw(tls_->takeCiphertext(), deadline);
}

Status BlockingClient::sendRaw(const std::vector<uint8_t>& bytes, Clock::time_point deadline) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + written, bytes.size() - written, MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A frame cut in the middle leaves the stream unusable: a timeout here breaks it.
      if (Status s = waitFor(fd_, POLLOUT, deadline, "sending"); !s.isOk()) {
        return written == 0 ? s : fail(s);
      }
      continue;
    }
    return fail(
        Status::unavailable("send to " + endpointName(endpoint_) + " failed: " + errnoText(errno)));
  }
  return Status::ok();
}

Status BlockingClient::fillFrames(Clock::time_point deadline) {
  std::vector<wire::Frame> frames;
  uint8_t buffer[kReadChunkBytes];
  while (frames.empty()) {
    if (Status s = waitFor(fd_, POLLIN, deadline, "waiting for the response"); !s.isOk()) {
      return s;
    }
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n == 0) {
      if (tls_ != nullptr && tls_->peerAlert().has_value()) {
        return fail(
            Status::failedPrecondition("TLS: " + endpointName(endpoint_) +
                                       " refused the session (alert: " + *tls_->peerAlert() + ")"));
      }
      return fail(Status::unavailable(endpointName(endpoint_) + " closed the connection"));
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return fail(Status::unavailable("receive from " + endpointName(endpoint_) +
                                      " failed: " + errnoText(errno)));
    }
    Status fed = received(std::span<const uint8_t>(buffer, static_cast<size_t>(n)), &frames);
    for (wire::Frame& frame : frames) frames_.push_back(std::move(frame));
    if (!fed.isOk()) return fed;
  }
  return Status::ok();
}

Result<wire::Response> BlockingClient::nextResponse(Clock::time_point deadline) {
  if (frames_.empty()) {
    if (!broken_.isOk()) return broken_;
    if (Status s = fillFrames(deadline); !s.isOk() && frames_.empty()) return s;
  }
  wire::Frame frame = std::move(frames_.front());
  frames_.pop_front();
  Result<wire::Response> response = wire::decodeResponse(frame);
  if (!response.isOk()) {
    return Status::corruption("malformed response from " + endpointName(endpoint_) + ": " +
                              response.status().message());
  }
  return response;
}

Result<uint64_t> BlockingClient::sendWithDeadline(const wire::RequestBody& body,
                                                  Clock::time_point deadline) {
  if (!broken_.isOk()) return broken_;
  const uint64_t request_id = next_request_id_++;
  Result<std::vector<uint8_t>> frame = wire::encodeRequestFrame(
      wire::Request{.request_id = request_id, .body = body}, options_.frame_bytes_max);
  if (!frame.isOk()) return frame.status();
  if (Status s = writeAll(frame.value(), deadline); !s.isOk()) return s;
  return request_id;
}

Result<wire::Response> BlockingClient::call(const wire::RequestBody& body, uint64_t timeout_ms) {
  const Clock::time_point deadline = deadlineAfter(timeout_ms);
  Result<uint64_t> sent = sendWithDeadline(body, deadline);
  if (!sent.isOk()) return sent.status();
  const uint64_t request_id = sent.value();
  for (;;) {
    Result<wire::Response> response = nextResponse(deadline);
    if (!response.isOk()) return response;
    const uint64_t id = response.value().request_id;
    if (id == request_id) return response;
    if (in_flight_.contains(id)) {
      received_.push_back(std::move(response).value());  // bounded: ids are in in_flight_
      continue;
    }
    // Id 0: the peer could not read our envelope, so this error answers the request we sent.
    if (id == 0 && std::holds_alternative<wire::ErrorReply>(response.value().body)) {
      return response;
    }
    // Otherwise a late answer to a call() that timed out: nobody waits for it any more.
  }
}

Result<uint64_t> BlockingClient::send(const wire::RequestBody& body, uint64_t timeout_ms) {
  if (in_flight_.size() >= options_.requests_in_flight_max) {
    return Status::resourceExhausted(std::to_string(in_flight_.size()) +
                                     " requests in flight; receive() some first");
  }
  Result<uint64_t> sent = sendWithDeadline(body, deadlineAfter(timeout_ms));
  if (sent.isOk()) in_flight_.insert(sent.value());
  return sent;
}

Result<wire::Response> BlockingClient::receive(uint64_t timeout_ms) {
  if (!received_.empty()) {
    wire::Response response = std::move(received_.front());
    received_.pop_front();
    in_flight_.erase(response.request_id);
    return response;
  }
  if (in_flight_.empty()) return Status::failedPrecondition("no request in flight");
  const Clock::time_point deadline = deadlineAfter(timeout_ms);
  for (;;) {
    Result<wire::Response> response = nextResponse(deadline);
    if (!response.isOk()) return response;
    const uint64_t id = response.value().request_id;
    if (in_flight_.erase(id) == 1) return response;
    if (id == 0 && std::holds_alternative<wire::ErrorReply>(response.value().body)) {
      return response;
    }
  }
}

}  // namespace tally::client
