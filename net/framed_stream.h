#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/limits.h"
#include "core/status.h"
#include "net/connection_limits.h"
#include "net/held_frames.h"
#include "wire/frame.h"

// The one framed-stream layer: every server and client of the length-framed protocol (ledger
// server, agent gateway socket, the agent's ledger link, tally-bench) reads, decodes, writes,
// pushes back and shuts down through a FramedStream. Read and write go through this one class
// only, so the TLS of a later issue (memory BIOs) slots in here and nowhere else.
//
//  * Reading: bytes are cut into frames by a wire::FrameDecoder (frame_bytes_max) and handed to
//    the handler one at a time. A framing error stops reading for good; the frames before it
//    are still delivered, then onBadFrame() is called once.
//  * Writing: the owner encodes frames straight into output() (or hands over a finished buffer
//    with write()) and calls flush(): what the socket takes at once is written with
//    uv_try_write, the rest goes into one uv_write whose buffer lives until its callback.
//  * Back-pressure (servers, StreamLimits::backpressure): a peer whose replies are not drained
//    is neither read nor served. Past pending_replies_max replies promised (addPending) or
//    write_queue_bytes_max bytes owed to it (promised + buffered + queued in libuv), the stream
//    stops delivering the frames it already decoded and stops reading; it resumes by itself as
//    the replies are settled and written. So a peer that never reads holds at most about
//    write_queue_bytes_max of replies plus one read (64 KiB) of undelivered requests and one
//    incomplete frame (frame_bytes_max) in the decoder, and costs the loop nothing more. A client
//    stream (backpressure = false) always reads: its answers are what drain its queue; its owner
//    bounds what it sends with queuedBytes().
//  * Stalled peers (servers, stall_timeout_ms > 0): a stream paused by back-pressure while bytes
//    wait in libuv's queue (the socket takes none of them: the peer does not read) is closed once
//    no byte has left that queue for stall_timeout_ms; onLost reports kResourceExhausted, its
//    message starting "stalled: ". A stream paused only because its owner has not answered yet
//    (addPending) is never closed for it: that is the server's delay, not the peer's.
//  * Shutdown: shutdownThenClose() flushes, stops delivering frames, lets the queued writes go
//    out and sends FIN (uv_shutdown), then lingers: it reads and discards until the peer's end
//    of stream, and only then closes, or after linger_ms at the latest. Closing a TCP socket
//    with unread input makes the kernel send RST, which throws away replies still in its send
//    queue: a peer that had pipelined more requests would lose answers to work already
//    applied. The wait also ends as soon as the kernel reports that the peer has every byte
//    (and the FIN) and no input of its is unread (SIOCOUTQ and SIOCINQ both 0, polled every
//    10 ms), so an idle client that keeps its end open does not delay a stop by linger_ms.
//    close() closes at once (queued writes are cancelled).
//  * TLS (optional, startTls()): a net::TlsSession sits between the socket and the frame
//    decoder. Bytes read are fed to the session and its plaintext goes to the decoder; frames
//    written are encrypted by it and its ciphertext goes to the socket. Plaintext the session
//    holds before its handshake is done counts in queuedBytes(), so back-pressure holds the
//    same. shutdownThenClose() sends close_notify before the FIN; close() sends it if the
//    socket takes it at once. A session that fails (the peer's key refused by either side, a
//    tampered or replayed record, a peer that does not speak TLS, an end of stream during the
//    handshake) ends the stream: its alert is written, the stream shuts down and lingers as
//    above, and onLost reports the reason, prefixed "TLS: " (kFailedPrecondition, or
//    kCorruption for a bad record). Without TLS, a peer whose first bytes are a TLS record is
//    reported the same way (kFailedPrecondition): a frame's length is a multiple of 8, a TLS
//    record header's first byte is not.
//
// Ownership: owns its uv_tcp_t or uv_pipe_t, its connect and shutdown requests and its write
// buffers; borrows `loop` and `handler`, which must outlive it. Non-copyable, non-movable
// (libuv holds pointers into it). After a successful init() it may be destroyed only from (or
// after) StreamHandler::onClosed, which the close callback calls last; callbacks of its write,
// connect and shutdown requests all run before that. Belongs to the loop thread.

namespace tally::net {

class TlsSession;

struct StreamLimits {
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  uint64_t write_queue_bytes_max = limits::kWriteQueueBytesPerConnectionMax;
  uint64_t pending_replies_max = limits::kRequestsInFlightPerConnectionMax;
  // true (servers): stop serving and reading a peer past either maximum until it drains.
  bool backpressure = true;
  // shutdownThenClose(): the longest wait for the queued writes and the peer's end of stream.
  uint64_t linger_ms = limits::kLingerMsDefault;
  // Paused by back-pressure and no byte taken by the peer for this long: closed (see above).
  // 0: never.
  uint64_t stall_timeout_ms = kStallTimeoutMsDefault;
};

enum class StreamKind : uint8_t { kTcp, kPipe };

class FramedStream;

// What a FramedStream reports, on the loop thread. Every method may call any method of the
// stream (write, flush, close, …) except destroy it, which only onClosed may.
class StreamHandler {
 public:
  // One complete frame, in arrival order.
  virtual void onFrame(FramedStream* stream, wire::Frame&& frame) = 0;
  // The framing is lost (oversized or zero-length frame); reading has stopped for good.
  virtual void onBadFrame(FramedStream* stream, const Status& status) = 0;
  // The peer is gone: end of stream, a read or a write error, a failed TLS session. The
  // stream is already closing (or, after a TLS failure, shutting down: its alert goes out).
  virtual void onLost(FramedStream* stream, const Status& status) = 0;
  // The result of connect()/connectPipe(); not called if the stream was closed meanwhile.
  virtual void onConnected(FramedStream* stream, const Status& status);
  // The stall watch started: paused by back-pressure, and the peer's socket takes none of the
  // bytes owed to it; unless it takes some within stall_timeout_ms it is closed (onLost).
  virtual void onPaused(FramedStream* stream);
  // The close callback: the last call for this stream; the owner may destroy it here.
  virtual void onClosed(FramedStream* stream) = 0;

 protected:
  ~StreamHandler() = default;
};

class FramedStream {
 public:
  FramedStream(uv_loop_t* loop, StreamKind kind, StreamHandler* handler, StreamLimits limits,
               uint64_t id);
  // Virtual: a ConnectionSet owns the servers' subclasses (their per-connection state) by base.
  virtual ~FramedStream();
  FramedStream(const FramedStream&) = delete;
  FramedStream& operator=(const FramedStream&) = delete;

  // Initializes the handle. Until it succeeds, nothing is open and the stream may be destroyed;
  // after, close() and onClosed must come first.
  [[nodiscard]] Status init();
  [[nodiscard]] Status accept(uv_stream_t* listener);
  // Starts a connect; StreamHandler::onConnected reports the result.
  [[nodiscard]] Status connect(const sockaddr* address);
  void connectPipe(const char* path);
  // Speaks TLS from now on, through `session` (made by its owner with its role, key and
  // pinning): call once the socket is open (after accept(), in onConnected, after
  // uv_pipe_open) and before anything is written or read. A client's first flight is sent at
  // once. Errors of the session's start are reported through onLost.
  void startTls(std::unique_ptr<TlsSession> session);
  // The session, if startTls() was called: handshakeDone(), peerKey().
  const TlsSession* tls() const { return tls_.get(); }

  // The owner wants (or no longer wants) to read. Back-pressure and a lost framing may still
  // hold reading off; stopReading() also stops delivering frames already decoded. A failing
  // uv_read_start is reported through onLost.
  void startReading();
  void stopReading();

  // Frames encoded here are sent by the next flush().
  std::vector<uint8_t>* output() { return &output_; }
  // Appends `bytes` to the output (adopting the buffer when the output is empty).
  void write(std::vector<uint8_t>&& bytes);
  void flush();

  // Replies the owner owes this peer and holds elsewhere (in a batch, in a handler), with the
  // bytes already known; both count against the limits until settled.
  void addPending(uint64_t replies, uint64_t bytes);
  void settlePending(uint64_t replies, uint64_t bytes);

  void shutdownThenClose();
  void close();

  uint64_t id() const { return id_; }
  uv_stream_t* stream();
  uv_handle_t* handle() { return reinterpret_cast<uv_handle_t*>(stream()); }
  uv_tcp_t* tcp() { return &tcp_; }
  uv_pipe_t* pipe() { return &pipe_; }
  bool closing() const { return closing_; }
  bool shuttingDown() const { return shutting_down_; }
  // Shut down and FIN sent; discarding input until the peer's end of stream or linger_ms.
  bool lingering() const { return shutdown_done_ && !closing_; }
  bool reading() const { return reading_; }
  // Bytes owed to the peer: promised, in output(), waiting in the TLS session, queued in libuv.
  uint64_t queuedBytes();
  uint64_t pendingReplies() const { return pending_replies_; }
  size_t heldFrames() const { return held_.size(); }
  // Every byte this stream holds for its peer or from it: queuedBytes(), the requests decoded
  // and not delivered yet, and the decoder's incomplete frame (the global bound of
  // net/connection_set.h sums this).
  uint64_t bufferedBytes();
  // Paused by back-pressure with bytes the peer's socket does not take: the stall watch runs.
  bool stalled() const { return stall_watch_; }

 private:
  struct WriteRequest;

  static void onAlloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void onWrite(uv_write_t* request, int status);
  static void onConnect(uv_connect_t* request, int status);
  static void onShutdown(uv_shutdown_t* request, int status);
  static void onLingerTimer(uv_timer_t* timer);
  static void onStallTimer(uv_timer_t* timer);
  static void onClose(uv_handle_t* handle);

  bool overLimit();
  // Hands held frames to the handler while allowed, then starts or stops reading to match.
  void deliver();
  void updateReading();
  void lost(Status status);
  void startLingering();
  // Initializes the timer on first use (the linger wait, or before a shutdown the stall watch).
  bool ensureTimer();
  // Starts or stops the stall watch to match the stream's state (called by updateReading).
  void updateStallWatch();
  uint64_t libuvQueuedBytes();
  // The kernel holds nothing of ours the peer has not received, and no unread input of its.
  bool peerHasEverything();
  // A read while shutting down: input is discarded; the peer's end of stream ends the wait.
  void onReadWhileShuttingDown(ssize_t nread);
  // Sends `bytes` as they are (ciphertext, or plaintext frames without TLS).
  void writeRaw(std::vector<uint8_t>&& bytes);
  // Shut down (FIN after the queued writes) and linger: shutdownThenClose after its flush.
  void beginShutdown();
  // Feeds what was read to the session; false if the stream ended.
  bool feedTls(std::span<const uint8_t> bytes);
  // The session failed: its alert goes out, the stream shuts down, the owner hears why.
  void failTls(const Status& status);
  // Hands decrypted (or plain) bytes to the frame decoder and delivers what it completes.
  void decode(std::span<const uint8_t> bytes);

  uv_loop_t* loop_;
  StreamKind kind_;
  StreamHandler* handler_;
  StreamLimits limits_;
  uint64_t id_;
  uv_tcp_t tcp_{};
  uv_pipe_t pipe_{};
  uv_connect_t connect_request_{};
  // The linger wait once shut down; before that, the stall watch. One handle for both.
  uv_timer_t linger_timer_{};
  uint64_t linger_deadline_ms_ = 0;  // uv_now() past which a lingering stream closes
  bool stall_watch_ = false;         // the timer runs onStallTimer
  uint64_t stall_progress_ms_ = 0;   // uv_now() when a byte last left libuv's queue
  uint64_t stall_queued_bytes_ = 0;  // libuv's queue at the last look
  bool initialized_ = false;
  bool linger_timer_initialized_ = false;
  int handles_closing_ = 0;  // close callbacks still to come
  bool closed_ = false;      // the last close callback ran
  bool closing_ = false;
  bool shutting_down_ = false;
  bool shutdown_done_ = false;  // the shutdown callback ran: FIN is out
  bool peer_ended_ = false;     // the peer's end of stream arrived while shutting down
  bool want_reading_ = false;
  bool reading_ = false;
  bool delivering_ = false;
  bool framing_lost_ = false;
  bool bad_frame_reported_ = false;
  Status bad_frame_;

  wire::FrameDecoder decoder_;
  HeldFrames held_;  // decoded, not delivered yet (back-pressure)
  std::vector<uint8_t> output_;
  uint64_t pending_replies_ = 0;
  uint64_t pending_bytes_ = 0;
  std::unique_ptr<TlsSession> tls_;
  bool tls_failed_ = false;
  bool first_read_ = true;  // nothing has been read yet
};

}  // namespace tally::net
