#include "net/framed_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "tests/net/frame_bytes.h"

// The framed-stream layer on a real libuv loop over a real socketpair: one end is the
// FramedStream under test, the other a raw non-blocking descriptor the test writes and reads.
// The loop runs one iteration at a time (UV_RUN_NOWAIT/ONCE after the bytes are there), never
// waiting on a clock.

namespace tally::net {
namespace {

using test_support::frameOf;

std::string text(const wire::Frame& frame) { return std::string(frame.begin(), frame.end()); }

class Recorder final : public StreamHandler {
 public:
  void onFrame(FramedStream* stream, wire::Frame&& frame) override {
    frames.push_back(text(frame));
    if (on_frame) on_frame(stream);
  }
  void onBadFrame(FramedStream*, const Status& status) override { bad_frames.push_back(status); }
  void onLost(FramedStream*, const Status& status) override { lost.push_back(status); }
  void onClosed(FramedStream*) override { ++closed; }
  void onPaused(FramedStream*) override { ++paused; }

  std::vector<std::string> frames;
  std::vector<Status> bad_frames;
  std::vector<Status> lost;
  int closed = 0;
  int paused = 0;
  std::function<void(FramedStream*)> on_frame;
};

class FramedStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    stream_fd_ = fds[0];
    peer_fd_ = fds[1];
    ASSERT_EQ(::fcntl(peer_fd_, F_SETFL, ::fcntl(peer_fd_, F_GETFL) | O_NONBLOCK), 0);
  }

  void TearDown() override {
    if (stream_ != nullptr && !stream_->closing()) stream_->close();
    ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);  // every handle closed
    if (stream_ != nullptr) {
      EXPECT_EQ(handler_.closed, 1);
    }
    stream_.reset();
    if (peer_fd_ >= 0) ::close(peer_fd_);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  void open(StreamLimits limits) {
    stream_ = std::make_unique<FramedStream>(&loop_, StreamKind::kPipe, &handler_, limits, 7);
    ASSERT_TRUE(stream_->init().isOk());
    ASSERT_EQ(uv_pipe_open(stream_->pipe(), stream_fd_), 0);
    stream_->startReading();
  }

  void peerWrite(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(::write(peer_fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  // Reads what the stream sent, without blocking; the number of bytes (0 at EOF or none yet).
  size_t peerDrain(std::string* into = nullptr) {
    size_t total = 0;
    char buffer[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(peer_fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      if (into != nullptr) into->append(buffer, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
    }
    return total;
  }

  // One loop iteration that handles whatever is ready now.
  void turn() { (void)uv_run(&loop_, UV_RUN_NOWAIT); }

  uv_loop_t loop_{};
  int stream_fd_ = -1;
  int peer_fd_ = -1;
  Recorder handler_;
  std::unique_ptr<FramedStream> stream_;
};

TEST_F(FramedStreamTest, ReassemblesFramesCutAcrossReads) {
  open({});
  const std::vector<uint8_t> one = frameOf("hello");
  const std::vector<uint8_t> two = frameOf("world!");
  peerWrite({one.begin(), one.begin() + 2});  // half a header
  turn();
  EXPECT_TRUE(handler_.frames.empty());
  peerWrite({one.begin() + 2, one.begin() + 6});  // the rest of the header, one body byte
  turn();
  EXPECT_TRUE(handler_.frames.empty());
  std::vector<uint8_t> rest(one.begin() + 6, one.end());
  rest.insert(rest.end(), two.begin(), two.end());  // the end of one frame and all of the next
  peerWrite(rest);
  turn();
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"hello", "world!"}));
  EXPECT_TRUE(handler_.bad_frames.empty());
  EXPECT_TRUE(stream_->reading());
}

TEST_F(FramedStreamTest, OversizedFrameStopsReadingAfterTheFramesBeforeIt) {
  open({.frame_bytes_max = 16});
  std::vector<uint8_t> bytes = frameOf("fits");
  const std::vector<uint8_t> big = frameOf(std::string(17, 'x'));
  bytes.insert(bytes.end(), big.begin(), big.end());
  const std::vector<uint8_t> after = frameOf("never");
  bytes.insert(bytes.end(), after.begin(), after.end());
  peerWrite(bytes);
  turn();
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"fits"}));
  ASSERT_EQ(handler_.bad_frames.size(), 1u);
  EXPECT_EQ(handler_.bad_frames[0].code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(stream_->reading());
  // Reading stays off for good: more bytes are neither read nor reported.
  peerWrite(frameOf("late"));
  turn();
  EXPECT_EQ(handler_.frames.size(), 1u);
  EXPECT_EQ(handler_.bad_frames.size(), 1u);
}

TEST_F(FramedStreamTest, PendingRepliesStopServingAndResumeWhenSettled) {
  open({.pending_replies_max = 2});
  handler_.on_frame = [](FramedStream* stream) { stream->addPending(1, 0); };
  std::vector<uint8_t> bytes;
  for (const char* payload : {"a", "b", "c", "d", "e"}) {
    const std::vector<uint8_t> frame = frameOf(payload);
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  peerWrite(bytes);
  turn();
  // Two served, three held, and the peer is not read meanwhile.
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stream_->heldFrames(), 3u);
  EXPECT_FALSE(stream_->reading());
  peerWrite(frameOf("f"));
  turn();
  EXPECT_EQ(handler_.frames.size(), 2u);

  stream_->settlePending(1, 0);  // one answered: one more is served
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(stream_->reading());
  stream_->settlePending(2, 0);  // d and e are served, which fills the two slots again
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(stream_->heldFrames(), 0u);
  EXPECT_FALSE(stream_->reading());
  stream_->settlePending(2, 0);
  EXPECT_TRUE(stream_->reading());
  turn();  // f, written while paused, was waiting in the socket
  EXPECT_EQ(handler_.frames.back(), "f");
}

// The ledger's case: replies held in a batch until their commit count by their bytes, so a
// client is not served past the byte bound while nothing has reached its socket yet.
TEST_F(FramedStreamTest, PromisedReplyBytesStopServingUntilSettled) {
  constexpr uint64_t kQueueMax = 1000;
  open({.write_queue_bytes_max = kQueueMax});
  handler_.on_frame = [](FramedStream* stream) { stream->addPending(1, 600); };
  std::vector<uint8_t> bytes;
  for (const char* payload : {"a", "b", "c"}) {
    const std::vector<uint8_t> frame = frameOf(payload);
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  peerWrite(bytes);
  turn();
  // 600 then 1200 bytes owed: the third request waits, and the peer is not read.
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stream_->queuedBytes(), 1200u);
  EXPECT_FALSE(stream_->reading());
  stream_->settlePending(2, 1200);  // the batch committed (and, here, was dropped)
  EXPECT_EQ(handler_.frames, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(stream_->reading());
}

TEST_F(FramedStreamTest, UndrainedRepliesStopServingAndResumeWhenThePeerReads) {
  constexpr uint64_t kQueueMax = 64 * 1024;
  open({.write_queue_bytes_max = kQueueMax});
  const std::vector<uint8_t> reply = frameOf(std::string(512 * 1024, 'r'));  // > socket buffers
  handler_.on_frame = [&reply](FramedStream* stream) {
    stream->write(std::vector<uint8_t>(reply));
    stream->flush();
  };
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) {
    const std::vector<uint8_t> frame = frameOf("req" + std::to_string(i));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  peerWrite(bytes);
  turn();
  // The first reply did not fit the socket: the rest is not served while it is owed.
  EXPECT_EQ(handler_.frames.size(), 1u);
  EXPECT_GE(stream_->queuedBytes(), kQueueMax);
  EXPECT_FALSE(stream_->reading());
  EXPECT_EQ(stream_->heldFrames(), 7u);

  // The peer reads: the queue drains, every request is served, every reply arrives.
  size_t received = 0;
  for (int i = 0; i < 100'000 && received < 8 * reply.size(); ++i) {
    received += peerDrain();
    turn();
  }
  EXPECT_EQ(received, 8 * reply.size());
  EXPECT_EQ(handler_.frames.size(), 8u);
  EXPECT_TRUE(stream_->reading());
}

// A peer that never reads: paused by back-pressure with bytes the socket does not take, it is
// closed after stall_timeout_ms with a typed reason. The wait is bounded by the loop's own timer
// (the stall watch); no clock is read by the test.
TEST_F(FramedStreamTest, APausedPeerThatReadsNothingIsClosedAfterTheStallTimeout) {
  constexpr uint64_t kQueueMax = 64 * 1024;
  open({.write_queue_bytes_max = kQueueMax, .stall_timeout_ms = 40});
  const std::vector<uint8_t> reply = frameOf(std::string(512 * 1024, 'r'));  // > socket buffers
  handler_.on_frame = [&reply](FramedStream* stream) {
    stream->write(std::vector<uint8_t>(reply));
    stream->flush();
  };
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 4; ++i) {
    const std::vector<uint8_t> frame = frameOf("req" + std::to_string(i));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  peerWrite(bytes);
  turn();
  ASSERT_EQ(handler_.frames.size(), 1u);
  EXPECT_FALSE(stream_->reading());
  EXPECT_TRUE(stream_->stalled());
  EXPECT_EQ(handler_.paused, 1);
  // UV_RUN_ONCE waits for the next event, here the stall watch's timer: a handful of turns.
  for (int i = 0; i < 1'000 && handler_.closed == 0; ++i) (void)uv_run(&loop_, UV_RUN_ONCE);
  ASSERT_EQ(handler_.closed, 1);
  ASSERT_EQ(handler_.lost.size(), 1u);
  EXPECT_EQ(handler_.lost[0].code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(handler_.lost[0].message().starts_with("stalled: ")) << handler_.lost[0].message();
  EXPECT_EQ(handler_.frames.size(), 1u) << "nothing more was served";
}

// Paused only because the owner has not answered (replies promised, none queued in the socket):
// the server's delay, not the peer's. The stream is never closed for it.
TEST_F(FramedStreamTest, APeerPausedOnlyByUnansweredRequestsIsNotClosed) {
  open({.pending_replies_max = 1, .stall_timeout_ms = 10});
  handler_.on_frame = [](FramedStream* stream) { stream->addPending(1, 0); };
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 2; ++i) {
    const std::vector<uint8_t> frame = frameOf("req" + std::to_string(i));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  peerWrite(bytes);
  turn();
  ASSERT_EQ(handler_.frames.size(), 1u);
  EXPECT_FALSE(stream_->reading());
  EXPECT_FALSE(stream_->stalled());
  EXPECT_EQ(handler_.paused, 0);
  // Ten stall timeouts pass on the loop's clock (a timer of the test's own, the only event).
  uv_timer_t later{};
  ASSERT_EQ(uv_timer_init(&loop_, &later), 0);
  bool fired = false;
  later.data = &fired;
  ASSERT_EQ(uv_timer_start(
                &later, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; }, 100, 0),
            0);
  for (int i = 0; i < 1'000 && !fired; ++i) (void)uv_run(&loop_, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&later), nullptr);
  turn();  // runs the close callback: `later` may go out of scope
  ASSERT_TRUE(fired);
  EXPECT_EQ(handler_.closed, 0);
  EXPECT_TRUE(handler_.lost.empty());
  // Answered: served again.
  stream_->settlePending(1, 0);
  EXPECT_EQ(handler_.frames.size(), 2u);
}

// What the global bound sums: replies owed, requests held undelivered, the incomplete frame.
TEST_F(FramedStreamTest, BufferedBytesCountHeldRequestsAndTheIncompleteFrame) {
  open({.pending_replies_max = 1});
  handler_.on_frame = [](FramedStream* stream) { stream->addPending(1, 100); };
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 3; ++i) {
    const std::vector<uint8_t> frame = frameOf(std::string(1000, 'a'));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  const std::vector<uint8_t> partial = frameOf(std::string(5000, 'p'));
  bytes.insert(bytes.end(), partial.begin(), partial.begin() + 2004);  // header + 2,000 bytes
  peerWrite(bytes);
  turn();
  ASSERT_EQ(handler_.frames.size(), 1u);
  EXPECT_EQ(stream_->heldFrames(), 2u);
  EXPECT_EQ(stream_->bufferedBytes(), 100u + 2 * (4u + 1000u) + 2004u);  // held: length + payload
}

TEST_F(FramedStreamTest, CloseWithWritesPendingFreesThemAndReportsClosedOnce) {
  open({});
  stream_->write(std::vector<uint8_t>(4 << 20, 'w'));  // far more than the socket takes
  stream_->flush();
  ASSERT_GT(stream_->queuedBytes(), 0u);
  stream_->close();
  stream_->close();  // idempotent
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  EXPECT_EQ(handler_.closed, 1);
  EXPECT_TRUE(handler_.lost.empty());
  // The peer sees some bytes, then the end.
  EXPECT_LT(peerDrain(), size_t{4 << 20});
}

TEST_F(FramedStreamTest, ShutdownThenCloseDeliversEverythingQueuedFirst) {
  open({});
  std::string expected(300 * 1024, 's');
  stream_->output()->assign(expected.begin(), expected.end());
  stream_->shutdownThenClose();
  peerWrite(frameOf("too late"));  // discarded: a stream shutting down serves nothing more
  std::string received;
  for (int i = 0; i < 100'000 && received.size() < expected.size(); ++i) {
    peerDrain(&received);
    turn();
  }
  EXPECT_EQ(received, expected);
  ASSERT_EQ(::shutdown(peer_fd_, SHUT_WR), 0);
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  EXPECT_EQ(handler_.closed, 1);
  EXPECT_TRUE(handler_.frames.empty());
  EXPECT_TRUE(handler_.lost.empty());
}

TEST_F(FramedStreamTest, ALingeringStreamClosesAtItsDeadlineWhenThePeerNeverCloses) {
  open({.linger_ms = 20});
  stream_->output()->assign(100, 'x');
  stream_->shutdownThenClose();
  // The loop ends once the linger timer has closed the stream: the peer never ended its side.
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  EXPECT_EQ(handler_.closed, 1);
  EXPECT_EQ(peerDrain(), 100u);
}

// A peer that took every reply but keeps its end open (an idle client) does not hold the close
// for linger_ms: once the kernel holds nothing the peer has not read, the stream closes.
TEST_F(FramedStreamTest, ALingeringStreamClosesOnceThePeerHasReadEverything) {
  constexpr uint64_t kLingerMs = 20'000;
  open({.linger_ms = kLingerMs});
  stream_->output()->assign(100, 'x');
  stream_->shutdownThenClose();
  std::string received;
  for (int i = 0; i < 100'000 && received.size() < 100; ++i) {
    peerDrain(&received);
    turn();
  }
  ASSERT_EQ(received.size(), 100u);
  const uint64_t drained_at_ms = uv_now(&loop_);
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  EXPECT_EQ(handler_.closed, 1);
  EXPECT_LT(uv_now(&loop_) - drained_at_ms, kLingerMs / 2) << "waited for the linger deadline";
  char byte = 0;
  EXPECT_EQ(::read(peer_fd_, &byte, 1), 0) << "the peer sees its end of stream";
}

// Unread replies keep a lingering stream open: the early close needs the peer to hold them all.
TEST_F(FramedStreamTest, ALingeringStreamWithUnreadRepliesWaitsForThePeer) {
  open({.linger_ms = 20'000});
  stream_->output()->assign(100, 'x');
  stream_->shutdownThenClose();
  const uint64_t started_ms = uv_now(&loop_);
  while (uv_now(&loop_) - started_ms < 200) {
    (void)uv_run(&loop_, UV_RUN_ONCE);  // the 10 ms linger poll wakes the loop
    uv_update_time(&loop_);
  }
  EXPECT_EQ(handler_.closed, 0) << "closed while the peer had not read its replies";
  EXPECT_EQ(peerDrain(), 100u);
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  EXPECT_EQ(handler_.closed, 1);
}

TEST_F(FramedStreamTest, PeerClosingIsReportedAsLost) {
  open({});
  ::close(peer_fd_);
  peer_fd_ = -1;
  ASSERT_EQ(uv_run(&loop_, UV_RUN_DEFAULT), 0);
  ASSERT_EQ(handler_.lost.size(), 1u);
  EXPECT_EQ(handler_.lost[0].code(), StatusCode::kUnavailable);
  EXPECT_EQ(handler_.closed, 1);
}

// A TCP peer that pipelined more requests than the server served, and reads slowly, must still
// get every reply the server queued before its shutdown. Closing with its unread requests in the
// receive queue would make the kernel answer with RST and drop the replies not yet sent: the
// defect behind "unacknowledged steps applied" at a ledger's SIGTERM.
TEST(FramedStreamTcpTest, ShutdownKeepsEveryReplyForAPeerWithUnreadRequests) {
  uv_loop_t loop{};
  ASSERT_EQ(uv_loop_init(&loop), 0);
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int peer = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(peer, 0);
  // A small receive window: most of the reply has to wait in the server's send queue.
  const int receive_bytes = 4096;
  ASSERT_EQ(::setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &receive_bytes, sizeof(receive_bytes)), 0);
  const timeval receive_timeout{.tv_sec = 10, .tv_usec = 0};
  ASSERT_EQ(::setsockopt(peer, SOL_SOCKET, SO_RCVTIMEO, &receive_timeout, sizeof(receive_timeout)),
            0);
  ASSERT_EQ(::connect(peer, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  ::close(listener);
  // Room for the whole reply in the kernel, so the shutdown completes with it all unsent.
  const int send_bytes = 256 * 1024;
  ASSERT_EQ(::setsockopt(accepted, SOL_SOCKET, SO_SNDBUF, &send_bytes, sizeof(send_bytes)), 0);

  Recorder handler;
  const std::string reply(128 * 1024, 'r');
  handler.on_frame = [&](FramedStream* stream) {
    stream->output()->assign(reply.begin(), reply.end());
    stream->shutdownThenClose();
  };
  FramedStream stream(&loop, StreamKind::kTcp, &handler, StreamLimits{.linger_ms = 30'000}, 1);
  ASSERT_TRUE(stream.init().isOk());
  ASSERT_EQ(uv_tcp_open(stream.tcp(), accepted), 0);
  stream.startReading();

  const std::vector<uint8_t> request = frameOf("reserve");
  ASSERT_EQ(::write(peer, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  for (int i = 0; i < 100'000 && handler.frames.empty(); ++i) (void)uv_run(&loop, UV_RUN_NOWAIT);
  ASSERT_EQ(handler.frames.size(), 1u);
  // More pipelined requests, which the server will never read as frames.
  const std::vector<uint8_t> unread = frameOf(std::string(1024, 'u'));
  ASSERT_EQ(::write(peer, unread.data(), unread.size()), static_cast<ssize_t>(unread.size()));
  for (int i = 0; i < 100'000 && !stream.lingering() && handler.closed == 0; ++i) {
    (void)uv_run(&loop, UV_RUN_NOWAIT);
  }
  ASSERT_EQ(handler.closed, 0) << "closed before the peer read its replies";
  ASSERT_TRUE(stream.lingering());

  // The reply and FIN are in the kernel: read them with blocking reads (bounded by
  // SO_RCVTIMEO), without the loop.
  std::string received;
  ssize_t last = 0;
  char buffer[16 * 1024];
  while ((last = ::read(peer, buffer, sizeof(buffer))) > 0) {
    received.append(buffer, static_cast<size_t>(last));
  }
  const int read_errno = errno;
  EXPECT_EQ(last, 0) << "the stream ended with " << std::strerror(read_errno) << ", not FIN";
  EXPECT_EQ(received.size(), reply.size());
  EXPECT_EQ(received, reply);

  ASSERT_EQ(::shutdown(peer, SHUT_WR), 0);
  for (int i = 0; i < 100'000 && handler.closed == 0; ++i) (void)uv_run(&loop, UV_RUN_NOWAIT);
  EXPECT_EQ(handler.closed, 1) << "the peer's end of stream did not end the linger";
  EXPECT_TRUE(handler.lost.empty());
  EXPECT_EQ(uv_run(&loop, UV_RUN_DEFAULT), 0);
  ::close(peer);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace tally::net
