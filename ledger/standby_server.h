#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/log.h"
#include "core/limits.h"
#include "core/status.h"
#include "net/connection_set.h"
#include "net/framed_stream.h"
#include "net/tls_session.h"
#include "wire/codec.h"
#include "wire/frame.h"

// A standby tally-ledger's network shell (docs/scale-out.md "A standby"): while it waits for the
// writer's lease it listens on its configured address and answers every request with
// NOT_PRIMARY, naming the lease holder's address ("not the primary; the primary is
// 10.0.0.5:7411"), so that agents and tallyctl move on to the primary at once instead of
// waiting on a refused connection. It holds no ledger state and decides nothing: every
// request, of any kind, gets that one answer under its own request id.
//
// handOver() gives the listening socket to the Server that serves once the lease is taken:
// connections not yet accepted wait in its backlog through the store's load (none is refused),
// the ones this server accepted are closed (their clients reconnect and reach the new primary).
//
// Owns its handles and connections; borrows `loop` and `logger`. Single-threaded (the loop
// thread). Once start() was called, stop() or handOver() must run and the loop must close the
// handles before the destructor.

namespace tally::ledger {

struct StandbyServerOptions {
  int listen_fd = -1;  // a bound, listening TCP socket (adopted: closed by stop/handOver)
  net::StreamLimits stream;
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t buffered_bytes_max = net::kBufferedBytesMaxDefault;
  // Set: connections speak TLS through a session this makes (ledger/link_tls.h
  // standbyTlsSessions), as the primary's do. Unset: plaintext (--insecure).
  std::function<Result<std::unique_ptr<net::TlsSession>>()> tls;
};

class StandbyServer : private net::StreamHandler {
 public:
  StandbyServer(uv_loop_t* loop, Logger* logger, StandbyServerOptions options);
  ~StandbyServer();
  StandbyServer(const StandbyServer&) = delete;
  StandbyServer& operator=(const StandbyServer&) = delete;

  [[nodiscard]] Status start();
  // The primary's address as the lease names it (refreshed by the owner at each poll).
  void setPrimary(const std::string& address) { primary_ = address; }
  // Closes every connection and the listener; returns a descriptor of the same listening
  // socket (a dup, still listening: its backlog is kept) for the Server, or -1 on failure.
  int handOver();
  void stop();
  uint64_t connections() const { return connections_.served(); }
  uint64_t answered() const { return answered_; }

  class Connection;

 private:
  static void onConnection(uv_stream_t* listener, int status);
  void accept();
  void onFrame(net::FramedStream* stream, wire::Frame&& frame) override;
  void onBadFrame(net::FramedStream* stream, const Status& status) override;
  void onLost(net::FramedStream* stream, const Status& status) override;
  void onClosed(net::FramedStream* stream) override;
  void answer(net::FramedStream* stream, const wire::Response& response);

  uv_loop_t* loop_;
  Logger* logger_;
  StandbyServerOptions options_;
  uv_tcp_t listener_{};
  bool listener_open_ = false;
  std::string primary_;
  uint64_t answered_ = 0;
  net::ConnectionSet connections_;
};

// A TCP socket bound to HOST:PORT (IPv4; port 0 picks one) and listening, for the ledger to
// serve on: bound before the lease is taken, so that the lease names the real port. Its port is
// written to *bound_port.
Result<int> bindListeningSocket(const std::string& host, uint16_t port, uint16_t* bound_port);

// A standby's /metrics: tally_ledger_standby 1, its connections and the NOT_PRIMARY answers it
// gave (a primary's /metrics has tally_ledger_standby 0 and everything else).
std::string renderStandbyMetrics(const StandbyServer& standby);

}  // namespace tally::ledger
