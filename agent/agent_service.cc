#include "agent/agent_service.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "common/wall_clock.h"
#include "core/assert.h"
#include "tally/version.h"

namespace tally::agent {
namespace {

wire::ErrorReply unavailable(std::string message) {
  return {.code = wire::ErrorCode::kUnavailable, .message = std::move(message)};
}

template <typename T>
constexpr bool kGatewayOrShardRequest =
    std::is_same_v<T, wire::EnrollGatewayRequest> || std::is_same_v<T, wire::ListGatewaysRequest> ||
    std::is_same_v<T, wire::SetGatewayEnabledRequest> || std::is_same_v<T, ShardIssueRequest> ||
    std::is_same_v<T, ShardReport> || std::is_same_v<T, wire::ShardStatusRequest> ||
    std::is_same_v<T, wire::ListShardsRequest> || std::is_same_v<T, wire::RevokeShardsRequest> ||
    std::is_same_v<T, wire::WriteOffShardRequest>;

constexpr const char* kOutcomeUnknown = kAgentOutcomeUnknown;

ReservationReply queuedReply(const OutboxEntry& entry) {
  return {.code = ReplyCode::kQueued,
          .message = std::string(outboxKindName(entry.kind)) + " of " + entry.reservation_id +
                     " durably queued at the agent (seq " + std::to_string(entry.seq) +
                     "); it reaches the ledger exactly once when the link is back"};
}

}  // namespace

wire::RequestBody outboxRequest(const OutboxEntry& entry) {
  switch (entry.kind) {
    case OutboxKind::kSettle:
      return SettleRequest{.reservation_id = entry.reservation_id,
                           .operation_id = entry.operation_id,
                           .actual_units = entry.actual_units};
    case OutboxKind::kRelease: return ReleaseRequest{.reservation_id = entry.reservation_id};
    case OutboxKind::kMarkUnknown:
      return MarkUnknownRequest{.reservation_id = entry.reservation_id,
                                .operation_id = entry.operation_id};
    case OutboxKind::kReportOperation:
      return ReportOperationRequest{.reservation_id = entry.reservation_id,
                                    .operation_id = entry.operation_id,
                                    .actual_units = entry.actual_units};
  }
  TALLY_UNREACHABLE();
}

AgentService::AgentService(uv_loop_t* loop, central::LedgerLink* link, OutboxStore* store,
                           AgentMetrics* metrics, Logger* logger, AgentServiceOptions options)
    : loop_(loop),
      link_(link),
      store_(store),
      metrics_(metrics),
      logger_(logger),
      options_(options),
      rng_(options.seed != 0 ? options.seed : monotonicClockUs()),
      policy_({.refresh_ms = options.policy_refresh_ms}, 0),
      local_({.entries_max = options.local_reservations_max}),
      unknown_(options.unknown_max),
      usage_unknown_(options.unknown_max),
      machine_({.window_max = options.ledger_window_max,
                .waiting_max = options.waiting_max,
                .outbox = {.entries_max = options.outbox_entries_max}}),
      central_ids_(options.central_ids_max) {
  check_.data = this;
  pump_timer_.data = this;
}

AgentService::~AgentService() { TALLY_ASSERT(open_handles_ == 0); }

Status AgentService::start(std::vector<OutboxEntry> restored, uint64_t boot_epoch) {
  const uint64_t now_ms = wallClockMs();
  boot_epoch_ = boot_epoch;
  policy_ = AgentPolicy({.refresh_ms = options_.policy_refresh_ms}, now_ms);
  const size_t restored_count = restored.size();
  machine_.restore(std::move(restored));
  if (restored_count > 0) {
    logger_->info("outbox_restored", {{"entries", uint64_t{restored_count}},
                                      {"oldest_age_ms", machine_.outbox().oldestAgeMs(now_ms)}});
  }
  if (int rc = uv_check_init(loop_, &check_); rc != 0) {
    return Status::ioError(std::string("uv_check_init: ") + uv_strerror(rc));
  }
  handles_.push_back(reinterpret_cast<uv_handle_t*>(&check_));
  ++open_handles_;
  if (int rc = uv_timer_init(loop_, &pump_timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  handles_.push_back(reinterpret_cast<uv_handle_t*>(&pump_timer_));
  ++open_handles_;
  started_ = true;
  if (int rc = uv_check_start(&check_, onCheck); rc != 0) {
    return Status::ioError(std::string("uv_check_start: ") + uv_strerror(rc));
  }
  if (int rc = uv_timer_start(&pump_timer_, onPump, options_.pump_interval_ms,
                              options_.pump_interval_ms);
      rc != 0) {
    return Status::ioError(std::string("uv_timer_start: ") + uv_strerror(rc));
  }
  link_->setOnConnected([this] {
    const uint64_t connected_ms = wallClockMs();
    policy_.refreshNow();
    fetchPolicy(connected_ms);
    pumpOutbox(connected_ms);
  });
  return Status::ok();
}

void AgentService::stop() {
  started_ = false;
  for (uv_handle_t* handle : std::exchange(handles_, {})) {
    uv_close(handle, [](uv_handle_t* closed) {
      --static_cast<AgentService*>(closed->data)->open_handles_;
    });
  }
}

bool AgentService::usable() const { return linkUsable(link_->connected(), link_->health()); }

GaugeSnapshot AgentService::gauges() const {
  const uint64_t now_ms = wallClockMs();
  GaugeSnapshot snapshot{.health = link_->health(),
                         .connected = link_->connected(),
                         .outbox_depth = machine_.outbox().size(),
                         .outbox_oldest_age_ms = machine_.outbox().oldestAgeMs(now_ms),
                         .reservation_unknown = unknown_.size(),
                         .reservation_unknown_oldest_age_ms = unknown_.oldestAgeMs(now_ms),
                         .usage_unknown = usage_unknown_.size(),
                         .usage_unknown_oldest_age_ms = usage_unknown_.oldestAgeMs(now_ms),
                         .boot_epoch = boot_epoch_,
                         .local_reservations = local_.size()};
  if (shards_ != nullptr) {
    const ShardGauges shard_gauges = shards_->gauges(now_ms);
    snapshot.shards_usable = shard_gauges.usable;
    snapshot.shards_closed = shard_gauges.closed;
    snapshot.shards_quarantined = shard_gauges.quarantined;
    snapshot.shard_available_units = shard_gauges.available_units;
    snapshot.shard_oldest_unreconciled_age_ms = shard_gauges.oldest_unreconciled_age_ms;
  }
  return snapshot;
}

void AgentService::handle(wire::RequestBody body, Respond respond, Alive alive) {
  const Op op = opFor(body);
  const uint64_t now_ms = wallClockMs();
  const uint64_t started_us = monotonicClockUs();  // the latency histogram only
  Respond measured = [this, op, started_us,
                      respond = std::move(respond)](wire::ResponseBody answer) {
    metrics_->countRequest(op, outcomeLabel(answer), monotonicClockUs() - started_us);
    if (const auto* reply = std::get_if<ReservationReply>(&answer)) {
      if (op == Op::kReserve && (reply->code == ReplyCode::kRejected ||
                                 reply->receipt.state == ReservationState::kRejected)) {
        metrics_->countRejection(reply->receipt.limiting_dimension);
      }
    }
    respond(std::move(answer));
  };
  std::visit(
      [&](auto& request) {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, ReserveRequest>) {
          reserve(request, std::move(measured), std::move(alive), now_ms);
        } else if constexpr (std::is_same_v<T, StartRequest>) {
          start(request, std::move(measured), std::move(alive), now_ms);
        } else if constexpr (std::is_same_v<T, SettleRequest>) {
          followUp(OutboxKind::kSettle, std::move(body), std::move(measured), std::move(alive),
                   now_ms);
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          followUp(OutboxKind::kRelease, std::move(body), std::move(measured), std::move(alive),
                   now_ms);
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          followUp(OutboxKind::kMarkUnknown, std::move(body), std::move(measured), std::move(alive),
                   now_ms);
        } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
          followUp(OutboxKind::kReportOperation, std::move(body), std::move(measured),
                   std::move(alive), now_ms);
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          query(request, std::move(measured), std::move(alive), now_ms);
        } else if constexpr (std::is_same_v<T, wire::HealthRequest>) {
          measured(wire::HealthReply{
              .status = link_->connected() ? linkHealthName(link_->health()) : "DISCONNECTED",
              .version = kVersion,
              .now_ms = now_ms});
        } else if constexpr (std::is_same_v<T, wire::UnknownMessage>) {
          measured(
              wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                               .message = "unknown request kind " + std::to_string(request.which)});
        } else if constexpr (kGatewayOrShardRequest<T>) {
          // Operator and agent-to-ledger messages: never forwarded from a gateway's socket.
          measured(wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                                    .message = "request kind not served by the agent"});
        } else {
          forwardOther(std::move(body), std::move(measured), std::move(alive), now_ms);
        }
      },
      body);
}

// --- the window to the ledger ------------------------------------------------------------------

void AgentService::forward(wire::RequestBody body, Respond respond, Alive alive,
                           std::optional<OutboxEntry> follow_up, std::string central_id,
                           OnAnswer on_answer, uint64_t now_ms) {
  const uint64_t token = next_token_++;
  responders_.emplace(token, std::move(respond));
  held_.emplace(token, Held{.body = std::move(body),
                            .alive = std::move(alive),
                            .central_id = std::move(central_id),
                            .on_answer = std::move(on_answer)});
  perform(machine_.submit(token, std::move(follow_up)), now_ms);
  sendWaiting(now_ms);
}

void AgentService::sendWaiting(uint64_t now_ms) {
  while (std::optional<uint64_t> next = machine_.nextToSend()) {
    auto it = held_.find(*next);
    TALLY_ASSERT(it != held_.end());
    const bool alive = !it->second.alive || it->second.alive();
    perform(machine_.admitNext(alive), now_ms);
  }
}

Respond AgentService::takeResponder(uint64_t token) {
  auto it = responders_.find(token);
  TALLY_ASSERT(it != responders_.end());
  Respond respond = std::move(it->second);
  responders_.erase(it);
  return respond;
}

void AgentService::perform(AgentEffects effects, uint64_t now_ms) {
  for (AgentEffect& effect : effects) {
    if (const auto* send = std::get_if<AgentSend>(&effect)) {
      auto it = held_.find(send->token);
      TALLY_ASSERT(it != held_.end());
      Held held = std::move(it->second);
      held_.erase(it);
      // Never admitted from a shard while partitioned: the ledger may hold it from now on.
      if (!held.central_id.empty()) central_ids_.addEvictingOldest(held.central_id, now_ms);
      link_->call(std::move(held.body),
                  [this, token = send->token,
                   on_answer = std::move(held.on_answer)](central::LinkResult result) {
                    if (!machine_.onResult(token)) return;  // answered at the shutdown deadline
                    on_answer(std::move(result), takeResponder(token));
                  });
    } else if (const auto* drop = std::get_if<AgentDrop>(&effect)) {
      ++dropped_gone_;
      held_.erase(drop->token);
      takeResponder(drop->token)(unavailable("the requester is gone"));  // a no-op for it
    } else if (auto* refusal = std::get_if<AgentReplyUnavailable>(&effect)) {
      held_.erase(refusal->token);
      takeResponder(refusal->token)(unavailable(std::move(refusal->message)));
    } else if (const auto* queued = std::get_if<AgentReplyQueued>(&effect)) {
      takeResponder(queued->token)(queuedReply(queued->entry));
    } else if (const auto* persist = std::get_if<AgentPersist>(&effect)) {
      // Group commit: one transaction, one fsync; the machine then says who hears QUEUED.
      const Status status = store_->appendBatch(persist->entries);
      if (status.isOk()) {
        logger_->debug("outbox_committed", {{"entries", uint64_t{persist->entries.size()}},
                                            {"depth", uint64_t{machine_.outbox().size()}}});
      } else {
        logger_->error("outbox_write_failed", {{"entries", uint64_t{persist->entries.size()}},
                                               {"error", status.toString()}});
      }
      perform(machine_.persisted(status.isOk(), status.message()), now_ms);
    }
  }
}

void AgentService::answerEveryPending(uint64_t now_ms) {
  if (!deadlines_.answerAll()) return;
  for (auto& [id, waiters] : std::exchange(unknown_waiters_, {})) {
    for (Respond& waiter : waiters) waiter(unavailable(kOutcomeUnknown));
  }
  const size_t pending = responders_.size();
  perform(machine_.shutdown(now_ms), now_ms);  // its durable write is the outbox's last
  logger_->info("shutdown_answered",
                {{"requests", uint64_t{pending}}, {"unanswered", uint64_t{responders_.size()}}});
}

void AgentService::beginShutdown(uint64_t timeout_ms) {
  const uint64_t now_ms = wallClockMs();
  if (deadlines_.beginShutdown(now_ms, timeout_ms)) answerEveryPending(now_ms);
}

// --- reserve -----------------------------------------------------------------------------------

bool AgentService::answeredByShards(const std::string& reservation_id,
                                    const wire::RequestBody& body, const Respond& respond,
                                    uint64_t now_ms) {
  if (shards_ == nullptr || !shards_->owns(reservation_id)) return false;
  shards_->apply(body, now_ms, respond);
  return true;
}

void AgentService::reserve(const ReserveRequest& request, Respond respond, Alive alive,
                           uint64_t now_ms) {
  const RolloutMode mode = policy_.mode(request.subject, request.route);
  const std::string& id = request.reservation_id;
  switch (reserveRoute({.shard_owned = shards_ != nullptr && shards_->owns(id),
                        .local = local_.contains(id),
                        .unknown = unknown_.contains(id),
                        .mode = mode,
                        .link_usable = usable(),
                        .shards_enabled = shards_ != nullptr,
                        .sent_to_ledger = central_ids_.contains(id)})) {
    case ReserveRoute::kShards: shards_->apply(request, now_ms, respond); return;
    case ReserveRoute::kLocalDuplicate:
    case ReserveRoute::kLocalOff: respond(local_.admit(request, kOriginOff, now_ms)); return;
    case ReserveRoute::kResolveUnknown: resolveUnknown(id, std::move(respond)); return;
    case ReserveRoute::kShadowUnreachable: {
      const ShadowDecision decision = classifyShadow(nullptr, true);
      metrics_->countShadowDecision(decision.outcome, decision.dimension);
      respond(local_.admit(request, kOriginShadow, now_ms));
      return;
    }
    case ReserveRoute::kSentToLedgerBefore:
      respond(unavailable("reservation " + id +
                          " was sent to the ledger, which is unreachable; retry later with "
                          "the same id"));
      return;
    case ReserveRoute::kTryShard:
      if (shards_->admit(request, now_ms, respond)) return;
      [[fallthrough]];
    case ReserveRoute::kRejectUnavailable:
      respond(ledgerUnavailableRejection(request, options_.unavailable_retry_after_ms, now_ms));
      return;
    case ReserveRoute::kForward: break;
  }
  forward(
      request, std::move(respond), std::move(alive), std::nullopt,
      shards_ != nullptr ? request.reservation_id : std::string(),
      [this, request, mode](central::LinkResult result, Respond answer) {
        onReserveAnswer(request, mode, std::move(result), std::move(answer));
      },
      now_ms);
}

void AgentService::onReserveAnswer(const ReserveRequest& request, RolloutMode mode,
                                   central::LinkResult result, Respond respond) {
  const uint64_t now_ms = wallClockMs();
  const ReservationReply* reply =
      result.status.isOk() ? std::get_if<ReservationReply>(&result.response.body) : nullptr;
  const LinkOutcome outcome = result.status.isOk() ? LinkOutcome::kAnswered
                              : result.status.code() == StatusCode::kResourceExhausted
                                  ? LinkOutcome::kNotSent
                                  : LinkOutcome::kLost;
  const bool shards_wanted =
      shards_ != nullptr && policy_.wantsShards(request.subject, request.route);
  const ReserveAnswerPlan plan = planReserveAnswer(mode, outcome, reply, shards_wanted);
  if (plan.shadow.has_value()) {
    metrics_->countShadowDecision(plan.shadow->outcome, plan.shadow->dimension);
  }
  if (plan.learn_shard_account) shards_->learnAccount({request.subject, request.route}, now_ms);
  switch (plan.action) {
    case ReserveAnswer::kAdmitShadow: respond(local_.admit(request, kOriginShadow, now_ms)); return;
    case ReserveAnswer::kPassOn:
      if (result.status.isOk()) {
        respond(std::move(result.response.body));
      } else {
        respond(unavailable(result.status.message()));
      }
      return;
    case ReserveAnswer::kNotSent:
      respond(unavailable("not sent to the ledger: " + result.status.message()));
      return;
    case ReserveAnswer::kUnknown: break;
  }
  // The debit may or may not have happened: RESERVATION_UNKNOWN until a query says.
  if (!unknown_.onAnswerLost(request, now_ms)) {
    logger_->error("reservation_unknown_table_full",
                   {{"reservation_id", request.reservation_id}, {"max", options_.unknown_max}});
  } else {
    logger_->warn("reservation_unknown", {{"reservation_id", request.reservation_id},
                                          {"error", result.status.toString()}});
  }
  respond(unavailable(kOutcomeUnknown));
}

void AgentService::resolveUnknown(const std::string& id, Respond waiter) {
  if (!unknown_.contains(id)) return;
  if (waiter) unknown_waiters_[id].push_back(std::move(waiter));
  if (unknown_.resolving(id)) return;
  if (!usable()) {
    resolutionFailed(id, "ledger unreachable");
    return;
  }
  const std::optional<QueryRequest> query = unknown_.resolve(id);
  if (!query.has_value()) return;
  link_->call(*query, [this, id](central::LinkResult result) {
    if (!unknown_.contains(id)) return;
    if (!result.status.isOk()) {
      resolutionFailed(id, result.status.toString());
      return;
    }
    const uint64_t now_ms = wallClockMs();
    const auto* reply = std::get_if<ReservationReply>(&result.response.body);
    const UnknownQueryOutcome outcome = unknown_.onQueryAnswer(id, reply);
    if (outcome.resolved.has_value()) {
      resolved(id, resolvedAnswer(*reply), now_ms);
      return;
    }
    if (!outcome.resend.has_value()) {
      resolutionFailed(id, "unexpected query answer " + outcomeLabel(result.response.body));
      return;
    }
    // The ledger never saw it: the same reserve again, same id and digest.
    link_->call(*outcome.resend, [this, id](central::LinkResult again) {
      if (!unknown_.contains(id)) return;
      if (!again.status.isOk()) {
        resolutionFailed(id, again.status.toString());
        return;
      }
      (void)unknown_.onResendAnswer(id, std::get_if<ReservationReply>(&again.response.body));
      resolved(id, std::move(again.response.body), wallClockMs());
    });
  });
}

void AgentService::resolutionFailed(const std::string& id, const std::string& why) {
  unknown_.onStepFailed(id);
  std::vector<Respond> waiters;
  if (auto it = unknown_waiters_.find(id); it != unknown_waiters_.end()) {
    waiters = std::move(it->second);
    unknown_waiters_.erase(it);
  }
  logger_->debug("reservation_unknown_unresolved", {{"reservation_id", id}, {"error", why}});
  for (Respond& waiter : waiters) waiter(unavailable(kOutcomeUnknown));
}

// `id` has just left the unknown table: its waiters hear the ledger's answer.
void AgentService::resolved(const std::string& id, wire::ResponseBody body, uint64_t now_ms) {
  std::vector<Respond> waiters;
  if (auto it = unknown_waiters_.find(id); it != unknown_waiters_.end()) {
    waiters = std::move(it->second);
    unknown_waiters_.erase(it);
  }
  logger_->info("reservation_unknown_resolved",
                {{"reservation_id", id},
                 {"answer", outcomeLabel(body)},
                 {"oldest_unknown_age_ms", unknown_.oldestAgeMs(now_ms)}});
  for (Respond& waiter : waiters) waiter(body);
}

// --- start, follow-ups, query ------------------------------------------------------------------

void AgentService::start(const StartRequest& request, Respond respond, Alive alive,
                         uint64_t now_ms) {
  if (answeredByShards(request.reservation_id, request, respond, now_ms)) return;
  switch (startRoute(local_.contains(request.reservation_id), usable())) {
    case StartRoute::kLocal: respond(local_.start(request, now_ms)); return;
    case StartRoute::kUnavailable:
      respond(unavailable(
          "the ledger is unreachable; only the ledger can start a central reservation; retry "
          "later with the same ids"));
      return;
    case StartRoute::kForward:
      forward(
          request, std::move(respond), std::move(alive), std::nullopt, std::string(),
          [](central::LinkResult result, Respond answer) {
            if (result.status.isOk()) {
              answer(std::move(result.response.body));
            } else {
              answer(unavailable("start " + std::string(kOutcomeUnknown) + " (" +
                                 result.status.message() + ")"));
            }
          },
          now_ms);
      return;
  }
}

void AgentService::followUp(OutboxKind kind, wire::RequestBody body, Respond respond, Alive alive,
                            uint64_t now_ms) {
  OutboxEntry entry{.kind = kind};
  std::visit(
      [&](const auto& request) {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, SettleRequest> ||
                      std::is_same_v<T, ReportOperationRequest>) {
          entry.reservation_id = request.reservation_id;
          entry.operation_id = request.operation_id;
          entry.actual_units = request.actual_units;
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          entry.reservation_id = request.reservation_id;
          entry.operation_id = request.operation_id;
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          entry.reservation_id = request.reservation_id;
        }
      },
      body);
  if (answeredByShards(entry.reservation_id, body, respond, now_ms)) return;
  const bool local = local_.contains(entry.reservation_id);
  switch (followUpRoute(local, !machine_.outbox().empty(), usable())) {
    case FollowUp::kLocal: {
      std::visit(
          [&](const auto& request) {
            using T = std::decay_t<decltype(request)>;
            if constexpr (std::is_same_v<T, SettleRequest>) {
              respond(local_.settle(request, now_ms));
            } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
              respond(local_.reportOperation(request, now_ms));
            } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
              respond(local_.markUnknown(request, now_ms));
            } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
              respond(local_.release(request, now_ms));
            }
          },
          body);
      return;
    }
    case FollowUp::kOutbox: enqueue(std::move(entry), std::move(respond), now_ms); return;
    case FollowUp::kForward: {
      OutboxEntry queued_if_lost = entry;
      forward(
          std::move(body), std::move(respond), std::move(alive), std::move(queued_if_lost),
          std::string(),
          [this, entry = std::move(entry)](central::LinkResult result, Respond answer) {
            const uint64_t answered_ms = wallClockMs();
            if (result.status.isOk()) {
              noteDelivered(entry.kind, entry.reservation_id, result.response.body, answered_ms);
              answer(std::move(result.response.body));
              return;
            }
            // The answer is lost or it was never sent: the outbox delivers it exactly once
            // later.
            logger_->info("queued_after_link_failure", {{"kind", outboxKindName(entry.kind)},
                                                        {"reservation_id", entry.reservation_id},
                                                        {"error", result.status.toString()}});
            enqueue(entry, std::move(answer), answered_ms);
          },
          now_ms);
      return;
    }
  }
}

void AgentService::noteDelivered(OutboxKind kind, const std::string& id,
                                 const wire::ResponseBody& body, uint64_t now_ms) {
  trackUsageUnknown(&usage_unknown_, kind, id, std::get_if<ReservationReply>(&body), now_ms);
}

void AgentService::query(const QueryRequest& request, Respond respond, Alive alive,
                         uint64_t now_ms) {
  if (answeredByShards(request.reservation_id, request, respond, now_ms)) return;
  if (local_.contains(request.reservation_id)) {
    respond(local_.query(request));
    return;
  }
  if (!link_->connected()) {
    respond(unavailable("the ledger is unreachable; query later"));
    return;
  }
  const std::string id = request.reservation_id;
  forward(
      request, std::move(respond), std::move(alive), std::nullopt, std::string(),
      [this, id](central::LinkResult result, Respond respond) {
        if (!result.status.isOk()) {
          respond(unavailable("query failed: " + result.status.message()));
          return;
        }
        std::optional<ReservationReply> resolution =
            unknown_.onGatewayQueryAnswer(id, std::get_if<ReservationReply>(&result.response.body));
        if (resolution.has_value()) resolved(id, std::move(*resolution), wallClockMs());
        respond(std::move(result.response.body));
      },
      now_ms);
}

void AgentService::forwardOther(wire::RequestBody body, Respond respond, Alive alive,
                                uint64_t now_ms) {
  if (!link_->connected()) {
    respond(unavailable("the ledger is unreachable"));
    return;
  }
  const bool changes_policy = std::holds_alternative<wire::PublishPolicyRequest>(body) ||
                              std::holds_alternative<wire::RollbackPolicyRequest>(body);
  forward(
      std::move(body), std::move(respond), std::move(alive), std::nullopt, std::string(),
      [this, changes_policy](central::LinkResult result, Respond respond) {
        if (result.status.isOk()) {
          if (changes_policy) {  // modes follow a publish through this agent at once
            policy_.refreshNow();
            fetchPolicy(wallClockMs());
          }
          respond(std::move(result.response.body));
        } else {
          respond(unavailable("ledger request failed: " + result.status.message()));
        }
      },
      now_ms);
}

// --- the outbox --------------------------------------------------------------------------------

void AgentService::enqueue(OutboxEntry entry, Respond respond, uint64_t now_ms) {
  if (machine_.outbox().size() >= options_.outbox_entries_max) {
    logger_->error("outbox_full", {{"entries_max", options_.outbox_entries_max}});
  }
  const uint64_t token = next_token_++;
  responders_.emplace(token, std::move(respond));
  perform(machine_.queue(token, std::move(entry), now_ms), now_ms);  // QUEUED once persisted
}

void AgentService::onCheck(uv_check_t* check) {
  auto* service = static_cast<AgentService*>(check->data);
  const uint64_t now_ms = wallClockMs();
  service->commitOutbox(now_ms);
  service->sendWaiting(now_ms);  // answers of this iteration made room in the window
}

void AgentService::commitOutbox(uint64_t now_ms) { perform(machine_.flush(), now_ms); }

void AgentService::pumpOutbox(uint64_t now_ms) {
  if (!started_ || !link_->connected()) return;
  const std::optional<OutboxEntry> next = machine_.nextDelivery(now_ms);
  if (!next.has_value()) return;
  link_->call(outboxRequest(*next), [this, entry = *next](central::LinkResult result) {
    const uint64_t answered_ms = wallClockMs();
    if (!result.status.isOk()) {
      machine_.onDelivery(entry.seq, false, answered_ms, static_cast<uint32_t>(rng_() % 1001));
      logger_->debug("outbox_delivery_failed",
                     {{"seq", entry.seq}, {"error", result.status.toString()}});
      return;
    }
    // An answer that says the ledger changed nothing (a protocol error, a full table, an
    // overflow) is not a delivery: an acknowledged entry is never dropped; it is retried with
    // backoff, and the outbox age metric and this log line tell the operator.
    if (!outboxAnswerDelivers(std::get_if<ReservationReply>(&result.response.body))) {
      machine_.onDelivery(entry.seq, false, answered_ms, static_cast<uint32_t>(rng_() % 1001));
      logger_->warn("outbox_delivery_refused", {{"seq", entry.seq},
                                                {"kind", outboxKindName(entry.kind)},
                                                {"reservation_id", entry.reservation_id},
                                                {"answer", outcomeLabel(result.response.body)}});
      return;
    }
    const std::string outcome = outcomeLabel(result.response.body);
    if (outcome != "ok") {
      logger_->warn("outbox_delivered_not_ok", {{"seq", entry.seq},
                                                {"kind", outboxKindName(entry.kind)},
                                                {"reservation_id", entry.reservation_id},
                                                {"answer", outcome}});
    }
    noteDelivered(entry.kind, entry.reservation_id, result.response.body, answered_ms);
    machine_.onDelivery(entry.seq, true, answered_ms, 0);
    if (Status s = store_->remove(entry.seq); !s.isOk()) {
      // Stays on disk: redelivered after a restart, which the ledger answers as a duplicate.
      logger_->error("outbox_remove_failed", {{"seq", entry.seq}, {"error", s.toString()}});
    }
    logger_->debug("outbox_delivered",
                   {{"seq", entry.seq}, {"depth", uint64_t{machine_.outbox().size()}}});
    pumpOutbox(answered_ms);
  });
}

void AgentService::onPump(uv_timer_t* timer) {
  static_cast<AgentService*>(timer->data)->onTimer(wallClockMs());
}

void AgentService::onTimer(uint64_t now_ms) {
  (void)local_.tick(now_ms);  // local reservations expire like any other
  if (deadlines_.answerPendingNow(now_ms)) answerEveryPending(now_ms);
  fetchPolicy(now_ms);
  pumpOutbox(now_ms);
  if (usable() && unknown_.size() > 0) {
    for (const std::string& id : unknown_.oldest(options_.resolve_batch_max)) {
      resolveUnknown(id, nullptr);
    }
  }
  if (deadlines_.drainEnds(now_ms, machine_.outbox().empty(), link_->connected())) {
    answerEveryPending(now_ms);  // no-op unless drain ended before the deadline with requests
                                 // waiting
    logger_->info("outbox_drain_done", {{"left", uint64_t{machine_.outbox().size()}},
                                        {"connected", link_->connected()}});
    if (on_drained_) std::exchange(on_drained_, nullptr)();
  }
}

void AgentService::drain(uint64_t timeout_ms, std::function<void()> on_done) {
  if (!started_) {
    on_done();
    return;
  }
  const uint64_t now_ms = wallClockMs();
  deadlines_.beginDrain(now_ms, timeout_ms);
  on_drained_ = std::move(on_done);
  onTimer(now_ms);
}

// --- policy ------------------------------------------------------------------------------------

void AgentService::fetchPolicy(uint64_t now_ms) {
  if (!started_ || !policy_.beginFetch(link_->connected(), now_ms)) return;
  link_->call(wire::ShowPolicyRequest{}, [this](central::LinkResult result) {
    auto* answer =
        result.status.isOk() ? std::get_if<wire::PolicyAnswer>(&result.response.body) : nullptr;
    if (answer == nullptr) {
      policy_.onFetchFailed();
      return;
    }
    const PolicyFetchOutcome outcome =
        policy_.onFetchAnswer(answer->reply, std::move(answer->policy));
    if (outcome.changed) {
      logger_->info("policy_loaded",
                    {{"generation", outcome.generation}, {"budgets", outcome.budgets}});
    }
  });
}

}  // namespace tally::agent
