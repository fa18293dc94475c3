#include "tests/sim/ledger_node.h"

#include <utility>
#include <variant>

#include "ledger/restore.h"
#include "ledger/store_batch.h"
#include "tests/sim/describe.h"
#include "wire/frame.h"

namespace tally::sim {

LedgerNode::LedgerNode(Rng rng, LedgerOptions options, Network* network, Trace* trace)
    : options_(options),
      network_(network),
      trace_(trace),
      store_(rng),
      ledger_(std::make_unique<Ledger>(options)) {
  attach();
}

void LedgerNode::setShardCrypto(const ShardCrypto* crypto) {
  crypto_ = crypto;
  if (ledger_ != nullptr) ledger_->setShardCrypto(crypto);
}

void LedgerNode::attach() {
  if (crypto_ != nullptr) ledger_->setShardCrypto(crypto_);
  requests_ = std::make_unique<LedgerRequests>(ledger_.get(), "tally-sim");
}

wire::ResponseBody LedgerNode::dispatch(const wire::RequestBody& body, uint64_t now_ms,
                                        CommittedReply* held) {
  // The daemon's own dispatch (core/ledger_requests.h), as ledger/server.cc calls it.
  static const std::string kNoGateway;
  const auto gateway = gateways_.find(held->to);
  LedgerOutcome outcome =
      requests_->apply(body, now_ms, gateway == gateways_.end() ? kNoGateway : gateway->second);
  if (const auto* request = std::get_if<ReserveRequest>(&body)) {
    if (const auto* reply = std::get_if<ReservationReply>(&outcome.reply);
        reply != nullptr && reply->code == ReplyCode::kOk && !reply->duplicate) {
      held->admitted_in_debt = ledger_->accounts().debt({request->subject, request->route}) > 0;
    }
  }
  held->events = std::move(outcome.events);
  return std::visit([](auto&& reply) -> wire::ResponseBody { return std::move(reply); },
                    std::move(outcome.reply));
}

namespace {

// Requests that only read: answering them leaves the ledger's state as it was, so the step
// needs no check of that state (a read that did change it would still be caught at the next
// step that checks, since the checks look at the whole state).
bool readsOnly(const wire::RequestBody& request) {
  return std::holds_alternative<QueryRequest>(request) ||
         std::holds_alternative<AuditRequest>(request) ||
         std::holds_alternative<HealthRequest>(request) ||
         std::holds_alternative<ShowPolicyRequest>(request) ||
         std::holds_alternative<ShardStatusRequest>(request) ||
         std::holds_alternative<ListShardsRequest>(request) ||
         std::holds_alternative<ListGatewaysRequest>(request) ||
         std::holds_alternative<UnknownMessage>(request);
}

}  // namespace

void LedgerNode::receive(const Envelope& envelope, uint64_t now_ms) {
  if (!up()) return;
  // One envelope is what one connection delivered: split it into frames as the server does.
  // A bad length closes the connection; the frames before it are served.
  wire::FrameDecoder decoder;
  std::vector<wire::Frame> frames;
  const Status fed = decoder.feed(envelope.frame, &frames);
  if (!fed.isOk() && trace_->on()) {
    trace_->add(now_ms, "ledger: closes the connection of node " + std::to_string(envelope.from) +
                            ": " + fed.toString());
  }
  for (const wire::Frame& frame : frames) {
    wire::DecodedRequest decoded = wire::decodeRequest(frame);
    if (!decoded.request_id.has_value()) {
      if (trace_->on()) trace_->add(now_ms, "ledger: unreadable envelope, connection closed");
      return;
    }
    CommittedReply held{.to = envelope.from};
    held.response.request_id = *decoded.request_id;
    if (!decoded.body.isOk()) {
      held.response.body = wire::errorReplyFor(decoded.body.status());
    } else {
      held.request = decoded.body.value();
      if (!readsOnly(held.request)) ++version_;
      held.response.body = dispatch(held.request, now_ms, &held);
    }
    if (trace_->on()) {
      trace_->add(now_ms, "ledger <- node " + std::to_string(envelope.from) + " #" +
                              std::to_string(held.response.request_id) + " " +
                              (decoded.body.isOk() ? describe(held.request) : "malformed") +
                              " => " + describe(held.response.body));
    }
#ifdef TALLY_TEST_FAULTS
    if (faults_.reply_before_commit) {
      Result<std::vector<uint8_t>> bytes = wire::encodeResponseFrame(held.response);
      if (bytes.isOk()) network_->send(kLedgerNode, held.to, std::move(bytes).value(), now_ms);
    }
#endif
    held_.push_back(std::move(held));
  }
}

void LedgerNode::applyLocal(const wire::RequestBody& request, uint64_t now_ms) {
  ++version_;
  CommittedReply held{.to = kLedgerNode, .request = request};
  held.response.body = dispatch(request, now_ms, &held);
  if (trace_->on()) {
    trace_->add(now_ms,
                "ledger (local) " + describe(request) + " => " + describe(held.response.body));
  }
  held_.push_back(std::move(held));
}

void LedgerNode::tick(uint64_t now_ms) {
  if (!up()) return;
  const TickOutcome outcome = ledger_->tick(now_ms);
  if (outcome.changed()) {  // a tick that changed nothing cannot have broken a check
    ++version_;
    dirty_ = true;
    if (trace_->on()) {
      trace_->add(now_ms,
                  "ledger tick: expired=" + std::to_string(outcome.expired) +
                      " closed_by_hard_limit=" + std::to_string(outcome.closed_by_hard_limit) +
                      " compacted=" + std::to_string(outcome.compacted) +
                      " periods_closed=" + std::to_string(outcome.periods_closed));
    }
  }
}

std::vector<CommittedReply> LedgerNode::commit(uint64_t now_ms) {
  if (!up()) return {};
  LedgerChangedRows rows = ledger_->takeChangedRows();
  if (!rows.empty()) {
    ++version_;  // a commit of nothing changes nothing (the replies it sends are checked apart)
    const ledger::StoreBatch batch = ledger::storeBatchOf(*ledger_, &rows, now_ms);
    if (Status s = store_.commit(batch); !s.isOk()) {
      if (trace_->on()) trace_->add(now_ms, "ledger: commit failed (" + s.toString() + "), stops");
      crash(now_ms);
      return {};
    }
    if (trace_->on()) {
      trace_->add(now_ms, "ledger: committed " + std::to_string(batch.reservations.size()) +
                              " reservations, " + std::to_string(batch.accounts.size()) +
                              " accounts, " + std::to_string(batch.deleted_reservations.size()) +
                              " deleted" + (batch.policies.empty() ? "" : ", policies") +
                              "; sends " + std::to_string(held_.size()) + " replies");
    }
  }
  dirty_ = false;
  std::vector<CommittedReply> sent = std::exchange(held_, {});
  for (const CommittedReply& reply : sent) {
    if (reply.to == kLedgerNode) continue;  // applied locally
#ifdef TALLY_TEST_FAULTS
    if (faults_.reply_before_commit) continue;  // already sent
#endif
    Result<std::vector<uint8_t>> bytes = wire::encodeResponseFrame(reply.response);
    if (bytes.isOk()) network_->send(kLedgerNode, reply.to, std::move(bytes).value(), now_ms);
  }
  return sent;
}

bool LedgerNode::beginExpiry(const std::string& reservation_id, uint64_t now_ms) {
  ++version_;
  if (!up() || !ledger_->beginExpiry(reservation_id, now_ms)) return false;
  dirty_ = true;
  if (trace_->on()) trace_->add(now_ms, "ledger: expiry begins for " + reservation_id);
  return true;
}

bool LedgerNode::completeExpiry(const std::string& reservation_id, uint64_t now_ms) {
  ++version_;
  if (!up() || !ledger_->completeExpiry(reservation_id, now_ms)) return false;
  dirty_ = true;
  if (trace_->on()) trace_->add(now_ms, "ledger: expiry completes for " + reservation_id);
  return true;
}

#ifdef TALLY_TEST_FAULTS
void LedgerNode::setFaults(NodeFaults faults) {
  faults_ = faults;
  if (ledger_ != nullptr) ledger_->setFaultsForTesting(faults_.ledger);
}
#endif

void LedgerNode::crash(uint64_t now_ms) {
  ++version_;
  if (!up()) return;
  ++crashes_;
  if (trace_->on()) {
    trace_->add(now_ms, "ledger CRASH: loses " + std::to_string(held_.size()) +
                            " unsent replies and the uncommitted batch");
  }
  requests_.reset();
  ledger_.reset();
  held_.clear();
  dirty_ = false;
  network_->dropTo(kLedgerNode);
}

bool LedgerNode::restart(uint64_t now_ms, std::string* error) {
  ++version_;
  if (up()) return true;
  auto fresh = std::make_unique<Ledger>(options_);
  if (crypto_ != nullptr) fresh->setShardCrypto(crypto_);
  Result<ledger::StoreContents> contents = store_.load();
  if (!contents.isOk()) {
    *error = contents.status().toString();
    return false;
  }
  Result<ledger::RestoreSummary> restored =
      ledger::restoreLedger(std::move(contents).value(), fresh.get(), now_ms);
  if (!restored.isOk()) {
    *error = restored.status().toString();
    return false;
  }
  if (trace_->on()) {
    trace_->add(now_ms, "ledger RESTART from durable rows: " +
                            std::to_string(restored.value().reservations) + " reservations, " +
                            std::to_string(restored.value().accounts) + " accounts");
  }
  ledger_ = std::move(fresh);
  attach();
#ifdef TALLY_TEST_FAULTS
  ledger_->setFaultsForTesting(faults_.ledger);
#endif
  return true;
}

}  // namespace tally::sim
