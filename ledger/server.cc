#include "ledger/server.h"

#include <arpa/inet.h>

#include <algorithm>
#include <utility>
#include <variant>

#include "core/assert.h"
#include "core/audit_entry.h"
#include "ledger/event_log.h"
#include "ledger/link_tls.h"
#include "ledger/store_batch.h"
#include "tally/version.h"
#include "wire/digest.h"

namespace tally::ledger {

// One client connection: a framed TCP stream and the peer's name for logs. Lives in
// Server::connections_ from accept until its close callback.
class Server::Connection final : public net::FramedStream {
 public:
  using FramedStream::FramedStream;
  std::string peer_;
  bool pause_logged_ = false;  // connection_paused is logged once per connection
  // Who it was at its last request (core/link_authority.h); identified again before each.
  std::optional<LinkPeer> link_peer_;
};

namespace {

// A connection's reply buffer starts with room for a few dozen reservation replies.
constexpr size_t kReplyBufferBytesInitial = 16 * 1024;

// The role of an operator peer for the logs ("" for any other peer).
const char* operatorRoleOf(const LinkPeer& peer) {
  return peer.role == LinkRole::kOperator ? operatorRoleName(peer.operator_role) : "";
}

std::string peerName(uv_tcp_t* tcp) {
  sockaddr_storage address{};
  int length = sizeof(address);
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  char host[64] = {};
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    uv_ip4_name(in, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  return "?";
}

// The wire's answer is the core's: the same types, one more alternative.
wire::ResponseBody responseBodyOf(LedgerReply&& reply) {
  return std::visit([](auto&& body) -> wire::ResponseBody { return std::move(body); },
                    std::move(reply));
}

}  // namespace

Server::Server(uv_loop_t* loop, Ledger* ledger, Store* store, LedgerClock* clock, Logger* logger,
               ServerOptions options)
    : loop_(loop),
      ledger_(ledger),
      store_(store),
      clock_(clock),
      logger_(logger),
      options_(std::move(options)),
      requests_(ledger, kVersion),
      connections_(loop, logger, options_.stream,
                   {.connections_max = options_.connections_max,
                    .buffered_bytes_max = options_.buffered_bytes_max,
                    .refusal_frame = !options_.tls}) {
  if (options_.operator_key.has_value()) {
    ledger_->operators().setFirstOperatorKey(*options_.operator_key);
  }
  listener_.data = this;
  check_.data = this;
  tick_timer_.data = this;
  work_.data = this;
}

Server::~Server() {
  // The loop must have run dry: every handle closed, no work queued.
  TALLY_ASSERT(open_handles_ == 0);
  TALLY_ASSERT(connections_.empty());
  TALLY_ASSERT(!commit_in_flight_);
}

Status Server::start() {
  sockaddr_in address{};
  if (int rc = uv_ip4_addr(options_.listen_host.c_str(), options_.listen_port, &address); rc != 0) {
    return Status::invalidArgument("listen address '" + options_.listen_host +
                                   "' is not an IPv4 address: " + uv_strerror(rc));
  }
  if (int rc = uv_tcp_init(loop_, &listener_); rc != 0) {
    return Status::ioError(std::string("uv_tcp_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  listener_open_ = true;
  if (options_.listen_fd >= 0) {
    if (int rc = uv_tcp_open(&listener_, options_.listen_fd); rc != 0) {
      return Status::ioError(std::string("uv_tcp_open: ") + uv_strerror(rc));
    }
  } else if (int rc = uv_tcp_bind(&listener_, reinterpret_cast<const sockaddr*>(&address), 0);
             rc != 0) {
    return Status::ioError("bind " + options_.listen_host + ":" +
                           std::to_string(options_.listen_port) + ": " + uv_strerror(rc));
  }
  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), 511, onConnection); rc != 0) {
    return Status::ioError(std::string("listen: ") + uv_strerror(rc));
  }
  sockaddr_in bound{};
  int length = sizeof(bound);
  if (int rc = uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &length);
      rc != 0) {
    return Status::ioError(std::string("getsockname: ") + uv_strerror(rc));
  }
  bound_port_ = ntohs(bound.sin_port);

  if (int rc = uv_check_init(loop_, &check_); rc != 0) {
    return Status::ioError(std::string("uv_check_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  check_open_ = true;
  if (int rc = uv_check_start(&check_, onCheck); rc != 0) {
    return Status::ioError(std::string("uv_check_start: ") + uv_strerror(rc));
  }
  if (int rc = uv_timer_init(loop_, &tick_timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  tick_timer_open_ = true;
  if (int rc = uv_timer_start(&tick_timer_, onTick, options_.tick_interval_ms,
                              options_.tick_interval_ms);
      rc != 0) {
    return Status::ioError(std::string("uv_timer_start: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void Server::onConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<Server*>(listener->data);
  if (status != 0) {
    server->logger_->warn("accept_failed", {{"error", uv_strerror(status)}});
    return;
  }
  server->accept();
}

void Server::accept() {
  net::StreamHandler* handler = this;  // a private base: converted here, not in make_unique
  auto* raw = static_cast<Connection*>(connections_.accept(
      reinterpret_cast<uv_stream_t*>(&listener_),
      [this, handler](uint64_t id, const net::StreamLimits& limits) {
        return std::make_unique<Connection>(loop_, net::StreamKind::kTcp, handler, limits, id);
      },
      stopping_));
  if (raw == nullptr) return;  // refused or failed: logged, and closing
  (void)uv_tcp_nodelay(raw->tcp(), 1);
  raw->peer_ = peerName(raw->tcp());
  logger_->debug("connection_opened", {{"connection", raw->id()}, {"peer", raw->peer_}});
  if (options_.tls && !startServerTls(raw, options_.tls, logger_)) return;
  raw->startReading();
}

void Server::onFrame(net::FramedStream* stream, wire::Frame&& frame) {
  auto* connection = static_cast<Connection*>(stream);
  wire::DecodedRequest decoded = wire::decodeRequest(frame);
  const uint64_t request_id = decoded.request_id.value_or(0);
  if (!decoded.body.isOk()) {
    logger_->warn("bad_request", {{"connection", connection->id()},
                                  {"peer", connection->peer_},
                                  {"error", decoded.body.status().toString()}});
    static const wire::RequestBody kUnknown;
    answer(connection, kUnknown,
           wire::Response{.request_id = request_id,
                          .body = wire::errorReplyFor(decoded.body.status())});
    return;
  }
  const wire::RequestBody& request = decoded.body.value();
  const LinkPeer peer = linkPeerOf(connection);
  std::optional<std::string> refusal = refusalOf(connection, peer, request);
  auto audit = [&](const LedgerReply* reply) {
    if (!isPrivilegedAction(request)) return;
    // In the batch of the action: the two are durable together, and so is a refusal.
    ledger_->appendAuditLog(auditLogEntryOf(peer, request, refusal, reply,
                                            wire::sha256(std::span<const uint8_t>(frame))),
                            clock_->nowMs());
  };
  if (refusal.has_value()) {
    audit(nullptr);
    answer(connection, request,
           wire::Response{.request_id = request_id,
                          .body = wire::ErrorReply{.code = wire::ErrorCode::kPermissionDenied,
                                                   .message = std::move(*refusal)}});
    return;
  }
  static const std::string kNoGateway;
  LedgerOutcome outcome = requests_.apply(
      request, clock_->nowMs(), peer.role == LinkRole::kGateway ? peer.gateway_name : kNoGateway);
  report(outcome.events);
  for (const LedgerEvent& event : outcome.events) {
    if (const auto* set = std::get_if<GatewayEnabledSet>(&event); set && !set->enabled) {
      open_.disabled_gateways.push_back(set->gateway_name);
    }
    if (const auto* set = std::get_if<OperatorEnabledSet>(&event); set && !set->enabled) {
      open_.disabled_operators.push_back(set->operator_name);
    }
  }
  audit(&outcome.reply);
  // Built in place: the reply (a whole receipt, usually) is moved once, not through temporaries.
  answer(
      connection, request,
      wire::Response{.request_id = request_id, .body = responseBodyOf(std::move(outcome.reply))});
}

void Server::answer(Connection* connection, const wire::RequestBody& request,
                    const wire::Response& response) {
  if (options_.metrics != nullptr) options_.metrics->countRequest(request, response.body);
  enqueueReply(connection, response);
}

LinkPeer Server::linkPeerOf(Connection* connection) {
  if (!options_.tls) return LinkPeer{.role = LinkRole::kUnauthenticated};
  const net::TlsSession* tls = connection->tls();
  LinkPeer peer;
  if (tls == nullptr || !tls->peerKey().has_value()) {  // frames arrive only after the handshake
    peer = LinkPeer{.role = LinkRole::kNobody, .why_nobody = "no key was presented"};
  } else {
    const std::string hint =
        connection->link_peer_.has_value() ? connection->link_peer_->gateway_name : std::string();
    const uint64_t now_ms = clock_->nowMs();
    peer = identifyLinkPeer(ledger_->shards(), ledger_->operators().all(), *tls->peerKey(), now_ms,
                            hint);
    if (endsKeyOverlap(ledger_->shards(), peer, now_ms)) {
      // The first use of a rotated gateway's new key: its previous key is no longer admitted
      // (durable with this batch; its connections are cut after it).
      if (std::optional<PublicKey> retired =
              ledger_->shards().endKeyOverlap(peer.gateway_name, now_ms)) {
        logger_->info("gateway_key_overlap_ended", {{"gateway", peer.gateway_name},
                                                    {"connection", connection->id()},
                                                    {"peer", connection->peer_},
                                                    {"reason", "its new key was used"}});
        open_.retired_keys.emplace_back(peer.gateway_name, *retired);
      }
    }
  }
  if (!connection->link_peer_.has_value() || *connection->link_peer_ != peer) {
    logger_->info("link_peer", {{"connection", connection->id()},
                                {"peer", connection->peer_},
                                {"role", linkRoleName(peer.role)},
                                {"gateway", peer.gateway_name},
                                {"why", peer.why_nobody},
                                {"operator", peer.operator_name},
                                {"operator_role", operatorRoleOf(peer)}});
    connection->link_peer_ = peer;
  }
  return peer;
}

std::optional<std::string> Server::refusalOf(Connection* connection, const LinkPeer& peer,
                                             const wire::RequestBody& request) {
  std::optional<std::string> refusal = linkRefusal(peer, request);
  if (refusal.has_value()) {
    logger_->warn("request_refused", {{"connection", connection->id()},
                                      {"peer", connection->peer_},
                                      {"role", linkRoleName(peer.role)},
                                      {"gateway", peer.gateway_name},
                                      {"request", linkRequestName(request)},
                                      {"reason", *refusal},
                                      {"operator", peer.operator_name},
                                      {"operator_role", operatorRoleOf(peer)}});
  }
  return refusal;
}

void Server::cutConnectionsOf(const std::string& gateway_name) {
  const GatewayRecord* gateway = ledger_->shards().findGateway(gateway_name);
  if (gateway == nullptr || gateway->enabled) return;  // enabled again meanwhile
  std::vector<PublicKey> keys{gateway->public_key};
  if (gateway->previous_public_key != PublicKey{}) keys.push_back(gateway->previous_public_key);
  cutConnections(keys, gateway_name, "gateway '" + gateway_name + "' was disabled");
}

void Server::cutConnectionsOfOperator(const std::string& operator_name) {
  for (const OperatorRecord& record : ledger_->operators().all()) {
    if (record.name != operator_name) continue;
    if (record.enabled) return;  // enabled again meanwhile
    cutConnections({record.public_key}, "", "operator '" + operator_name + "' was disabled");
    return;
  }
}

void Server::cutConnectionsOfRetiredKey(const std::string& gateway_name, const PublicKey& key) {
  const GatewayRecord* gateway = ledger_->shards().findGateway(gateway_name);
  if (gateway != nullptr && gatewayHoldsKey(*gateway, key, clock_->nowMs())) return;
  cutConnections({key}, gateway_name,
                 "gateway '" + gateway_name + "' was rotated to a new key, now in use");
}

void Server::cutConnections(const std::vector<PublicKey>& keys, const std::string& gateway_name,
                            const std::string& reason) {
  std::vector<Connection*> cut;
  for (net::FramedStream* stream : connections_.all()) {
    auto* connection = static_cast<Connection*>(stream);
    const net::TlsSession* tls = connection->tls();
    if (connection->closing() || connection->shuttingDown() || tls == nullptr ||
        !tls->peerKey().has_value() ||
        std::find(keys.begin(), keys.end(), *tls->peerKey()) == keys.end()) {
      continue;
    }
    cut.push_back(connection);
  }
  for (Connection* connection : cut) {
    logger_->warn("connection_cut", {{"connection", connection->id()},
                                     {"peer", connection->peer_},
                                     {"gateway", gateway_name},
                                     {"reason", reason}});
    connection->shutdownThenClose();
  }
}

void Server::onBadFrame(net::FramedStream* stream, const Status& status) {
  // Framing is lost (the stream has stopped reading): answer once, then close this connection
  // only, after the replies before it.
  auto* connection = static_cast<Connection*>(stream);
  logger_->warn("bad_frame", {{"connection", connection->id()},
                              {"peer", connection->peer_},
                              {"error", status.toString()}});
  enqueueReply(connection, wire::Response{.request_id = 0, .body = wire::errorReplyFor(status)});
  open_.close_after_flush.push_back(connection->id());
}

void Server::onLost(net::FramedStream* stream, const Status& status) {
  if (status.message().starts_with("TLS: ")) {  // refused key, bad record, plaintext client
    logger_->warn("tls_refused", {{"connection", stream->id()},
                                  {"peer", static_cast<Connection*>(stream)->peer_},
                                  {"error", status.toString()}});
    return;
  }
  if (status.message().starts_with("stalled: ")) {  // paused, and it read nothing for too long
    logger_->warn("connection_stalled", {{"connection", stream->id()},
                                         {"peer", static_cast<Connection*>(stream)->peer_},
                                         {"reason", status.message()}});
    return;
  }
  if (status.code() != StatusCode::kUnavailable) {  // unavailable: the client closed
    logger_->debug("connection_error",
                   {{"connection", stream->id()}, {"error", status.toString()}});
  }
}

void Server::onPaused(net::FramedStream* stream) {
  auto* connection = static_cast<Connection*>(stream);
  if (std::exchange(connection->pause_logged_, true)) return;
  logger_->info("connection_paused", {{"connection", connection->id()},
                                      {"peer", connection->peer_},
                                      {"owed_bytes", connection->queuedBytes()},
                                      {"stall_timeout_ms", options_.stream.stall_timeout_ms}});
}

void Server::onClosed(net::FramedStream* stream) {
  logger_->debug("connection_closed", {{"connection", stream->id()}});
  connections_.erase(stream->id());  // frees the stream
  maybeFinishStop();
  closeTimerIfDrained();
}

void Server::report(const std::vector<LedgerEvent>& events) {
  for (const LedgerEvent& event : events) {
    if (const auto* audited = std::get_if<Audited>(&event)) {
      if (options_.metrics != nullptr) options_.metrics->observeAudit(*audited);
    } else {
      logLedgerEvent(logger_, event);
    }
  }
}

void Server::enqueueReply(Connection* connection, const wire::Response& response) {
  ConnectionReplies& replies = open_.replies[connection->id()];
  if (replies.bytes.capacity() == 0) replies.bytes.reserve(kReplyBufferBytesInitial);
  const size_t bytes_before = replies.bytes.size();
  Status status = wire::encodeResponseFrameInto(response, &replies.bytes,
                                                limits::kFrameBytesMaxDefault, &encode_scratch_);
  if (!status.isOk()) {
    // Our own answer is too large for a frame (e.g. a huge audit): say so instead.
    status = wire::encodeResponseFrameInto(wire::replyTooLarge(response.request_id, status),
                                           &replies.bytes, limits::kFrameBytesMaxDefault,
                                           &encode_scratch_);
    TALLY_ASSERT(status.isOk());
  }
  ++replies.count;
  replies.request_ids.push_back(response.request_id);
  ++open_.requests;
  // Counted against the client's limits now, so a client that does not read is not served
  // past them while its replies wait for the commit.
  connection->addPending(1, replies.bytes.size() - bytes_before);
}

void Server::onTick(uv_timer_t* timer) {
  auto* server = static_cast<Server*>(timer->data);
  if (server->fatal_) return;
  if (server->refusal_.has_value()) {
    server->stop();  // refuse() answered what was held; what was waiting has been read since
    return;
  }
  if (server->ledger_->tick(server->clock_->nowMs()).changed()) server->open_.tick_changes = true;
}

void Server::onCheck(uv_check_t* check) {
  auto* server = static_cast<Server*>(check->data);
  if (!server->commit_in_flight_ && !server->open_.idle() && !server->fatal_) server->seal();
}

void Server::seal() {
  TALLY_ASSERT(!commit_in_flight_);
  if (refusal_.has_value()) {  // nothing more is committed: the batch is answered refused
    Batch refused = std::exchange(open_, Batch{});
    answerRefused(&refused, *refusal_);
    maybeFinishStop();
    return;
  }
  LedgerChangedRows rows = ledger_->takeChangedRows();
  Batch batch = std::exchange(open_, Batch{});
  if (rows.empty()) {
    flush(&batch);  // nothing to make durable: reads answer at once
    maybeFinishStop();
    return;
  }
  batch.store = storeBatchOf(*ledger_, &rows, clock_->nowMs());
  batch.sealed_ns = uv_hrtime();
  committing_ = std::move(batch);
  commit_in_flight_ = true;
  if (options_.commit_on_loop) {
    doCommit(&work_);
    afterCommit(&work_, 0);
    return;
  }
  if (int rc = uv_queue_work(loop_, &work_, doCommit, afterCommit); rc != 0) {
    commit_in_flight_ = false;
    failFatally(Status::ioError(std::string("uv_queue_work: ") + uv_strerror(rc)));
  }
}

void Server::doCommit(uv_work_t* work) {
  // Worker thread (or the loop, with commit_on_loop): touches only the store and the sealed
  // batch.
  auto* server = static_cast<Server*>(work->data);
  const uint64_t started_ns = uv_hrtime();
  server->committing_.result = server->store_->commit(server->committing_.store);
  server->committing_.store_us = (uv_hrtime() - started_ns) / 1000;
}

void Server::afterCommit(uv_work_t* work, int status) {
  auto* server = static_cast<Server*>(work->data);
  server->commit_in_flight_ = false;
  if (status != 0) {
    server->failFatally(Status::ioError(std::string("commit cancelled: ") + uv_strerror(status)));
    return;
  }
  if (!server->committing_.result.isOk()) {
    server->failFatally(server->committing_.result);
    return;
  }
  ++server->commits_;
  Batch done = std::exchange(server->committing_, Batch{});
  if (server->options_.metrics != nullptr) {
    server->options_.metrics->observeCommit(done.requests, (uv_hrtime() - done.sealed_ns) / 1000,
                                            done.store_us);
  }
  server->flush(&done);
  if (!server->open_.idle()) {
    server->seal();
  } else {
    server->maybeFinishStop();
  }
}

void Server::flush(Batch* batch) {
  for (auto& [connection_id, replies] : batch->replies) {
    auto* connection = static_cast<Connection*>(connections_.find(connection_id));
    if (connection == nullptr || connection->closing()) continue;
    const uint64_t bytes = replies.bytes.size();
    // Written before the promise is settled, so the bytes count against the limits throughout.
    connection->write(std::move(replies.bytes));
    connection->settlePending(replies.count, bytes);
    connection->flush();
  }
  for (uint64_t connection_id : batch->close_after_flush) {
    net::FramedStream* connection = connections_.find(connection_id);
    if (connection == nullptr || connection->closing()) continue;
    connection->shutdownThenClose();  // the queued error reply goes out first
  }
  // After the disable's answer went out (to the operator's connection, in the loop above).
  for (const std::string& gateway_name : batch->disabled_gateways) cutConnectionsOf(gateway_name);
  for (const std::string& name : batch->disabled_operators) cutConnectionsOfOperator(name);
  for (const auto& [gateway_name, key] : batch->retired_keys) {
    cutConnectionsOfRetiredKey(gateway_name, key);
  }
}

void Server::failFatally(const Status& status) {
  std::optional<wire::ErrorReply> answer = refusal_;
  if (!answer.has_value() && options_.refused_answer) answer = options_.refused_answer(status);
  if (answer.has_value()) {
    // Nothing of the refused batches was committed: they are answered the error, not left
    // unanswered.
    requests_.markFailed();
    logger_->error("commit_failed",
                   {{"error", status.toString()},
                    {"action",
                     "stopping; nothing of the batch was committed: its requests and "
                     "those held after it are answered " +
                         std::string(wire::errorCodeName(answer->code))}});
    Batch refused = std::exchange(committing_, Batch{});
    answerRefused(&refused, *answer);
    refuse(*answer);
    return;
  }
  fatal_ = true;
  requests_.markFailed();
  logger_->error("commit_failed", {{"error", status.toString()},
                                   {"action",
                                    "stopping; restart rebuilds from the durable "
                                    "record; unanswered requests are unknown to "
                                    "clients, who retry with the same ids"}});
  // None of the unanswered replies may leave: drop them, and stop.
  open_ = Batch{};
  committing_ = Batch{};
  stop();
}

void Server::refuse(const wire::ErrorReply& answer) {
  const bool first = !refusal_.has_value();
  refusal_ = answer;
  // A commit in flight is refused too (the store no longer commits): its afterCommit answers it
  // and the open batch.
  if (!commit_in_flight_) {
    Batch refused = std::exchange(open_, Batch{});
    answerRefused(&refused, answer);
  }
  if (stopping_) {
    maybeFinishStop();
  } else if (first && tick_timer_open_) {
    // Stops at the next tick, a whole interval from now: the loop polls the sockets meanwhile,
    // so requests already waiting in them are read and answered too.
    (void)uv_timer_start(&tick_timer_, onTick, options_.tick_interval_ms,
                         options_.tick_interval_ms);
  }
}

void Server::answerRefused(Batch* batch, const wire::ErrorReply& answer) {
  for (auto& [connection_id, replies] : batch->replies) {
    auto* connection = static_cast<Connection*>(connections_.find(connection_id));
    if (connection == nullptr || connection->closing()) continue;
    std::vector<uint8_t> bytes;
    bool encoded = true;
    for (uint64_t request_id : replies.request_ids) {
      encoded = encoded && wire::encodeResponseFrameInto(
                               wire::Response{.request_id = request_id, .body = answer}, &bytes,
                               limits::kFrameBytesMaxDefault, &encode_scratch_)
                               .isOk();
    }
    connection->settlePending(replies.count, replies.bytes.size());
    if (!encoded) {  // an answer too large for a frame (a huge address): nothing is said
      connection->close();
      continue;
    }
    connection->write(std::move(bytes));
    connection->flush();
  }
  for (uint64_t connection_id : batch->close_after_flush) {
    net::FramedStream* connection = connections_.find(connection_id);
    if (connection == nullptr || connection->closing()) continue;
    connection->shutdownThenClose();
  }
}

void Server::closeHandle(uv_handle_t* handle) {
  uv_close(handle,
           [](uv_handle_t* closed) { --static_cast<Server*>(closed->data)->open_handles_; });
}

void Server::stop() {
  if (stopping_) return;
  stopping_ = true;
  if (listener_open_) {
    listener_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&listener_));
  }
  if (tick_timer_open_) (void)uv_timer_stop(&tick_timer_);
  for (net::FramedStream* connection : connections_.all()) connection->stopReading();
  maybeFinishStop();
}

void Server::maybeFinishStop() {
  if (!stopping_ || stopped_ || commit_in_flight_) return;
  if (!open_.idle() && !fatal_) {
    seal();
    return;
  }
  stopped_ = true;
  logger_->info("stopped", {{"commits", commits_}, {"fatal", fatal_}});
  if (options_.on_stopped) options_.on_stopped();
  if (check_open_) {
    check_open_ = false;
    closeHandle(reinterpret_cast<uv_handle_t*>(&check_));
  }
  if (tick_timer_open_) {
    // The tick timer becomes the drain deadline: a peer that never reads cannot hold the
    // process open.
    (void)uv_timer_stop(&tick_timer_);
    if (uv_timer_start(&tick_timer_, onDrainDeadline, options_.drain_timeout_ms, 0) != 0) {
      tick_timer_open_ = false;
      closeHandle(reinterpret_cast<uv_handle_t*>(&tick_timer_));
    }
  }
  for (net::FramedStream* connection : connections_.all()) {
    if (fatal_) {
      connection->close();  // nothing more may be said
    } else {
      connection->shutdownThenClose();
    }
  }
  closeTimerIfDrained();
}

void Server::onDrainDeadline(uv_timer_t* timer) {
  auto* server = static_cast<Server*>(timer->data);
  server->logger_->warn("drain_deadline",
                        {{"connections_closed", server->connections_.served()},
                         {"drain_timeout_ms", server->options_.drain_timeout_ms}});
  for (net::FramedStream* connection : server->connections_.all()) connection->close();
  server->closeTimerIfDrained();
}

void Server::closeTimerIfDrained() {
  if (!stopped_ || !tick_timer_open_) return;
  for (net::FramedStream* connection : connections_.all()) {
    if (!connection->closing()) return;
  }
  tick_timer_open_ = false;
  closeHandle(reinterpret_cast<uv_handle_t*>(&tick_timer_));
}

}  // namespace tally::ledger
