#include "tests/support/fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

namespace tally::testing {
namespace {

constexpr size_t kHeaderBytes = 4;
// Frames announcing more than this are not parsed: the connection falls back to forwarding raw
// bytes (the proxy stays transparent to hostile peers, it just cannot drop their frames).
constexpr uint64_t kFrameBytesParsedMax = 64u << 20;
// A side is not read while the other side's unsent bytes exceed this (backpressure).
constexpr size_t kPendingBytesMax = 8u << 20;
constexpr auto kControlTimeout = std::chrono::seconds(10);

void closeFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

void setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// Blocking connect to 127.0.0.1:port, then non-blocking; -1 on failure.
int connectLoopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const sockaddr_in address = loopback(port);
  int rc = 0;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setNonBlocking(fd);
  return fd;
}

}  // namespace

// Named, not anonymous: FaultProxy::Connection (external linkage) holds them as fields.
namespace fault_proxy_internal {

// Bytes waiting to be written to one socket.
struct Outgoing {
  std::vector<uint8_t> bytes;
  size_t offset = 0;

  size_t size() const { return bytes.size() - offset; }
  void append(const uint8_t* data, size_t n) {
    if (offset > 0 && offset == bytes.size()) {
      bytes.clear();
      offset = 0;
    }
    bytes.insert(bytes.end(), data, data + n);
  }
  // Writes what the socket takes; false on a hard error.
  bool flush(int fd) {
    while (size() > 0) {
      const ssize_t n = ::send(fd, bytes.data() + offset, size(), MSG_NOSIGNAL);
      if (n > 0) {
        offset += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    bytes.clear();
    offset = 0;
    return true;
  }
};

// Cuts one direction's byte stream into frames.
struct FrameCutter {
  std::vector<uint8_t> buffer;
  bool raw = false;  // a frame too large to parse was announced: pass bytes through

  // Appends `data`; calls on_frame(header+payload span, payload span) for every whole frame,
  // or on_raw(bytes) once the stream is raw.
  template <typename OnFrame, typename OnRaw>
  void feed(const uint8_t* data, size_t n, OnFrame&& on_frame, OnRaw&& on_raw) {
    if (raw) {
      on_raw(data, n);
      return;
    }
    buffer.insert(buffer.end(), data, data + n);
    size_t at = 0;
    while (buffer.size() - at >= kHeaderBytes) {
      const uint8_t* h = buffer.data() + at;
      const uint64_t length =
          uint64_t{h[0]} | (uint64_t{h[1]} << 8) | (uint64_t{h[2]} << 16) | (uint64_t{h[3]} << 24);
      if (length > kFrameBytesParsedMax) {
        raw = true;
        on_raw(buffer.data() + at, buffer.size() - at);
        buffer.clear();
        return;
      }
      if (buffer.size() - at < kHeaderBytes + length) break;
      on_frame(std::span<const uint8_t>(h, kHeaderBytes + length),
               std::span<const uint8_t>(h + kHeaderBytes, length));
      at += kHeaderBytes + length;
    }
    buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(at));
  }
};

}  // namespace fault_proxy_internal

using fault_proxy_internal::FrameCutter;
using fault_proxy_internal::Outgoing;

struct FaultProxy::Connection {
  int client_fd = -1;
  int upstream_fd = -1;
  Outgoing to_client;
  Outgoing to_upstream;
  FrameCutter from_client;
  FrameCutter from_upstream;
  bool dead = false;
};

struct FaultProxy::State {
  mutable std::mutex mutex;
  std::condition_variable changed;
  uint16_t upstream_port = 0;
  bool blackholed = false;
  bool stopping = false;
  // The drop rule: forward `forward_first` matching replies, then drop `drop_count`.
  uint64_t forward_first = 0;
  uint64_t drop_count = 0;
  ReplyMatcher matcher;
  uint64_t sever_requested = 0;
  uint64_t sever_done = 0;
  FaultProxyCounters counters;
};

FaultProxy::FaultProxy(uint16_t upstream_port, uint16_t listen_port)
    : state_(std::make_unique<State>()) {
  state_->upstream_port = upstream_port;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error("fault proxy: socket failed");
  const int one = 1;
  (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const sockaddr_in address = loopback(listen_port);
  if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listen_fd_, 128) != 0) {
    const std::string error = std::strerror(errno);
    closeFd(&listen_fd_);
    throw std::runtime_error(
        "fault proxy: cannot listen on 127.0.0.1:" + std::to_string(listen_port) + ": " + error);
  }
  sockaddr_in bound{};
  socklen_t length = sizeof(bound);
  (void)::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.sin_port);
  int pipe_fds[2] = {-1, -1};
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    closeFd(&listen_fd_);
    throw std::runtime_error("fault proxy: pipe2 failed");
  }
  wake_read_fd_ = pipe_fds[0];
  wake_write_fd_ = pipe_fds[1];
  thread_ = std::thread([this] { run(); });
}

FaultProxy::~FaultProxy() { stop(); }

void FaultProxy::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  if (thread_.joinable()) {
    wake();
    thread_.join();
  }
  closeFd(&listen_fd_);
  closeFd(&wake_read_fd_);
  closeFd(&wake_write_fd_);
}

void FaultProxy::wake() {
  const uint8_t byte = 1;
  // A full pipe already guarantees a wake-up.
  (void)!::write(wake_write_fd_, &byte, 1);
}

void FaultProxy::setUpstreamPort(uint16_t port) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->upstream_port = port;
}

void FaultProxy::dropNextReplies(uint64_t k, ReplyMatcher matcher) {
  dropRepliesAfter(0, k, std::move(matcher));
}

void FaultProxy::dropRepliesAfter(uint64_t n, uint64_t k, ReplyMatcher matcher) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->forward_first = n;
  state_->drop_count = k;
  state_->matcher = std::move(matcher);
}

void FaultProxy::clearFaults() { dropRepliesAfter(0, 0, nullptr); }

void FaultProxy::blackhole(bool on) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->blackholed = on;
  }
  wake();  // connections waiting for an upstream get one now
}

void FaultProxy::severAll() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const uint64_t ticket = ++state_->sever_requested;
  lock.unlock();
  wake();
  lock.lock();
  state_->changed.wait_for(lock, kControlTimeout,
                           [&] { return state_->sever_done >= ticket || state_->stopping; });
}

FaultProxyCounters FaultProxy::counters() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->counters;
}

uint64_t FaultProxy::dropsPending() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->drop_count;
}

void FaultProxy::run() {
  std::vector<std::unique_ptr<Connection>> connections;
  State& s = *state_;

  auto closeConnection = [&](Connection& c) {
    if (c.dead) return;
    // Best effort: what one side already said still reaches the other before the close.
    if (c.upstream_fd >= 0) (void)c.to_upstream.flush(c.upstream_fd);
    if (c.client_fd >= 0) (void)c.to_client.flush(c.client_fd);
    closeFd(&c.client_fd);
    closeFd(&c.upstream_fd);
    c.dead = true;
    std::lock_guard<std::mutex> lock(s.mutex);
    --s.counters.connections_open;
  };

  // Connects `c` upstream unless blackholed; closes it if the upstream refuses.
  auto connectUpstream = [&](Connection& c) {
    uint16_t port = 0;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.blackholed) return;
      port = s.upstream_port;
    }
    c.upstream_fd = connectLoopback(port);
    if (c.upstream_fd < 0) {
      {
        std::lock_guard<std::mutex> lock(s.mutex);
        ++s.counters.upstream_connect_failures;
      }
      closeConnection(c);
    }
  };

  // Reads what `fd` has; false when the connection must close.
  auto readSide = [&](Connection& c, bool from_client) -> bool {
    uint8_t buffer[64 * 1024];
    for (;;) {
      const int fd = from_client ? c.client_fd : c.upstream_fd;
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      const size_t got = static_cast<size_t>(n);
      if (from_client) {
        c.from_client.feed(
            buffer, got,
            [&](std::span<const uint8_t> whole, std::span<const uint8_t>) {
              bool pass = false;
              {
                std::lock_guard<std::mutex> lock(s.mutex);
                pass = !s.blackholed && c.upstream_fd >= 0;
                ++(pass ? s.counters.requests_forwarded : s.counters.requests_dropped);
              }
              if (pass) c.to_upstream.append(whole.data(), whole.size());
            },
            [&](const uint8_t* data, size_t size) {
              if (c.upstream_fd >= 0) c.to_upstream.append(data, size);
            });
        if (c.upstream_fd >= 0 && !c.to_upstream.flush(c.upstream_fd)) return false;
      } else {
        c.from_upstream.feed(
            buffer, got,
            [&](std::span<const uint8_t> whole, std::span<const uint8_t> payload) {
              bool pass = true;
              {
                std::lock_guard<std::mutex> lock(s.mutex);
                if (s.blackholed) {
                  pass = false;
                } else if (s.drop_count > 0 && (!s.matcher || s.matcher(payload))) {
                  if (s.forward_first > 0) {
                    --s.forward_first;
                  } else {
                    pass = false;
                    if (s.drop_count != UINT64_MAX) --s.drop_count;
                  }
                }
                ++(pass ? s.counters.replies_forwarded : s.counters.replies_dropped);
              }
              if (pass) c.to_client.append(whole.data(), whole.size());
            },
            [&](const uint8_t* data, size_t size) { c.to_client.append(data, size); });
        if (!c.to_client.flush(c.client_fd)) return false;
      }
      // Backpressure: leave the rest in the kernel until the other side drains.
      if ((from_client ? c.to_upstream.size() : c.to_client.size()) > kPendingBytesMax) {
        return true;
      }
    }
  };

  std::vector<pollfd> fds;
  std::vector<std::pair<Connection*, bool>> owners;  // (connection, is client side) per fd
  for (;;) {
    // Control: stop, sever, and upstreams for connections accepted while blackholed.
    {
      uint8_t drain[256];
      while (::read(wake_read_fd_, drain, sizeof(drain)) > 0) {
      }
    }
    bool stopping = false;
    bool sever = false;
    bool blackholed = false;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      stopping = s.stopping;
      sever = s.sever_done < s.sever_requested;
      blackholed = s.blackholed;
    }
    if (stopping || sever) {
      for (auto& c : connections) closeConnection(*c);
      connections.clear();
      std::lock_guard<std::mutex> lock(s.mutex);
      s.sever_done = s.sever_requested;
      s.changed.notify_all();
      if (stopping) return;
    }
    if (!blackholed) {
      for (auto& c : connections) {
        if (!c->dead && c->upstream_fd < 0) connectUpstream(*c);
      }
    }
    std::erase_if(connections, [](const std::unique_ptr<Connection>& c) { return c->dead; });

    fds.clear();
    owners.clear();
    fds.push_back({.fd = wake_read_fd_, .events = POLLIN, .revents = 0});
    owners.emplace_back(nullptr, false);
    fds.push_back({.fd = listen_fd_, .events = POLLIN, .revents = 0});
    owners.emplace_back(nullptr, false);
    for (auto& c : connections) {
      short client_events = 0;
      if (c->to_upstream.size() <= kPendingBytesMax) client_events |= POLLIN;
      if (c->to_client.size() > 0) client_events |= POLLOUT;
      fds.push_back({.fd = c->client_fd, .events = client_events, .revents = 0});
      owners.emplace_back(c.get(), true);
      if (c->upstream_fd >= 0) {
        short upstream_events = 0;
        if (c->to_client.size() <= kPendingBytesMax) upstream_events |= POLLIN;
        if (c->to_upstream.size() > 0) upstream_events |= POLLOUT;
        fds.push_back({.fd = c->upstream_fd, .events = upstream_events, .revents = 0});
        owners.emplace_back(c.get(), false);
      }
    }
    const int rc = ::poll(fds.data(), fds.size(), -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        auto c = std::make_unique<Connection>();
        c->client_fd = fd;
        {
          std::lock_guard<std::mutex> lock(s.mutex);
          ++s.counters.connections_accepted;
          ++s.counters.connections_open;
        }
        connectUpstream(*c);
        connections.push_back(std::move(c));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      Connection* c = owners[i].first;
      const bool client_side = owners[i].second;
      if (c->dead || fds[i].revents == 0) continue;
      const int fd = client_side ? c->client_fd : c->upstream_fd;
      if (fd != fds[i].fd) continue;  // replaced meanwhile
      bool keep = true;
      if ((fds[i].revents & POLLOUT) != 0) {
        keep = client_side ? c->to_client.flush(fd) : c->to_upstream.flush(fd);
      }
      if (keep && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        keep = readSide(*c, client_side);
      }
      if (!keep) closeConnection(*c);
    }
  }
}

}  // namespace tally::testing
