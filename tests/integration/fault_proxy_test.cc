// FaultProxy (tests/support/fault_proxy.h) against a tiny framed echo server on 127.0.0.1: it
// forwards both ways, drops whole reply frames when told, blackholes, severs, follows a new
// upstream port, and shuts down cleanly.

#include "tests/support/fault_proxy.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/raw_socket.h"

namespace tally::testing {
namespace {

constexpr uint64_t kTimeoutMs = 5'000;
constexpr uint64_t kSilenceMs = 200;  // how long "nothing arrives" is watched for

// Echoes every byte it receives, on every connection, from one poll() thread. stop() (or the
// destructor) closes everything and joins.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t length = sizeof(address);
    (void)::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    EXPECT_EQ(::pipe2(wake_, O_CLOEXEC), 0);
    thread_ = std::thread([this] { run(); });
  }
  ~EchoServer() { stop(); }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  uint16_t port() const { return port_; }
  void stop() {
    if (!thread_.joinable()) return;
    const uint8_t byte = 1;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

 private:
  void run() {
    std::vector<int> clients;
    for (;;) {
      std::vector<pollfd> fds = {{.fd = wake_[0], .events = POLLIN, .revents = 0},
                                 {.fd = listen_fd_, .events = POLLIN, .revents = 0}};
      for (int fd : clients) fds.push_back({.fd = fd, .events = POLLIN, .revents = 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents != 0) break;
      if (fds[1].revents != 0) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) clients.push_back(fd);
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        uint8_t buffer[4096];
        const ssize_t n = ::recv(fds[i].fd, buffer, sizeof(buffer), 0);
        if (n <= 0) {
          ::close(fds[i].fd);
          std::erase(clients, fds[i].fd);
          continue;
        }
        (void)::send(fds[i].fd, buffer, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    }
    for (int fd : clients) ::close(fd);
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread thread_;
};

std::vector<uint8_t> frameOf(const std::string& text) {
  const auto n = static_cast<uint32_t>(text.size());
  std::vector<uint8_t> frame(4 + text.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(text.begin(), text.end(), frame.begin() + 4);
  return frame;
}

std::unique_ptr<RawSocket> connectTo(uint16_t port) {
  std::string error;
  std::unique_ptr<RawSocket> socket = RawSocket::connect("127.0.0.1", port, kTimeoutMs, &error);
  EXPECT_NE(socket, nullptr) << error;
  return socket;
}

// Sends one frame and returns what came back: the payload, or "<timeout>", "<closed>"….
std::string roundTrip(RawSocket& socket, const std::string& text,
                      uint64_t timeout_ms = kTimeoutMs) {
  if (!socket.sendAll(frameOf(text), kTimeoutMs)) return "<send failed>";
  std::vector<uint8_t> payload;
  const RawSocket::Read read = socket.readFrame(&payload, timeout_ms);
  if (read != RawSocket::Read::kFrame) return std::string("<") + RawSocket::readName(read) + ">";
  return std::string(payload.begin(), payload.end());
}

TEST(FaultProxyTest, ForwardsFramesBothWaysAndCountsThem) {
  EchoServer echo;
  FaultProxy proxy(echo.port());
  std::unique_ptr<RawSocket> client = connectTo(proxy.port());
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 20; ++i) {
    const std::string text = "frame-" + std::to_string(i) + std::string(i * 100, 'x');
    EXPECT_EQ(roundTrip(*client, text), text);
  }
  // A frame cut in three writes is still one frame.
  const std::vector<uint8_t> frame = frameOf("split-frame");
  ASSERT_TRUE(client->sendAll(std::span(frame).first(2), kTimeoutMs));
  ASSERT_TRUE(client->sendAll(std::span(frame).subspan(2, 5), kTimeoutMs));
  ASSERT_TRUE(client->sendAll(std::span(frame).subspan(7), kTimeoutMs));
  std::vector<uint8_t> payload;
  ASSERT_EQ(client->readFrame(&payload, kTimeoutMs), RawSocket::Read::kFrame);
  EXPECT_EQ(std::string(payload.begin(), payload.end()), "split-frame");
  const FaultProxyCounters counters = proxy.counters();
  EXPECT_EQ(counters.connections_accepted, 1u);
  EXPECT_EQ(counters.connections_open, 1u);
  EXPECT_EQ(counters.requests_forwarded, 21u);
  EXPECT_EQ(counters.replies_forwarded, 21u);
  EXPECT_EQ(counters.replies_dropped, 0u);
}

TEST(FaultProxyTest, DropNextRepliesSwallowsWholeFramesAfterTheUpstreamSawThem) {
  EchoServer echo;
  FaultProxy proxy(echo.port());
  std::unique_ptr<RawSocket> client = connectTo(proxy.port());
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(roundTrip(*client, "before"), "before");
  proxy.dropNextReplies(2);
  EXPECT_EQ(proxy.dropsPending(), 2u);
  EXPECT_EQ(roundTrip(*client, "lost-1", kSilenceMs), "<timeout>");
  EXPECT_EQ(roundTrip(*client, "lost-2", kSilenceMs), "<timeout>");
  // Framing is intact: the next reply is exactly the next frame.
  EXPECT_EQ(roundTrip(*client, "after"), "after");
  EXPECT_EQ(proxy.dropsPending(), 0u);
  const FaultProxyCounters counters = proxy.counters();
  EXPECT_EQ(counters.requests_forwarded, 4u) << "the upstream saw every request";
  EXPECT_EQ(counters.replies_dropped, 2u);
  EXPECT_EQ(counters.replies_forwarded, 2u);
}

TEST(FaultProxyTest, DropRepliesAfterForwardsNThenDropsK) {
  EchoServer echo;
  FaultProxy proxy(echo.port());
  std::unique_ptr<RawSocket> client = connectTo(proxy.port());
  ASSERT_NE(client, nullptr);
  proxy.dropRepliesAfter(2, 1);
  EXPECT_EQ(roundTrip(*client, "a"), "a");
  EXPECT_EQ(roundTrip(*client, "b"), "b");
  EXPECT_EQ(roundTrip(*client, "c", kSilenceMs), "<timeout>");
  EXPECT_EQ(roundTrip(*client, "d"), "d");
  // With a matcher only matching frames count; without k, drops last until clearFaults().
  proxy.dropRepliesAfter(0, UINT64_MAX, [](std::span<const uint8_t> payload) {
    return std::string(payload.begin(), payload.end()).starts_with("drop");
  });
  EXPECT_EQ(roundTrip(*client, "keep-1"), "keep-1");
  EXPECT_EQ(roundTrip(*client, "drop-1", kSilenceMs), "<timeout>");
  EXPECT_EQ(roundTrip(*client, "drop-2", kSilenceMs), "<timeout>");
  EXPECT_EQ(roundTrip(*client, "keep-2"), "keep-2");
  proxy.clearFaults();
  EXPECT_EQ(roundTrip(*client, "drop-3"), "drop-3");
  EXPECT_EQ(proxy.counters().replies_dropped, 3u);
}

TEST(FaultProxyTest, BlackholeAcceptsButForwardsNothingUntilLifted) {
  EchoServer echo;
  FaultProxy proxy(echo.port());
  std::unique_ptr<RawSocket> before = connectTo(proxy.port());
  ASSERT_NE(before, nullptr);
  EXPECT_EQ(roundTrip(*before, "hello"), "hello");
  proxy.blackhole(true);
  EXPECT_EQ(roundTrip(*before, "into-the-void", kSilenceMs), "<timeout>");
  std::unique_ptr<RawSocket> during = connectTo(proxy.port());
  ASSERT_NE(during, nullptr) << "a blackholed proxy still accepts";
  EXPECT_EQ(roundTrip(*during, "void-2", kSilenceMs), "<timeout>");
  proxy.blackhole(false);
  EXPECT_EQ(roundTrip(*before, "back"), "back");
  EXPECT_EQ(roundTrip(*during, "connected-late"), "connected-late");
  const FaultProxyCounters counters = proxy.counters();
  EXPECT_EQ(counters.requests_dropped, 2u);
  EXPECT_EQ(counters.connections_accepted, 2u);
}

TEST(FaultProxyTest, SeverAllClosesEveryConnectionAndNewOnesWork) {
  EchoServer echo;
  FaultProxy proxy(echo.port());
  std::unique_ptr<RawSocket> a = connectTo(proxy.port());
  std::unique_ptr<RawSocket> b = connectTo(proxy.port());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(roundTrip(*a, "a"), "a");
  EXPECT_EQ(roundTrip(*b, "b"), "b");
  proxy.severAll();
  EXPECT_EQ(proxy.counters().connections_open, 0u);
  std::vector<uint8_t> payload;
  const RawSocket::Read read_a = a->readFrame(&payload, kTimeoutMs);
  EXPECT_TRUE(read_a == RawSocket::Read::kClosed || read_a == RawSocket::Read::kReset)
      << RawSocket::readName(read_a);
  const RawSocket::Read read_b = b->readFrame(&payload, kTimeoutMs);
  EXPECT_TRUE(read_b == RawSocket::Read::kClosed || read_b == RawSocket::Read::kReset)
      << RawSocket::readName(read_b);
  std::unique_ptr<RawSocket> c = connectTo(proxy.port());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(roundTrip(*c, "c"), "c");
}

TEST(FaultProxyTest, FollowsANewUpstreamPortAndClosesWhenTheUpstreamIsGone) {
  auto first = std::make_unique<EchoServer>();
  FaultProxy proxy(first->port());
  std::unique_ptr<RawSocket> client = connectTo(proxy.port());
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(roundTrip(*client, "one"), "one");
  first->stop();  // the upstream hangs up: the proxy closes the client side too
  std::vector<uint8_t> payload;
  const RawSocket::Read read = client->readFrame(&payload, kTimeoutMs);
  EXPECT_TRUE(read == RawSocket::Read::kClosed || read == RawSocket::Read::kReset)
      << RawSocket::readName(read);
  first.reset();
  // Nothing listens upstream: connections are accepted, then closed.
  std::unique_ptr<RawSocket> refused = connectTo(proxy.port());
  ASSERT_NE(refused, nullptr);
  const RawSocket::Read refused_read = refused->readFrame(&payload, kTimeoutMs);
  EXPECT_TRUE(refused_read == RawSocket::Read::kClosed || refused_read == RawSocket::Read::kReset)
      << RawSocket::readName(refused_read);
  EXPECT_GE(proxy.counters().upstream_connect_failures, 1u);
  EchoServer second;
  proxy.setUpstreamPort(second.port());
  std::unique_ptr<RawSocket> again = connectTo(proxy.port());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(roundTrip(*again, "two"), "two");
  proxy.stop();
  proxy.stop();  // idempotent
  const RawSocket::Read after_stop = again->readFrame(&payload, kTimeoutMs);
  EXPECT_TRUE(after_stop == RawSocket::Read::kClosed || after_stop == RawSocket::Read::kReset)
      << RawSocket::readName(after_stop);
}

}  // namespace
}  // namespace tally::testing
