#include "core/agent_core.h"

#include <type_traits>
#include <utility>

#include "core/assert.h"
#include "core/outbox_request.h"
#include "core/region_fence.h"

namespace tally {

LedgerRequest callRequest(AgentCallBody body) {
  return std::visit(
      [](auto& call_body) -> LedgerRequest {
        using B = std::decay_t<decltype(call_body)>;
        if constexpr (std::is_same_v<B, OutboxEntry>) {
          return outboxRequest(call_body);
        } else if constexpr (std::is_same_v<B, AgentShowPolicy>) {
          return ShowPolicyRequest{.unless_generation = call_body.unless_generation};
        } else {
          return std::move(call_body);
        }
      },
      body);
}
namespace {

std::string num(uint64_t value) { return std::to_string(value); }

ShardNote logLine(ShardNoteLevel level, std::string event,
                  std::vector<std::pair<std::string, std::string>> fields) {
  return ShardNote{.level = level, .event = std::move(event), .fields = std::move(fields)};
}

const ReservationReply* reservationOf(const AgentLedgerAnswer& answer) {
  return answer.outcome == LinkOutcome::kAnswered && answer.reservation.has_value()
             ? &*answer.reservation
             : nullptr;
}

}  // namespace

AgentCore::AgentCore(AgentCoreOptions options, std::function<bool(uint64_t token)> alive,
                     ShardKeeping* shards)
    : options_(options),
      alive_(std::move(alive)),
      shards_(shards),
      policy_({.refresh_ms = options.policy_refresh_ms}, 0),
      fair_(options.fair),
      local_({.entries_max = options.local_reservations_max}),
      unknown_(options.unknown_max),
      usage_unknown_(options.unknown_max),
      central_ids_(options.central_ids_max),
      machine_({.window_max = options.ledger_window_max,
                .waiting_max = options.waiting_max,
                .outbox = {.entries_max = options.outbox_entries_max}}) {
#ifdef TALLY_TEST_FAULTS
  unknown_.setFaultsForTesting(options_.unknown_faults);
#endif
}

void AgentCore::start(std::vector<OutboxEntry> restored, uint64_t now_ms) {
  policy_ = AgentPolicy({.refresh_ms = options_.policy_refresh_ms}, now_ms);
  const size_t restored_count = restored.size();
  machine_.restore(std::move(restored));
  if (restored_count > 0) {
    note(logLine(ShardNoteLevel::kInfo, "outbox_restored",
                 {{"entries", num(restored_count)},
                  {"oldest_age_ms", num(machine_.outbox().oldestAgeMs(now_ms))}}));
  }
  started_ = true;
}

void AgentCore::unavailable(uint64_t token, std::string message) {
  effects_.push_back(AgentReplyUnavailable{token, std::move(message)});
}

// --- requests ------------------------------------------------------------------------------------

void AgentCore::onRequest(uint64_t token, const AgentRequest& request, const AgentLinkState& link,
                          uint64_t now_ms) {
  TALLY_ASSERT(token != 0 && token < next_token_);
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ReserveRequest>) {
          reserve(token, value, link, now_ms);
        } else if constexpr (std::is_same_v<T, StartRequest>) {
          start(token, value, link, now_ms);
        } else if constexpr (std::is_same_v<T, SettleRequest>) {
          followUp(token, OutboxKind::kSettle, request, link, now_ms);
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          followUp(token, OutboxKind::kRelease, request, link, now_ms);
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          followUp(token, OutboxKind::kMarkUnknown, request, link, now_ms);
        } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
          followUp(token, OutboxKind::kReportOperation, request, link, now_ms);
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          query(token, value, link, now_ms);
        } else if constexpr (std::is_same_v<T, ExtendRequest>) {
          extend(token, value, link, now_ms);
        } else {
          static_assert(std::is_same_v<T, AgentOtherRequest>);
          if (!link.connected) {
            unavailable(token, "the ledger is unreachable");
            return;
          }
          forward(token, std::nullopt, OtherAnswerStep{.changes_policy = value.changes_policy},
                  std::string(), now_ms);
        }
      },
      request);
  forwardAdmitted(now_ms);  // a follow-up may have freed an execution slot
}

bool AgentCore::toShards(uint64_t token, const ShardOperation& operation, uint64_t now_ms) {
  const std::string& id = std::visit(
      [](const auto& value) -> const std::string& { return value.reservation_id; }, operation);
  if (shards_ == nullptr || !shards_->owns(id)) return false;
  shards_->apply(token, operation, now_ms);
  effects_.push_back(AgentToShards{token});
  return true;
}

void AgentCore::reserve(uint64_t token, const ReserveRequest& request, const AgentLinkState& link,
                        uint64_t now_ms) {
  const RolloutMode mode = policy_.mode(request.subject, request.route);
  const std::string& id = request.reservation_id;
  const bool usable = linkUsable(link.connected, link.health);
  switch (reserveRoute({.shard_owned = shards_ != nullptr && shards_->owns(id),
                        .local = local_.contains(id),
                        .unknown = unknown_.contains(id),
                        .mode = mode,
                        .link_usable = usable,
                        .shards_enabled = shards_ != nullptr,
                        .sent_to_ledger = central_ids_.contains(id)})) {
    case ReserveRoute::kShards: (void)toShards(token, request, now_ms); return;
    case ReserveRoute::kLocalDuplicate:
    case ReserveRoute::kLocalOff:
      effects_.push_back(AgentReplyReservation{token, local_.admit(request, kOriginOff, now_ms)});
      return;
    case ReserveRoute::kResolveUnknown: resolveUnknown(id, token, link); return;
    case ReserveRoute::kShadowUnreachable:
      effects_.push_back(AgentCountShadow{classifyShadow(nullptr, true)});
      effects_.push_back(
          AgentReplyReservation{token, local_.admit(request, kOriginShadow, now_ms)});
      return;
    case ReserveRoute::kSentToLedgerBefore:
      unavailable(token, "reservation " + id +
                             " was sent to the ledger, which is unreachable; retry later with "
                             "the same id");
      return;
    case ReserveRoute::kTryShard:
      if (std::optional<ReservationReply> refused = shardRegionRefusal(
              policy_.policy(), request, options_.unavailable_retry_after_ms, now_ms)) {
        effects_.push_back(AgentReplyReservation{token, *std::move(refused)});
        return;
      }
      if (shards_->admit(token, request, now_ms)) {
        effects_.push_back(AgentToShards{token});
        return;
      }
      [[fallthrough]];
    case ReserveRoute::kRejectUnavailable:
      effects_.push_back(AgentReplyReservation{
          token, ledgerUnavailableRejection(request, options_.unavailable_retry_after_ms, now_ms)});
      return;
    case ReserveRoute::kForward: break;
  }
  forward(token, std::nullopt, ReserveAnswerStep{.request = request, .mode = mode},
          shards_ != nullptr ? id : std::string(), now_ms);
}

void AgentCore::start(uint64_t token, const StartRequest& request, const AgentLinkState& link,
                      uint64_t now_ms) {
  if (toShards(token, request, now_ms)) return;
  switch (startRoute(local_.contains(request.reservation_id),
                     linkUsable(link.connected, link.health))) {
    case StartRoute::kLocal:
      effects_.push_back(AgentReplyReservation{token, local_.start(request, now_ms)});
      return;
    case StartRoute::kUnavailable:
      unavailable(token,
                  "the ledger is unreachable; only the ledger can start a central reservation; "
                  "retry later with the same ids");
      return;
    case StartRoute::kForward: scheduleStart(token, request, now_ms); return;
  }
}

// --- fair scheduling (core/fair_scheduler.h) -----------------------------------------------------

FairStartTerms AgentCore::fairTerms(const std::string& subject, const std::string& route,
                                    uint32_t request_priority) const {
  const Budget* budget =
      policy_.policy().has_value() ? matchBudget(*policy_.policy(), subject, route) : nullptr;
  if (budget == nullptr) return {.weight = 1, .priority = fairPriorityClass(request_priority, 0)};
  return {.weight = budget->weight,
          .priority = fairPriorityClass(request_priority, budget->priority),
          .slot_ttl_ms = budget->hard_execution_limit_ms};
}

void AgentCore::scheduleStart(uint64_t token, const StartRequest& request, uint64_t now_ms) {
  const std::string& id = request.reservation_id;
  FairStartTerms terms;
  if (const FairReserved* reserved = fair_.reservation(id)) {
    terms = fairTerms(reserved->subject, reserved->route, reserved->priority);
  }
  const FairStart decision = fair_.requestStart(token, id, terms, now_ms);
  switch (decision) {
    case FairStart::kNotScheduled:
    case FairStart::kHoldsSlot:  // a retry: the ledger answers it as a duplicate
      forward(token, std::nullopt, StartAnswerStep{.id = id}, std::string(), now_ms);
      return;
    case FairStart::kAdmitted:
      forward(token, std::nullopt, StartAnswerStep{.id = id, .slotted = true}, std::string(),
              now_ms);
      return;
    case FairStart::kWaiting: return;  // forwardAdmitted() sends it when its turn comes
    case FairStart::kAlreadyWaiting:
      unavailable(token, "a start of reservation " + id +
                             " already waits for an execution slot; retry later with the same ids");
      return;
    case FairStart::kFull:
      unavailable(token,
                  "too many starts wait for an execution slot; retry later with the same ids");
      return;
  }
}

void AgentCore::forwardAdmitted(uint64_t now_ms) {
  // Forwarding can free a slot again (the window refuses it, its requester is gone): loop.
  for (std::vector<FairAdmission> admitted = fair_.takeAdmitted(); !admitted.empty();
       admitted = fair_.takeAdmitted()) {
    for (FairAdmission& admission : admitted) {
      forward(admission.token, std::nullopt,
              StartAnswerStep{.id = std::move(admission.reservation_id), .slotted = true},
              std::string(), now_ms);
    }
  }
}

void AgentCore::onStartAnswer(const StartAnswerStep& step, const AgentLedgerAnswer& answer,
                              uint64_t now_ms) {
  const ReservationReply* reply = reservationOf(answer);
  const bool started = reply != nullptr && reply->code == ReplyCode::kOk;
  if (step.slotted) {
    // A lost answer may hide a start: the slot stays held until the work finishes.
    if (answer.outcome != LinkOutcome::kLost) fair_.onStartAnswered(step.id, started, now_ms);
    return;
  }
  if (started && fair_.schedules(reply->receipt.route)) {
    const Reservation& receipt = reply->receipt;
    fair_.onStartedOutside({.reservation_id = receipt.reservation_id,
                            .subject = receipt.subject,
                            .route = receipt.route,
                            .priority = receipt.priority,
                            .expires_at_ms = receipt.expires_at_ms},
                           fairTerms(receipt.subject, receipt.route, receipt.priority).slot_ttl_ms,
                           now_ms);
  }
}

void AgentCore::followUp(uint64_t token, OutboxKind kind, const AgentRequest& request,
                         const AgentLinkState& link, uint64_t now_ms) {
  OutboxEntry entry{.kind = kind};
  ShardOperation operation;
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, SettleRequest> ||
                      std::is_same_v<T, ReportOperationRequest>) {
          entry.reservation_id = value.reservation_id;
          entry.operation_id = value.operation_id;
          entry.actual_units = value.actual_units;
          operation = value;
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          entry.reservation_id = value.reservation_id;
          entry.operation_id = value.operation_id;
          operation = value;
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          entry.reservation_id = value.reservation_id;
          operation = value;
        } else {
          TALLY_UNREACHABLE();
        }
      },
      request);
  // The work is over (or given up): its execution slot is free. A start still waiting is
  // never sent: its requester hears so.
  if (std::optional<uint64_t> waiter = fair_.onFinished(entry.reservation_id, now_ms)) {
    unavailable(*waiter, "reservation " + entry.reservation_id + " got a " + outboxKindName(kind) +
                             " while its start waited for an execution slot; it was not started");
  }
  if (toShards(token, operation, now_ms)) return;
  const bool local = local_.contains(entry.reservation_id);
  switch (
      followUpRoute(local, !machine_.outbox().empty(), linkUsable(link.connected, link.health))) {
    case FollowUp::kLocal: {
      ReservationReply reply = std::visit(
          [&](const auto& value) -> ReservationReply {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, SettleRequest>) {
              return local_.settle(value, now_ms);
            } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
              return local_.reportOperation(value, now_ms);
            } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
              return local_.markUnknown(value, now_ms);
            } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
              return local_.release(value, now_ms);
            } else {
              TALLY_UNREACHABLE();
            }
          },
          request);
      effects_.push_back(AgentReplyReservation{token, std::move(reply)});
      return;
    }
    case FollowUp::kOutbox: enqueue(token, std::move(entry), now_ms); return;
    case FollowUp::kForward: {
      OutboxEntry queued_if_lost = entry;
      forward(token, std::move(queued_if_lost), FollowUpAnswerStep{.entry = std::move(entry)},
              std::string(), now_ms);
      return;
    }
  }
}

void AgentCore::query(uint64_t token, const QueryRequest& request, const AgentLinkState& link,
                      uint64_t now_ms) {
  if (toShards(token, request, now_ms)) return;
  if (local_.contains(request.reservation_id)) {
    effects_.push_back(AgentReplyReservation{token, local_.query(request)});
    return;
  }
  if (!link.connected) {
    unavailable(token, "the ledger is unreachable; query later");
    return;
  }
  forward(token, std::nullopt, QueryAnswerStep{.id = request.reservation_id}, std::string(),
          now_ms);
}

void AgentCore::extend(uint64_t token, const ExtendRequest& request, const AgentLinkState& link,
                       uint64_t now_ms) {
  if (local_.contains(request.reservation_id)) {
    effects_.push_back(AgentReplyReservation{token, local_.extend(request, now_ms)});
    return;
  }
  if (shards_ != nullptr && shards_->owns(request.reservation_id)) {
    unavailable(token, "reservation " + request.reservation_id +
                           " is held by an emergency shard, which this agent cannot extend; "
                           "stop the work or settle it");
    return;
  }
  if (!linkUsable(link.connected, link.health)) {
    unavailable(token, "the ledger is unreachable; extend later with the same total");
    return;
  }
  forward(token, std::nullopt, OtherAnswerStep{}, std::string(), now_ms);
}

// --- the window ----------------------------------------------------------------------------------

void AgentCore::forward(uint64_t token, std::optional<OutboxEntry> follow_up, Step step,
                        std::string central_id, uint64_t now_ms) {
  forwarded_.emplace(token, Forward{.step = std::move(step), .central_id = std::move(central_id)});
  take(machine_.submit(token, std::move(follow_up)), now_ms);
  sendWaiting(now_ms);
}

void AgentCore::sendWaiting(uint64_t now_ms) {
  while (std::optional<uint64_t> next = machine_.nextToSend()) {
    const bool alive = !alive_ || alive_(*next);
    AgentEffects effects = machine_.admitNext(alive);
    for (const AgentEffect& effect : effects) {
      if (const auto* send = std::get_if<AgentSend>(&effect)) {
        auto it = forwarded_.find(send->token);
        TALLY_ASSERT(it != forwarded_.end());
        // Never admitted from a shard while partitioned: the ledger may hold it from now on.
        if (!it->second.central_id.empty()) {
          central_ids_.addEvictingOldest(it->second.central_id, now_ms);
        }
      }
    }
    take(std::move(effects), now_ms);
  }
}

// Takes the machine's effects; a token answered or dropped leaves `forwarded_` (and a start
// never sent gives its execution slot back).
void AgentCore::take(AgentEffects effects, uint64_t now_ms) {
  for (AgentEffect& effect : effects) {
    std::visit(
        [&](auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, AgentDrop> || std::is_same_v<T, AgentReplyUnavailable> ||
                        std::is_same_v<T, AgentReplyQueued>) {
            if (auto it = forwarded_.find(value.token); it != forwarded_.end()) {
              const auto* start = std::get_if<StartAnswerStep>(&it->second.step);
              if (start != nullptr && start->slotted) {
                fair_.onStartAnswered(start->id, false, now_ms);
              }
              forwarded_.erase(it);
            }
          }
          effects_.push_back(std::move(value));
        },
        effect);
  }
}

void AgentCore::call(Step step, AgentCallBody body) {
  const uint64_t id = newToken();
  calls_.emplace(id, std::move(step));
  effects_.push_back(AgentCall{.call = id, .body = std::move(body)});
}

void AgentCore::onIterationEnd(uint64_t now_ms) {
  take(machine_.flush(), now_ms);
  sendWaiting(now_ms);  // answers of this iteration made room in the window
  forwardAdmitted(now_ms);
}

void AgentCore::persisted(bool ok, const std::string& error, uint64_t now_ms) {
  take(machine_.persisted(ok, error), now_ms);
  forwardAdmitted(now_ms);
}

// --- answers -------------------------------------------------------------------------------------

void AgentCore::onAnswer(uint64_t call, const AgentLedgerAnswer& answer, const AgentLinkState& link,
                         uint64_t now_ms, uint32_t jitter_permille) {
  dispatchAnswer(call, answer, link, now_ms, jitter_permille);
  forwardAdmitted(now_ms);  // a refused start may have freed an execution slot
}

void AgentCore::dispatchAnswer(uint64_t call, const AgentLedgerAnswer& answer,
                               const AgentLinkState& link, uint64_t now_ms,
                               uint32_t jitter_permille) {
  if (auto it = calls_.find(call); it != calls_.end()) {
    Step step = std::move(it->second);
    calls_.erase(it);
    onCallAnswer(std::move(step), answer, link, now_ms, jitter_permille);
    return;
  }
  if (!machine_.onResult(call)) return;  // answered at the shutdown deadline
  auto it = forwarded_.find(call);
  TALLY_ASSERT(it != forwarded_.end());
  Step step = std::move(it->second.step);
  forwarded_.erase(it);
  onForwardAnswer(call, std::move(step), answer, link, now_ms);
}

void AgentCore::onForwardAnswer(uint64_t token, Step step, const AgentLedgerAnswer& answer,
                                const AgentLinkState& link, uint64_t now_ms) {
  const bool answered = answer.outcome == LinkOutcome::kAnswered;
  const ReservationReply* reply = reservationOf(answer);
  std::visit(
      [&](auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ReserveAnswerStep>) {
          const ReserveRequest& request = value.request;
          const bool shards_wanted =
              shards_ != nullptr && policy_.wantsShards(request.subject, request.route);
          const ReserveAnswerPlan plan =
              planReserveAnswer(value.mode, answer.outcome, reply, shards_wanted);
          if (plan.shadow.has_value()) effects_.push_back(AgentCountShadow{*plan.shadow});
          if (plan.learn_shard_account) {
            shards_->learnAccount({request.subject, request.route}, now_ms);
          }
          switch (plan.action) {
            case ReserveAnswer::kAdmitShadow:
              effects_.push_back(
                  AgentReplyReservation{token, local_.admit(request, kOriginShadow, now_ms)});
              return;
            case ReserveAnswer::kPassOn:
              if (answered) {
                if (reply != nullptr && reply->code == ReplyCode::kOk &&
                    reply->receipt.state == ReservationState::kReserved &&
                    !fair_.onReserved({.reservation_id = request.reservation_id,
                                       .subject = request.subject,
                                       .route = request.route,
                                       .priority = request.priority,
                                       .expires_at_ms = reply->receipt.expires_at_ms})) {
                  note(logLine(ShardNoteLevel::kWarn, "fair_reservations_full",
                               {{"reservation_id", request.reservation_id}}));
                }
                effects_.push_back(AgentReplyLedgerAnswer{token});
              } else {
                unavailable(token, answer.error);
              }
              return;
            case ReserveAnswer::kNotSent:
              unavailable(token, "not sent to the ledger: " + answer.error);
              return;
            case ReserveAnswer::kUnknown: break;
          }
#ifdef TALLY_TEST_FAULTS
          if (options_.unknown_faults.answer_lost_as_reserved) {
            effects_.push_back(AgentReplyReservation{
                token, ReservationReply{.code = ReplyCode::kOk,
                                        .receipt = agentReceiptOf(
                                            request, ReservationState::kReserved, now_ms)}});
            return;
          }
#endif
          // The debit may or may not have happened: RESERVATION_UNKNOWN until a query says.
          if (!unknown_.onAnswerLost(request, now_ms)) {
            note(logLine(
                ShardNoteLevel::kError, "reservation_unknown_table_full",
                {{"reservation_id", request.reservation_id}, {"max", num(options_.unknown_max)}}));
          } else {
            note(logLine(
                ShardNoteLevel::kWarn, "reservation_unknown",
                {{"reservation_id", request.reservation_id}, {"error", answer.error_detail}}));
          }
          unavailable(token, kAgentOutcomeUnknown);
        } else if constexpr (std::is_same_v<T, StartAnswerStep>) {
          onStartAnswer(value, answer, now_ms);
          if (answered) {
            effects_.push_back(AgentReplyLedgerAnswer{token});
          } else {
            unavailable(token,
                        "start " + std::string(kAgentOutcomeUnknown) + " (" + answer.error + ")");
          }
        } else if constexpr (std::is_same_v<T, FollowUpAnswerStep>) {
          if (answered) {
            trackUsageUnknown(&usage_unknown_, value.entry.kind, value.entry.reservation_id, reply,
                              now_ms);
            effects_.push_back(AgentReplyLedgerAnswer{token});
            return;
          }
          // The answer is lost or it was never sent: the outbox delivers it exactly once later.
          note(logLine(ShardNoteLevel::kInfo, "queued_after_link_failure",
                       {{"kind", outboxKindName(value.entry.kind)},
                        {"reservation_id", value.entry.reservation_id},
                        {"error", answer.error_detail}}));
          enqueue(token, value.entry, now_ms);
        } else if constexpr (std::is_same_v<T, QueryAnswerStep>) {
          if (!answered) {
            unavailable(token, "query failed: " + answer.error);
            return;
          }
          std::optional<ReservationReply> resolution =
              unknown_.onGatewayQueryAnswer(value.id, reply);
          if (resolution.has_value()) {
            resolved(value.id, std::move(resolution), answer.label, now_ms);
          }
          effects_.push_back(AgentReplyLedgerAnswer{token});
        } else if constexpr (std::is_same_v<T, OtherAnswerStep>) {
          if (!answered) {
            unavailable(token, "ledger request failed: " + answer.error);
            return;
          }
          if (value.changes_policy) {  // modes follow a publish through this agent at once
            policy_.refreshNow();
            fetchPolicy(link, now_ms);
          }
          effects_.push_back(AgentReplyLedgerAnswer{token});
        } else {
          TALLY_UNREACHABLE();  // the core's own calls are not forwarded requests
        }
      },
      step);
}

void AgentCore::onCallAnswer(Step step, const AgentLedgerAnswer& answer, const AgentLinkState& link,
                             uint64_t now_ms, uint32_t jitter_permille) {
  const bool answered = answer.outcome == LinkOutcome::kAnswered;
  const ReservationReply* reply = reservationOf(answer);
  std::visit(
      [&](auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ResolveQueryStep>) {
          const std::string& id = value.id;
          if (!unknown_.contains(id)) return;
          if (!answered) {
            resolutionFailed(id, answer.error_detail);
            return;
          }
          const UnknownQueryOutcome outcome = unknown_.onQueryAnswer(id, reply);
          if (outcome.resolved.has_value()) {
            resolved(id, resolvedAnswer(*reply), answer.label, now_ms);
            return;
          }
          if (!outcome.resend.has_value()) {
            resolutionFailed(id, "unexpected query answer " + answer.label);
            return;
          }
          // The ledger never saw it: the same reserve again, same id and digest.
          call(ResolveResendStep{.id = id}, *outcome.resend);
        } else if constexpr (std::is_same_v<T, ResolveResendStep>) {
          const std::string& id = value.id;
          if (!unknown_.contains(id)) return;
          if (!answered) {
            resolutionFailed(id, answer.error_detail);
            return;
          }
          (void)unknown_.onResendAnswer(id, reply);
          resolved(id, std::nullopt, answer.label, now_ms);
        } else if constexpr (std::is_same_v<T, DeliveryStep>) {
          const OutboxEntry& entry = value.entry;
          if (!answered) {
            machine_.onDelivery(entry.seq, false, now_ms, jitter_permille);
            note(logLine(ShardNoteLevel::kDebug, "outbox_delivery_failed",
                         {{"seq", num(entry.seq)}, {"error", answer.error_detail}}));
            return;
          }
          // An answer that says the ledger changed nothing (a protocol error, a full table, an
          // overflow) is not a delivery: an acknowledged entry is never dropped; it is retried
          // with backoff, and the outbox age metric and this log line tell the operator.
          if (!outboxAnswerDelivers(reply)) {
            machine_.onDelivery(entry.seq, false, now_ms, jitter_permille);
            note(logLine(ShardNoteLevel::kWarn, "outbox_delivery_refused",
                         {{"seq", num(entry.seq)},
                          {"kind", outboxKindName(entry.kind)},
                          {"reservation_id", entry.reservation_id},
                          {"answer", answer.label}}));
            return;
          }
          if (answer.label != "ok") {
            note(logLine(ShardNoteLevel::kWarn, "outbox_delivered_not_ok",
                         {{"seq", num(entry.seq)},
                          {"kind", outboxKindName(entry.kind)},
                          {"reservation_id", entry.reservation_id},
                          {"answer", answer.label}}));
          }
          trackUsageUnknown(&usage_unknown_, entry.kind, entry.reservation_id, reply, now_ms);
          machine_.onDelivery(entry.seq, true, now_ms, 0);
          effects_.push_back(AgentRemoveDelivered{entry.seq});
          note(logLine(ShardNoteLevel::kDebug, "outbox_delivered",
                       {{"seq", num(entry.seq)}, {"depth", num(machine_.outbox().size())}}));
          pumpOutbox(link, now_ms);
        } else if constexpr (std::is_same_v<T, PolicyStep>) {
          if (!answered || !answer.policy_reply.has_value()) {
            policy_.onFetchFailed();
            return;
          }
          const PolicyFetchOutcome outcome =
              policy_.onFetchAnswer(*answer.policy_reply, answer.policy);
          if (outcome.changed) {
            note(logLine(
                ShardNoteLevel::kInfo, "policy_loaded",
                {{"generation", num(outcome.generation)}, {"budgets", num(outcome.budgets)}}));
          }
        } else {
          TALLY_UNREACHABLE();  // forwarded requests are answered by onForwardAnswer
        }
      },
      step);
}

// --- RESERVATION_UNKNOWN -------------------------------------------------------------------------

void AgentCore::resolveUnknown(const std::string& id, uint64_t waiter, const AgentLinkState& link) {
  if (!unknown_.contains(id)) return;
  if (waiter != 0) unknown_waiters_[id].push_back(waiter);
  if (unknown_.resolving(id)) return;
  if (!linkUsable(link.connected, link.health)) {
    resolutionFailed(id, "ledger unreachable");
    return;
  }
  std::optional<QueryRequest> query = unknown_.resolve(id);
  if (!query.has_value()) return;
  call(ResolveQueryStep{.id = id}, std::move(*query));
}

void AgentCore::resolutionFailed(const std::string& id, const std::string& why) {
  unknown_.onStepFailed(id);
  std::vector<uint64_t> waiters;
  if (auto it = unknown_waiters_.find(id); it != unknown_waiters_.end()) {
    waiters = std::move(it->second);
    unknown_waiters_.erase(it);
  }
  note(logLine(ShardNoteLevel::kDebug, "reservation_unknown_unresolved",
               {{"reservation_id", id}, {"error", why}}));
  for (uint64_t waiter : waiters) unavailable(waiter, kAgentOutcomeUnknown);
}

// `id` has just left the unknown table: its waiters hear the ledger's answer.
void AgentCore::resolved(const std::string& id, std::optional<ReservationReply> reply,
                         const std::string& label, uint64_t now_ms) {
  std::vector<uint64_t> waiters;
  if (auto it = unknown_waiters_.find(id); it != unknown_waiters_.end()) {
    waiters = std::move(it->second);
    unknown_waiters_.erase(it);
  }
  note(logLine(ShardNoteLevel::kInfo, "reservation_unknown_resolved",
               {{"reservation_id", id},
                {"answer", label},
                {"oldest_unknown_age_ms", num(unknown_.oldestAgeMs(now_ms))}}));
  for (uint64_t waiter : waiters) {
    if (reply.has_value()) {
      effects_.push_back(AgentReplyReservation{waiter, *reply});
    } else {
      effects_.push_back(AgentReplyLedgerAnswer{waiter});
    }
  }
}

// --- the outbox, the policy, time ----------------------------------------------------------------

void AgentCore::enqueue(uint64_t token, OutboxEntry entry, uint64_t now_ms) {
  if (machine_.outbox().size() >= options_.outbox_entries_max) {
    note(logLine(ShardNoteLevel::kError, "outbox_full",
                 {{"entries_max", num(options_.outbox_entries_max)}}));
  }
  take(machine_.queue(token, std::move(entry), now_ms), now_ms);  // QUEUED once persisted
}

void AgentCore::pumpOutbox(const AgentLinkState& link, uint64_t now_ms) {
  if (!started_ || !link.connected) return;
  std::optional<OutboxEntry> next = machine_.nextDelivery(now_ms);
  if (!next.has_value()) return;
  OutboxEntry entry = *next;
  call(DeliveryStep{.entry = std::move(entry)}, std::move(*next));
}

void AgentCore::fetchPolicy(const AgentLinkState& link, uint64_t now_ms) {
  if (!started_ || !policy_.beginFetch(link.connected, now_ms)) return;
  call(PolicyStep{}, AgentShowPolicy{.unless_generation = policy_.unlessGeneration()});
}

void AgentCore::onConnected(const AgentLinkState& link, uint64_t now_ms) {
  policy_.onConnected();
  fetchPolicy(link, now_ms);
  pumpOutbox(link, now_ms);
}

void AgentCore::onTick(const AgentLinkState& link, uint64_t now_ms) {
  (void)local_.tick(now_ms);  // local reservations expire like any other
  if (const uint64_t freed = fair_.tick(now_ms); freed > 0) {  // and waiting starts too
    note(logLine(ShardNoteLevel::kWarn, "fair_slots_timed_out", {{"slots", num(freed)}}));
  }
  forwardAdmitted(now_ms);
  if (deadlines_.answerPendingNow(now_ms)) answerEveryPending(now_ms);
  fetchPolicy(link, now_ms);
  pumpOutbox(link, now_ms);
  if (linkUsable(link.connected, link.health) && unknown_.size() > 0) {
    for (const std::string& id : unknown_.oldest(options_.resolve_batch_max)) {
      resolveUnknown(id, 0, link);
    }
  }
  if (deadlines_.drainEnds(now_ms, machine_.outbox().empty(), link.connected)) {
    answerEveryPending(now_ms);  // no-op unless drain ended before the deadline with requests
                                 // waiting
    effects_.push_back(
        AgentDrainDone{.left = machine_.outbox().size(), .connected = link.connected});
  }
}

void AgentCore::beginShutdown(uint64_t timeout_ms, uint64_t now_ms) {
  if (deadlines_.beginShutdown(now_ms, timeout_ms)) answerEveryPending(now_ms);
}

void AgentCore::beginDrain(uint64_t timeout_ms, const AgentLinkState& link, uint64_t now_ms) {
  deadlines_.beginDrain(now_ms, timeout_ms);
  onTick(link, now_ms);
}

void AgentCore::answerEveryPending(uint64_t now_ms) {
  if (!deadlines_.answerAll()) return;
  effects_.push_back(AgentShutdownAnswering{});
  for (auto& [id, waiters] : std::exchange(unknown_waiters_, {})) {
    for (uint64_t waiter : waiters) unavailable(waiter, kAgentOutcomeUnknown);
  }
  for (uint64_t waiter : fair_.takeAllWaiting()) {  // never started
    unavailable(waiter, "shutting down; the start was not sent; retry later with the same ids");
  }
  take(machine_.shutdown(now_ms), now_ms);  // its durable write is the outbox's last
  forwarded_.clear();                       // every forwarded request has been answered
  effects_.push_back(AgentShutdownAnswered{});
}

}  // namespace tally
