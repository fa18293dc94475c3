#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

// A fault-injecting TCP proxy for integration tests, on 127.0.0.1 only: a client (an agent)
// connects to the proxy's port, the proxy connects to an upstream port (a ledger) and forwards
// both ways, frame by frame (4-byte little-endian length, then that many bytes; wire/frame.h).
// Because it cuts at frame boundaries, the faults it injects keep both byte streams well framed:
//
//  * dropNextReplies(k) / dropRepliesAfter(n, k): whole response frames (upstream → client) are
//    swallowed, so the client sees a lost answer although the upstream applied the request.
//    An optional predicate picks which frames count (e.g. the reply about one reservation id).
//  * blackhole(true): connections are still accepted, but no frame passes in either direction
//    (frames that complete while blackholed are discarded) and no new upstream connection is
//    made until blackhole(false).
//  * severAll(): closes every proxied connection, both sides.
//  * setUpstreamPort(): later connections go to another port (a restarted ledger), so clients
//    keep one stable address.
//
// The proxy runs on its own thread with a poll() loop; every control call is thread-safe and
// takes effect before the loop handles its next event (a wake-up pipe interrupts poll). The
// destructor (or stop()) closes every socket and joins the thread. Upstream connects are
// blocking connects to 127.0.0.1 (immediate on loopback: accepted or refused).

namespace tally::testing {

struct FaultProxyCounters {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t upstream_connect_failures = 0;
  uint64_t requests_forwarded = 0;  // client → upstream frames
  uint64_t requests_dropped = 0;    // client → upstream frames discarded (blackhole)
  uint64_t replies_forwarded = 0;   // upstream → client frames
  uint64_t replies_dropped = 0;     // upstream → client frames swallowed (drops or blackhole)
};

class FaultProxy {
 public:
  // Decides whether a reply frame (its payload, without the length) is one the drop rules
  // count. Called on the proxy thread.
  using ReplyMatcher = std::function<bool(std::span<const uint8_t> payload)>;

  // Listens on 127.0.0.1:`listen_port` (0: any free port) and forwards to 127.0.0.1:
  // `upstream_port`. Throws std::runtime_error if it cannot listen.
  explicit FaultProxy(uint16_t upstream_port, uint16_t listen_port = 0);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  void setUpstreamPort(uint16_t port);
  // Swallow the next `k` reply frames (that `matcher` accepts, if given).
  void dropNextReplies(uint64_t k, ReplyMatcher matcher = nullptr);
  // Forward the next `n` reply frames, then swallow the following `k` (default: all of them,
  // until clearFaults()). Only frames `matcher` accepts count, if given.
  void dropRepliesAfter(uint64_t n, uint64_t k = UINT64_MAX, ReplyMatcher matcher = nullptr);
  // Cancels pending drops (not the blackhole).
  void clearFaults();
  void blackhole(bool on);
  // Closes every proxied connection now (returns once they are closed).
  void severAll();

  FaultProxyCounters counters() const;
  // Reply frames still to be dropped under the current rule (0 when none).
  uint64_t dropsPending() const;

  // Closes everything and joins the thread; idempotent.
  void stop();

 private:
  struct State;
  struct Connection;

  void run();
  void wake();

  uint16_t port_ = 0;
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;
  int wake_write_fd_ = -1;
  std::unique_ptr<State> state_;  // guarded by its mutex
  std::thread thread_;
};

}  // namespace tally::testing
