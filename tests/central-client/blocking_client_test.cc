#include "central-client/blocking_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tally::client {
namespace {

// --- A scripted peer: accepts one connection and runs a script on it in a thread -------------

void writeBytes(int fd, const std::vector<uint8_t>& bytes) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + written, bytes.size() - written, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << std::strerror(errno);
    written += static_cast<size_t>(n);
  }
}

void writeResponse(int fd, const wire::Response& response) {
  Result<std::vector<uint8_t>> frame = wire::encodeResponseFrame(response);
  ASSERT_TRUE(frame.isOk());
  writeBytes(fd, frame.value());
}

wire::Response health(uint64_t request_id, const std::string& status) {
  return wire::Response{.request_id = request_id, .body = wire::HealthReply{.status = status}};
}

// Reads exactly `count` requests (fewer if the client closes first).
std::vector<wire::Request> readRequests(int fd, size_t count) {
  wire::FrameDecoder decoder;
  std::vector<wire::Request> requests;
  std::vector<wire::Frame> frames;
  uint8_t buffer[4096];
  while (requests.size() < count) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    EXPECT_TRUE(decoder.feed({buffer, static_cast<size_t>(n)}, &frames).isOk());
    for (const wire::Frame& frame : frames) {
      wire::DecodedRequest decoded = wire::decodeRequest(frame);
      EXPECT_TRUE(decoded.request_id.has_value() && decoded.body.isOk());
      requests.push_back(
          {.request_id = decoded.request_id.value_or(0),
           .body = decoded.body.isOk() ? decoded.body.value() : wire::RequestBody{}});
    }
    frames.clear();
  }
  return requests;
}

// Blocks until the client closes its end.
void waitForClose(int fd) {
  uint8_t buffer[256];
  while (::recv(fd, buffer, sizeof(buffer), 0) > 0) {
  }
}

class ScriptedPeer {
 public:
  using Script = std::function<void(int fd)>;

  // Listens on 127.0.0.1 (an ephemeral port) or, with `unix_socket`, on a path in a temp dir.
  ScriptedPeer(Script script, bool unix_socket = false) {
    if (unix_socket) {
      char dir_template[] = "/tmp/tally-bc-XXXXXX";
      dir_ = ::mkdtemp(dir_template);
      path_ = dir_ + "/peer.sock";
      listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::memcpy(address.sun_path, path_.c_str(), path_.size());
      EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
      endpoint_ = unixEndpoint(path_).value();
    } else {
      listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
      socklen_t length = sizeof(address);
      EXPECT_EQ(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length), 0);
      endpoint_ = Endpoint{.host = "127.0.0.1", .port = ntohs(address.sin_port)};
    }
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    thread_ = std::thread([this, script = std::move(script)] {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      script(fd);
      ::close(fd);
    });
  }

  ~ScriptedPeer() {
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes an accept() that never got a client
    thread_.join();
    ::close(listen_fd_);
    if (!path_.empty()) {
      ::unlink(path_.c_str());
      ::rmdir(dir_.c_str());
    }
  }

  const Endpoint& endpoint() const { return endpoint_; }

 private:
  int listen_fd_ = -1;
  std::string dir_;
  std::string path_;
  Endpoint endpoint_;
  std::thread thread_;
};

std::unique_ptr<BlockingClient> connectTo(const Endpoint& endpoint,
                                          BlockingClientOptions options = {}) {
  Result<std::unique_ptr<BlockingClient>> client = BlockingClient::connect(endpoint, 5000, options);
  EXPECT_TRUE(client.isOk()) << client.status().toString();
  return client.isOk() ? std::move(client).value() : nullptr;
}

std::string statusOf(const wire::Response& response) {
  const auto* reply = std::get_if<wire::HealthReply>(&response.body);
  return reply == nullptr ? "<not health>" : reply->status;
}

// --- Tests ------------------------------------------------------------------------------------

TEST(BlockingClientTest, CallGetsItsResponse) {
  ScriptedPeer peer([](int fd) {
    for (int i = 0; i < 2; ++i) {
      for (const wire::Request& request : readRequests(fd, 1)) {
        writeResponse(fd, health(request.request_id, "r" + std::to_string(request.request_id)));
      }
    }
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  for (uint64_t id = 1; id <= 2; ++id) {
    Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
    ASSERT_TRUE(response.isOk()) << response.status().toString();
    EXPECT_EQ(response.value().request_id, id);
    EXPECT_EQ(statusOf(response.value()), "r" + std::to_string(id));
  }
}

TEST(BlockingClientTest, PipelinedResponsesArriveInAnyOrder) {
  constexpr size_t kCount = 50;
  ScriptedPeer peer([](int fd) {
    std::vector<wire::Request> requests = readRequests(fd, kCount);
    for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
      writeResponse(fd, health(it->request_id, "ok"));
    }
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  std::set<uint64_t> sent;
  for (size_t i = 0; i < kCount; ++i) {
    Result<uint64_t> id = client->send(wire::HealthRequest{}, 5000);
    ASSERT_TRUE(id.isOk());
    EXPECT_TRUE(sent.insert(id.value()).second);
  }
  EXPECT_EQ(client->inFlight(), kCount);
  std::set<uint64_t> received;
  for (size_t i = 0; i < kCount; ++i) {
    Result<wire::Response> response = client->receive(5000);
    ASSERT_TRUE(response.isOk()) << response.status().toString();
    received.insert(response.value().request_id);
  }
  EXPECT_EQ(received, sent);
  EXPECT_EQ(client->inFlight(), 0u);
}

TEST(BlockingClientTest, CallKeepsResponsesToEarlierSends) {
  ScriptedPeer peer([](int fd) {
    std::vector<wire::Request> requests = readRequests(fd, 2);
    ASSERT_EQ(requests.size(), 2u);
    writeResponse(fd, health(requests[0].request_id, "first"));
    writeResponse(fd, health(requests[1].request_id, "second"));
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->send(wire::HealthRequest{}, 5000).isOk());
  Result<wire::Response> called = client->call(wire::HealthRequest{}, 5000);
  ASSERT_TRUE(called.isOk());
  EXPECT_EQ(statusOf(called.value()), "second");
  Result<wire::Response> kept = client->receive(5000);
  ASSERT_TRUE(kept.isOk());
  EXPECT_EQ(statusOf(kept.value()), "first");
}

TEST(BlockingClientTest, TimeoutIsBoundedAndLateAnswerIsDropped) {
  ScriptedPeer peer([](int fd) {
    // Answer the first request only after the second arrives, i.e. after the client gave up.
    std::vector<wire::Request> requests = readRequests(fd, 2);
    ASSERT_EQ(requests.size(), 2u);
    writeResponse(fd, health(requests[0].request_id, "late"));
    writeResponse(fd, health(requests[1].request_id, "on time"));
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  const auto started = std::chrono::steady_clock::now();
  Result<wire::Response> timed_out = client->call(wire::HealthRequest{}, 100);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(timed_out.isOk());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(elapsed, std::chrono::milliseconds(100));
  EXPECT_LT(elapsed, std::chrono::milliseconds(2000));

  Result<wire::Response> next = client->call(wire::HealthRequest{}, 5000);
  ASSERT_TRUE(next.isOk()) << next.status().toString();
  EXPECT_EQ(statusOf(next.value()), "on time");
  EXPECT_EQ(next.value().request_id, 2u);
}

TEST(BlockingClientTest, PeerClosingIsUnavailable) {
  ScriptedPeer peer([](int fd) { (void)readRequests(fd, 1); });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(response.isOk());
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(response.status().message().find("closed"), std::string::npos);
  Result<wire::Response> again = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(again.isOk());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
}

TEST(BlockingClientTest, ZeroLengthFrameIsCorruptionAndBreaksTheConnection) {
  ScriptedPeer peer([](int fd) {
    (void)readRequests(fd, 1);
    writeBytes(fd, {0, 0, 0, 0});
    waitForClose(fd);
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(response.isOk());
  EXPECT_EQ(response.status().code(), StatusCode::kCorruption);
  Result<wire::Response> again = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(again.isOk());
  EXPECT_EQ(again.status().code(), StatusCode::kCorruption);
}

TEST(BlockingClientTest, OversizedFrameIsCorruption) {
  ScriptedPeer peer([](int fd) {
    (void)readRequests(fd, 1);
    writeBytes(fd, {0x00, 0x00, 0x10, 0x00});  // announces 1 MiB
    waitForClose(fd);
  });
  auto client = connectTo(peer.endpoint(), {.frame_bytes_max = 1024});
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(response.isOk());
  EXPECT_EQ(response.status().code(), StatusCode::kCorruption);
}

TEST(BlockingClientTest, GarbageMessageIsCorruption) {
  ScriptedPeer peer([](int fd) {
    (void)readRequests(fd, 1);
    writeBytes(fd, {8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
    waitForClose(fd);
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_FALSE(response.isOk());
  EXPECT_EQ(response.status().code(), StatusCode::kCorruption);
}

TEST(BlockingClientTest, ErrorUnderIdZeroAnswersTheCall) {
  ScriptedPeer peer([](int fd) {
    (void)readRequests(fd, 1);
    writeResponse(
        fd, wire::Response{.request_id = 0,
                           .body = wire::ErrorReply{.code = wire::ErrorCode::kMalformedFrame}});
    waitForClose(fd);
  });
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_TRUE(response.isOk());
  EXPECT_TRUE(std::holds_alternative<wire::ErrorReply>(response.value().body));
}

TEST(BlockingClientTest, UnixSocket) {
  ScriptedPeer peer(
      [](int fd) {
        for (const wire::Request& request : readRequests(fd, 1)) {
          writeResponse(fd, health(request.request_id, "unix"));
        }
      },
      /*unix_socket=*/true);
  auto client = connectTo(peer.endpoint());
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_TRUE(response.isOk()) << response.status().toString();
  EXPECT_EQ(statusOf(response.value()), "unix");
}

TEST(BlockingClientTest, HostNameIsResolved) {
  ScriptedPeer peer([](int fd) {
    for (const wire::Request& request : readRequests(fd, 1)) {
      writeResponse(fd, health(request.request_id, "named"));
    }
  });
  // "localhost" may resolve to ::1 first; the client tries every address.
  Endpoint endpoint = peer.endpoint();
  endpoint.host = "localhost";
  auto client = connectTo(endpoint);
  ASSERT_NE(client, nullptr);
  Result<wire::Response> response = client->call(wire::HealthRequest{}, 5000);
  ASSERT_TRUE(response.isOk()) << response.status().toString();
  EXPECT_EQ(statusOf(response.value()), "named");
}

TEST(BlockingClientTest, ConnectFailuresAreUnavailable) {
  // A port that was just free: nothing listens there.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(fd);
  Result<std::unique_ptr<BlockingClient>> refused =
      BlockingClient::connect(Endpoint{.host = "127.0.0.1", .port = ntohs(address.sin_port)}, 1000);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);

  Result<std::unique_ptr<BlockingClient>> missing =
      BlockingClient::connect(unixEndpoint("/nonexistent/tally.sock").value(), 1000);
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
}

TEST(BlockingClientTest, InFlightIsBounded) {
  ScriptedPeer peer([](int fd) { waitForClose(fd); });
  auto client = connectTo(peer.endpoint(), {.requests_in_flight_max = 2});
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->receive(10).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client->send(wire::HealthRequest{}, 1000).isOk());
  ASSERT_TRUE(client->send(wire::HealthRequest{}, 1000).isOk());
  Result<uint64_t> third = client->send(wire::HealthRequest{}, 1000);
  ASSERT_FALSE(third.isOk());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
}

TEST(EndpointTest, ParsesHostPort) {
  Result<Endpoint> endpoint = parseTcpEndpoint("127.0.0.1:7411");
  ASSERT_TRUE(endpoint.isOk());
  EXPECT_EQ(endpoint.value().host, "127.0.0.1");
  EXPECT_EQ(endpoint.value().port, 7411);
  EXPECT_EQ(endpointName(endpoint.value()), "127.0.0.1:7411");

  endpoint = parseTcpEndpoint("[::1]:80");
  ASSERT_TRUE(endpoint.isOk());
  EXPECT_EQ(endpoint.value().host, "::1");
  EXPECT_EQ(endpointName(endpoint.value()), "[::1]:80");

  EXPECT_TRUE(parseTcpEndpoint("ledger.example.com:65535").isOk());
  for (const char* bad :
       {"", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "::1:80", "host:-1"}) {
    EXPECT_FALSE(parseTcpEndpoint(bad).isOk()) << bad;
  }
  EXPECT_FALSE(unixEndpoint("").isOk());
  EXPECT_FALSE(unixEndpoint(std::string(108, 'p')).isOk());
  EXPECT_EQ(endpointName(unixEndpoint("/run/tally/agent.sock").value()),
            "unix:/run/tally/agent.sock");
}

}  // namespace
}  // namespace tally::client
