#pragma once

#include <uv.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "central-client/ledger_addresses.h"
#include "common/log.h"
#include "core/limits.h"
#include "core/link_health.h"
#include "core/status.h"
#include "net/tls_session.h"
#include "wire/codec.h"
#include "wire/frame.h"

// The agent's asynchronous link to the central ledger (SPEC §7): one TCP connection on one
// libuv loop, many pipelined requests multiplexed over it by request id.
//
//  * call() sends at once when connected (frames written once per loop iteration, so a burst of
//    calls costs one write); when not connected it fails at once with kUnavailable. Nothing is
//    queued or retried here: the agent decides what to retry, always with the original
//    reservation id (SPEC §5).
//  * Every request has a deadline (request_timeout_ms). Unanswered by then, it fails with
//    kUnavailable: the ledger may or may not have applied it. A late answer is dropped.
//  * Losing the connection fails every pending request (kUnavailable, outcome unknown) and
//    reconnects with exponential backoff and jitter. An answer that cannot be decoded, or that
//    names a request id never sent, closes the connection the same way.
//  * The LinkHealthMonitor is fed a success (with the measured latency) per answer, a late
//    answer as slowness, a timeout (a failure only if nothing answered while it waited), and a
//    failure per connection loss and failed connect; a periodic tick lets time alone partition.
//    Health transitions are logged (warn "ledger_link_health") and reported to the callback.
//
// Ownership: owns its handles, connections and write buffers; borrows `loop` and `logger`, which
// must outlive it. Single-threaded: every method runs on the loop thread. Each `done` is called
// exactly once, on the loop thread, never from inside call(); callbacks may call call() and
// stop(), but must not destroy the link. Once start() was called (even if it failed), stop()
// must run and `on_closed` must have been called before the destructor. call() after
// `on_closed` is a bug.

namespace tally::central {

struct LedgerLinkOptions {
  std::string host = "127.0.0.1";  // an IPv4/IPv6 literal, or a name resolved at each connect
  uint16_t port = 7411;
  // More addresses of the same ledger (its standbys: `--ledger H:P,H:P`), tried after host:port
  // in turn (client::AddressRotation): at a failed connect or a lost connection the next one,
  // at a NOT_PRIMARY answer the primary it names.
  std::vector<client::Endpoint> also;
  uint64_t request_timeout_ms = 2'000;  // a request unanswered this long fails (outcome unknown)
  uint64_t connect_timeout_ms = 1'000;
  uint64_t reconnect_backoff_initial_ms = 50;
  uint64_t reconnect_backoff_max_ms = 5'000;  // exponential with jitter
  uint64_t requests_in_flight_max = 65'536;   // beyond: fail fast with kResourceExhausted
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  LinkHealthThresholds health;
  uint64_t seed = 0;  // jitter PRNG seed (0: from time) — the link's only randomness
  uint64_t health_tick_ms = 100;
  // Set: each connection speaks TLS through a client session this makes (the gateway key, the
  // pinned ledger keys); a refused or failed session drops the connection with a reason that
  // starts "TLS: " (logged as ledger_link_lost). Unset: plaintext (--insecure).
  std::function<Result<std::unique_ptr<net::TlsSession>>()> tls;
};

struct LinkResult {
  // ok: `response` is the ledger's answer. Otherwise kUnavailable (not connected, connection
  // lost, timeout, stopping): the ledger may or may not have applied the request;
  // kResourceExhausted (too many requests in flight, request larger than a frame): not sent.
  Status status;
  wire::Response response;
  uint64_t latency_us = 0;
};

// Counters for metrics; monotonic since construction.
struct LedgerLinkStats {
  uint64_t calls = 0;
  uint64_t answered = 0;
  uint64_t timeouts = 0;
  uint64_t failed_not_connected = 0;
  uint64_t failed_in_flight = 0;  // sent, then failed by a connection loss or stop()
  uint64_t failed_exhausted = 0;
  uint64_t late_answers = 0;  // answers that arrived after their request timed out
  uint64_t connects = 0;
  uint64_t connect_failures = 0;
  uint64_t connections_lost = 0;
  uint64_t protocol_errors = 0;
  uint64_t not_primary_answers = 0;  // answers NOT_PRIMARY (a standby): the link moved on
};

class LedgerLink {
 public:
  LedgerLink(uv_loop_t* loop, LedgerLinkOptions options, Logger* logger);
  ~LedgerLink();
  LedgerLink(const LedgerLink&) = delete;
  LedgerLink& operator=(const LedgerLink&) = delete;

  // Initializes the handles and begins connecting (returns at once). Errors only for invalid
  // options or a failing libuv call; then stop() still has to run.
  [[nodiscard]] Status start();
  // Fails pending calls (kUnavailable "stopping"), closes every handle, then calls `on_closed`
  // on the loop thread (inside stop() itself if nothing was ever opened). A second stop() only
  // adds its callback.
  void stop(std::function<void()> on_closed);

  void call(wire::RequestBody&& body, std::function<void(LinkResult&&)> done);

  bool connected() const { return state_ == State::kConnected; }
  LinkHealth health() const { return monitor_.state(); }
  const LinkHealthMonitor& monitor() const { return monitor_; }
  void setOnHealthChange(std::function<void(LinkHealth previous, LinkHealth now)> callback) {
    on_health_change_ = std::move(callback);
  }
  void setOnConnected(std::function<void()> callback) { on_connected_ = std::move(callback); }

  size_t inFlight() const { return pending_.size(); }
  // The address the link uses now (or tries next), "HOST:PORT".
  std::string currentAddress() const { return client::endpointName(rotation_.current()); }
  const LedgerLinkStats& stats() const { return stats_; }

  class Connection;

 private:
  enum class State : uint8_t {
    kIdle,        // constructed, start() not called
    kResolving,   // host name lookup in flight
    kConnecting,  // TCP connect in flight, connect timer running
    kConnected,
    kBackoff,  // waiting for the reconnect timer
    kStopping,
    kStopped,
  };

  struct Pending {
    std::function<void(LinkResult&&)> done;
    uint64_t deadline_ms = 0;  // loop time
    uint64_t sent_ns = 0;      // uv_hrtime at call()
  };

  // Handles owned for the link's lifetime; each closed once by stop().
  Status initHandle(uv_handle_t* handle, int rc, const char* what);
  void closeHandle(uv_handle_t* handle);

  void beginConnect();
  static void onResolved(uv_getaddrinfo_t* req, int status, addrinfo* result);
  void connectTo(const sockaddr* address);
  void onConnect(Connection* connection, const Status& status);
  static void onConnectTimer(uv_timer_t* timer);
  void connectFailed(const std::string& error);
  void scheduleReconnect();
  uint64_t nextBackoffMs();

  // Handles one answer; false when the connection is gone or the link is stopping.
  bool onFrame(Connection* connection, const wire::Frame& frame);
  void protocolError(const std::string& error);
  // The current address answered NOT_PRIMARY: no answer on this connection is the ledger's;
  // every pending request fails (kUnavailable, outcome unknown) and the link moves on.
  void notPrimary(const std::string& message);
  // Closes the current connection and fails every pending request with kUnavailable `reason`.
  void dropConnection(const std::string& reason);
  void closeConnection();
  void failAllPending(const std::string& reason);

  static void onFlush(uv_handle_t* handle);
  void flush();
  static void onDeadlineTimer(uv_timer_t* timer);
  void armDeadlineTimer();
  static void onHealthTick(uv_timer_t* timer);
  void noteHealth();

  // Delivers `result` to `done` on a later loop iteration (for results known inside call()).
  void defer(std::function<void(LinkResult&&)> done, LinkResult result);
  static void onIdle(uv_idle_t* idle);
  void drainDeferred();
  void maybeFinishStop();

  uint64_t nowMs() const { return uv_now(loop_); }

  uv_loop_t* loop_;
  LedgerLinkOptions options_;
  Logger* logger_;
  LinkHealthMonitor monitor_;
  LinkHealth reported_health_;
  std::mt19937_64 rng_;
  State state_ = State::kIdle;
  LedgerLinkStats stats_;

  uv_timer_t health_timer_{};
  uv_timer_t deadline_timer_{};
  uv_timer_t connect_timer_{};         // connect timeout while kConnecting, backoff while kBackoff
  uv_prepare_t prepare_{};             // flushes writes queued before the loop polls
  uv_check_t check_{};                 // flushes writes queued by the poll phase's callbacks
  uv_idle_t idle_{};                   // active while deferred results wait
  std::vector<uv_handle_t*> handles_;  // initialized fixed handles, closed by stop()
  int open_handles_ = 0;               // fixed handles and connections not yet closed
  uv_getaddrinfo_t resolve_req_{};
  bool resolving_ = false;
  uint64_t resolve_rotation_ = 0;  // which resolved address the next attempt uses

  std::unique_ptr<Connection> connection_;            // the current one (connecting or connected)
  std::vector<std::unique_ptr<Connection>> closing_;  // freed by their close callbacks
  uint64_t next_connection_id_ = 1;
  uint32_t backoff_attempt_ = 0;
  client::AddressRotation rotation_;
  bool since_not_primary_ =
      false;  // no answer from a primary since a NOT_PRIMARY: keep backing off

  uint64_t next_request_id_ = 1;
  // By request id. Ids grow with loop time and the timeout is one constant, so the first entry
  // always has the earliest deadline.
  std::map<uint64_t, Pending> pending_;
  wire::EncodeScratch scratch_;  // first segment of every request's encoding
  std::deque<std::pair<std::function<void(LinkResult&&)>, LinkResult>> deferred_;

  std::function<void(LinkHealth, LinkHealth)> on_health_change_;
  std::function<void()> on_connected_;
  std::vector<std::function<void()>> on_closed_;
};

}  // namespace tally::central
