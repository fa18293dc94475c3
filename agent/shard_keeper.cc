#include "agent/shard_keeper.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/wall_clock.h"
#include "core/agent_decisions.h"
#include "core/assert.h"

namespace tally::agent {
namespace {

wire::ErrorReply unavailable(std::string message) {
  return {.code = wire::ErrorCode::kUnavailable, .message = std::move(message)};
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string accountName(const SubjectRoute& account) {
  return account.subject + " " + account.route;
}

// Keeps the union of two change sets (a failed commit's and the next one's).
void merge(ShardBookChanges* into, ShardBookChanges from) {
  auto add = [](std::vector<std::string>* to, const std::vector<std::string>& more) {
    to->insert(to->end(), more.begin(), more.end());
    std::sort(to->begin(), to->end());
    to->erase(std::unique(to->begin(), to->end()), to->end());
  };
  add(&into->shards_upserted, from.shards_upserted);
  add(&into->shards_deleted, from.shards_deleted);
  add(&into->reservations_upserted, from.reservations_upserted);
  add(&into->reservations_deleted, from.reservations_deleted);
  into->fences.insert(into->fences.end(), from.fences.begin(), from.fences.end());
  std::sort(into->fences.begin(), into->fences.end());
  into->fences.erase(std::unique(into->fences.begin(), into->fences.end()), into->fences.end());
}

}  // namespace

ShardKeeper::ShardKeeper(uv_loop_t* loop, central::LedgerLink* link, ShardStore* store,
                         const ShardCrypto* crypto, GatewaySigner signer, AgentMetrics* metrics,
                         Logger* logger, EmergencyOptions options, uint64_t boot_epoch,
                         uint64_t seed)
    : loop_(loop),
      link_(link),
      store_(store),
      signer_(std::move(signer)),
      metrics_(metrics),
      logger_(logger),
      options_(std::move(options)),
      boot_epoch_(boot_epoch),
      book_(ShardBookOptions{.gateway_id = signer_.public_key,
                             .boot_epoch = boot_epoch,
                             .crypto = crypto,
                             .retention_ms = options_.retention_ms,
                             .hold_ttl_ms = options_.hold_ttl_ms}),
      rng_(seed != 0 ? seed : monotonicClockUs() ^ (boot_epoch << 32)) {
  timer_.data = this;
  check_.data = this;
  request_nonce_ = rng_();
  for (const SubjectRoute& account : options_.accounts) accounts_[account].configured = true;
}

ShardKeeper::~ShardKeeper() {
  TALLY_ASSERT(open_handles_ == 0);
  TALLY_ASSERT(pending_.empty());
}

Status ShardKeeper::start(uint64_t now_ms) {
  Result<ShardRestoreReport> report = store_->restore(&book_, now_ms);
  if (!report.isOk()) return report.status();
  for (const std::string& id : report.value().quarantined) {
    logger_->error("shard_quarantined",
                   {{"shard_id", id}, {"why", "stored grant does not verify; never used"}});
    metrics_->countShardEvent("quarantined");
  }
  logClosed(report.value().closed_at_boot, "boot-epoch");
  logger_->info("shards_restored", {{"shards", uint64_t{book_.shardCount()}},
                                    {"reservations", uint64_t{book_.reservationCount()}},
                                    {"boot_epoch", boot_epoch_}});
  if (int rc = uv_timer_init(loop_, &timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  if (int rc = uv_check_init(loop_, &check_); rc != 0) {
    return Status::ioError(std::string("uv_check_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  if (int rc = uv_timer_start(&timer_, onTimer, options_.maintain_interval_ms,
                              options_.maintain_interval_ms);
      rc != 0) {
    return Status::ioError(std::string("uv_timer_start: ") + uv_strerror(rc));
  }
  if (int rc = uv_check_start(&check_, onCheck); rc != 0) {
    return Status::ioError(std::string("uv_check_start: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void ShardKeeper::stop() {
  if (!pending_.empty()) commitPending();  // every accepted request gets its answer
  auto closed = [](uv_handle_t* handle) {
    --static_cast<ShardKeeper*>(handle->data)->open_handles_;
  };
  for (uv_handle_t* handle :
       {reinterpret_cast<uv_handle_t*>(&timer_), reinterpret_cast<uv_handle_t*>(&check_)}) {
    if (handle->loop != nullptr && !uv_is_closing(handle)) uv_close(handle, closed);
  }
}

bool ShardKeeper::linkUsable() const {
  return tally::linkUsable(link_->connected(), link_->health());
}

bool ShardKeeper::persist() {
  merge(&unsaved_, book_.takeChanges());
  if (unsaved_.empty()) return true;
  const Status status = store_->commit(book_, unsaved_);
  if (!status.isOk()) {
    if (!store_failing_) logger_->error("shard_store_write_failed", {{"error", status.toString()}});
    store_failing_ = true;
    return false;
  }
  if (store_failing_) logger_->info("shard_store_write_recovered");
  store_failing_ = false;
  unsaved_ = {};
  return true;
}

// --- gateway operations ------------------------------------------------------------------------

void ShardKeeper::answerWhenDurable(wire::ResponseBody body, Respond respond) {
  pending_.push_back(PendingReply{.body = std::move(body), .respond = std::move(respond)});
}

void ShardKeeper::onCheck(uv_check_t* check) {
  auto* keeper = static_cast<ShardKeeper*>(check->data);
  if (!keeper->pending_.empty()) keeper->commitPending();
}

void ShardKeeper::commitPending() {
  // One transaction (one fsync) for everything this loop iteration changed, then the answers.
  std::vector<PendingReply> batch = std::exchange(pending_, {});
  if (!persist()) {
    for (PendingReply& pending : batch) {
      pending.respond(unavailable(
          "the agent could not record the shard reservation durably; retry with the same ids"));
    }
    return;
  }
  for (PendingReply& pending : batch) pending.respond(std::move(pending.body));
}

bool ShardKeeper::admit(const ReserveRequest& request, uint64_t now_ms, Respond respond) {
  std::optional<ReservationReply> reply = book_.reserve(request, now_ms);
  if (!reply.has_value()) {
    metrics_->countShardAdmission("no-shard");
    return false;
  }
  if (reply->code == ReplyCode::kOk && !reply->duplicate) {
    metrics_->countShardAdmission("admitted");
    logger_->debug("shard_admitted", {{"reservation_id", request.reservation_id},
                                      {"shard_id", reply->receipt.origin},
                                      {"units", request.units}});
  }
  answerWhenDurable(std::move(*reply), std::move(respond));
  return true;
}

void ShardKeeper::apply(const wire::RequestBody& body, uint64_t now_ms, Respond respond) {
  ReservationReply reply = std::visit(
      [&](const auto& request) -> ReservationReply {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, ReserveRequest>) {
          std::optional<ReservationReply> known = book_.reserve(request, now_ms);
          TALLY_ASSERT(known.has_value());  // owns(): a known id is always answered
          return *known;
        } else if constexpr (std::is_same_v<T, StartRequest>) {
          return book_.start(request, now_ms);  // granted locally: the shard holds the units
        } else if constexpr (std::is_same_v<T, SettleRequest>) {
          return book_.settle(request, now_ms);
        } else if constexpr (std::is_same_v<T, ReleaseRequest>) {
          return book_.release(request, now_ms);
        } else if constexpr (std::is_same_v<T, MarkUnknownRequest>) {
          return book_.markUnknown(request, now_ms);
        } else if constexpr (std::is_same_v<T, ReportOperationRequest>) {
          return book_.reportOperation(request, now_ms);
        } else if constexpr (std::is_same_v<T, QueryRequest>) {
          return book_.query(request);
        } else {
          TALLY_UNREACHABLE();
        }
      },
      body);
  // Even a read waits: it may show state another request changed in this iteration.
  answerWhenDurable(std::move(reply), std::move(respond));
}

void ShardKeeper::learnAccount(const SubjectRoute& account, uint64_t now_ms) {
  auto it = accounts_.find(account);
  if (it != accounts_.end()) {
    it->second.learned_at_ms = now_ms;
    return;
  }
  uint64_t learned = 0;
  for (const auto& [key, state] : accounts_) learned += state.configured ? 0 : 1;
  if (learned >= options_.accounts_max) {
    // Bounded: the account learned longest ago (and not being issued for) makes room.
    auto oldest = accounts_.end();
    for (auto candidate = accounts_.begin(); candidate != accounts_.end(); ++candidate) {
      if (candidate->second.configured || candidate->second.issuing) continue;
      if (oldest == accounts_.end() ||
          candidate->second.learned_at_ms < oldest->second.learned_at_ms) {
        oldest = candidate;
      }
    }
    if (oldest == accounts_.end()) return;
    accounts_.erase(oldest);
  }
  accounts_[account].learned_at_ms = now_ms;
  logger_->info("shard_account_learned", {{"account", accountName(account)}});
}

ShardGauges ShardKeeper::gauges(uint64_t now_ms) const {
  ShardGauges gauges;
  book_.forEachShard([&](const std::string&, const ShardBook::Shard& shard) {
    if (shard.record.quarantined) {
      ++gauges.quarantined;
    } else if (shard.account.closed()) {
      ++gauges.closed;
    } else if (book_.isUsable(shard, now_ms)) {
      ++gauges.usable;
      gauges.available_units += shard.account.balances().local_available;
    }
    const bool reconciled =
        shard.record.ledger_known && isFinalShardState(shard.record.ledger_state);
    if (shard.account.closed() && !shard.record.quarantined && !reconciled &&
        now_ms > shard.record.closed_at_ms) {
      gauges.oldest_unreconciled_age_ms =
          std::max(gauges.oldest_unreconciled_age_ms, now_ms - shard.record.closed_at_ms);
    }
  });
  return gauges;
}

// --- maintenance -------------------------------------------------------------------------------

void ShardKeeper::onTimer(uv_timer_t* timer) { static_cast<ShardKeeper*>(timer->data)->maintain(); }

void ShardKeeper::logClosed(const std::vector<std::string>& ids, const char* why) {
  for (const std::string& id : ids) {
    const ShardBook::Shard* shard = book_.findShard(id);
    if (shard == nullptr) continue;
    const ShardBalances& b = shard->account.balances();
    logger_->info("shard_closed", {{"shard_id", id},
                                   {"reason", why},
                                   {"allocated", b.allocated},
                                   {"reserved", b.local_reserved},
                                   {"spent", b.local_spent},
                                   {"retired", b.local_retired},
                                   {"overspent", b.overspent}});
    metrics_->countShardEvent(std::string("closed-") + why);
  }
}

void ShardKeeper::maintain() {
  const uint64_t now_ms = wallClockMs();
  const ShardTickOutcome tick = book_.tick(now_ms);
  logClosed(tick.shards_closed, "expiry");
  for (const std::string& id : tick.shards_forgotten) {
    report_retry_at_ms_.erase(id);
    logger_->info("shard_forgotten", {{"shard_id", id}});
  }
  if (!persist() || !linkUsable()) return;
  closeForReconnect(now_ms);
  if (!persist()) return;
  sendReports(now_ms);
  pollStatus(now_ms);
  keepOnHand(now_ms);
}

void ShardKeeper::closeForReconnect(uint64_t now_ms) {
  const std::vector<std::string> closed =
      book_.closeForReconnect(now_ms, options_.refresh_before_expiry_ms);
  for (const std::string& id : closed) {
    logClosed({id}, shardCloseReasonName(book_.findShard(id)->record.close_reason));
  }
}

void ShardKeeper::sendReports(uint64_t now_ms) {
  for (const std::string& id : book_.shardsNeedingReport()) {
    if (reports_in_flight_.contains(id)) continue;
    if (auto retry = report_retry_at_ms_.find(id);
        retry != report_retry_at_ms_.end() && now_ms < retry->second) {
      continue;
    }
    std::optional<ShardReport> report = book_.buildReport(id, now_ms);
    if (!report.has_value()) continue;
    signer_.sign_report(&*report);
    reports_in_flight_.insert(id);
    logger_->info("shard_report_sent", {{"shard_id", id},
                                        {"receipts", uint64_t{report->receipts.size()}},
                                        {"spent", report->balances.local_spent},
                                        {"reserved", report->balances.local_reserved},
                                        {"overspent", report->balances.overspent}});
    link_->call(std::move(*report),
                [this, id](central::LinkResult result) { onReportAnswer(id, std::move(result)); });
  }
}

void ShardKeeper::onReportAnswer(const std::string& shard_id, central::LinkResult result) {
  reports_in_flight_.erase(shard_id);
  const uint64_t now_ms = wallClockMs();
  if (!result.status.isOk()) {
    metrics_->countShardReport("failed");
    report_retry_at_ms_[shard_id] = now_ms + options_.issue_retry_ms;
    logger_->warn("shard_report_failed",
                  {{"shard_id", shard_id}, {"error", result.status.toString()}});
    return;  // retried at the next maintenance: reports are idempotent at the ledger
  }
  const auto* reply = std::get_if<ShardReply>(&result.response.body);
  if (reply == nullptr || reply->code != ReplyCode::kOk || reply->shards.empty()) {
    const std::string answer =
        reply == nullptr ? outcomeLabel(result.response.body)
                         : std::string(replyCodeName(reply->code)) + ": " + reply->message;
    metrics_->countShardReport("refused");
    report_retry_at_ms_[shard_id] = now_ms + options_.issue_retry_ms;
    logger_->error("shard_report_refused", {{"shard_id", shard_id}, {"answer", answer}});
    // A refusal that carries the shard (e.g. WRITTEN_OFF: never reported again) is recorded.
    if (reply != nullptr && !reply->shards.empty() &&
        reply->shards.front().grant.shard_id == shard_id) {
      (void)book_.onLedgerAnswer(shard_id, reply->shards.front(), now_ms);
      (void)persist();
    }
    return;
  }
  report_retry_at_ms_.erase(shard_id);
  const ShardLedgerView& view = reply->shards.front();
  const ShardAnswerOutcome outcome = book_.onLedgerAnswer(shard_id, view, now_ms);
  (void)persist();
  const std::string state = shardStateName(view.state);
  metrics_->countShardReport(reply->duplicate ? "duplicate" : state);
  if (view.state == ShardState::kConflict) {
    metrics_->countShardEvent("conflict");
    logger_->error(
        "shard_conflict_reported",
        {{"shard_id", shard_id}, {"spent", view.spent_units}, {"debt", view.debt_units}});
  }
  logger_->info("shard_reconciled", {{"shard_id", shard_id},
                                     {"state", state},
                                     {"acknowledged", outcome.acknowledged},
                                     {"reminted_now", reply->reminted_units},
                                     {"spent_now", reply->spent_units},
                                     {"reminted_total", view.reminted_units},
                                     {"spent_total", view.spent_units},
                                     {"retired", view.retired_units}});
}

void ShardKeeper::pollStatus(uint64_t now_ms) {
  if (status_in_flight_ || now_ms < next_status_poll_ms_) return;
  std::vector<std::string> ids = book_.openShards();
  if (ids.empty()) return;
  status_in_flight_ = true;
  next_status_poll_ms_ = now_ms + options_.status_poll_ms;
  link_->call(
      wire::ShardStatusRequest{.gateway_name = signer_.gateway_name, .shard_ids = ids},
      [this](central::LinkResult result) {
        status_in_flight_ = false;
        if (!result.status.isOk()) return;
        const auto* reply = std::get_if<ShardReply>(&result.response.body);
        if (reply == nullptr || reply->code != ReplyCode::kOk) {
          logger_->warn("shard_status_refused", {{"answer", outcomeLabel(result.response.body)}});
          return;
        }
        const uint64_t at_ms = wallClockMs();
        for (const ShardLedgerView& view : reply->shards) {
          const ShardAnswerOutcome outcome = book_.onLedgerAnswer(view.grant.shard_id, view, at_ms);
          if (outcome.closed_now) {
            const ShardBook::Shard* shard = book_.findShard(view.grant.shard_id);
            logClosed({view.grant.shard_id}, shardCloseReasonName(shard->record.close_reason));
          }
        }
        (void)persist();
      });
}

void ShardKeeper::keepOnHand(uint64_t now_ms) {
  for (auto it = accounts_.begin(); it != accounts_.end();) {
    const SubjectRoute& account = it->first;
    AccountState& state = it->second;
    if (!state.configured && !state.issuing &&
        now_ms >= state.learned_at_ms + options_.account_idle_ms) {
      // Its shards stay until they are used, expire or are fenced; none are asked for again.
      logger_->info("shard_account_dropped", {{"account", accountName(account)}});
      it = accounts_.erase(it);
      continue;
    }
    if (!state.issuing && now_ms >= state.next_issue_ms &&
        book_.usableShardCount(account, now_ms) < options_.shards_on_hand) {
      issue(account);
    }
    ++it;
  }
}

void ShardKeeper::issue(const SubjectRoute& account) {
  AccountState& state = accounts_[account];
  state.issuing = true;
  if (!state.unanswered.has_value()) {
    ShardIssueRequest fresh{.request_id = signer_.gateway_name + "/" + std::to_string(boot_epoch_) +
                                          "/" + hex64(request_nonce_) + "/" +
                                          std::to_string(++issue_seq_),
                            .gateway_name = signer_.gateway_name,
                            .gateway_id = signer_.public_key,
                            .gateway_boot_epoch = boot_epoch_,
                            .subject = account.subject,
                            .route = account.route};
    signer_.sign_issue(&fresh);
    state.unanswered = std::move(fresh);
  }
  ShardIssueRequest request = *state.unanswered;
  logger_->debug("shard_issue_requested",
                 {{"account", accountName(account)}, {"request_id", request.request_id}});
  link_->call(std::move(request), [this, account](central::LinkResult result) {
    onIssueAnswer(account, std::move(result));
  });
}

void ShardKeeper::onIssueAnswer(const SubjectRoute& account, central::LinkResult result) {
  auto it = accounts_.find(account);
  const uint64_t now_ms = wallClockMs();
  if (it != accounts_.end()) {
    it->second.issuing = false;
    it->second.next_issue_ms = now_ms + options_.issue_retry_ms;
  }
  if (!result.status.isOk()) {
    metrics_->countShardIssue("failed");  // outcome unknown: `unanswered` is retried as is
    return;
  }
  if (it != accounts_.end()) it->second.unanswered.reset();
  const auto* reply = std::get_if<ShardReply>(&result.response.body);
  if (reply == nullptr || reply->code != ReplyCode::kOk || reply->shards.empty()) {
    const bool off = reply != nullptr && reply->code == ReplyCode::kInvalidState;
    if (off && it != accounts_.end()) {
      it->second.next_issue_ms = now_ms + options_.emergency_off_retry_ms;
    }
    metrics_->countShardIssue(off ? "emergency-off" : "refused");
    logger_->info("shard_issue_refused",
                  {{"account", accountName(account)},
                   {"answer", reply == nullptr ? outcomeLabel(result.response.body)
                                               : std::string(replyCodeName(reply->code)) + " " +
                                                     reply->message}});
    return;
  }
  const ShardGrant& grant = reply->shards.front().grant;
  const ShardAddCode code = book_.addShard(grant, now_ms);
  if (code != ShardAddCode::kOk && code != ShardAddCode::kDuplicate) {
    metrics_->countShardIssue(std::string("refused-") + shardAddCodeName(code));
    logger_->error("shard_grant_refused",
                   {{"shard_id", grant.shard_id}, {"why", shardAddCodeName(code)}});
    return;
  }
  if (!persist()) return;  // kept in memory; durable at the next successful commit
  if (it != accounts_.end()) it->second.next_issue_ms = now_ms;  // more may be needed
  metrics_->countShardIssue("issued");
  logger_->info("shard_obtained", {{"shard_id", grant.shard_id},
                                   {"account", accountName(account)},
                                   {"units", grant.allocated_units},
                                   {"fence", grant.fence},
                                   {"expires_at_ms", grant.expires_at_ms}});
}

}  // namespace tally::agent
