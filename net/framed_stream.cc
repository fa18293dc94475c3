#include "net/framed_stream.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <array>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "core/assert.h"
#include "net/tls_session.h"

namespace tally::net {

// One buffer on its way to the socket; freed by the write callback, which libuv runs (with
// UV_ECANCELED at worst) before the stream's close callback.
struct FramedStream::WriteRequest {
  uv_write_t req{};
  std::vector<uint8_t> bytes;
  FramedStream* stream = nullptr;
};

namespace {

// Reads are consumed synchronously inside the read callback, so one buffer per loop thread
// serves every stream on it.
constexpr size_t kReadBufferBytes = 64 * 1024;
thread_local std::array<char, kReadBufferBytes> read_buffer;
// The frames one read completes, handed over or held before the next read: shared the same way
// (its capacity, a slot per frame of a 64 KiB read, is not kept per connection).
thread_local std::vector<wire::Frame> decoded;

// How often a lingering stream asks the kernel whether the peer has everything it was sent.
constexpr uint64_t kLingerPollMs = 10;

Status uvStatus(const char* what, int rc) {
  return Status::ioError(std::string(what) + ": " + uv_strerror(rc));
}

// TLS record types: handshake (a ClientHello, a ServerHello) and alert. A frame's length is a
// whole number of Cap'n Proto words, so its first byte is a multiple of 8; these are not.
constexpr uint8_t kTlsHandshakeRecord = 0x16;
constexpr uint8_t kTlsAlertRecord = 0x15;
constexpr uint8_t kTlsMajorVersion = 0x03;

bool looksLikeTls(std::span<const uint8_t> first) {
  return first.size() >= 2 && (first[0] == kTlsHandshakeRecord || first[0] == kTlsAlertRecord) &&
         first[1] == kTlsMajorVersion;
}

// The owner's view of a failed session: "TLS: " and why, kCorruption for a bad record,
// kFailedPrecondition for everything else (never kUnavailable, which owners read as "the peer
// closed the connection").
Status tlsFailure(const TlsSession& session, const Status& error, bool peer_spoke_tls) {
  if (!peer_spoke_tls) {
    return Status::failedPrecondition(
        "TLS: the peer does not speak TLS (is it running with --insecure?)");
  }
  if (session.peerRefused()) {
    return Status::failedPrecondition("TLS: the peer's key is not accepted (" + error.message() +
                                      ")");
  }
  if (session.peerAlert().has_value()) {
    return Status::failedPrecondition("TLS: the peer ended the session (alert: " +
                                      *session.peerAlert() + "): it does not accept our key");
  }
  if (error.code() == StatusCode::kCorruption) return Status::corruption("TLS: " + error.message());
  return Status::failedPrecondition("TLS: " + error.message());
}

}  // namespace

void StreamHandler::onConnected(FramedStream*, const Status&) {}
void StreamHandler::onPaused(FramedStream*) {}

FramedStream::FramedStream(uv_loop_t* loop, StreamKind kind, StreamHandler* handler,
                           StreamLimits limits, uint64_t id)
    : loop_(loop),
      kind_(kind),
      handler_(handler),
      limits_(limits),
      id_(id),
      decoder_({.frame_bytes_max = limits.frame_bytes_max}) {
  tcp_.data = this;
  pipe_.data = this;
  connect_request_.data = this;
}

FramedStream::~FramedStream() {
  // libuv holds pointers into an initialized handle until its close callback.
  TALLY_ASSERT(!initialized_ || closed_);
}

uv_stream_t* FramedStream::stream() {
  return kind_ == StreamKind::kTcp ? reinterpret_cast<uv_stream_t*>(&tcp_)
                                   : reinterpret_cast<uv_stream_t*>(&pipe_);
}

Status FramedStream::init() {
  TALLY_ASSERT(!initialized_);
  const int rc =
      kind_ == StreamKind::kTcp ? uv_tcp_init(loop_, &tcp_) : uv_pipe_init(loop_, &pipe_, 0);
  if (rc != 0) return uvStatus(kind_ == StreamKind::kTcp ? "uv_tcp_init" : "uv_pipe_init", rc);
  initialized_ = true;
  return Status::ok();
}

Status FramedStream::accept(uv_stream_t* listener) {
  TALLY_ASSERT(initialized_);
  if (int rc = uv_accept(listener, stream()); rc != 0) return uvStatus("accept", rc);
  return Status::ok();
}

Status FramedStream::connect(const sockaddr* address) {
  TALLY_ASSERT(initialized_ && kind_ == StreamKind::kTcp);
  if (int rc = uv_tcp_connect(&connect_request_, &tcp_, address, onConnect); rc != 0) {
    return uvStatus("connect", rc);
  }
  return Status::ok();
}

void FramedStream::connectPipe(const char* path) {
  TALLY_ASSERT(initialized_ && kind_ == StreamKind::kPipe);
  // libuv 1.44: uv_pipe_connect reports every failure through the callback.
  uv_pipe_connect(&connect_request_, &pipe_, path, onConnect);
}

void FramedStream::onConnect(uv_connect_t* request, int status) {
  auto* self = static_cast<FramedStream*>(request->data);
  if (self->closing_) return;  // closed while connecting (UV_ECANCELED)
  self->handler_->onConnected(self, status == 0 ? Status::ok() : uvStatus("connect", status));
}

// --- Reading ----------------------------------------------------------------------------------

void FramedStream::startReading() {
  want_reading_ = true;
  deliver();
}

void FramedStream::stopReading() {
  want_reading_ = false;
  updateReading();
}

void FramedStream::onAlloc(uv_handle_t*, size_t, uv_buf_t* buf) {
  *buf = uv_buf_init(read_buffer.data(), static_cast<unsigned>(read_buffer.size()));
}

void FramedStream::onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<FramedStream*>(stream->data);
  if (self->shutting_down_) {
    self->onReadWhileShuttingDown(nread);
    return;
  }
  if (nread < 0) {
    if (self->tls_ != nullptr && !self->tls_->handshakeDone() && !self->tls_failed_) {
      self->lost(Status::failedPrecondition(
          self->first_read_ ? "TLS: the peer closed the connection before the TLS handshake (does "
                              "it run with --insecure, or refuse our address?)"
                            : "TLS: the peer closed the connection during the TLS handshake (it "
                              "may not accept our key)"));
      return;
    }
    self->lost(nread == UV_EOF ? Status::unavailable("the peer closed the connection")
                               : uvStatus("read", static_cast<int>(nread)));
    return;
  }
  if (nread == 0 || self->closing_) return;
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(buf->base),
                                       static_cast<size_t>(nread));
  if (self->tls_ != nullptr) {
    (void)self->feedTls(bytes);
    return;
  }
  if (self->first_read_) {
    self->first_read_ = false;
    if (looksLikeTls(bytes)) {
      self->lost(Status::failedPrecondition(
          "TLS: the peer speaks TLS and this end runs without it (--insecure)"));
      return;
    }
  }
  self->decode(bytes);
}

void FramedStream::decode(std::span<const uint8_t> bytes) {
  if (bytes.empty() || closing_ || shutting_down_) return;
  decoded.clear();
  const Status status = decoder_.feed(bytes, &decoded);
  if (!status.isOk()) {
    framing_lost_ = true;
    bad_frame_ = status;
  }
  // Straight to the handler while it may be served and nothing is held before it; the rest is
  // held, packed, in order. (onFrame cannot read or decode: `decoded` is not reentered.)
  const bool nested = delivering_;
  delivering_ = true;
  for (wire::Frame& frame : decoded) {
    if (closing_ || shutting_down_) break;  // nothing more is served
    if (!nested && held_.empty() && want_reading_ && !overLimit()) {
      handler_->onFrame(this, std::move(frame));
    } else {
      held_.push(frame);
    }
  }
  delivering_ = nested;
  decoded.clear();
  deliver();
}

// --- TLS --------------------------------------------------------------------------------------

void FramedStream::startTls(std::unique_ptr<TlsSession> session) {
  TALLY_ASSERT(tls_ == nullptr && session != nullptr);
  tls_ = std::move(session);
  const Status started = tls_->start();
  if (!started.isOk()) {
    failTls(started);
    return;
  }
  writeRaw(tls_->takeCiphertext());  // a client's ClientHello
}

bool FramedStream::feedTls(std::span<const uint8_t> bytes) {
  const bool first = std::exchange(first_read_, false);
  if (tls_failed_) return false;
  const Status fed = tls_->feed(bytes);
  if (!fed.isOk()) {
    const bool peer_spoke_tls = !first || looksLikeTls(bytes);
    std::vector<uint8_t> alert = tls_->takeCiphertext();
    if (!peer_spoke_tls && alert.empty()) {
      // OpenSSL sends nothing to a peer that is not speaking TLS; this fatal protocol_version
      // alert is what a plaintext tally peer recognizes as "the other end speaks TLS".
      alert = {kTlsAlertRecord, kTlsMajorVersion, 0x03, 0x00, 0x02, 0x02, 0x46};
    }
    writeRaw(std::move(alert));
    failTls(tlsFailure(*tls_, fed, peer_spoke_tls));
    return false;
  }
  // Handshake flights, and frames written before the handshake, now encrypted.
  writeRaw(tls_->takeCiphertext());
  if (closing_) return false;
  const std::vector<uint8_t> plaintext = tls_->takePlaintext();
  decode(plaintext);
  if (tls_->closed() && !closing_ && !shutting_down_) {  // close_notify: the peer's end of stream
    lost(Status::unavailable("the peer closed the connection"));
    return false;
  }
  return !closing_;
}

void FramedStream::failTls(const Status& status) {
  if (tls_failed_ || closing_) return;
  tls_failed_ = true;
  const Status reason = status.message().starts_with("TLS: ") ? status
                        : status.code() == StatusCode::kCorruption
                            ? Status::corruption("TLS: " + status.message())
                            : Status::failedPrecondition("TLS: " + status.message());
  // The alert goes out first; the lingering shutdown keeps the peer from an RST that would
  // throw it away.
  writeRaw(tls_->takeCiphertext());
  output_.clear();
  if (closing_) return;  // the write failed: lost() reported it
  if (!shutting_down_) beginShutdown();
  handler_->onLost(this, reason);
}

bool FramedStream::overLimit() {
  if (!limits_.backpressure) return false;
  return pending_replies_ >= limits_.pending_replies_max ||
         queuedBytes() >= limits_.write_queue_bytes_max;
}

void FramedStream::deliver() {
  if (delivering_) return;  // the handler answered from inside onFrame: the outer loop goes on
  delivering_ = true;
  while (!held_.empty() && want_reading_ && !closing_ && !shutting_down_ && !overLimit()) {
    handler_->onFrame(this, held_.pop());
  }
  delivering_ = false;
  if (framing_lost_ && held_.empty() && !bad_frame_reported_ && !closing_) {
    bad_frame_reported_ = true;
    updateReading();
    handler_->onBadFrame(this, bad_frame_);
    return;
  }
  updateReading();
}

void FramedStream::updateReading() {
  if (shutting_down_) return;  // the lingering close reads until the end of stream
  const bool wanted = want_reading_ && !closing_ && !shutting_down_ && !framing_lost_ &&
                      held_.empty() && !overLimit();
  if (wanted && !reading_) {
    if (int rc = uv_read_start(stream(), onAlloc, onRead); rc != 0) {
      lost(uvStatus("read start", rc));
      return;
    }
    reading_ = true;
  } else if (!wanted && reading_) {
    (void)uv_read_stop(stream());
    reading_ = false;
  }
  updateStallWatch();
}

// --- Stalled peers ----------------------------------------------------------------------------

uint64_t FramedStream::libuvQueuedBytes() {
  return initialized_ && !closed_ ? uv_stream_get_write_queue_size(stream()) : 0;
}

void FramedStream::updateStallWatch() {
  const bool stalled = limits_.stall_timeout_ms > 0 && want_reading_ && !reading_ && !closing_ &&
                       !shutting_down_ && overLimit() && libuvQueuedBytes() > 0;
  if (!stalled) {
    if (stall_watch_) {
      stall_watch_ = false;
      (void)uv_timer_stop(&linger_timer_);
    }
    return;
  }
  if (stall_watch_ || !ensureTimer()) return;
  stall_watch_ = true;
  stall_progress_ms_ = uv_now(loop_);
  stall_queued_bytes_ = libuvQueuedBytes();
  // Looked at four times per timeout: a peer is closed between 1 and 1.25 timeouts after the
  // last byte it took.
  const uint64_t poll_ms = std::clamp<uint64_t>(limits_.stall_timeout_ms / 4, 1, 1'000);
  if (uv_timer_start(&linger_timer_, onStallTimer, poll_ms, poll_ms) != 0) {
    stall_watch_ = false;
    return;
  }
  handler_->onPaused(this);
}

void FramedStream::onStallTimer(uv_timer_t* timer) {
  auto* self = static_cast<FramedStream*>(timer->data);
  if (!self->stall_watch_ || self->closing_) return;
  const uint64_t now_ms = uv_now(self->loop_);
  const uint64_t queued = self->libuvQueuedBytes();
  if (queued < self->stall_queued_bytes_) self->stall_progress_ms_ = now_ms;  // the peer read
  self->stall_queued_bytes_ = queued;
  if (now_ms - self->stall_progress_ms_ < self->limits_.stall_timeout_ms) return;
  self->stall_watch_ = false;
  self->lost(Status::resourceExhausted(
      "stalled: the peer read none of the " + std::to_string(self->queuedBytes()) +
      " bytes owed to it for " + std::to_string(self->limits_.stall_timeout_ms) +
      " ms (stall_timeout_ms) while its requests were paused (write_queue_bytes_max " +
      std::to_string(self->limits_.write_queue_bytes_max) + ", pending_replies_max " +
      std::to_string(self->limits_.pending_replies_max) + ")"));
}

// --- Writing ----------------------------------------------------------------------------------

uint64_t FramedStream::queuedBytes() {
  const uint64_t in_tls = tls_ != nullptr ? tls_->pendingPlaintextBytes() : 0;
  return pending_bytes_ + output_.size() + in_tls + libuvQueuedBytes();
}

uint64_t FramedStream::bufferedBytes() {
  return queuedBytes() + held_.bytes() + decoder_.bufferedBytes();
}

void FramedStream::addPending(uint64_t replies, uint64_t bytes) {
  pending_replies_ += replies;
  pending_bytes_ += bytes;
  if (!delivering_) updateReading();  // inside deliver(), its loop checks the limits
}

void FramedStream::settlePending(uint64_t replies, uint64_t bytes) {
  TALLY_ASSERT(replies <= pending_replies_ && bytes <= pending_bytes_);
  pending_replies_ -= replies;
  pending_bytes_ -= bytes;
  // Resuming here may serve held frames; the caller queues its reply right after, so the
  // limits are checked against it once flushed.
  deliver();
}

void FramedStream::write(std::vector<uint8_t>&& bytes) {
  if (output_.empty()) {
    output_ = std::move(bytes);
  } else {
    output_.insert(output_.end(), bytes.begin(), bytes.end());
  }
}

void FramedStream::flush() {
  if (closing_ || output_.empty()) return;
  if (tls_ != nullptr) {
    if (tls_failed_) {
      output_.clear();
      return;
    }
    const Status written = tls_->write(output_);
    output_.clear();
    if (!written.isOk()) {
      if (written.code() == StatusCode::kResourceExhausted) {
        lost(Status::resourceExhausted("TLS: " + written.message()));
      } else {
        failTls(tlsFailure(*tls_, written, true));
      }
      return;
    }
    writeRaw(tls_->takeCiphertext());
  } else {
    writeRaw(std::exchange(output_, {}));
  }
  if (!closing_) deliver();
}

void FramedStream::writeRaw(std::vector<uint8_t>&& bytes) {
  if (closing_ || bytes.empty()) return;
  if (uv_stream_get_write_queue_size(stream()) == 0) {
    // Straight to the socket when nothing is queued before it: no write request, no callback
    // and no epoll_ctl in the next iteration. What does not fit goes through uv_write.
    uv_buf_t direct =
        uv_buf_init(reinterpret_cast<char*>(bytes.data()), static_cast<unsigned>(bytes.size()));
    const int written = uv_try_write(stream(), &direct, 1);
    if (written < 0 && written != UV_EAGAIN) {
      lost(uvStatus("write", written));
      return;
    }
    if (written > 0) {
      // What is left goes into a buffer of its own size: the write queue then holds what it
      // counts (uv_stream_get_write_queue_size), not the whole buffer the socket took most of.
      std::vector<uint8_t> rest(bytes.begin() + written, bytes.end());
      bytes.swap(rest);
    }
  }
  if (!bytes.empty()) {
    auto request = std::make_unique<WriteRequest>();
    request->bytes = std::move(bytes);
    request->stream = this;
    request->req.data = request.get();
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(request->bytes.data()),
                               static_cast<unsigned>(request->bytes.size()));
    if (int rc = uv_write(&request->req, stream(), &buf, 1, onWrite); rc != 0) {
      lost(uvStatus("write", rc));
      return;
    }
    (void)request.release();  // owned by the write callback now
  }
}

void FramedStream::onWrite(uv_write_t* req, int status) {
  std::unique_ptr<WriteRequest> owned(static_cast<WriteRequest*>(req->data));
  FramedStream* self = owned->stream;
  if (status == UV_ECANCELED || self->closing_) return;
  if (status != 0) {
    self->lost(uvStatus("write", status));
    return;
  }
  self->stall_progress_ms_ = uv_now(self->loop_);  // the peer took a whole write
  self->deliver();                                 // the queue drained a little: maybe resume
}

// --- Closing ----------------------------------------------------------------------------------

void FramedStream::lost(Status status) {
  if (closing_) return;
  close();
  handler_->onLost(this, status);
}

void FramedStream::shutdownThenClose() {
  if (closing_ || shutting_down_) return;
  flush();
  if (closing_ || shutting_down_) return;
  if (tls_ != nullptr && !tls_failed_) {
    tls_->close();  // close_notify, after everything written
    writeRaw(tls_->takeCiphertext());
    if (closing_) return;
  }
  beginShutdown();
}

void FramedStream::beginShutdown() {
  shutting_down_ = true;
  stall_watch_ = false;  // the timer becomes the linger wait
  held_.clear();         // requests not served by now never will be
  startLingering();
  if (closing_) return;
  auto request = std::make_unique<uv_shutdown_t>();
  request->data = this;
  if (uv_shutdown(request.get(), stream(), onShutdown) != 0) {
    close();
    return;
  }
  (void)request.release();  // owned by the shutdown callback now
}

bool FramedStream::ensureTimer() {
  if (linger_timer_initialized_) return true;
  if (uv_timer_init(loop_, &linger_timer_) != 0) return false;
  linger_timer_.data = this;
  linger_timer_initialized_ = true;
  return true;
}

void FramedStream::startLingering() {
  if (!ensureTimer()) {
    close();  // no bound on the wait: do not wait
    return;
  }
  linger_deadline_ms_ = uv_now(loop_) + limits_.linger_ms;
  const uint64_t first_ms = std::min(kLingerPollMs, limits_.linger_ms);
  if (uv_timer_start(&linger_timer_, onLingerTimer, first_ms, kLingerPollMs) != 0) {
    close();
    return;
  }
  if (!reading_) {
    if (uv_read_start(stream(), onAlloc, onRead) != 0) {
      close();
      return;
    }
    reading_ = true;
  }
}

void FramedStream::onReadWhileShuttingDown(ssize_t nread) {
  if (closing_ || nread >= 0) return;  // input after the shutdown is discarded
  if (nread != UV_EOF) {
    close();  // the peer is gone: nothing more can reach it
    return;
  }
  peer_ended_ = true;
  (void)uv_read_stop(stream());
  reading_ = false;
  if (shutdown_done_) close();
}

void FramedStream::onShutdown(uv_shutdown_t* req, int status) {
  std::unique_ptr<uv_shutdown_t> owned(req);
  auto* self = static_cast<FramedStream*>(owned->data);
  if (self->closing_) return;  // closed meanwhile (UV_ECANCELED)
  self->shutdown_done_ = true;
  // Everything queued is in the kernel and FIN follows it. Wait for the peer's end of stream
  // (it has read our last byte) unless it came already or the shutdown failed.
  if (status != 0 || self->peer_ended_) self->close();
}

void FramedStream::onLingerTimer(uv_timer_t* timer) {
  auto* self = static_cast<FramedStream*>(timer->data);
  if (uv_now(self->loop_) >= self->linger_deadline_ms_ ||
      (self->shutdown_done_ && self->peerHasEverything())) {
    self->close();
  }
}

bool FramedStream::peerHasEverything() {
  // SIOCOUTQ: bytes the peer has not acknowledged (TCP, FIN included) or not yet read (a Unix
  // socket). SIOCINQ: our unread input. With both 0 a close can make no RST that drops a reply,
  // so a peer that took every reply but keeps its end open does not hold the close for linger_ms.
  uv_os_fd_t fd = -1;
  if (uv_fileno(handle(), &fd) != 0) return false;
  int unacknowledged = 0;
  int unread = 0;
  return ::ioctl(fd, SIOCOUTQ, &unacknowledged) == 0 && unacknowledged == 0 &&
         ::ioctl(fd, SIOCINQ, &unread) == 0 && unread == 0;
}

void FramedStream::close() {
  if (closing_) return;
  if (tls_ != nullptr && !tls_failed_ && tls_->handshakeDone() && initialized_ && !shutting_down_ &&
      uv_stream_get_write_queue_size(stream()) == 0) {
    // close_notify if the socket takes it now; a close does not wait.
    tls_->close();
    std::vector<uint8_t> notify = tls_->takeCiphertext();
    uv_buf_t buf =
        uv_buf_init(reinterpret_cast<char*>(notify.data()), static_cast<unsigned>(notify.size()));
    if (!notify.empty()) (void)uv_try_write(stream(), &buf, 1);
  }
  closing_ = true;
  reading_ = false;
  stall_watch_ = false;
  held_.clear();
  if (!initialized_) return;
  handles_closing_ = 1;
  if (linger_timer_initialized_) {
    ++handles_closing_;
    uv_close(reinterpret_cast<uv_handle_t*>(&linger_timer_), onClose);
  }
  uv_close(handle(), onClose);
}

void FramedStream::onClose(uv_handle_t* handle) {
  auto* self = static_cast<FramedStream*>(handle->data);
  if (--self->handles_closing_ > 0) return;  // the stream's and the linger timer's
  self->closed_ = true;
  self->handler_->onClosed(self);  // may destroy self
}

}  // namespace tally::net
