#include "tests/sim/agent_node.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <variant>

#include "core/agent_decisions.h"
#include "tests/sim/ledger_node.h"
#include "wire/frame.h"

namespace tally::sim {
namespace {

constexpr uint64_t kRequestTimeoutMs = 2'000;  // central::LedgerLinkOptions' default

wire::ErrorReply unavailable(std::string message) {
  return {.code = wire::ErrorCode::kUnavailable, .message = std::move(message)};
}

ReservationReply queuedReply(const OutboxEntry& entry) {
  return {.code = ReplyCode::kQueued,
          .message = std::string(outboxKindName(entry.kind)) + " of " + entry.reservation_id +
                     " durably queued (seq " + std::to_string(entry.seq) + ")"};
}

std::string labelOf(const wire::ResponseBody& body) {
  if (const auto* reply = std::get_if<ReservationReply>(&body)) return replyCodeName(reply->code);
  if (const auto* error = std::get_if<wire::ErrorReply>(&body)) return errorCodeName(error->code);
  return "ok";
}

}  // namespace

AgentNode::AgentNode(NodeId id, uint32_t index, Rng rng, const ShardCrypto* crypto,
                     Network* network, Trace* trace, std::function<bool()> ledger_up)
    : id_(id),
      gateway_name_("agent-" + std::to_string(index)),
      rng_(rng),
      crypto_(crypto),
      network_(network),
      trace_(trace),
      ledger_up_(std::move(ledger_up)) {
  gateway_key_.fill(static_cast<uint8_t>(0xa0 + index));
}

void AgentNode::trace(uint64_t now_ms, const std::string& line) {
  if (trace_->on()) trace_->add(now_ms, gateway_name_ + ": " + line);
}

bool AgentNode::busy() const { return !calls_.empty() || !tags_.empty() || !failed_now_.empty(); }

bool AgentNode::linkUsable() const { return tally::linkUsable(connected_, monitor_.state()); }

// --- the process ---------------------------------------------------------------------------------

bool AgentNode::start(uint64_t now_ms, std::string* error) {
  ++version_;
  if (up()) return true;
  ++boot_epoch_;  // durably incremented before anything else, as agent/main.cc does
  keeping_ = std::make_unique<ShardKeeping>(ShardBookOptions{.gateway_id = gateway_key_,
                                                             .boot_epoch = boot_epoch_,
                                                             .crypto = crypto_,
                                                             .retention_ms = 60'000,
                                                             .hold_ttl_ms = 2'000},
                                            ShardKeepingOptions{.accounts = accounts_,
                                                                .shards_on_hand = 1,
                                                                .refresh_before_expiry_ms = 1'000,
                                                                .account_idle_ms = kAccountIdleMs,
                                                                .status_poll_ms = 2'000,
                                                                .issue_retry_ms = 2'000,
                                                                .emergency_off_retry_ms = 10'000,
                                                                .gateway_name = gateway_name_,
                                                                .gateway_id = gateway_key_,
                                                                .boot_epoch = boot_epoch_,
                                                                .request_nonce = rng_.next()},
                                            &shard_store_);
#ifdef TALLY_TEST_FAULTS
  keeping_->bookForRestore()->setFaultsForTesting(faults_.book);
#endif
  Result<ShardRestoreReport> restored = shard_store_.restore(keeping_->bookForRestore(), now_ms);
  if (!restored.isOk()) {
    *error = gateway_name_ + ": shard store: " + restored.status().toString();
    keeping_.reset();
    return false;
  }
  keeping_->restored(restored.value());
  AgentCoreOptions options;
#ifdef TALLY_TEST_FAULTS
  options.unknown_faults = faults_.unknown;
#endif
  if (fair_.has_value()) {
    options.fair.started_max = {{fair_->route, fair_->started_max}};
    options.fair.fairness_window_admissions = fair_->window_admissions;
#ifdef TALLY_TEST_FAULTS
    options.fair.faults = faults_.fair;
#endif
  }
  fair_windows_seen_ = 0;
  core_ = std::make_unique<AgentCore>(
      std::move(options), [](uint64_t) { return true; }, keeping_.get());
  std::vector<OutboxEntry> rows;
  for (const auto& [seq, entry] : outbox_rows_) rows.push_back(entry);
  trace(now_ms, "START boot epoch " + std::to_string(boot_epoch_) + ", " +
                    std::to_string(rows.size()) + " outbox entries, " +
                    std::to_string(keeping_->book().shardCount()) + " shards restored");
  monitor_ = LinkHealthMonitor(LinkHealthThresholds{}, now_ms);
  connected_ = false;
  core_->start(std::move(rows), now_ms);
  perform(now_ms);
  updateLink(now_ms);
  endIteration(now_ms);
  fairWatch(now_ms, false);
  return true;
}

void AgentNode::crash(uint64_t now_ms) {
  ++version_;
  if (!up()) return;
  ++crashes_;
  trace(now_ms, "CRASH: loses " + std::to_string(calls_.size()) + " calls in flight and " +
                    std::to_string(tags_.size()) + " unanswered requests");
  for (const auto& [token, tag] : tags_) {
    replies_.emplace_back(tag, unavailable("the agent's connection closed"));
  }
  tags_.clear();
  held_.clear();
  calls_.clear();
  failed_now_.clear();
  fair_waiting_.clear();
  fair_queues_.clear();
  core_.reset();
  keeping_.reset();
  connected_ = false;
  network_->dropTo(id_);
}

// --- the link ------------------------------------------------------------------------------------

void AgentNode::updateLink(uint64_t now_ms) {
  // A TCP connection survives a cut in one direction (requests then time out); it is lost
  // when the ledger is down or both directions are cut.
  const bool connected = ledger_up_() && !(network_->partitioned(id_, kLedgerNode) &&
                                           network_->partitioned(kLedgerNode, id_));
  if (connected == connected_) return;
  connected_ = connected;
  if (!connected) {
    trace(now_ms, "link lost: " + std::to_string(calls_.size()) + " calls fail");
    monitor_.onFailure(now_ms);
    std::map<uint64_t, Call> lost = std::exchange(calls_, {});
    for (auto& [id, call] : lost) failed(std::move(call), "connection lost", now_ms);
  } else {
    trace(now_ms, "link connected");
    core_->onConnected(linkState(), now_ms);
    perform(now_ms);
  }
}

void AgentNode::send(Call call, wire::RequestBody body, uint64_t now_ms) {
  const uint64_t request_id = next_request_id_++;
  call.sent_ms = now_ms;
  calls_.emplace(request_id, std::move(call));
  if (!connected_) {
    failed_now_.push_back(request_id);  // "fails at once", never from inside call()
    return;
  }
  // A report with receipts still holding units is followed by another once they resolve; from
  // then on it is stale (takeStaleReports()).
  std::optional<std::pair<std::string, bool>> report;  // (shard id, holding)
  if (const auto* sent = std::get_if<ShardReport>(&body)) {
    report.emplace(sent->shard.shard_id, sent->balances.local_reserved > 0);
  }
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = std::move(body)});
  if (!frame.isOk()) {
    failed_now_.push_back(request_id);
    return;
  }
  if (report.has_value()) {
    auto [shard_id, holding] = *std::move(report);
    if (auto earlier = holding_reports_.find(shard_id);
        earlier != holding_reports_.end() && earlier->second != frame.value()) {
      if (stale_reports_.size() == kStaleReportsKept) stale_reports_.pop_front();
      stale_reports_.push_back(std::move(earlier->second));
      holding_reports_.erase(earlier);
    }
    if (holding && holding_reports_.size() < kStaleReportsKept) {
      holding_reports_.emplace(std::move(shard_id), frame.value());
    }
  }
  network_->send(id_, kLedgerNode, std::move(frame).value(), now_ms);
}

void AgentNode::onFrame(const std::vector<uint8_t>& bytes, uint64_t now_ms) {
  ++version_;
  if (!up()) return;
  updateLink(now_ms);
  wire::FrameDecoder decoder;
  std::vector<wire::Frame> frames;
  (void)decoder.feed(bytes, &frames);
  for (const wire::Frame& frame : frames) {
    Result<wire::Response> response = wire::decodeResponse(frame);
    if (!response.isOk()) continue;
    auto it = calls_.find(response.value().request_id);
    if (it == calls_.end()) {  // timed out or failed before: the ledger is alive, only slow
      monitor_.onLateAnswer(now_ms);
      continue;
    }
    Call call = std::move(it->second);
    calls_.erase(it);
    monitor_.onSuccess((now_ms - call.sent_ms) * 1'000, now_ms);
    answered(std::move(call), std::move(response).value().body, now_ms);
  }
  endIteration(now_ms);
  fairWatch(now_ms, false);
}

void AgentNode::answered(Call call, wire::ResponseBody body, uint64_t now_ms) {
  if (call.kind == CallKind::kCore) {
    AgentLedgerAnswer answer{.outcome = LinkOutcome::kAnswered, .label = labelOf(body)};
    if (const auto* reply = std::get_if<ReservationReply>(&body)) {
      answer.reservation = *reply;
      if (fair_.has_value() && reply->code == ReplyCode::kOk &&
          reply->receipt.state == ReservationState::kReserved &&
          reply->receipt.route == fair_->route) {
        ledger_reserved_[reply->receipt.reservation_id] = reply->receipt.expires_at_ms;
      }
    } else if (const auto* policy = std::get_if<wire::PolicyAnswer>(&body)) {
      answer.policy_reply = policy->reply;
      answer.policy = policy->policy;
    }
    core_->onAnswer(call.core_call, answer, linkState(), now_ms,
                    static_cast<uint32_t>(rng_.below(1001)));
    perform(now_ms, &body);
    return;
  }
  ShardCallResult result{.answered = true, .label = labelOf(body)};
  if (auto* reply = std::get_if<ShardReply>(&body)) result.reply = std::move(*reply);
  if (call.kind == CallKind::kIssue) {
    keeping_->onIssueAnswer(call.account, result, now_ms);
  } else if (call.kind == CallKind::kReport) {
    keeping_->onReportAnswer(call.shard_id, result, now_ms);
  } else {
    keeping_->onStatusAnswer(result, now_ms);
  }
  perform(now_ms);
}

void AgentNode::failed(Call call, const std::string& why, uint64_t now_ms) {
  if (call.kind == CallKind::kCore) {
    AgentLedgerAnswer answer{.outcome = LinkOutcome::kLost,
                             .error = why,
                             .error_detail = "UNAVAILABLE: " + why,
                             .label = "unavailable"};
    core_->onAnswer(call.core_call, answer, linkState(), now_ms,
                    static_cast<uint32_t>(rng_.below(1001)));
    perform(now_ms);
    return;
  }
  const ShardCallResult result{.answered = false, .error = why};
  if (call.kind == CallKind::kIssue) {
    keeping_->onIssueAnswer(call.account, result, now_ms);
  } else if (call.kind == CallKind::kReport) {
    keeping_->onReportAnswer(call.shard_id, result, now_ms);
  } else {
    keeping_->onStatusAnswer(result, now_ms);
  }
  perform(now_ms);
}

// --- timers and requests -------------------------------------------------------------------------

void AgentNode::request(uint64_t tag, const wire::RequestBody& body, uint64_t now_ms) {
  ++version_;
  if (!up()) {
    replies_.emplace_back(tag, unavailable("the agent is down"));
    return;
  }
  updateLink(now_ms);
  std::optional<AgentRequest> request;
  std::visit(
      [&](const auto& value) {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, ReserveRequest> || std::is_same_v<T, StartRequest> ||
                      std::is_same_v<T, SettleRequest> || std::is_same_v<T, ReleaseRequest> ||
                      std::is_same_v<T, MarkUnknownRequest> ||
                      std::is_same_v<T, ReportOperationRequest> ||
                      std::is_same_v<T, QueryRequest>) {
          request = value;
        }
      },
      body);
  if (!request.has_value()) {
    replies_.emplace_back(tag, wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                                                .message = "not served by the simulated agent"});
    return;
  }
  const uint64_t token = core_->newToken();
  tags_.emplace(token, tag);
  held_.emplace(token, body);
  core_->onRequest(token, *request, linkState(), now_ms);
  perform(now_ms);
  endIteration(now_ms);
  if (const auto* start = std::get_if<StartRequest>(&body); start != nullptr && fair_.has_value()) {
    fairRequest(token, start->reservation_id, now_ms);
  }
  fairWatch(now_ms, false);
}

void AgentNode::pump(uint64_t now_ms) {
  ++version_;
  if (!up()) return;
  updateLink(now_ms);
  std::vector<std::pair<uint64_t, Call>> timed_out;
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.sent_ms + kRequestTimeoutMs <= now_ms) {
      timed_out.emplace_back(it->first, std::move(it->second));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [id, call] : timed_out) {
    monitor_.onTimeout(call.sent_ms, now_ms);
    failed(std::move(call), "request timed out", now_ms);
  }
  monitor_.tick(now_ms);
  core_->onTick(linkState(), now_ms);
  perform(now_ms);
  endIteration(now_ms);
  fairWatch(now_ms, true);
}

void AgentNode::maintain(uint64_t now_ms) {
  ++version_;
  if (!up()) return;
  updateLink(now_ms);
  keeping_->maintain(now_ms, linkUsable());
  perform(now_ms);
  endIteration(now_ms);
  fairWatch(now_ms, false);
}

void AgentNode::endIteration(uint64_t now_ms) {
  if (!up()) return;
  core_->onIterationEnd(now_ms);
  perform(now_ms);
  if (keeping_->waitingForCommit()) {
    keeping_->commit();
    perform(now_ms);
  }
}

// --- effects -------------------------------------------------------------------------------------

void AgentNode::reply(uint64_t token, wire::ResponseBody body) {
  held_.erase(token);
  if (auto waiting = fair_waiting_.find(token); waiting != fair_waiting_.end()) {
    std::erase(fair_queues_[waiting->second.queue], token);  // left the queue unsent
    fair_waiting_.erase(waiting);
  }
  auto it = tags_.find(token);
  if (it == tags_.end()) return;
  replies_.emplace_back(it->second, std::move(body));
  tags_.erase(it);
}

void AgentNode::perform(uint64_t now_ms, const wire::ResponseBody* answer) {
  for (bool more = true; more && up();) {
    more = false;
    for (AgentCoreEffects effects = core_->takeEffects(); !effects.empty();
         effects = core_->takeEffects()) {
      for (AgentCoreEffect& effect : effects) {
        std::visit(
            [&](auto& value) {
              using T = std::decay_t<decltype(value)>;
              if constexpr (std::is_same_v<T, AgentSend>) {
                auto it = held_.find(value.token);
                if (it == held_.end()) return;
                if (!fair_waiting_.empty()) fairSent(value.token, now_ms);
                wire::RequestBody body = std::move(it->second);
                held_.erase(it);
                send(Call{.kind = CallKind::kCore, .core_call = value.token}, std::move(body),
                     now_ms);
              } else if constexpr (std::is_same_v<T, AgentDrop>) {
                reply(value.token, unavailable("the requester is gone"));
              } else if constexpr (std::is_same_v<T, AgentReplyUnavailable>) {
                reply(value.token, unavailable(std::move(value.message)));
              } else if constexpr (std::is_same_v<T, AgentReplyQueued>) {
                reply(value.token, queuedReply(value.entry));
              } else if constexpr (std::is_same_v<T, AgentReplyReservation>) {
                reply(value.token, std::move(value.reply));
              } else if constexpr (std::is_same_v<T, AgentReplyLedgerAnswer>) {
                reply(value.token, answer != nullptr ? *answer : unavailable("no answer"));
              } else if constexpr (std::is_same_v<T, AgentPersist>) {
                bool ok = true;
                if (outbox_failing_ > 0) {
                  --outbox_failing_;
                  ok = false;
                } else {
                  for (const OutboxEntry& entry : value.entries) outbox_rows_[entry.seq] = entry;
                }
                trace(now_ms, std::string("outbox: ") + (ok ? "persisted " : "FAILED to persist ") +
                                  std::to_string(value.entries.size()) + " entries");
                core_->persisted(ok, ok ? "" : "simulated disk full", now_ms);
              } else if constexpr (std::is_same_v<T, AgentCall>) {
                send(Call{.kind = CallKind::kCore, .core_call = value.call},
                     callRequest(std::move(value.body)), now_ms);
              } else if constexpr (std::is_same_v<T, AgentRemoveDelivered>) {
                outbox_rows_.erase(value.seq);
              } else if constexpr (std::is_same_v<T, AgentToShards>) {
                held_.erase(value.token);  // ShardKeeping answers it (tags_ keeps the tag)
              } else {
                // Metrics and log lines: AgentCountShadow, ShardNote, shutdown and drain.
              }
            },
            effect);
      }
    }
    if (!up()) return;
    for (ShardKeepingEffect& effect : keeping_->takeEffects()) {
      std::visit(
          [&](auto& value) {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, ShardSendIssue>) {
              trace(now_ms,
                    "asks for a shard of " + value.account.subject + "/" + value.account.route);
              send(Call{.kind = CallKind::kIssue, .account = value.account},
                   std::move(value.request), now_ms);
            } else if constexpr (std::is_same_v<T, ShardSendReport>) {
              trace(now_ms, "reports shard " + value.shard_id);
              send(Call{.kind = CallKind::kReport, .shard_id = value.shard_id},
                   std::move(value.report), now_ms);
            } else if constexpr (std::is_same_v<T, ShardSendStatus>) {
              send(Call{.kind = CallKind::kStatus},
                   wire::ShardStatusRequest{.gateway_name = gateway_name_,
                                            .shard_ids = std::move(value.shard_ids)},
                   now_ms);
            } else if constexpr (std::is_same_v<T, ShardGatewayAnswer>) {
              if (value.reply.has_value()) {
                reply(value.token, std::move(*value.reply));
              } else {
                reply(value.token, unavailable(std::move(value.unavailable)));
              }
            } else {
              static_assert(std::is_same_v<T, ShardNote>);
              if (!value.event.empty() && value.level != ShardNoteLevel::kDebug) {
                trace(now_ms, "note " + value.event);
              }
            }
          },
          effect);
    }
    // Calls refused while not connected fail now, after the effects that made them.
    if (!failed_now_.empty()) {
      more = true;
      for (uint64_t id : std::exchange(failed_now_, {})) {
        auto it = calls_.find(id);
        if (it == calls_.end()) continue;
        Call call = std::move(it->second);
        calls_.erase(it);
        failed(std::move(call), "not connected", now_ms);
      }
    }
  }
}

}  // namespace tally::sim

namespace tally::sim {

// --- the watch of the fair scheduler -------------------------------------------------------------

void AgentNode::fairViolation(bool over_budget, std::string detail, uint64_t now_ms) {
  trace(now_ms, "FAIR SCHEDULING: " + detail);
  fair_violations_.push_back({.over_budget = over_budget, .detail = gateway_name_ + ": " + detail});
}

void AgentNode::fairRequest(uint64_t token, const std::string& id, uint64_t now_ms) {
  const FairScheduler& fair = core_->fair();
  const FairReserved* held = fair.reservation(id);
  if (held == nullptr) return;
  auto reserved = ledger_reserved_.find(id);
  if (reserved == ledger_reserved_.end()) {
    fairViolation(false, "the scheduler holds " + id + ", which the ledger never answered RESERVED",
                  now_ms);
    return;
  }
  const std::optional<uint32_t> cls = fair.waitingClass(id);
  if (!cls.has_value()) return;  // admitted at once (nothing waited), or answered
  FairWaiting waiting{.queue = {held->subject, *cls}, .id = id, .expires_at_ms = reserved->second};
  fair_queues_[waiting.queue].push_back(token);
  fair_waiting_.emplace(token, std::move(waiting));
}

void AgentNode::fairSent(uint64_t token, uint64_t now_ms) {
  auto it = fair_waiting_.find(token);
  if (it == fair_waiting_.end()) return;
  const FairWaiting& sent = it->second;
  std::deque<uint64_t>& queue = fair_queues_[sent.queue];
  // Handed out at its expiry, a start may pass its tenant's earlier ones; otherwise it is first.
  if (!queue.empty() && queue.front() != token && now_ms < sent.expires_at_ms) {
    fairViolation(false,
                  "the start of " + sent.id + " was sent before that of " +
                      fair_waiting_.at(queue.front()).id + " (" + sent.queue.first + ", class " +
                      std::to_string(sent.queue.second) + "), which began to wait earlier",
                  now_ms);
  }
  std::erase(queue, token);
  fair_waiting_.erase(it);
}

void AgentNode::fairWatch(uint64_t now_ms, bool pumped) {
  if (!fair_.has_value() || !up()) return;
  const FairScheduler& fair = core_->fair();
  if (pumped) {
    for (const auto& [token, waiting] : fair_waiting_) {
      if (waiting.expires_at_ms <= now_ms && fair.waitingClass(waiting.id).has_value()) {
        fairViolation(false,
                      "the start of " + waiting.id + " still waits after the pump at " +
                          std::to_string(now_ms) + ", past its reservation's expiry at " +
                          std::to_string(waiting.expires_at_ms),
                      now_ms);
      }
    }
  }
  // The meter's last complete window, once per window (a window is longer than the admissions
  // one entry point can make: at most started_max).
  const FairnessMeter* meter = fair.meter(fair_->route);
  if (meter == nullptr || meter->windowsCompleted() == fair_windows_seen_) return;
  fair_windows_seen_ = meter->windowsCompleted();
  if (trace_->on()) {
    std::string line = "fairness window " + std::to_string(fair_windows_seen_) + ":";
    for (const FairnessShare& share : meter->last().tenants) {
      char part[96];
      std::snprintf(part, sizeof part, " %s admitted %.3f fair %.3f", share.tenant.c_str(),
                    share.admitted_share, share.fair_share);
      line += part;
    }
    trace(now_ms, line);
  }
  for (const FairnessShare& share : meter->last().tenants) {
    TenantFairness& worst = fair_worst_[share.tenant];
    worst.tenant = share.tenant;
    worst.budget_permille = fair_->budget_permille;
    worst.error = std::max(worst.error, share.error);
    ++worst.windows;
    if (share.error * 1000 > fair_->budget_permille + kFairnessEpsilonPermille) {
      char detail[160];
      std::snprintf(detail, sizeof detail,
                    "window %llu: %s admitted %.3f, fair share %.3f: error %.1f‰ > budget %u‰",
                    static_cast<unsigned long long>(fair_windows_seen_), share.tenant.c_str(),
                    share.admitted_share, share.fair_share, share.error * 1000,
                    fair_->budget_permille);
      fairViolation(true, detail, now_ms);
    }
  }
}

}  // namespace tally::sim
