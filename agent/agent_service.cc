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
    std::is_same_v<T, wire::WriteOffShardRequest> || std::is_same_v<T, EnrollOperatorRequest> ||
    std::is_same_v<T, SetOperatorEnabledRequest> || std::is_same_v<T, ListOperatorsRequest> ||
    std::is_same_v<T, AuditLogRequest>;

template <typename T>
constexpr bool kPolicyChange =
    std::is_same_v<T, wire::PublishPolicyRequest> || std::is_same_v<T, wire::RollbackPolicyRequest>;

constexpr const char* kPolicyChangeRefused =
    "policy publish and rollback are operator requests, not served on the agent's socket: send "
    "them to the ledger with the operator key (tallyctl --ledger HOST:PORT --key operator.key)";

ReservationReply queuedReply(const OutboxEntry& entry) {
  return {.code = ReplyCode::kQueued,
          .message = std::string(outboxKindName(entry.kind)) + " of " + entry.reservation_id +
                     " durably queued at the agent (seq " + std::to_string(entry.seq) +
                     "); it reaches the ledger exactly once when the link is back"};
}

}  // namespace

AgentService::AgentService(uv_loop_t* loop, central::LedgerLink* link, OutboxStore* store,
                           AgentMetrics* metrics, Logger* logger, AgentServiceOptions options)
    : loop_(loop),
      link_(link),
      store_(store),
      metrics_(metrics),
      logger_(logger),
      options_(options),
      rng_(options.seed != 0 ? options.seed : monotonicClockUs()),
      core_(
          AgentCoreOptions{.policy_refresh_ms = options.policy_refresh_ms,
                           .outbox_entries_max = options.outbox_entries_max,
                           .local_reservations_max = options.local_reservations_max,
                           .unknown_max = options.unknown_max,
                           .unavailable_retry_after_ms = options.unavailable_retry_after_ms,
                           .resolve_batch_max = options.resolve_batch_max,
                           .central_ids_max = options.central_ids_max,
                           .ledger_window_max = options.ledger_window_max,
                           .waiting_max = options.waiting_max,
                           .fair = options.fair},
          [this](uint64_t token) {
            auto it = held_.find(token);
            return it == held_.end() || !it->second.alive || it->second.alive();
          },
          nullptr) {
  check_.data = this;
  pump_timer_.data = this;
}

AgentService::~AgentService() { TALLY_ASSERT(open_handles_ == 0); }

Status AgentService::start(std::vector<OutboxEntry> restored, uint64_t boot_epoch) {
  boot_epoch_ = boot_epoch;
  core_.start(std::move(restored), wallClockMs());
  perform();
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
    core_.onConnected(linkState(), wallClockMs());
    perform();
  });
  return Status::ok();
}

void AgentService::stop() {
  started_ = false;
  core_.stop();
  for (uv_handle_t* handle : std::exchange(handles_, {})) {
    uv_close(handle, [](uv_handle_t* closed) {
      --static_cast<AgentService*>(closed->data)->open_handles_;
    });
  }
}

AgentLinkState AgentService::linkState() const {
  return {.connected = link_->connected(), .health = link_->health()};
}

GaugeSnapshot AgentService::gauges() const {
  const uint64_t now_ms = wallClockMs();
  const AgentMachine& machine = core_.machine();
  GaugeSnapshot snapshot{.health = link_->health(),
                         .connected = link_->connected(),
                         .outbox_depth = machine.outbox().size(),
                         .outbox_oldest_age_ms = machine.outbox().oldestAgeMs(now_ms),
                         .reservation_unknown = core_.unknown().size(),
                         .reservation_unknown_oldest_age_ms = core_.unknown().oldestAgeMs(now_ms),
                         .usage_unknown = core_.usageUnknown().size(),
                         .usage_unknown_oldest_age_ms = core_.usageUnknown().oldestAgeMs(now_ms),
                         .boot_epoch = boot_epoch_,
                         .local_reservations = core_.local().size()};
  snapshot.ledger_address = link_->currentAddress();
  snapshot.ledger_not_primary_answers = link_->stats().not_primary_answers;
  for (const FairRouteView& route : core_.fair().routes()) {
    snapshot.fair_routes.push_back(FairRouteGauges{.route = route.route,
                                                   .started_max = route.started_max,
                                                   .started = route.started,
                                                   .waiting = route.waiting,
                                                   .fairness_error = route.meter->last().error,
                                                   .windows = route.meter->windowsCompleted()});
  }
  if (shards_ != nullptr) {
    const ShardGauges shard_gauges = shards_->gauges(now_ms);
    snapshot.shards_usable = shard_gauges.usable;
    snapshot.shards_closed = shard_gauges.closed;
    snapshot.shards_quarantined = shard_gauges.quarantined;
    snapshot.shards_unreconcilable = shard_gauges.unreconcilable;
    snapshot.shard_available_units = shard_gauges.available_units;
    snapshot.shard_oldest_unreconciled_age_ms = shard_gauges.oldest_unreconciled_age_ms;
  }
  return snapshot;
}

void AgentService::handle(wire::RequestBody&& body, Respond respond, Alive alive) {
  const Op op = opFor(body);
  const uint64_t now_ms = wallClockMs();
  const uint64_t started_us = monotonicClockUs();  // the latency histogram only
  Respond measured = [this, op, started_us,
                      respond = std::move(respond)](wire::ResponseBody&& answer) {
    metrics_->countRequest(op, outcomeName(answer), monotonicClockUs() - started_us);
    if (const auto* reply = std::get_if<ReservationReply>(&answer)) {
      if (op == Op::kReserve && (reply->code == ReplyCode::kRejected ||
                                 reply->receipt.state == ReservationState::kRejected)) {
        metrics_->countRejection(reply->receipt.limiting_dimension);
      }
    }
    respond(std::move(answer));
  };
  // What the core decides on; everything else is answered here (not a decision: the agent's
  // own health, and kinds no gateway may send).
  std::optional<AgentRequest> request;
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ReserveRequest> || std::is_same_v<T, StartRequest> ||
                      std::is_same_v<T, SettleRequest> || std::is_same_v<T, ReleaseRequest> ||
                      std::is_same_v<T, MarkUnknownRequest> ||
                      std::is_same_v<T, ReportOperationRequest> ||
                      std::is_same_v<T, QueryRequest> || std::is_same_v<T, ExtendRequest>) {
          request = value;
        } else if constexpr (std::is_same_v<T, wire::HealthRequest>) {
          measured(wire::HealthReply{
              .status = link_->connected() ? linkHealthName(link_->health()) : "DISCONNECTED",
              .version = kVersion,
              .now_ms = now_ms});
        } else if constexpr (std::is_same_v<T, wire::UnknownMessage>) {
          measured(
              wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                               .message = "unknown request kind " + std::to_string(value.which)});
        } else if constexpr (kGatewayOrShardRequest<T>) {
          // Operator and agent-to-ledger messages: never forwarded from a gateway's socket.
          measured(wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                                    .message = "request kind not served by the agent"});
        } else if constexpr (kPolicyChange<T>) {
          // Operator requests: a gateway peer of the agent's socket may not change the policy
          // of every tenant through the agent's link (docs/security.md "Agents").
          measured(wire::ErrorReply{.code = wire::ErrorCode::kPermissionDenied,
                                    .message = kPolicyChangeRefused});
        } else {
          static_assert(
              std::is_same_v<T, wire::AuditRequest> || std::is_same_v<T, wire::ShowPolicyRequest>,
              "only the operator's reads are forwarded as other requests");
          request = AgentOtherRequest{};
        }
      },
      body);
  if (!request.has_value()) return;
  const uint64_t token = core_.newToken();
  responders_.emplace(token, std::move(measured));
  held_.emplace(token, Held{.body = std::move(body), .alive = std::move(alive)});
  core_.onRequest(token, *request, linkState(), now_ms);
  perform();
}

// --- effects -------------------------------------------------------------------------------------

void AgentService::reply(uint64_t token, wire::ResponseBody&& body) {
  held_.erase(token);
  auto it = responders_.find(token);
  TALLY_ASSERT(it != responders_.end());
  Respond respond = std::move(it->second);
  responders_.erase(it);
  respond(std::move(body));
}

void AgentService::send(uint64_t call, wire::RequestBody&& body) {
  link_->call(std::move(body), [this, call](central::LinkResult&& result) {
    onLinkResult(call, std::move(result));
  });
}

void AgentService::onLinkResult(uint64_t call, central::LinkResult&& result) {
  AgentLedgerAnswer answer;
  if (result.status.isOk()) {
    answer.outcome = LinkOutcome::kAnswered;
    answer.label = outcomeName(result.response.body);
    if (const auto* reply = std::get_if<ReservationReply>(&result.response.body)) {
      answer.reservation = *reply;
    } else if (auto* policy = std::get_if<wire::PolicyAnswer>(&result.response.body)) {
      answer.policy_reply = policy->reply;
      // A copy: the same answer may still be relayed whole to the gateway that asked (perform).
      answer.policy = policy->policy;
    }
  } else {
    answer.outcome = result.status.code() == StatusCode::kResourceExhausted ? LinkOutcome::kNotSent
                                                                            : LinkOutcome::kLost;
    answer.error = result.status.message();
    answer.error_detail = result.status.toString();
  }
  core_.onAnswer(call, answer, linkState(), wallClockMs(), static_cast<uint32_t>(rng_() % 1001));
  perform(&result.response.body);
}

void AgentService::perform(wire::ResponseBody* answer) {
  for (AgentCoreEffects effects = core_.takeEffects(); !effects.empty();
       effects = core_.takeEffects()) {
    for (AgentCoreEffect& effect : effects) {
      std::visit(
          [&](auto& value) {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, AgentSend>) {
              auto it = held_.find(value.token);
              TALLY_ASSERT(it != held_.end());
              wire::RequestBody body = std::move(it->second.body);
              held_.erase(it);
              send(value.token, std::move(body));
            } else if constexpr (std::is_same_v<T, AgentDrop>) {
              ++dropped_gone_;
              reply(value.token, unavailable("the requester is gone"));  // a no-op for it
            } else if constexpr (std::is_same_v<T, AgentReplyUnavailable>) {
              reply(value.token, unavailable(std::move(value.message)));
            } else if constexpr (std::is_same_v<T, AgentReplyQueued>) {
              reply(value.token, queuedReply(value.entry));
            } else if constexpr (std::is_same_v<T, AgentReplyReservation>) {
              reply(value.token, std::move(value.reply));
            } else if constexpr (std::is_same_v<T, AgentReplyLedgerAnswer>) {
              TALLY_ASSERT(answer != nullptr);
              reply(value.token, std::move(*std::exchange(answer, nullptr)));
            } else if constexpr (std::is_same_v<T, AgentPersist>) {
              // Group commit: one transaction, one fsync; the core then says who hears QUEUED.
              const Status status = store_->appendBatch(value.entries);
              if (status.isOk()) {
                logger_->debug("outbox_committed",
                               {{"entries", uint64_t{value.entries.size()}},
                                {"depth", uint64_t{core_.machine().outbox().size()}}});
              } else {
                logger_->error("outbox_write_failed", {{"entries", uint64_t{value.entries.size()}},
                                                       {"error", status.toString()}});
              }
              core_.persisted(status.isOk(), status.message(), wallClockMs());
            } else if constexpr (std::is_same_v<T, AgentCall>) {
              send(value.call, callRequest(std::move(value.body)));
            } else if constexpr (std::is_same_v<T, AgentRemoveDelivered>) {
              if (Status s = store_->remove(value.seq); !s.isOk()) {
                // Stays on disk: redelivered after a restart, which the ledger answers as a
                // duplicate.
                logger_->error("outbox_remove_failed",
                               {{"seq", value.seq}, {"error", s.toString()}});
              }
            } else if constexpr (std::is_same_v<T, AgentToShards>) {
              held_.erase(value.token);
              auto it = responders_.find(value.token);
              TALLY_ASSERT(it != responders_.end() && shards_ != nullptr);
              shards_->expect(value.token, std::move(it->second));
              responders_.erase(it);
            } else if constexpr (std::is_same_v<T, AgentCountShadow>) {
              metrics_->countShadowDecision(value.decision.outcome, value.decision.dimension);
            } else if constexpr (std::is_same_v<T, ShardNote>) {
              note(value);
            } else if constexpr (std::is_same_v<T, AgentShutdownAnswering>) {
              shutdown_pending_ = responders_.size();
            } else if constexpr (std::is_same_v<T, AgentShutdownAnswered>) {
              logger_->info("shutdown_answered", {{"requests", uint64_t{shutdown_pending_}},
                                                  {"unanswered", uint64_t{responders_.size()}}});
            } else {
              static_assert(std::is_same_v<T, AgentDrainDone>);
              logger_->info("outbox_drain_done",
                            {{"left", value.left}, {"connected", value.connected}});
              if (on_drained_) std::exchange(on_drained_, nullptr)();
            }
          },
          effect);
    }
  }
  if (shards_ != nullptr) shards_->perform();  // what the core asked of the shard keeping
}

void AgentService::note(const ShardNote& note) { logNote(logger_, note); }

// --- time ----------------------------------------------------------------------------------------

void AgentService::onCheck(uv_check_t* check) {
  auto* service = static_cast<AgentService*>(check->data);
  service->core_.onIterationEnd(wallClockMs());
  service->perform();
}

void AgentService::onPump(uv_timer_t* timer) {
  auto* service = static_cast<AgentService*>(timer->data);
  service->core_.onTick(service->linkState(), wallClockMs());
  service->perform();
}

void AgentService::beginShutdown(uint64_t timeout_ms) {
  core_.beginShutdown(timeout_ms, wallClockMs());
  perform();
}

void AgentService::drain(uint64_t timeout_ms, std::function<void()> on_done) {
  if (!started_) {
    on_done();
    return;
  }
  on_drained_ = std::move(on_done);
  core_.beginDrain(timeout_ms, linkState(), wallClockMs());
  perform();
}

}  // namespace tally::agent
