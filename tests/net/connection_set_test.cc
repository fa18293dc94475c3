#include "net/connection_set.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/fd_limit.h"
#include "tests/net/frame_bytes.h"
#include "wire/codec.h"

// The shared accept path and its global bounds, on a real libuv loop with a real TCP listener on
// loopback: clients are raw non-blocking sockets; the loop is turned (UV_RUN_NOWAIT) until what
// a test waits for happened, a bounded number of times, never against a clock.

namespace tally::net {
namespace {

TEST(ConnectionsMaxFor, LeavesTheReservedDescriptorsFreeUnderTheSoftLimit) {
  EXPECT_EQ(connectionsMaxFor(4096, 1u << 20), 4096u);
  EXPECT_EQ(connectionsMaxFor(4096, 1024), 1024u - kDescriptorsReserved);
  EXPECT_EQ(connectionsMaxFor(4096, 4096 + kDescriptorsReserved), 4096u);
  EXPECT_EQ(connectionsMaxFor(4096, kDescriptorsReserved), 1u);
  EXPECT_EQ(connectionsMaxFor(10, 1024), 10u);
}

// The default bound is sane against this process's limit once raised as the daemons raise it
// (common/fd_limit.h): the function the daemons call leaves kDescriptorsReserved free under the
// soft limit, and keeps the default where the limit allows it.
TEST(ConnectionsMaxFor, TheDefaultFitsThisProcesssDescriptorLimit) {
  const FdLimit raised = raiseFdLimit();
  ASSERT_TRUE(raised.error.empty()) << raised.error;
  Logger logger("test", LogLevel::kError);
  const uint64_t allowed = connectionsMaxForThisProcess(limits::kConnectionsPerServerMax, &logger);
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur == RLIM_INFINITY) {
    EXPECT_EQ(allowed, limits::kConnectionsPerServerMax);
  } else if (limit.rlim_cur > kDescriptorsReserved) {
    EXPECT_EQ(allowed, std::min<uint64_t>(limits::kConnectionsPerServerMax,
                                          limit.rlim_cur - kDescriptorsReserved));
    EXPECT_LE(allowed + kDescriptorsReserved, limit.rlim_cur);
  } else {
    EXPECT_EQ(allowed, 1u);
  }
}

class Owner final : public StreamHandler {
 public:
  void onFrame(FramedStream*, wire::Frame&&) override { ++frames; }
  void onBadFrame(FramedStream*, const Status&) override {}
  void onLost(FramedStream*, const Status&) override {}
  void onClosed(FramedStream* stream) override {
    ++closed;
    set->erase(stream->id());
  }
  ConnectionSet* set = nullptr;
  int frames = 0;
  int closed = 0;
};

class ConnectionSetTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }

  void listen(ConnectionBounds bounds) {
    set_ = std::make_unique<ConnectionSet>(&loop_, &logger_, StreamLimits{}, bounds);
    owner_.set = set_.get();
    ASSERT_EQ(uv_tcp_init(&loop_, &listener_), 0);
    listener_.data = this;
    sockaddr_in address{};
    ASSERT_EQ(uv_ip4_addr("127.0.0.1", 0, &address), 0);
    ASSERT_EQ(uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&address), 0), 0);
    ASSERT_EQ(uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 128,
                        [](uv_stream_t* listener, int status) {
                          auto* self = static_cast<ConnectionSetTest*>(listener->data);
                          ASSERT_EQ(status, 0);
                          self->onConnection();
                        }),
              0);
    int length = sizeof(address_);
    ASSERT_EQ(uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&address_), &length), 0);
  }

  void onConnection() {
    ++accepts_;
    StreamHandler* handler = &owner_;
    FramedStream* stream = set_->accept(
        reinterpret_cast<uv_stream_t*>(&listener_),
        [this, handler](uint64_t id, const StreamLimits& limits) {
          return std::make_unique<FramedStream>(&loop_, StreamKind::kTcp, handler, limits, id);
        },
        false);
    if (stream != nullptr) {
      stream->startReading();
      admitted_.push_back(stream);
    }
  }

  void TearDown() override {
    for (FramedStream* stream : set_->all()) stream->close();
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    for (int fd : clients_) ::close(fd);
    ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
    EXPECT_TRUE(set_->empty());
    set_.reset();
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  // A client connected (the kernel completes it from the backlog), then accepted by the loop.
  int connectClient() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&address_), sizeof(address_)), 0);
    EXPECT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
    clients_.push_back(fd);
    const int before = accepts_;
    for (int i = 0; i < 100'000 && accepts_ == before; ++i) (void)uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(accepts_, before + 1);
    return fd;
  }

  // Everything `fd` receives until its end of stream (turning the loop meanwhile); false if the
  // stream did not end within the bound.
  bool readToEnd(int fd, std::string* out) {
    char buffer[4096];
    for (int i = 0; i < 200'000; ++i) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n == 0) return true;
      if (n > 0) {
        out->append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) return true;  // reset: ended too
      (void)uv_run(&loop_, UV_RUN_NOWAIT);
    }
    return false;
  }

  // The ErrorReply a refused client got, decoded from its bytes.
  void expectRefusal(const std::string& bytes, const std::string& names) {
    ASSERT_GT(bytes.size(), 4u) << "no refusal frame";
    const std::vector<uint8_t> payload(bytes.begin() + 4, bytes.end());
    Result<wire::Response> response = wire::decodeResponse(payload);
    ASSERT_TRUE(response.isOk()) << response.status().toString();
    EXPECT_EQ(response.value().request_id, 0u);
    const auto* error = std::get_if<wire::ErrorReply>(&response.value().body);
    ASSERT_NE(error, nullptr);
    EXPECT_EQ(error->code, wire::ErrorCode::kUnavailable);
    EXPECT_NE(error->message.find(names), std::string::npos) << error->message;
  }

  uv_loop_t loop_{};
  uv_tcp_t listener_{};
  sockaddr_in address_{};
  Logger logger_{"test", LogLevel::kError};
  Owner owner_;
  std::unique_ptr<ConnectionSet> set_;
  std::vector<FramedStream*> admitted_;
  std::vector<int> clients_;
  int accepts_ = 0;
};

TEST_F(ConnectionSetTest,
       PastConnectionsMaxANewConnectionIsRefusedWithATypedErrorAndTheOthersServed) {
  ASSERT_NO_FATAL_FAILURE(listen({.connections_max = 2}));
  const int first = connectClient();
  connectClient();
  EXPECT_EQ(set_->served(), 2u);
  const int third = connectClient();
  EXPECT_EQ(admitted_.size(), 2u);
  EXPECT_EQ(set_->served(), 2u);
  EXPECT_EQ(set_->refusedTotal(), 1u);
  std::string refusal;
  ASSERT_TRUE(readToEnd(third, &refusal));
  ASSERT_NO_FATAL_FAILURE(expectRefusal(refusal, "connections_max"));

  // The admitted ones are still served: a request of the first is delivered.
  const std::vector<uint8_t> request = test_support::frameOf("hello");
  ASSERT_EQ(::write(first, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  for (int i = 0; i < 100'000 && owner_.frames == 0; ++i) (void)uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(owner_.frames, 1);

  // One leaves: there is room for the next.
  admitted_[1]->close();
  for (int i = 0; i < 100'000 && set_->served() == 2; ++i) (void)uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(set_->served(), 1u);
  connectClient();
  EXPECT_EQ(admitted_.size(), 3u);
  EXPECT_EQ(set_->served(), 2u);
}

TEST_F(ConnectionSetTest, WhileTheConnectionsHoldBufferedBytesMaxNewOnesAreRefused) {
  ASSERT_NO_FATAL_FAILURE(listen({.buffered_bytes_max = 3000}));
  const int holder = connectClient();
  // An incomplete frame of 3,000 of its 10,000 bytes: held by the decoder.
  const std::vector<uint8_t> frame = test_support::frameOf(std::string(10'000, 'x'));
  ASSERT_EQ(::write(holder, frame.data(), 3004), 3004);
  for (int i = 0; i < 100'000 && set_->bufferedBytes() < 3004; ++i) {
    (void)uv_run(&loop_, UV_RUN_NOWAIT);
  }
  ASSERT_EQ(set_->bufferedBytes(), 3004u);
  const int refused = connectClient();
  EXPECT_EQ(admitted_.size(), 1u);
  std::string refusal;
  ASSERT_TRUE(readToEnd(refused, &refusal));
  ASSERT_NO_FATAL_FAILURE(expectRefusal(refusal, "buffered_bytes_max"));
  // The rest of its frame arrives: delivered, the bytes are freed, new connections admitted.
  ASSERT_EQ(::write(holder, frame.data() + 3004, frame.size() - 3004),
            static_cast<ssize_t>(frame.size() - 3004));
  for (int i = 0; i < 100'000 && owner_.frames == 0; ++i) (void)uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(owner_.frames, 1);
  EXPECT_EQ(set_->bufferedBytes(), 0u);
  connectClient();
  EXPECT_EQ(admitted_.size(), 2u);
}

TEST_F(ConnectionSetTest, ATlsServerRefusesByClosingWithoutAPlaintextFrame) {
  ASSERT_NO_FATAL_FAILURE(listen({.connections_max = 1, .refusal_frame = false}));
  connectClient();
  const int refused = connectClient();
  std::string bytes;
  ASSERT_TRUE(readToEnd(refused, &bytes));
  EXPECT_TRUE(bytes.empty()) << bytes.size() << " bytes";
  EXPECT_EQ(set_->refusedTotal(), 1u);
}

}  // namespace
}  // namespace tally::net
