// net::FramedStream with TLS (startTls) on a real libuv loop over real socketpairs: two streams
// talking to each other, or one stream and a raw net::TlsSession the test pumps by hand (to
// tamper with records and to be a peer that does not read). The loop runs one iteration at a
// time while the test waits for a condition, bounded by an iteration count, never a clock.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "net/framed_stream.h"
#include "net/tls_session.h"
#include "shard/identity.h"
#include "tests/net/frame_bytes.h"
#include "tests/net/tls_test_keys.h"

namespace tally::net {
namespace {

using test_support::kGateway;
using test_support::kLedger;
using test_support::kStranger;

std::unique_ptr<TlsSession> session(TlsRole role, const identity::KeyPair& key,
                                    std::set<PublicKey> accepted) {
  Result<std::unique_ptr<TlsSession>> created = TlsSession::create(
      TlsOptions{.role = role, .key = key, .accept_peer = [accepted](const PublicKey& peer) {
                   return accepted.contains(peer);
                 }});
  EXPECT_TRUE(created.isOk()) << created.status().toString();
  return created.isOk() ? std::move(created).value() : nullptr;
}

using test_support::frameOf;

class TlsRecorder final : public StreamHandler {
 public:
  void onFrame(FramedStream* stream, wire::Frame&& frame) override {
    frames.emplace_back(frame.begin(), frame.end());
    if (on_frame) on_frame(stream, frames.back());
  }
  void onBadFrame(FramedStream*, const Status& status) override { bad_frames.push_back(status); }
  void onLost(FramedStream*, const Status& status) override { lost.push_back(status); }
  void onClosed(FramedStream*) override { ++closed; }

  std::vector<std::string> frames;
  std::vector<Status> bad_frames;
  std::vector<Status> lost;
  int closed = 0;
  std::function<void(FramedStream*, const std::string&)> on_frame;
};

// A TLS peer driven by hand over a non-blocking descriptor.
struct RawPeer {
  int fd = -1;
  std::unique_ptr<TlsSession> tls;
  std::vector<uint8_t> outbox;  // ciphertext the socket did not take yet
  std::string plaintext;
  bool eof = false;
  bool reading = true;

  void send(std::vector<uint8_t> bytes) {
    outbox.insert(outbox.end(), bytes.begin(), bytes.end());
    while (!outbox.empty()) {
      const ssize_t n = ::write(fd, outbox.data(), outbox.size());
      if (n <= 0) break;
      outbox.erase(outbox.begin(), outbox.begin() + n);
    }
  }
  // Moves ciphertext out and (if reading) in; returns whether anything moved.
  void pump() {
    send(tls->takeCiphertext());
    if (!reading) return;
    char buffer[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n == 0) eof = true;
      if (n <= 0) break;
      (void)tls->feed(std::span(reinterpret_cast<const uint8_t*>(buffer), static_cast<size_t>(n)));
      const std::vector<uint8_t> clear = tls->takePlaintext();
      plaintext.append(clear.begin(), clear.end());
    }
    send(tls->takeCiphertext());
  }
};

class FramedStreamTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);  // as the daemons do: a close_notify to a gone peer is EPIPE
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
  }

  void TearDown() override {
    for (auto* stream : {server_.get(), client_.get()}) {
      if (stream != nullptr && !stream->closing()) stream->close();
    }
    ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
    if (server_ != nullptr) {
      EXPECT_EQ(server_handler_.closed, 1);
    }
    if (client_ != nullptr) {
      EXPECT_EQ(client_handler_.closed, 1);
    }
    server_.reset();
    client_.reset();
    for (int fd : fds_) {
      if (fd >= 0 && !adopted_.contains(fd)) ::close(fd);
    }
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  std::unique_ptr<FramedStream> openStream(int fd, TlsRecorder* handler, StreamLimits limits,
                                           std::unique_ptr<TlsSession> tls) {
    auto stream = std::make_unique<FramedStream>(&loop_, StreamKind::kPipe, handler, limits, fd);
    EXPECT_TRUE(stream->init().isOk());
    EXPECT_EQ(uv_pipe_open(stream->pipe(), fd), 0);
    adopted_.insert(fd);
    if (tls != nullptr) stream->startTls(std::move(tls));
    stream->startReading();
    return stream;
  }

  // The ledger's end on fds_[0], the gateway's on fds_[1].
  void openPair(std::set<PublicKey> ledger_admits, const identity::KeyPair& gateway_key,
                StreamLimits server_limits = {}) {
    server_ = openStream(fds_[0], &server_handler_, server_limits,
                         session(TlsRole::kServer, kLedger, std::move(ledger_admits)));
    client_ = openStream(fds_[1], &client_handler_, StreamLimits{.backpressure = false},
                         session(TlsRole::kClient, gateway_key, {kLedger.public_key}));
  }

  RawPeer rawClient(const identity::KeyPair& key) {
    EXPECT_EQ(::fcntl(fds_[1], F_SETFL, ::fcntl(fds_[1], F_GETFL) | O_NONBLOCK), 0);
    RawPeer peer{.fd = fds_[1], .tls = session(TlsRole::kClient, key, {kLedger.public_key})};
    EXPECT_TRUE(peer.tls->start().isOk());
    return peer;
  }

  // Runs the loop (and `also`) until `done`, for at most a bounded number of iterations.
  bool runUntil(const std::function<bool()>& done, const std::function<void()>& also = {}) {
    for (int i = 0; i < 200'000; ++i) {
      if (done()) return true;
      if (also) also();
      (void)uv_run(&loop_, UV_RUN_NOWAIT);
    }
    return done();
  }

  uv_loop_t loop_{};
  int fds_[2] = {-1, -1};
  std::set<int> adopted_;
  TlsRecorder server_handler_;
  TlsRecorder client_handler_;
  std::unique_ptr<FramedStream> server_;
  std::unique_ptr<FramedStream> client_;
};

TEST_F(FramedStreamTlsTest, FramesTravelBothWaysAndEachSideLearnsTheOthersKey) {
  openPair({kGateway.public_key}, kGateway);
  server_handler_.on_frame = [](FramedStream* stream, const std::string& payload) {
    stream->write(frameOf("re:" + payload));
    stream->flush();
  };
  // Written before the handshake: held by the session (and counted), sent after it.
  client_->write(frameOf("reserve"));
  client_->write(frameOf(std::string(200 * 1024, 'b')));
  client_->flush();
  EXPECT_GT(client_->queuedBytes(), 200u * 1024);
  ASSERT_TRUE(runUntil([&] { return client_handler_.frames.size() == 2; }));
  EXPECT_EQ(client_handler_.frames[0], "re:reserve");
  EXPECT_EQ(client_handler_.frames[1], "re:" + std::string(200 * 1024, 'b'));
  ASSERT_TRUE(server_->tls()->peerKey().has_value());
  EXPECT_EQ(*server_->tls()->peerKey(), kGateway.public_key);
  EXPECT_EQ(*client_->tls()->peerKey(), kLedger.public_key);
  EXPECT_TRUE(server_handler_.lost.empty());
  EXPECT_TRUE(client_handler_.lost.empty());
}

TEST_F(FramedStreamTlsTest, AGatewayKeyTheLedgerDoesNotAdmitIsRefusedWithATypedReason) {
  openPair({kGateway.public_key}, kStranger);
  client_->write(frameOf("publish"));
  client_->flush();
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1 && client_handler_.closed == 1; }));
  EXPECT_TRUE(server_handler_.frames.empty()) << "the stranger's request was served";
  ASSERT_EQ(server_handler_.lost.size(), 1u);
  EXPECT_EQ(server_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(server_handler_.lost[0].message().find("TLS: the peer's key is not accepted"),
            std::string::npos)
      << server_handler_.lost[0].toString();
  // The ledger's alert reached the gateway before the close: it knows it was refused.
  ASSERT_EQ(client_handler_.lost.size(), 1u);
  EXPECT_EQ(client_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(client_handler_.lost[0].message().find("TLS: the peer ended the session (alert"),
            std::string::npos)
      << client_handler_.lost[0].toString();
}

TEST_F(FramedStreamTlsTest, ALedgerKeyTheGatewayDoesNotPinIsRefused) {
  server_ = openStream(fds_[0], &server_handler_, {},
                       session(TlsRole::kServer, kStranger, {kGateway.public_key}));
  client_ = openStream(fds_[1], &client_handler_, StreamLimits{.backpressure = false},
                       session(TlsRole::kClient, kGateway, {kLedger.public_key}));
  client_->write(frameOf("reserve"));
  client_->flush();
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1 && client_handler_.closed == 1; }));
  EXPECT_TRUE(server_handler_.frames.empty());
  ASSERT_EQ(client_handler_.lost.size(), 1u);
  EXPECT_EQ(client_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(client_handler_.lost[0].message().find("TLS: the peer's key is not accepted"),
            std::string::npos)
      << client_handler_.lost[0].toString();
  ASSERT_EQ(server_handler_.lost.size(), 1u);
  EXPECT_EQ(server_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
}

TEST_F(FramedStreamTlsTest, ATamperedRecordClosesTheConnection) {
  server_ = openStream(fds_[0], &server_handler_, {},
                       session(TlsRole::kServer, kLedger, {kGateway.public_key}));
  RawPeer peer = rawClient(kGateway);
  ASSERT_TRUE(runUntil([&] { return peer.tls->handshakeDone(); }, [&] { peer.pump(); }));
  ASSERT_TRUE(peer.tls->write(frameOf("first")).isOk());
  peer.pump();
  ASSERT_TRUE(runUntil([&] { return server_handler_.frames.size() == 1; }, [&] { peer.pump(); }));
  ASSERT_TRUE(peer.tls->write(frameOf("second")).isOk());
  std::vector<uint8_t> record = peer.tls->takeCiphertext();
  ASSERT_GT(record.size(), 10u);
  record[record.size() - 3] ^= 0x01;  // in the authentication tag
  peer.send(record);
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1; }, [&] { peer.pump(); }));
  EXPECT_EQ(server_handler_.frames, (std::vector<std::string>{"first"}));
  ASSERT_EQ(server_handler_.lost.size(), 1u);
  EXPECT_EQ(server_handler_.lost[0].code(), StatusCode::kCorruption);
  EXPECT_TRUE(server_handler_.lost[0].message().starts_with("TLS: "));
  EXPECT_TRUE(peer.eof);  // the peer saw the alert (its session failed) and the end of stream
  EXPECT_TRUE(peer.tls->failed());
}

// A ledger replying to a client that has stopped reading: the stream stops serving and reading
// it at write_queue_bytes_max, as without TLS, and resumes when the client reads again.
TEST_F(FramedStreamTlsTest, BackPressureHoldsForAPeerThatDoesNotRead) {
  constexpr uint64_t kQueueMax = 64 * 1024;
  server_ = openStream(fds_[0], &server_handler_, {.write_queue_bytes_max = kQueueMax},
                       session(TlsRole::kServer, kLedger, {kGateway.public_key}));
  const std::vector<uint8_t> reply = frameOf(std::string(512 * 1024, 'r'));  // > socket buffers
  server_handler_.on_frame = [&reply](FramedStream* stream, const std::string&) {
    stream->write(std::vector<uint8_t>(reply));
    stream->flush();
  };
  RawPeer peer = rawClient(kGateway);
  ASSERT_TRUE(runUntil([&] { return peer.tls->handshakeDone() && server_->tls()->handshakeDone(); },
                       [&] { peer.pump(); }));
  peer.reading = false;
  for (int i = 0; i < 8; ++i)
    ASSERT_TRUE(peer.tls->write(frameOf("req" + std::to_string(i))).isOk());
  peer.pump();
  ASSERT_TRUE(runUntil([&] { return !server_handler_.frames.empty() && !server_->reading(); }));
  for (int i = 0; i < 1000; ++i) (void)uv_run(&loop_, UV_RUN_NOWAIT);  // nothing more happens
  EXPECT_EQ(server_handler_.frames.size(), 1u);
  EXPECT_GE(server_->queuedBytes(), kQueueMax);
  EXPECT_FALSE(server_->reading());

  peer.reading = true;
  ASSERT_TRUE(
      runUntil([&] { return peer.plaintext.size() == 8 * reply.size(); }, [&] { peer.pump(); }));
  EXPECT_EQ(server_handler_.frames.size(), 8u);
  EXPECT_TRUE(server_->reading());
}

// The lingering close over TLS: the last reply, then close_notify, then FIN; the stream closes
// when the peer ends its side.
TEST_F(FramedStreamTlsTest, ShutdownSendsTheLastFramesThenCloseNotify) {
  server_ = openStream(fds_[0], &server_handler_, {.linger_ms = 20'000},
                       session(TlsRole::kServer, kLedger, {kGateway.public_key}));
  RawPeer peer = rawClient(kGateway);
  ASSERT_TRUE(runUntil([&] { return server_->tls()->handshakeDone(); }, [&] { peer.pump(); }));
  server_->write(frameOf("last"));
  server_->shutdownThenClose();
  ASSERT_TRUE(runUntil([&] { return peer.eof; }, [&] { peer.pump(); }));
  EXPECT_EQ(peer.plaintext, std::string(reinterpret_cast<const char*>(frameOf("last").data()), 8));
  EXPECT_TRUE(peer.tls->closed()) << "no close_notify before the end of stream";
  EXPECT_FALSE(peer.tls->failed());
  EXPECT_EQ(server_handler_.closed, 0);
  ASSERT_EQ(::shutdown(peer.fd, SHUT_WR), 0);
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1; }));
  EXPECT_TRUE(server_handler_.lost.empty());
}

// Mismatched ends fail at once with a reason that names the switch, instead of hanging.
TEST_F(FramedStreamTlsTest, APlaintextClientOfATlsServerIsToldWhy) {
  server_ = openStream(fds_[0], &server_handler_, {},
                       session(TlsRole::kServer, kLedger, {kGateway.public_key}));
  client_ = openStream(fds_[1], &client_handler_, StreamLimits{.backpressure = false}, nullptr);
  client_->write(frameOf(std::string(16, 'p')));
  client_->flush();
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1 && client_handler_.closed == 1; }));
  EXPECT_TRUE(server_handler_.frames.empty());
  ASSERT_EQ(server_handler_.lost.size(), 1u);
  EXPECT_EQ(server_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(server_handler_.lost[0].message().find("does not speak TLS"), std::string::npos)
      << server_handler_.lost[0].toString();
  ASSERT_EQ(client_handler_.lost.size(), 1u) << "the plaintext client heard nothing";
  EXPECT_NE(client_handler_.lost[0].message().find("--insecure"), std::string::npos)
      << client_handler_.lost[0].toString();
}

TEST_F(FramedStreamTlsTest, ATlsClientOfAPlaintextServerIsToldWhy) {
  server_ = openStream(fds_[0], &server_handler_, {}, nullptr);
  client_ = openStream(fds_[1], &client_handler_, StreamLimits{.backpressure = false},
                       session(TlsRole::kClient, kGateway, {kLedger.public_key}));
  ASSERT_TRUE(runUntil([&] { return server_handler_.closed == 1 && client_handler_.closed == 1; }));
  EXPECT_TRUE(server_handler_.frames.empty());
  EXPECT_TRUE(server_handler_.bad_frames.empty());
  ASSERT_EQ(server_handler_.lost.size(), 1u);
  EXPECT_EQ(server_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(server_handler_.lost[0].message().find("speaks TLS"), std::string::npos)
      << server_handler_.lost[0].toString();
  ASSERT_EQ(client_handler_.lost.size(), 1u);
  EXPECT_EQ(client_handler_.lost[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(client_handler_.lost[0].message().find("--insecure"), std::string::npos)
      << client_handler_.lost[0].toString();
}

}  // namespace
}  // namespace tally::net
