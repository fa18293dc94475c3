#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/wall_clock.h"
#include "core/ledger.h"
#include "core/ledger_requests.h"
#include "core/limits.h"
#include "core/link_authority.h"
#include "core/status.h"
#include "ledger/metrics.h"
#include "ledger/store.h"
#include "net/connection_set.h"
#include "net/framed_stream.h"
#include "net/tls_session.h"
#include "wire/codec.h"
#include "wire/frame.h"

// tally-ledger's network shell: a libuv TCP server around the core Ledger, with group commit.
//
// Every request is decoded, answered at once (in arrival order) by the core's LedgerRequests
// (core/ledger_requests.h: every decision about a request is made there, with one clock read
// per request), its events logged or counted, and its reply held in the open batch. A tick
// whose outcome changed() durable state joins the open batch too. At the end of each loop
// iteration, if no commit is in flight, the open batch is sealed: the Ledger's changed rows are
// copied into a StoreBatch and committed on a libuv worker thread; its replies are written only
// after the commit is durable. Requests that arrive meanwhile form the next batch. So no reply ever
// leaves before its mutation (and every mutation before it) is durable, and throughput does not
// fall to one fsync per request.
//
// A failed commit (I/O error, disk full) is fatal: memory is ahead of disk, so the server stops
// serving, sends none of that batch's replies, and reports fatal(); the process exits and a
// restart rebuilds from the durable record. Clients see a dropped connection (an unknown
// outcome) and retry with the same ids. Unless the owner says none of the batch can be durable
// (refused_answer: a deposed primary, whose fence rolled the transaction back): then every
// request held is answered that error and the server stops (refuse()).
//
// Owns its handles and connections; borrows `loop`, `ledger`, `store`, `clock` and `logger`,
// which must outlive it. Single-threaded: everything but Store::commit runs on the loop thread.

namespace tally::ledger {

struct ServerOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 7411;  // 0: pick a free port (see port())
  // A bound, listening socket to serve on instead of binding listen_host:listen_port (the
  // postgres store's, bound before the lease is taken; a standby's at takeover). Adopted.
  int listen_fd = -1;
  // Per connection: frame size, and the replies (count, bytes) a client may be owed before it
  // is neither read nor served until it takes them, and how long a paused client that reads
  // nothing is kept (net/framed_stream.h).
  net::StreamLimits stream;
  uint64_t tick_interval_ms = 10;
  // Where Store::commit runs. false: on a threadpool thread, while the loop keeps reading and
  // applying requests into the next batch. true: on the loop thread, which waits for it: no
  // thread hand-off (two wake-ups) per commit, but nothing else is served during a commit
  // (docs/LEDGER.md "Durability and group commit"; LedgerConfig::commit_mode).
  bool commit_on_loop = false;
  // Global bounds: past them new connections are refused (net/connection_set.h).
  uint64_t connections_max = limits::kConnectionsPerServerMax;
  uint64_t buffered_bytes_max = net::kBufferedBytesMaxDefault;
  // On stop, connections get this long to take their last replies; then they are closed.
  uint64_t drain_timeout_ms = 5'000;
  // Called once on the loop thread when the server has stopped (gracefully or fatally) and
  // is closing its last handles; the owner closes its own handles (signals) there.
  std::function<void()> on_stopped;
  // Fed with every answer, commit and audit when set; borrowed, must outlive the server.
  LedgerMetrics* metrics = nullptr;
  // Set: every accepted connection speaks TLS through a session this makes (ledger/link_tls.h);
  // a refused handshake is logged (event=tls_refused) and the connection closed. Unset:
  // plaintext (--insecure).
  std::function<Result<std::unique_ptr<net::TlsSession>>()> tls;
  // Called on the loop thread when a commit failed: the error to answer every request of the
  // refused batches with, when none of their changes can be durable (a deposed primary: the
  // fence rolled the transaction back; docs/scale-out.md), instead of dropping them; then the
  // server refuses as refuse() does. Unset, or nullopt: the failure is fatal (nothing is said).
  std::function<std::optional<wire::ErrorReply>(const Status& failure)> refused_answer;
  // With tls: the operator key (every request). Every other key a session admitted is a
  // gateway's, and every request on its connection is checked against that gateway
  // (core/link_authority.h); refusals are answered PERMISSION_DENIED and logged
  // (event=request_refused). Without tls every request is allowed, as before TLS.
  std::optional<PublicKey> operator_key;
};

class Server final : private net::StreamHandler {
 public:
  Server(uv_loop_t* loop, Ledger* ledger, Store* store, LedgerClock* clock, Logger* logger,
         ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  [[nodiscard]] Status start();
  uint16_t port() const { return bound_port_; }

  // Graceful stop: no new connections or requests; the commit in flight and the open batch are
  // committed and answered; then every handle is closed and the loop can run dry.
  void stop();
  bool fatal() const { return fatal_; }
  // The store may no longer commit (this ledger was deposed): every request held for a commit,
  // or read from now on, is answered `answer` and none is committed; at the next tick the
  // server stops as stop() does (so requests already waiting in its sockets are read and
  // answered first). refusing() is true from here on.
  void refuse(const wire::ErrorReply& answer);
  bool refusing() const { return refusal_.has_value(); }
  uint64_t connections() const { return connections_.served(); }
  uint64_t connectionsRefused() const { return connections_.refusedTotal(); }

  class Connection;

 private:
  // One connection's framed replies in a batch, encoded straight into the buffer that is
  // written once the batch is durable.
  struct ConnectionReplies {
    std::vector<uint8_t> bytes;
    uint64_t count = 0;
    std::vector<uint64_t> request_ids;  // of each reply, in order (answered so when refused)
  };
  struct Batch {
    std::unordered_map<uint64_t, ConnectionReplies> replies;  // by connection id
    std::vector<uint64_t> close_after_flush;
    // Gateways disabled by this batch: their open connections are cut once it is durable.
    std::vector<std::string> disabled_gateways;
    std::vector<std::string> disabled_operators;  // likewise, operators
    // Previous keys of gateways whose rotation this batch ended (their new key was used): the
    // connections that presented them are cut once it is durable.
    std::vector<std::pair<std::string, PublicKey>> retired_keys;
    bool tick_changes = false;
    StoreBatch store;
    Status result;
    uint64_t requests = 0;   // replies held, for the batch-size metric
    uint64_t sealed_ns = 0;  // uv_hrtime at seal
    uint64_t store_us = 0;   // time in Store::commit (commit thread)

    bool idle() const {
      return replies.empty() && close_after_flush.empty() && disabled_gateways.empty() &&
             disabled_operators.empty() && retired_keys.empty() && !tick_changes;
    }
  };

  static void onConnection(uv_stream_t* listener, int status);
  static void onCheck(uv_check_t* check);
  static void onTick(uv_timer_t* timer);
  static void onDrainDeadline(uv_timer_t* timer);
  void closeTimerIfDrained();
  static void doCommit(uv_work_t* work);
  static void afterCommit(uv_work_t* work, int status);

  void accept();
  // net::StreamHandler, for every connection.
  void onFrame(net::FramedStream* stream, wire::Frame&& frame) override;
  void onBadFrame(net::FramedStream* stream, const Status& status) override;
  void onLost(net::FramedStream* stream, const Status& status) override;
  void onClosed(net::FramedStream* stream) override;
  void onPaused(net::FramedStream* stream) override;
  // Logs each event, or feeds it to the metrics.
  void report(const std::vector<LedgerEvent>& events);
  // Who `connection` is now (core/link_authority.h), and why `request` is refused on it, if it
  // is (logged: event=request_refused).
  LinkPeer linkPeerOf(Connection* connection);
  std::optional<std::string> refusalOf(Connection* connection, const LinkPeer& peer,
                                       const wire::RequestBody& request);
  // Closes the open connections that presented the keys of `gateway_name` if it is disabled
  // (logged: event=connection_cut).
  void cutConnectionsOf(const std::string& gateway_name);
  void cutConnectionsOfOperator(const std::string& operator_name);
  // Closes the open connections that presented `key` if `gateway_name` no longer holds it.
  void cutConnectionsOfRetiredKey(const std::string& gateway_name, const PublicKey& key);
  void cutConnections(const std::vector<PublicKey>& keys, const std::string& gateway_name,
                      const std::string& reason);
  void enqueueReply(Connection* connection, const wire::Response& response);
  // Counts `response` to `request` in the metrics, then enqueueReply.
  void answer(Connection* connection, const wire::RequestBody& request,
              const wire::Response& response);
  void seal();
  // Copies the changed rows into a batch the commit thread owns (moves the deleted ids).
  void flush(Batch* batch);
  void failFatally(const Status& status);
  // Answers every request of `batch` with `answer` instead of its reply (the batch is dropped).
  void answerRefused(Batch* batch, const wire::ErrorReply& answer);
  void maybeFinishStop();
  void closeHandle(uv_handle_t* handle);

  uv_loop_t* loop_;
  Ledger* ledger_;
  Store* store_;
  LedgerClock* clock_;
  Logger* logger_;
  ServerOptions options_;
  LedgerRequests requests_;  // every decision about a request: the shell only carries it out

  uv_tcp_t listener_{};
  uv_check_t check_{};
  uv_timer_t tick_timer_{};
  uv_work_t work_{};
  int open_handles_ = 0;
  bool listener_open_ = false;
  bool check_open_ = false;
  bool tick_timer_open_ = false;
  uint16_t bound_port_ = 0;

  wire::EncodeScratch encode_scratch_;  // every reply is built here, on the loop thread
  net::ConnectionSet connections_;      // every Connection, from accept to its close callback
  Batch open_;
  Batch committing_;
  bool commit_in_flight_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  bool fatal_ = false;
  std::optional<wire::ErrorReply> refusal_;  // set by refuse(): the answer to every request
  uint64_t commits_ = 0;
};

}  // namespace tally::ledger
