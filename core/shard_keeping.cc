#include "core/shard_keeping.h"

#include <algorithm>
#include <type_traits>

#include "core/assert.h"

namespace tally {
namespace {

std::string hex64(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[static_cast<size_t>(i)] = kDigits[value & 0xf];
  return text;
}

std::string accountName(const SubjectRoute& account) {
  return account.subject + " " + account.route;
}

std::string num(uint64_t value) { return std::to_string(value); }
std::string flag(bool value) { return value ? "true" : "false"; }

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

ShardNote count(ShardCounter counter, std::string label) {
  return ShardNote{.counter = counter, .label = std::move(label)};
}

}  // namespace

ShardKeeping::ShardKeeping(ShardBookOptions book_options, ShardKeepingOptions options,
                           ShardBookStore* store)
    : options_(std::move(options)), store_(store), book_(book_options) {
  TALLY_ASSERT(store_ != nullptr);
  for (const SubjectRoute& account : options_.accounts) accounts_[account].configured = true;
}

void ShardKeeping::restored(const ShardRestoreReport& report) {
  for (const std::string& id : report.quarantined) {
    note({.level = ShardNoteLevel::kError,
          .event = "shard_quarantined",
          .fields = {{"shard_id", id}, {"why", "stored grant does not verify; never used"}},
          .counter = ShardCounter::kEvent,
          .label = "quarantined"});
  }
  noteClosed(report.closed_at_boot, "boot-epoch");
  note({.event = "shards_restored",
        .fields = {{"shards", num(book_.shardCount())},
                   {"reservations", num(book_.reservationCount())},
                   {"boot_epoch", num(book_.bootEpoch())}}});
}

bool ShardKeeping::persist() {
  merge(&unsaved_, book_.takeChanges());
  if (unsaved_.empty()) return true;
  const Status status = store_->commit(book_, unsaved_);
  if (!status.isOk()) {
    if (!store_failing_) {
      note({.level = ShardNoteLevel::kError,
            .event = "shard_store_write_failed",
            .fields = {{"error", status.toString()}}});
    }
    store_failing_ = true;
    return false;
  }
  if (store_failing_) note({.event = "shard_store_write_recovered"});
  store_failing_ = false;
  unsaved_ = {};
  return true;
}

// --- gateway operations --------------------------------------------------------------------------

bool ShardKeeping::admit(uint64_t token, const ReserveRequest& request, uint64_t now_ms) {
  std::optional<ReservationReply> reply = book_.reserve(request, now_ms);
  if (!reply.has_value()) {
    note(count(ShardCounter::kAdmission, "no-shard"));
    return false;
  }
  if (reply->code == ReplyCode::kOk && !reply->duplicate) {
    note({.level = ShardNoteLevel::kDebug,
          .event = "shard_admitted",
          .fields = {{"reservation_id", request.reservation_id},
                     {"shard_id", reply->receipt.origin},
                     {"units", num(request.units)}},
          .counter = ShardCounter::kAdmission,
          .label = "admitted"});
  }
  pending_.push_back(Pending{.token = token, .reply = std::move(*reply)});
  return true;
}

void ShardKeeping::apply(uint64_t token, const ShardOperation& operation, uint64_t now_ms) {
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
        } else {
          static_assert(std::is_same_v<T, QueryRequest>);
          return book_.query(request);
        }
      },
      operation);
  pending_.push_back(Pending{.token = token, .reply = std::move(reply)});
}

void ShardKeeping::commit() {
  if (pending_.empty()) return;
  // One transaction (one fsync) for everything this loop iteration changed, then the answers.
  std::vector<Pending> batch = std::exchange(pending_, {});
  const bool durable = persist();
  for (Pending& pending : batch) {
    if (durable) {
      effects_.push_back(
          ShardGatewayAnswer{.token = pending.token, .reply = std::move(pending.reply)});
    } else {
      effects_.push_back(ShardGatewayAnswer{
          .token = pending.token,
          .unavailable =
              "the agent could not record the shard reservation durably; retry with the same "
              "ids"});
    }
  }
}

void ShardKeeping::learnAccount(const SubjectRoute& account, uint64_t now_ms) {
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
  note({.event = "shard_account_learned", .fields = {{"account", accountName(account)}}});
}

ShardGauges ShardKeeping::gauges(uint64_t now_ms) const {
  ShardGauges gauges;
  book_.forEachShard([&](const std::string&, const ShardBook::Shard& shard) {
    if (shard.record.quarantined) {
      ++gauges.quarantined;
    } else if (shard.record.unreconcilable != ShardUnreconcilable::kNo) {
      ++gauges.unreconcilable;
    } else if (shard.account.closed()) {
      ++gauges.closed;
    } else if (book_.isUsable(shard, now_ms)) {
      ++gauges.usable;
      gauges.available_units += shard.account.balances().local_available;
    }
    const bool reconciled = isFinalShard(shard.record);  // or never will be: not pending
    if (shard.account.closed() && !shard.record.quarantined && !reconciled &&
        now_ms > shard.record.closed_at_ms) {
      gauges.oldest_unreconciled_age_ms =
          std::max(gauges.oldest_unreconciled_age_ms, now_ms - shard.record.closed_at_ms);
    }
  });
  return gauges;
}

// --- maintenance ---------------------------------------------------------------------------------

void ShardKeeping::noteClosed(const std::vector<std::string>& ids, const char* why) {
  for (const std::string& id : ids) {
    const ShardBook::Shard* shard = book_.findShard(id);
    if (shard == nullptr) continue;
    const ShardBalances& b = shard->account.balances();
    note({.event = "shard_closed",
          .fields = {{"shard_id", id},
                     {"reason", why},
                     {"allocated", num(b.allocated)},
                     {"reserved", num(b.local_reserved)},
                     {"spent", num(b.local_spent)},
                     {"retired", num(b.local_retired)},
                     {"overspent", num(b.overspent)}},
          .counter = ShardCounter::kEvent,
          .label = std::string("closed-") + why});
  }
}

void ShardKeeping::maintain(uint64_t now_ms, bool link_usable) {
  const ShardTickOutcome tick = book_.tick(now_ms);
  noteClosed(tick.shards_closed, "expiry");
  for (const std::string& id : tick.shards_forgotten) {
    report_retry_at_ms_.erase(id);
    note({.event = "shard_forgotten", .fields = {{"shard_id", id}}});
  }
  if (!persist() || !link_usable) return;
  closeForReconnect(now_ms);
  if (!persist()) return;
  sendReports(now_ms);
  pollStatus(now_ms);
  keepOnHand(now_ms);
}

void ShardKeeping::closeForReconnect(uint64_t now_ms) {
  const std::vector<std::string> closed =
      book_.closeForReconnect(now_ms, options_.refresh_before_expiry_ms);
  for (const std::string& id : closed) {
    noteClosed({id}, shardCloseReasonName(book_.findShard(id)->record.close_reason));
  }
}

void ShardKeeping::sendReports(uint64_t now_ms) {
  for (const std::string& id : book_.shardsNeedingReport()) {
    if (reports_in_flight_.contains(id)) continue;
    if (auto retry = report_retry_at_ms_.find(id);
        retry != report_retry_at_ms_.end() && now_ms < retry->second) {
      continue;
    }
    std::optional<ShardReport> report = book_.buildReport(id, now_ms);
    if (!report.has_value()) continue;
    reports_in_flight_.insert(id);
    note({.event = "shard_report_sent",
          .fields = {{"shard_id", id},
                     {"receipts", num(report->receipts.size())},
                     {"spent", num(report->balances.local_spent)},
                     {"reserved", num(report->balances.local_reserved)},
                     {"overspent", num(report->balances.overspent)}}});
    effects_.push_back(ShardSendReport{.shard_id = id, .report = std::move(*report)});
  }
}

void ShardKeeping::onReportAnswer(const std::string& shard_id, const ShardCallResult& result,
                                  uint64_t now_ms) {
  reports_in_flight_.erase(shard_id);
  if (!result.answered) {
    report_retry_at_ms_[shard_id] = now_ms + options_.issue_retry_ms;
    note({.level = ShardNoteLevel::kWarn,
          .event = "shard_report_failed",
          .fields = {{"shard_id", shard_id}, {"error", result.error}},
          .counter = ShardCounter::kReport,
          .label = "failed"});
    return;  // retried at the next maintenance: reports are idempotent at the ledger
  }
  const ShardReply* reply = result.reply.has_value() ? &*result.reply : nullptr;
  if (reply == nullptr || reply->code != ReplyCode::kOk || reply->shards.empty()) {
    const std::string answer =
        reply == nullptr ? result.label
                         : std::string(replyCodeName(reply->code)) + ": " + reply->message;
    // The ledger has no record of the shard (typed: kNotFound, no shard, not a permission
    // refusal): it never will, so retrying cannot help. Keep it for the operator instead.
    if (reply != nullptr && reply->code == ReplyCode::kNotFound && reply->shards.empty() &&
        !reply->permission_denied) {
      markUnreconcilable(shard_id, ShardUnreconcilable::kForgotten, answer, now_ms);
      return;
    }
    report_retry_at_ms_[shard_id] = now_ms + options_.issue_retry_ms;
    note({.level = ShardNoteLevel::kError,
          .event = "shard_report_refused",
          .fields = {{"shard_id", shard_id}, {"answer", answer}},
          .counter = ShardCounter::kReport,
          .label = "refused"});
    // A refusal that carries the shard (e.g. WRITTEN_OFF: never reported again) is recorded.
    if (reply != nullptr && !reply->shards.empty() &&
        reply->shards.front().grant.shard_id == shard_id) {
      (void)book_.onLedgerAnswer(shard_id, reply->shards.front(), now_ms);
      if (reply->shards.front().state == ShardState::kWrittenOff) {
        // Written off while we held usage it never heard of: that usage is not recorded
        // centrally, so the operator must see it (the units stay retired at the ledger).
        markUnreconcilable(shard_id, ShardUnreconcilable::kWrittenOff, answer, now_ms);
        return;
      }
      (void)persist();
    }
    return;
  }
  report_retry_at_ms_.erase(shard_id);
  const ShardLedgerView& view = reply->shards.front();
  const ShardAnswerOutcome outcome = book_.onLedgerAnswer(shard_id, view, now_ms);
  (void)persist();
  const std::string state = shardStateName(view.state);
  note(count(ShardCounter::kReport, reply->duplicate ? "duplicate" : state));
  if (view.state == ShardState::kConflict) {
    note({.level = ShardNoteLevel::kError,
          .event = "shard_conflict_reported",
          .fields = {{"shard_id", shard_id},
                     {"spent", num(view.spent_units)},
                     {"debt", num(view.debt_units)}},
          .counter = ShardCounter::kEvent,
          .label = "conflict"});
  }
  note({.event = "shard_reconciled",
        .fields = {{"shard_id", shard_id},
                   {"state", state},
                   {"acknowledged", flag(outcome.acknowledged)},
                   {"reminted_now", num(reply->reminted_units)},
                   {"spent_now", num(reply->spent_units)},
                   {"reminted_total", num(view.reminted_units)},
                   {"spent_total", num(view.spent_units)},
                   {"retired", num(view.retired_units)}}});
}

void ShardKeeping::markUnreconcilable(const std::string& shard_id, ShardUnreconcilable reason,
                                      const std::string& answer, uint64_t now_ms) {
  report_retry_at_ms_.erase(shard_id);
  if (!book_.markUnreconcilable(shard_id, reason, now_ms)) return;
  (void)persist();  // a failed write is retried with the next commit; nothing is sent meanwhile
  const ShardBook::Shard* shard = book_.findShard(shard_id);
  const ShardBalances& b = shard->account.balances();
  note(count(ShardCounter::kReport, "unreconcilable"));
  note({.level = ShardNoteLevel::kError,
        .event = "shard_unreconcilable",
        .fields = {{"shard_id", shard_id},
                   {"reason", shardUnreconcilableName(reason)},
                   {"answer", answer},
                   {"subject", shard->record.grant.subject},
                   {"route", shard->record.grant.route},
                   {"allocated", num(b.allocated)},
                   {"reserved", num(b.local_reserved)},
                   {"spent", num(b.local_spent)},
                   {"retired", num(b.local_retired)},
                   {"overspent", num(b.overspent)},
                   {"receipts", num(shard->reservation_ids.size())}},
        .counter = ShardCounter::kEvent,
        .label = "unreconcilable"});
}

void ShardKeeping::pollStatus(uint64_t now_ms) {
  if (status_in_flight_ || now_ms < next_status_poll_ms_) return;
  std::vector<std::string> ids = book_.openShards();
  if (ids.empty()) return;
  status_in_flight_ = true;
  next_status_poll_ms_ = now_ms + options_.status_poll_ms;
  effects_.push_back(ShardSendStatus{.shard_ids = std::move(ids)});
}

void ShardKeeping::onStatusAnswer(const ShardCallResult& result, uint64_t now_ms) {
  status_in_flight_ = false;
  if (!result.answered) return;
  const ShardReply* reply = result.reply.has_value() ? &*result.reply : nullptr;
  if (reply == nullptr || reply->code != ReplyCode::kOk) {
    note({.level = ShardNoteLevel::kWarn,
          .event = "shard_status_refused",
          .fields = {{"answer", result.label}}});
    return;
  }
  for (const ShardLedgerView& view : reply->shards) {
    const ShardAnswerOutcome outcome = book_.onLedgerAnswer(view.grant.shard_id, view, now_ms);
    if (outcome.closed_now) {
      const ShardBook::Shard* shard = book_.findShard(view.grant.shard_id);
      noteClosed({view.grant.shard_id}, shardCloseReasonName(shard->record.close_reason));
    }
  }
  (void)persist();
}

void ShardKeeping::keepOnHand(uint64_t now_ms) {
  for (auto it = accounts_.begin(); it != accounts_.end();) {
    const SubjectRoute& account = it->first;
    AccountState& state = it->second;
    if (!state.configured && !state.issuing &&
        now_ms >= state.learned_at_ms + options_.account_idle_ms) {
      // Its shards stay until they are used, expire or are fenced; none are asked for again.
      note({.event = "shard_account_dropped", .fields = {{"account", accountName(account)}}});
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

void ShardKeeping::issue(const SubjectRoute& account) {
  AccountState& state = accounts_[account];
  state.issuing = true;
  if (!state.unanswered.has_value()) {
    state.unanswered = ShardIssueRequest{
        .request_id = options_.gateway_name + "/" + std::to_string(options_.boot_epoch) + "/" +
                      hex64(options_.request_nonce) + "/" + std::to_string(++issue_seq_),
        .gateway_name = options_.gateway_name,
        .gateway_id = options_.gateway_id,
        .gateway_boot_epoch = options_.boot_epoch,
        .subject = account.subject,
        .route = account.route};
  }
  note({.level = ShardNoteLevel::kDebug,
        .event = "shard_issue_requested",
        .fields = {{"account", accountName(account)},
                   {"request_id", state.unanswered->request_id}}});
  effects_.push_back(ShardSendIssue{.account = account, .request = *state.unanswered});
}

void ShardKeeping::onIssueAnswer(const SubjectRoute& account, const ShardCallResult& result,
                                 uint64_t now_ms) {
  auto it = accounts_.find(account);
  if (it != accounts_.end()) {
    it->second.issuing = false;
    it->second.next_issue_ms = now_ms + options_.issue_retry_ms;
  }
  if (!result.answered) {
    note(count(ShardCounter::kIssue, "failed"));  // outcome unknown: `unanswered` is retried
    return;
  }
  if (it != accounts_.end()) it->second.unanswered.reset();
  const ShardReply* reply = result.reply.has_value() ? &*result.reply : nullptr;
  if (reply == nullptr || reply->code != ReplyCode::kOk || reply->shards.empty()) {
    const bool off = reply != nullptr && reply->code == ReplyCode::kInvalidState;
    if (off && it != accounts_.end()) {
      it->second.next_issue_ms = now_ms + options_.emergency_off_retry_ms;
    }
    note(count(ShardCounter::kIssue, off ? "emergency-off" : "refused"));
    note({.event = "shard_issue_refused",
          .fields = {{"account", accountName(account)},
                     {"answer", reply == nullptr ? result.label
                                                 : std::string(replyCodeName(reply->code)) + " " +
                                                       reply->message}}});
    return;
  }
  const ShardGrant& grant = reply->shards.front().grant;
  const ShardAddCode code = book_.addShard(grant, now_ms);
  if (code != ShardAddCode::kOk && code != ShardAddCode::kDuplicate) {
    note(count(ShardCounter::kIssue, std::string("refused-") + shardAddCodeName(code)));
    note({.level = ShardNoteLevel::kError,
          .event = "shard_grant_refused",
          .fields = {{"shard_id", grant.shard_id}, {"why", shardAddCodeName(code)}}});
    return;
  }
  if (!persist()) return;  // kept in memory; durable at the next successful commit
  if (it != accounts_.end()) it->second.next_issue_ms = now_ms;  // more may be needed
  note(count(ShardCounter::kIssue, "issued"));
  note({.event = "shard_obtained",
        .fields = {{"shard_id", grant.shard_id},
                   {"account", accountName(account)},
                   {"units", num(grant.allocated_units)},
                   {"fence", num(grant.fence)},
                   {"expires_at_ms", num(grant.expires_at_ms)}}});
}

}  // namespace tally
