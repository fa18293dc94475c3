#include "central-client/ledger_link.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <span>

#include "core/assert.h"
#include "net/framed_stream.h"

namespace tally::central {

// One TCP connection to the ledger (a client FramedStream: always read, never pushed back),
// from connect until its close callback. The link holds the current one in connection_ and
// closing ones in closing_; write and connect callbacks, which libuv runs before the close
// callback, may still use it. It forwards what its stream reports to the link.
class LedgerLink::Connection final : public net::StreamHandler {
 public:
  Connection(LedgerLink* link, uint64_t id, uint64_t frame_bytes_max)
      : link_(link),
        stream_(link->loop_, net::StreamKind::kTcp, this,
                net::StreamLimits{.frame_bytes_max = frame_bytes_max, .backpressure = false}, id) {}

  void onFrame(net::FramedStream*, wire::Frame&& frame) override {
    if (link_->connection_.get() == this) (void)link_->onFrame(this, frame);
  }
  void onBadFrame(net::FramedStream*, const Status& status) override {
    if (link_->connection_.get() == this) link_->protocolError("bad frame: " + status.toString());
  }
  void onLost(net::FramedStream*, const Status& status) override {
    if (link_->connection_.get() != this) return;
    link_->dropConnection(status.code() == StatusCode::kUnavailable
                              ? std::string("the ledger closed the connection")
                              : status.message());
  }
  void onConnected(net::FramedStream*, const Status& status) override {
    if (status.isOk() && link_->options_.tls) {
      if (Status started = startTls(); !started.isOk()) {
        link_->onConnect(this, started);
        return;
      }
    }
    link_->onConnect(this, status);
  }
  // TLS from the first byte: requests written from here on wait in the session until its
  // handshake is done.
  Status startTls() {
    Result<std::unique_ptr<net::TlsSession>> session = link_->options_.tls();
    if (!session.isOk()) return Status::ioError("TLS session: " + session.status().message());
    stream_.startTls(std::move(session).value());
    return Status::ok();
  }
  void onClosed(net::FramedStream*) override {
    LedgerLink* link = link_;
    std::erase_if(link->closing_, [this](const auto& c) { return c.get() == this; });  // frees
    --link->open_handles_;
    link->maybeFinishStop();
  }

  uint64_t id() const { return stream_.id(); }

  LedgerLink* link_;
  net::FramedStream stream_;
  bool connected_ = false;
};

namespace {

constexpr unsigned kKeepAliveDelaySeconds = 30;
constexpr uint32_t kBackoffShiftMax = 30;

uint64_t seedFromTime() { return uv_hrtime() ^ 0x9e3779b97f4a7c15ull; }

std::string uvError(const char* what, int rc) { return std::string(what) + ": " + uv_strerror(rc); }

std::vector<client::Endpoint> addressesOf(const LedgerLinkOptions& options) {
  std::vector<client::Endpoint> addresses{client::Endpoint{
      .kind = client::Endpoint::Kind::kTcp, .host = options.host, .port = options.port}};
  for (const client::Endpoint& more : options.also) {
    if (std::find(addresses.begin(), addresses.end(), more) == addresses.end()) {
      addresses.push_back(more);
    }
  }
  return addresses;
}

}  // namespace

LedgerLink::LedgerLink(uv_loop_t* loop, LedgerLinkOptions options, Logger* logger)
    : loop_(loop),
      options_(std::move(options)),
      logger_(logger),
      monitor_(options_.health, uv_now(loop)),
      reported_health_(monitor_.state()),
      rng_(options_.seed != 0 ? options_.seed : seedFromTime()),
      rotation_(addressesOf(options_), /*follow_unlisted=*/true) {
  for (uv_handle_t* handle :
       {reinterpret_cast<uv_handle_t*>(&health_timer_),
        reinterpret_cast<uv_handle_t*>(&deadline_timer_),
        reinterpret_cast<uv_handle_t*>(&connect_timer_), reinterpret_cast<uv_handle_t*>(&prepare_),
        reinterpret_cast<uv_handle_t*>(&check_), reinterpret_cast<uv_handle_t*>(&idle_)}) {
    handle->data = this;
  }
  resolve_req_.data = this;
}

LedgerLink::~LedgerLink() {
  // stop() must have finished: every handle closed, no lookup in flight.
  TALLY_ASSERT(open_handles_ == 0);
  TALLY_ASSERT(!resolving_);
  TALLY_ASSERT(state_ == State::kIdle || state_ == State::kStopped);
}

// --- Start and stop ---------------------------------------------------------------------------

Status LedgerLink::initHandle(uv_handle_t* handle, int rc, const char* what) {
  if (rc != 0) return Status::ioError(uvError(what, rc));
  handle->data = this;
  handles_.push_back(handle);
  ++open_handles_;
  return Status::ok();
}

Status LedgerLink::start() {
  TALLY_ASSERT(state_ == State::kIdle && handles_.empty());
  if (options_.host.empty()) return Status::invalidArgument("ledger link: empty host");
  if (options_.port == 0) return Status::invalidArgument("ledger link: port 0");
  if (options_.request_timeout_ms == 0 || options_.connect_timeout_ms == 0 ||
      options_.requests_in_flight_max == 0 || options_.health_tick_ms == 0 ||
      options_.frame_bytes_max < wire::kFrameHeaderBytes) {
    return Status::invalidArgument(
        "ledger link: request_timeout_ms, connect_timeout_ms, requests_in_flight_max, "
        "health_tick_ms and frame_bytes_max must be positive");
  }
  if (options_.reconnect_backoff_max_ms < options_.reconnect_backoff_initial_ms) {
    return Status::invalidArgument(
        "ledger link: reconnect_backoff_max_ms is below reconnect_backoff_initial_ms");
  }
  auto as_handle = [](auto* handle) { return reinterpret_cast<uv_handle_t*>(handle); };
  if (Status s = initHandle(as_handle(&health_timer_), uv_timer_init(loop_, &health_timer_),
                            "uv_timer_init");
      !s.isOk()) {
    return s;
  }
  if (Status s = initHandle(as_handle(&deadline_timer_), uv_timer_init(loop_, &deadline_timer_),
                            "uv_timer_init");
      !s.isOk()) {
    return s;
  }
  if (Status s = initHandle(as_handle(&connect_timer_), uv_timer_init(loop_, &connect_timer_),
                            "uv_timer_init");
      !s.isOk()) {
    return s;
  }
  if (Status s =
          initHandle(as_handle(&prepare_), uv_prepare_init(loop_, &prepare_), "uv_prepare_init");
      !s.isOk()) {
    return s;
  }
  if (Status s = initHandle(as_handle(&check_), uv_check_init(loop_, &check_), "uv_check_init");
      !s.isOk()) {
    return s;
  }
  if (Status s = initHandle(as_handle(&idle_), uv_idle_init(loop_, &idle_), "uv_idle_init");
      !s.isOk()) {
    return s;
  }
  if (int rc = uv_timer_start(&health_timer_, onHealthTick, options_.health_tick_ms,
                              options_.health_tick_ms);
      rc != 0) {
    return Status::ioError(uvError("uv_timer_start", rc));
  }
  if (int rc = uv_prepare_start(
          &prepare_, [](uv_prepare_t* h) { onFlush(reinterpret_cast<uv_handle_t*>(h)); });
      rc != 0) {
    return Status::ioError(uvError("uv_prepare_start", rc));
  }
  if (int rc = uv_check_start(&check_,
                              [](uv_check_t* h) { onFlush(reinterpret_cast<uv_handle_t*>(h)); });
      rc != 0) {
    return Status::ioError(uvError("uv_check_start", rc));
  }
  // The loop's clock may be stale (the owner may have done slow work since it last ran): the
  // monitor starts from the real now, so startup time does not count as time without success.
  uv_update_time(loop_);
  monitor_ = LinkHealthMonitor(options_.health, nowMs());
  logger_->info("ledger_link_starting",
                {{"ledger", currentAddress()},
                 {"addresses", client::ledgerAddressesName(addressesOf(options_))}});
  beginConnect();
  return Status::ok();
}

void LedgerLink::stop(std::function<void()> on_closed) {
  if (state_ == State::kStopped) {
    if (on_closed) on_closed();
    return;
  }
  if (on_closed) on_closed_.push_back(std::move(on_closed));
  if (state_ == State::kStopping) return;
  state_ = State::kStopping;
  if (resolving_) {
    // A lookup already running cannot be cancelled; its callback arrives later either way.
    (void)uv_cancel(reinterpret_cast<uv_req_t*>(&resolve_req_));
  }
  if (connection_ != nullptr) closeConnection();
  for (uv_handle_t* handle : handles_) closeHandle(handle);
  handles_.clear();
  failAllPending("stopping");
  maybeFinishStop();
}

void LedgerLink::closeHandle(uv_handle_t* handle) {
  uv_close(handle, [](uv_handle_t* closed) {
    auto* link = static_cast<LedgerLink*>(closed->data);
    --link->open_handles_;
    link->maybeFinishStop();
  });
}

void LedgerLink::maybeFinishStop() {
  if (state_ != State::kStopping || open_handles_ > 0 || resolving_) return;
  // Results deferred by call() are delivered here, from a close callback: never inside call().
  while (!deferred_.empty()) drainDeferred();
  state_ = State::kStopped;
  logger_->info("ledger_link_stopped", {{"calls", stats_.calls}});
  std::vector<std::function<void()>> callbacks = std::exchange(on_closed_, {});
  for (auto& callback : callbacks) callback();
}

// --- Connecting ---------------------------------------------------------------------------------

void LedgerLink::beginConnect() {
  if (state_ == State::kStopping || state_ == State::kStopped) return;
  sockaddr_storage address{};
  auto* in4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
  const client::Endpoint target = rotation_.current();
  if (uv_ip4_addr(target.host.c_str(), target.port, in4) == 0 ||
      uv_ip6_addr(target.host.c_str(), target.port, in6) == 0) {
    connectTo(reinterpret_cast<const sockaddr*>(&address));
    return;
  }
  // A name: looked up at each attempt, so a moved ledger is found again.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(target.port);
  state_ = State::kResolving;
  if (int rc = uv_getaddrinfo(loop_, &resolve_req_, onResolved, target.host.c_str(), port.c_str(),
                              &hints);
      rc != 0) {
    connectFailed(uvError("resolve host", rc));
    return;
  }
  resolving_ = true;
}

void LedgerLink::onResolved(uv_getaddrinfo_t* req, int status, addrinfo* result) {
  auto* link = static_cast<LedgerLink*>(req->data);
  link->resolving_ = false;
  if (link->state_ == State::kStopping) {
    uv_freeaddrinfo(result);
    link->maybeFinishStop();
    return;
  }
  if (status != 0 || result == nullptr) {
    uv_freeaddrinfo(result);
    link->connectFailed(uvError("resolve host", status != 0 ? status : UV_EAI_NONAME));
    return;
  }
  // Successive attempts rotate through the addresses (e.g. ::1 and 127.0.0.1 for localhost).
  std::vector<const addrinfo*> addresses;
  for (const addrinfo* a = result; a != nullptr; a = a->ai_next) {
    if (a->ai_addr != nullptr) addresses.push_back(a);
  }
  if (addresses.empty()) {
    uv_freeaddrinfo(result);
    link->connectFailed("resolve host: no address");
    return;
  }
  link->connectTo(addresses[link->resolve_rotation_++ % addresses.size()]->ai_addr);
  uv_freeaddrinfo(result);
}

void LedgerLink::connectTo(const sockaddr* address) {
  auto connection =
      std::make_unique<Connection>(this, next_connection_id_++, options_.frame_bytes_max);
  if (Status s = connection->stream_.init(); !s.isOk()) {
    connectFailed(s.message());
    return;
  }
  ++open_handles_;
  connection_ = std::move(connection);
  state_ = State::kConnecting;
  if (Status s = connection_->stream_.connect(address); !s.isOk()) {
    connectFailed(s.message());
    return;
  }
  const int rc = uv_timer_start(&connect_timer_, onConnectTimer, options_.connect_timeout_ms, 0);
  TALLY_ASSERT(rc == 0);  // fails only on a closing handle, and we are not stopping
}

void LedgerLink::onConnect(Connection* connection, const Status& status) {
  // Closed by a timeout or stop (the stream then reports nothing), or superseded.
  if (connection != connection_.get()) return;
  if (!status.isOk()) {
    connectFailed(status.message());
    return;
  }
  (void)uv_timer_stop(&connect_timer_);
  // Both are optimizations: a failure leaves a working, if slower, connection.
  (void)uv_tcp_nodelay(connection->stream_.tcp(), 1);
  (void)uv_tcp_keepalive(connection->stream_.tcp(), 1, kKeepAliveDelaySeconds);
  connection->connected_ = true;
  state_ = State::kConnected;
  connection->stream_.startReading();  // a failure is reported as a lost connection
  if (connection != connection_.get()) return;
  if (!since_not_primary_) backoff_attempt_ = 0;  // a standby again: keep backing off
  ++stats_.connects;
  logger_->info("ledger_link_connected",
                {{"ledger", currentAddress()}, {"connection", connection->id()}});
  if (on_connected_) on_connected_();
}

void LedgerLink::onConnectTimer(uv_timer_t* timer) {
  auto* link = static_cast<LedgerLink*>(timer->data);
  if (link->state_ == State::kConnecting) {
    link->connectFailed("connect timed out after " +
                        std::to_string(link->options_.connect_timeout_ms) + " ms");
  } else if (link->state_ == State::kBackoff) {
    link->beginConnect();
  }
}

void LedgerLink::connectFailed(const std::string& error) {
  if (connection_ != nullptr) closeConnection();
  ++stats_.connect_failures;
  monitor_.onFailure(nowMs());
  logger_->warn(
      "ledger_link_connect_failed",
      {{"ledger", currentAddress()}, {"error", error}, {"attempt", backoff_attempt_ + 1}});
  rotation_.onUnreachable();
  noteHealth();
  scheduleReconnect();
}

uint64_t LedgerLink::nextBackoffMs() {
  const uint32_t shift = std::min(backoff_attempt_, kBackoffShiftMax);
  ++backoff_attempt_;
  const uint64_t initial = options_.reconnect_backoff_initial_ms;
  const uint64_t ceiling = options_.reconnect_backoff_max_ms;
  const uint64_t base =
      initial > (ceiling >> shift) ? ceiling : std::min(initial << shift, ceiling);
  // "Equal jitter": at least half the step, so a fleet of agents spreads out but never spins.
  const uint64_t half = base / 2;
  return base - half + (half == 0 ? 0 : rng_() % (half + 1));
}

void LedgerLink::scheduleReconnect() {
  if (state_ == State::kStopping || state_ == State::kStopped) return;
  state_ = State::kBackoff;
  const uint64_t delay_ms = nextBackoffMs();
  const int rc = uv_timer_start(&connect_timer_, onConnectTimer, delay_ms, 0);
  TALLY_ASSERT(rc == 0);
}

// --- Closing ----------------------------------------------------------------------------------

void LedgerLink::closeConnection() {
  TALLY_ASSERT(connection_ != nullptr);
  Connection* connection = connection_.get();
  connection->connected_ = false;
  closing_.push_back(std::move(connection_));
  (void)uv_timer_stop(&connect_timer_);
  connection->stream_.close();  // its close callback frees it
}

void LedgerLink::dropConnection(const std::string& reason) {
  if (connection_ == nullptr) return;
  const uint64_t id = connection_->id();
  closeConnection();
  ++stats_.connections_lost;
  monitor_.onFailure(nowMs());
  logger_->warn(
      "ledger_link_lost",
      {{"connection", id}, {"reason", reason}, {"pending_failed", uint64_t{pending_.size()}}});
  noteHealth();
  rotation_.onUnreachable();
  // Reconnecting first: callbacks run with the link already not connected.
  scheduleReconnect();
  failAllPending("connection to the ledger lost (" + reason + "); the outcome is unknown");
}

void LedgerLink::notPrimary(const std::string& message) {
  if (connection_ == nullptr) return;
  const std::string from = currentAddress();
  closeConnection();
  ++stats_.not_primary_answers;
  since_not_primary_ = true;
  monitor_.onFailure(nowMs());  // a standby is not the ledger: never a healthy link
  rotation_.onNotPrimary(message);
  logger_->warn("ledger_link_not_primary", {{"ledger", from},
                                            {"message", message},
                                            {"next", currentAddress()},
                                            {"pending_failed", uint64_t{pending_.size()}}});
  noteHealth();
  scheduleReconnect();
  // Nothing was applied there, but the request is not resent here: the agent retries it with
  // the same ids, as after any unknown outcome.
  failAllPending("the ledger at " + from + " is not the primary (" + message +
                 "); the outcome is unknown");
}

void LedgerLink::failAllPending(const std::string& reason) {
  std::map<uint64_t, Pending> failed = std::exchange(pending_, {});
  if (state_ != State::kStopping) (void)uv_timer_stop(&deadline_timer_);
  for (auto& [id, pending] : failed) {
    ++stats_.failed_in_flight;
    pending.done(LinkResult{.status = Status::unavailable(reason)});
  }
}

void LedgerLink::protocolError(const std::string& error) {
  ++stats_.protocol_errors;
  logger_->warn("ledger_link_bad_answer", {{"error", error}});
  dropConnection("malformed answer: " + error);
}

// --- Requests ---------------------------------------------------------------------------------

void LedgerLink::call(wire::RequestBody&& body, std::function<void(LinkResult&&)> done) {
  TALLY_ASSERT(state_ != State::kIdle && state_ != State::kStopped);
  TALLY_ASSERT(done != nullptr);
  ++stats_.calls;
  if (state_ == State::kStopping) {
    defer(std::move(done), LinkResult{.status = Status::unavailable("ledger link stopping")});
    return;
  }
  if (state_ != State::kConnected) {
    ++stats_.failed_not_connected;
    defer(std::move(done), LinkResult{.status = Status::unavailable(
                                          "not connected to the ledger at " + currentAddress())});
    return;
  }
  if (pending_.size() >= options_.requests_in_flight_max) {
    ++stats_.failed_exhausted;
    defer(std::move(done), LinkResult{.status = Status::resourceExhausted(
                                          "ledger link: requests_in_flight_max (" +
                                          std::to_string(options_.requests_in_flight_max) +
                                          ") requests in flight")});
    return;
  }
  const uint64_t id = next_request_id_++;
  // Encoded straight into the write buffer (unchanged when the request is too large).
  if (Status s = wire::encodeRequestFrameInto(
          wire::Request{.request_id = id, .body = std::move(body)}, connection_->stream_.output(),
          options_.frame_bytes_max, &scratch_);
      !s.isOk()) {
    ++stats_.failed_exhausted;
    defer(std::move(done), LinkResult{.status = std::move(s)});
    return;
  }
  pending_.emplace(id, Pending{.done = std::move(done),
                               .deadline_ms = nowMs() + options_.request_timeout_ms,
                               .sent_ns = uv_hrtime()});
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&deadline_timer_)) == 0) armDeadlineTimer();
}

void LedgerLink::onFlush(uv_handle_t* handle) { static_cast<LedgerLink*>(handle->data)->flush(); }

void LedgerLink::flush() {
  if (connection_ == nullptr || !connection_->connected_) return;
  connection_->stream_.flush();  // a write error is reported as a lost connection
}

bool LedgerLink::onFrame(Connection* connection, const wire::Frame& frame) {
  // Read where the caller gets it: a reservation reply is never moved on its way.
  LinkResult result{.status = Status::ok()};
  wire::Response& response = result.response;
  if (const Status decoded = wire::decodeResponse(frame, &response); !decoded.isOk()) {
    protocolError("undecodable response: " + decoded.toString());
    return false;
  }
  const uint64_t id = response.request_id;
  if (id == 0 || id >= next_request_id_) {
    // Id 0: the ledger could not read one of our envelopes, so our framing is suspect too.
    std::string detail;
    if (const auto* error = std::get_if<wire::ErrorReply>(&response.body)) {
      detail = std::string(" (") + wire::errorCodeName(error->code) + ": " + error->message + ")";
    }
    protocolError("answer under request id " + std::to_string(id) + ", which was never sent" +
                  detail);
    return false;
  }
  if (std::string message; client::isNotPrimary(response, &message)) {
    notPrimary(message);
    return false;
  }
  if (since_not_primary_) {  // a primary at last: the next reconnect starts from the first step
    since_not_primary_ = false;
    backoff_attempt_ = 0;
  }
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    ++stats_.late_answers;
    monitor_.onLateAnswer(nowMs());  // slow, not silent
    noteHealth();
    logger_->debug("ledger_link_late_answer", {{"request_id", id}});
    return true;
  }
  Pending pending = std::move(it->second);
  pending_.erase(it);
  const uint64_t latency_us = (uv_hrtime() - pending.sent_ns) / 1000;
  ++stats_.answered;
  monitor_.onSuccess(latency_us, nowMs());
  noteHealth();
  result.latency_us = latency_us;
  pending.done(std::move(result));
  // The callback may have stopped the link (closing this connection).
  return connection == connection_.get() && state_ == State::kConnected;
}

// --- Timers -----------------------------------------------------------------------------------

void LedgerLink::armDeadlineTimer() {
  if (state_ == State::kStopping || state_ == State::kStopped) return;
  if (pending_.empty()) {
    (void)uv_timer_stop(&deadline_timer_);
    return;
  }
  const uint64_t deadline_ms = pending_.begin()->second.deadline_ms;
  const uint64_t now_ms = nowMs();
  const int rc = uv_timer_start(&deadline_timer_, onDeadlineTimer,
                                deadline_ms > now_ms ? deadline_ms - now_ms : 0, 0);
  TALLY_ASSERT(rc == 0);
}

void LedgerLink::onDeadlineTimer(uv_timer_t* timer) {
  auto* link = static_cast<LedgerLink*>(timer->data);
  const uint64_t now_ms = link->nowMs();
  std::vector<std::function<void(LinkResult &&)>> expired;
  while (!link->pending_.empty() && link->pending_.begin()->second.deadline_ms <= now_ms) {
    const uint64_t sent_ms =
        link->pending_.begin()->second.deadline_ms - link->options_.request_timeout_ms;
    expired.push_back(std::move(link->pending_.begin()->second.done));
    link->pending_.erase(link->pending_.begin());
    ++link->stats_.timeouts;
    link->monitor_.onTimeout(sent_ms, now_ms);  // a failure only if nothing answered meanwhile
  }
  // Answers removed the front early: the timer fired for nothing and is simply re-armed.
  link->armDeadlineTimer();
  if (expired.empty()) return;
  link->logger_->warn("ledger_link_timeouts",
                      {{"requests", uint64_t{expired.size()}},
                       {"request_timeout_ms", link->options_.request_timeout_ms}});
  link->noteHealth();
  const std::string reason = "no answer from the ledger within " +
                             std::to_string(link->options_.request_timeout_ms) +
                             " ms; the outcome is unknown";
  for (auto& done : expired) done(LinkResult{.status = Status::unavailable(reason)});
}

void LedgerLink::onHealthTick(uv_timer_t* timer) {
  auto* link = static_cast<LedgerLink*>(timer->data);
  link->monitor_.tick(link->nowMs());
  link->noteHealth();
}

void LedgerLink::noteHealth() {
  const LinkHealth now = monitor_.state();
  if (now == reported_health_) return;
  const LinkHealth previous = std::exchange(reported_health_, now);
  logger_->warn("ledger_link_health",
                {{"from", linkHealthName(previous)},
                 {"to", linkHealthName(now)},
                 {"consecutive_failures", monitor_.consecutiveFailures()},
                 {"ms_since_success", nowMs() - std::min(nowMs(), monitor_.lastSuccessMs())}});
  if (on_health_change_) on_health_change_(previous, now);
}

// --- Deferred results -------------------------------------------------------------------------

void LedgerLink::defer(std::function<void(LinkResult&&)> done, LinkResult result) {
  deferred_.emplace_back(std::move(done), std::move(result));
  if (state_ == State::kStopping) return;  // delivered by maybeFinishStop()
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&idle_)) == 0) {
    const int rc = uv_idle_start(&idle_, onIdle);
    TALLY_ASSERT(rc == 0);
  }
}

void LedgerLink::onIdle(uv_idle_t* idle) {
  auto* link = static_cast<LedgerLink*>(idle->data);
  link->drainDeferred();
  if (link->deferred_.empty() && link->state_ != State::kStopping &&
      link->state_ != State::kStopped) {
    (void)uv_idle_stop(idle);
  }
}

void LedgerLink::drainDeferred() {
  auto batch = std::exchange(deferred_, {});
  for (auto& [done, result] : batch) done(std::move(result));
}

}  // namespace tally::central
