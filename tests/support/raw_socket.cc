#include "tests/support/raw_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "tests/support/process.h"

namespace tally::testing {
namespace {

// Waits for `events` until `deadline_ms`; false on timeout.
bool waitFor(int fd, short events, uint64_t deadline_ms) {
  for (;;) {
    const uint64_t now = monotonicNowMs();
    if (now >= deadline_ms) return false;
    pollfd pfd{.fd = fd, .events = events, .revents = 0};
    const int rc =
        ::poll(&pfd, 1, static_cast<int>(std::min<uint64_t>(deadline_ms - now, INT_MAX)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

}  // namespace

std::unique_ptr<RawSocket> RawSocket::connect(const std::string& host, uint16_t port,
                                              uint64_t timeout_ms, std::string* error,
                                              RawSocketOptions options) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    *error = "not an IPv4 literal: " + host;
    return nullptr;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<RawSocket> socket(new RawSocket(fd));
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (options.receive_buffer_bytes > 0 &&
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &options.receive_buffer_bytes,
                   sizeof(options.receive_buffer_bytes)) != 0) {
    *error = std::string("setsockopt(SO_RCVBUF): ") + std::strerror(errno);
    return nullptr;
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    if (errno != EINPROGRESS) {
      *error = std::string("connect: ") + std::strerror(errno);
      return nullptr;
    }
    if (!waitFor(fd, POLLOUT, monotonicNowMs() + timeout_ms)) {
      *error = "connect timed out";
      return nullptr;
    }
    int so_error = 0;
    socklen_t length = sizeof(so_error);
    (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error != 0) {
      *error = std::string("connect: ") + std::strerror(so_error);
      return nullptr;
    }
  }
  return socket;
}

std::unique_ptr<RawSocket> RawSocket::connectUnix(const std::string& path, uint64_t timeout_ms,
                                                  std::string* error) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    *error = "bad Unix socket path: " + path;
    return nullptr;
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<RawSocket> socket(new RawSocket(fd));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      *error = std::string("connect ") + path + ": " + std::strerror(errno);
      return nullptr;
    }
    if (!waitFor(fd, POLLOUT, monotonicNowMs() + timeout_ms)) {
      *error = "connect timed out";
      return nullptr;
    }
  }
  return socket;
}

RawSocket::~RawSocket() { ::close(fd_); }

bool RawSocket::sendAll(std::span<const uint8_t> bytes, uint64_t timeout_ms) {
  return send(&bytes, timeout_ms) == Send::kAll;
}

RawSocket::Send RawSocket::send(std::span<const uint8_t>* bytes, uint64_t timeout_ms) {
  const uint64_t deadline = monotonicNowMs() + timeout_ms;
  while (!bytes->empty()) {
    const ssize_t n = ::send(fd_, bytes->data(), bytes->size(), MSG_NOSIGNAL);
    if (n > 0) {
      *bytes = bytes->subspan(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitFor(fd_, POLLOUT, deadline)) return Send::kTimeout;
      continue;
    }
    return Send::kError;
  }
  return Send::kAll;
}

bool RawSocket::waitWritable(uint64_t timeout_ms) {
  return waitFor(fd_, POLLOUT, monotonicNowMs() + timeout_ms);
}

void RawSocket::shutdownWrite() { (void)::shutdown(fd_, SHUT_WR); }

const char* RawSocket::readName(Read read) {
  switch (read) {
    case Read::kFrame: return "frame";
    case Read::kClosed: return "closed";
    case Read::kReset: return "reset";
    case Read::kTimeout: return "timeout";
    case Read::kTorn: return "torn";
  }
  return "?";
}

int64_t RawSocket::fill(uint64_t deadline_ms) {
  for (;;) {
    if (!waitFor(fd_, POLLIN, deadline_ms)) return -2;
    uint8_t chunk[64 * 1024];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer_.insert(buffer_.end(), chunk, chunk + n);
      return n;
    }
    if (n == 0) return 0;
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    return -1;
  }
}

RawSocket::Read RawSocket::readFrame(std::vector<uint8_t>* payload, uint64_t timeout_ms,
                                     uint64_t frame_bytes_max) {
  const uint64_t deadline = monotonicNowMs() + timeout_ms;
  for (;;) {
    if (buffer_.size() >= 4) {
      const uint64_t length = uint64_t{buffer_[0]} | uint64_t{buffer_[1]} << 8 |
                              uint64_t{buffer_[2]} << 16 | uint64_t{buffer_[3]} << 24;
      if (length > frame_bytes_max) return Read::kTorn;
      if (buffer_.size() >= 4 + length) {
        payload->assign(buffer_.begin() + 4, buffer_.begin() + 4 + static_cast<ptrdiff_t>(length));
        buffer_.erase(buffer_.begin(), buffer_.begin() + 4 + static_cast<ptrdiff_t>(length));
        return Read::kFrame;
      }
    }
    const int64_t n = fill(deadline);
    if (n == -2) return Read::kTimeout;
    if (n == -1) return Read::kReset;
    if (n == 0) return buffer_.empty() ? Read::kClosed : Read::kTorn;
  }
}

}  // namespace tally::testing
