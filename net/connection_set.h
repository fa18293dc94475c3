#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "core/limits.h"
#include "net/connection_limits.h"
#include "net/framed_stream.h"

// The accept path every server of the length-framed protocol shares (tally-ledger's Server and
// StandbyServer, tally-agent's GatewayServer), and the global bounds on its connections:
//
//  * connections_max: connections served at once. The connection past it is refused.
//  * buffered_bytes_max: the bytes every connection holds together (FramedStream::
//    bufferedBytes(): replies owed, requests read and not served, incomplete frames). While the
//    sum is at or above it, new connections are refused; the ones open keep being served (each
//    within its own StreamLimits), so the sum is bounded by connections_max times the
//    per-connection bound and stops growing by admission once it reaches buffered_bytes_max.
//  * While the owner stops (`stopping`), every new connection is refused.
//
// A refusal is logged (warn "connection_refused" with the reason; at most one line per second,
// counting the refusals since the last) and said to the peer: on a plaintext server, one
// ErrorReply UNAVAILABLE under request id 0 ("too many connections … retry later"), then end of
// stream; on a TLS server (refusal_frame = false) the connection is closed without a word, since
// a plaintext frame would read as a peer without TLS. Either way the refused connection is shut
// down at once, lingers at most kRefusedLingerMs and never reaches the owner's onFrame; it stays
// registered (the owner's onClosed frees it, as any other) but counts against no bound.
//
// Owns the connections (made by the owner's factory, of the owner's type, with the owner's
// handler); borrows `loop` and `logger`. Loop thread only.

namespace tally::net {

// How long a refused connection may wait for the peer to take the refusal (the lingering close).
inline constexpr uint64_t kRefusedLingerMs = 200;
// Descriptors a daemon keeps for itself beyond its connections (listeners, store, logs, TLS
// files, the metrics listener and its clients, libuv's own): connectionsMaxFor() keeps them free.
inline constexpr uint64_t kDescriptorsReserved = 64;

struct ConnectionBounds {
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t buffered_bytes_max = kBufferedBytesMaxDefault;
  // false on a TLS server: refuse by closing, without the plaintext error frame.
  bool refusal_frame = true;
};

// connections_max as configured, lowered so that it and kDescriptorsReserved fit under the soft
// RLIMIT_NOFILE (`fd_soft_limit`, after common/fd_limit.h raised it): a daemon refuses cleanly at
// its own bound instead of failing accept() with EMFILE. At least 1.
uint64_t connectionsMaxFor(uint64_t configured, uint64_t fd_soft_limit);
// connectionsMaxFor(configured, this process's soft RLIMIT_NOFILE now); logs a warning
// ("connections_max_lowered", naming both) when that is lower than configured.
uint64_t connectionsMaxForThisProcess(uint64_t configured, Logger* logger);

class ConnectionSet {
 public:
  // Makes the owner's connection (a FramedStream subclass, with the owner's handler) for `id`
  // with `limits` (the owner's, or a refusal's shorter linger).
  using Make = std::function<std::unique_ptr<FramedStream>(uint64_t id, const StreamLimits&)>;

  ConnectionSet(uv_loop_t* loop, Logger* logger, StreamLimits stream, ConnectionBounds bounds);
  ~ConnectionSet();
  ConnectionSet(const ConnectionSet&) = delete;
  ConnectionSet& operator=(const ConnectionSet&) = delete;

  // Accepts the next connection waiting on `listener` (call it from the listener's connection
  // callback). Returns it registered and open, not reading yet (the owner sets it up, e.g.
  // startTls, then startReading), or nullptr: the accept failed (logged "accept_failed") or the
  // connection was refused (above).
  FramedStream* accept(uv_stream_t* listener, const Make& make, bool stopping);

  // The connection `id` if it is registered (refused ones included), else nullptr.
  FramedStream* find(uint64_t id) const;
  // Forgets (frees) connection `id`: the owner's StreamHandler::onClosed calls it.
  void erase(uint64_t id);
  // Every registered connection, refused ones included (to stop reading, close, …).
  std::vector<FramedStream*> all() const;
  bool empty() const { return connections_.empty(); }
  // Connections served: registered and not refused.
  uint64_t served() const { return connections_.size() - refused_open_; }
  // The sum of bufferedBytes() over every registered connection.
  uint64_t bufferedBytes() const;
  uint64_t refusedTotal() const { return refused_total_; }
  const ConnectionBounds& bounds() const { return bounds_; }

 private:
  struct Entry {
    std::unique_ptr<FramedStream> stream;
    bool refused = false;
  };
  // Why a new connection is refused now, or "" if it is admitted.
  std::string refusalReason(bool stopping) const;
  void refuse(FramedStream* stream, const std::string& reason);

  uv_loop_t* loop_;
  Logger* logger_;
  StreamLimits stream_;
  ConnectionBounds bounds_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> connections_;
  uint64_t refused_open_ = 0;   // registered, refused, not closed yet
  uint64_t refused_total_ = 0;  // since start
  uint64_t refused_unlogged_ = 0;
  uint64_t refusal_logged_ms_ = 0;
  bool refusal_ever_logged_ = false;
};

}  // namespace tally::net
