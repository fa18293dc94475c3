#include "core/ledger.h"

#include <algorithm>
#include <functional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/reservation_lifecycle.h"
#include "core/reservation_replies.h"
#include "core/retry_after.h"

namespace tally {
namespace {

using replies::validId;

}  // namespace

const char* replyCodeName(ReplyCode code) {
  switch (code) {
    case ReplyCode::kOk: return "OK";
    case ReplyCode::kRejected: return "REJECTED";
    case ReplyCode::kIdempotencyConflict: return "IDEMPOTENCY_CONFLICT";
    case ReplyCode::kOperationConflict: return "OPERATION_CONFLICT";
    case ReplyCode::kExpired: return "EXPIRED";
    case ReplyCode::kInvalidState: return "INVALID_STATE";
    case ReplyCode::kNotFound: return "NOT_FOUND";
    case ReplyCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case ReplyCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case ReplyCode::kArithmeticOverflow: return "ARITHMETIC_OVERFLOW";
    case ReplyCode::kQueued: return "QUEUED";
  }
  return "UNKNOWN";
}

Ledger::Ledger(LedgerOptions options) : options_(options) {
  TALLY_ASSERT(options_.reservations_max <= ReservationTable::kRecordsMax);
}

#ifdef TALLY_TEST_FAULTS
void Ledger::setFaultsForTesting(LedgerFaults faults) {
  faults_ = faults;
  shards_.setFaultsForTesting(
      {.remint_holding_receipts = faults.remint_holding_receipts,
       .reconcile_superseded_reports = faults.reconcile_superseded_reports});
}
#endif

uint64_t Ledger::advance(uint64_t now_ms) {
  now_ms_ = std::max(now_ms_, now_ms);
  return now_ms_;
}

Ledger::Record* Ledger::lookup(const std::string& reservation_id) {
  const uint64_t hash = ReservationTable::hashOf(reservation_id);
  if (Record* record = reservations_.find(reservation_id, hash)) return record;
  // A receipt of the window: back into the live table, so that the lifecycle answers (or, for a
  // late receipt after a hard-limit close, changes) it as it always has; the next tick after its
  // image is taken archives it again, kept until the same moment.
  std::optional<Reservation> receipt = receipts_.take(reservation_id, hash);
  if (!receipt) return nullptr;
  Record* record = reservations_.insert(*std::move(receipt), hash);
  closed_.push_back(ReservationTable::handleOf(*record));
  return record;
}

const Reservation* Ledger::findReservation(const std::string& reservation_id) const {
  const uint64_t hash = ReservationTable::hashOf(reservation_id);
  if (const Record* record = reservations_.find(reservation_id, hash)) {
    return &record->reservation;
  }
  std::optional<Reservation> receipt = receipts_.find(reservation_id, hash);
  if (!receipt) return nullptr;
  found_scratch_ = *std::move(receipt);
  return &found_scratch_;
}

std::array<uint64_t, kReservationStateCount> Ledger::reservationCountsByState() const {
  std::array<uint64_t, kReservationStateCount> counts{};
  for (int state = 0; state < kReservationStateCount; ++state) {
    counts[state] = receipts_.countOf(static_cast<ReservationState>(state));
  }
  reservations_.forEach(
      [&counts](const Record& record) { ++counts[static_cast<size_t>(record.reservation.state)]; });
  return counts;
}

AccountEntry* Ledger::accountOf(const Reservation& reservation) {
  AccountEntry* entry =
      accounts_.find(reservation.subject, reservation.route, reservation.policy_generation);
  TALLY_ASSERT(entry != nullptr);  // a reservation that holds units always has its account
  // Every caller is about to change the balances: the store must hear of it.
  accounts_.markChanged(entry);
  return entry;
}

void Ledger::touched(Record* record) {
  if (record->change_pending) return;
  record->change_pending = true;
  upserted_.push_back(record);
}

class Ledger::AccountHolder final : public CapacityHolder {
 public:
  AccountHolder(Ledger* ledger, Record* record) : ledger_(ledger), record_(record) {}

  void returnUnits(const Reservation& reservation, uint64_t now_ms) override {
    AccountEntry* entry = ledger_->accountOf(reservation);
    const AccountCode code = entry->account.release(reservation.reserved_units);
    TALLY_ASSERT(code == AccountCode::kOk);  // `reserved` covers every live reservation
    ledger_->accounts_.rebalance(reservation.subject, reservation.route, now_ms);
  }

  HolderSettle settle(const Reservation& reservation, Units actual_units,
                      uint64_t now_ms) override {
    AccountEntry* entry = ledger_->accountOf(reservation);
    const SettleOutcome outcome = entry->account.settle(reservation.reserved_units, actual_units,
                                                        entry->budget.max_overdraft);
    if (outcome.code == AccountCode::kOverflow) return {.code = HolderCode::kOverflow};
    TALLY_ASSERT(outcome.code == AccountCode::kOk);
    ledger_->accounts_.rebalance(reservation.subject, reservation.route, now_ms);
    return of(outcome);
  }

  HolderSettle consumeAll(const Reservation& reservation, uint64_t /*now_ms*/) override {
    AccountEntry* entry = ledger_->accountOf(reservation);
    const SettleOutcome outcome = entry->account.settle(
        reservation.reserved_units, reservation.reserved_units, entry->budget.max_overdraft);
    if (outcome.code == AccountCode::kOverflow) return {.code = HolderCode::kOverflow};
    TALLY_ASSERT(outcome.code == AccountCode::kOk);
    return of(outcome);
  }

  HolderSettle chargeExtra(const Reservation& reservation, Units extra_units,
                           uint64_t /*now_ms*/) override {
    AccountEntry* entry = ledger_->accountOf(reservation);
    const SettleOutcome outcome =
        entry->account.chargeExtra(extra_units, entry->budget.max_overdraft);
    if (outcome.code == AccountCode::kOverflow) return {.code = HolderCode::kOverflow};
    TALLY_ASSERT(outcome.code == AccountCode::kOk);
    return of(outcome);
  }

  HolderGrow grow(const Reservation& reservation, Units more_units, Units total_units,
                  uint64_t now_ms) override {
    AccountBook& accounts = ledger_->accounts_;
    bool table_full = false;
    // The reservation's generation, pinned: a draining one admits nothing new
    // (kGenerationDraining).
    const Admission admission =
        accounts.admit(reservation.subject, reservation.route, reservation.policy_generation,
                       now_ms, &table_full, reservation.region);
    if (table_full || admission.entry == nullptr) {
      // No admissible account (draining generation, no budget any more, region fence).
      return {.refused = admission.refused == LimitingDimension::kNone
                             ? LimitingDimension::kNoBudget
                             : admission.refused,
              .retry_after_ms = kRetryNever,
              .message = admission.message};
    }
    AccountEntry& entry = *admission.entry;
    // The active account of the pinned generation is the one holding the reservation's units.
    TALLY_ASSERT(entry.key.generation == reservation.policy_generation);
    const Account& account = entry.account;
    if (admission.refused != LimitingDimension::kNone) {
      return {.refused = admission.refused,
              .retry_after_ms =
                  retryAfterMs({.units = more_units,
                                .available = account.balances().available,
                                .debt = accounts.debt({reservation.subject, reservation.route}),
                                .refill_per_second = account.bucket().refill_per_second,
                                .burst = account.bucket().burst}),
              .message = admission.message};
    }
    if (total_units > entry.budget.max_single_reservation) {
      return {.refused = LimitingDimension::kMaxSingleReservation,
              .retry_after_ms = kRetryNever,
              .message = "the new total is above the policy's max single reservation (" +
                         std::to_string(entry.budget.max_single_reservation) + ")"};
    }
    switch (entry.account.reserve(more_units, total_units)) {
      case AccountCode::kOk: accounts.markChanged(&entry); return {};
      case AccountCode::kInsufficientAvailable:
        return {.refused = LimitingDimension::kCapacity,
                .retry_after_ms = retryAfterMs({.units = more_units,
                                                .available = account.balances().available,
                                                .debt = 0,
                                                .refill_per_second = entry.budget.refill_per_second,
                                                .burst = entry.budget.burst})};
      case AccountCode::kOverflow: return {.code = HolderCode::kOverflow};
      default: TALLY_UNREACHABLE();  // units > 0, max single checked, debt refused above
    }
  }

  void changed(const Reservation& reservation, ReservationState from,
               uint64_t /*now_ms*/) override {
    const ReservationState to = reservation.state;
    if (to != from) {
      if (to == ReservationState::kReserved) {
        ledger_->pushDeadline(&ledger_->expiry_queue_, reservation.expires_at_ms, *record_);
      } else if (to == ReservationState::kUsageUnknown) {
        ledger_->pushHardLimit(*record_);
      } else if (isTerminal(to) && !isTerminal(from)) {
        ledger_->closed_.push_back(ReservationTable::handleOf(*record_));  // to the archive
      }
    }
    ledger_->touched(record_);
  }

 private:
  static HolderSettle of(const SettleOutcome& outcome) {
    return {.refunded_units = outcome.refunded,
            .debt_units = outcome.debt_issued,
            .overdraft_breach = outcome.overdraft_breach};
  }

  Ledger* ledger_;
  Record* record_;  // null only for a request about an unknown id (never called then)
};

void Ledger::pushDeadline(DeadlineQueue* queue, uint64_t at_ms, const Record& record) {
  queue->push({.at_ms = at_ms,
               .handle = ReservationTable::handleOf(record),
               .reservation_id = record.reservation.reservation_id});
}

Ledger::Record* Ledger::popDue(DeadlineQueue* queue) {
  const Deadline& top = queue->top();
  Record* record = reservations_.resolve(top.handle);
  // Closed or compacted since it was queued: the id may name a later live reservation by now
  // (a receipt never has a deadline due: it stays archived).
  if (record == nullptr) record = reservations_.find(top.reservation_id);
  queue->pop();
  return record;
}

Ledger::DeadlineQueue* Ledger::queueWaitedIn(ReservationState state) {
  switch (state) {
    case ReservationState::kReserved:
    case ReservationState::kExpiring: return &expiry_queue_;
    case ReservationState::kUsageUnknown: return &hard_limit_queue_;
    default: return nullptr;
  }
}

void Ledger::compactDeadlines() {
  const size_t kept_max = 2 * reservations_.size() + kDeadlinesKeptMin;
  // Every reservation waiting in a queue has an entry of its own there, pushed when it entered
  // its state (or by enqueueDeadlines() at restore), so what is dropped is only ever skipped
  // when popped.
  for (DeadlineQueue* queue : {&expiry_queue_, &hard_limit_queue_}) {
    if (queue->size() <= kept_max) continue;
    queue->keepOnly([this, queue](const Deadline& deadline) {
      const Record* record = reservations_.resolve(deadline.handle);
      if (record == nullptr) return false;  // closed and archived or compacted: popDue skips it
      const ReservationState state = record->reservation.state;
#ifdef TALLY_TEST_FAULTS
      if (faults_.expire_started && state == ReservationState::kStarted &&
          queue == &expiry_queue_) {
        return true;
      }
#endif
      return queueWaitedIn(state) == queue;
    });
  }
}

Status Ledger::restoreReservation(Reservation reservation) {
  if (!validId(reservation.reservation_id, limits::kReservationIdBytesMax)) {
    return Status::corruption("stored reservation has an invalid id");
  }
  if (reservation.state == ReservationState::kRequested ||
      reservation.state == ReservationState::kReservationUnknown) {
    return Status::corruption("reservation '" + reservation.reservation_id +
                              "' stored in agent-only state " +
                              reservationStateName(reservation.state));
  }
  const uint64_t hash = ReservationTable::hashOf(reservation.reservation_id);
  if (reservations_.find(reservation.reservation_id, hash) != nullptr ||
      receipts_.contains(reservation.reservation_id, hash)) {
    return Status::corruption("reservation '" + reservation.reservation_id + "' stored twice");
  }
  now_ms_ = std::max(
      {now_ms_, reservation.created_at_ms, reservation.started_at_ms, reservation.closed_at_ms});
  // A receipt goes straight to the archive (a restart holds the window's receipts packed too);
  // the first tick compacts those already past retention.
  const bool terminal = isTerminal(reservation.state);
  if (!terminal || !receipts_.add(reservation, hash, keepUntil(reservation))) {
    Record* record = reservations_.insert(std::move(reservation), hash);
    if (terminal) closed_.push_back(ReservationTable::handleOf(*record));
  }
  return Status::ok();
}

void Ledger::enqueueDeadlines(const Record& record, const AccountEntry* entry) {
  const Reservation& reservation = record.reservation;
  switch (reservation.state) {
    case ReservationState::kReserved:
    case ReservationState::kExpiring:  // a crash between the halves: the tick finishes it
      pushDeadline(&expiry_queue_, reservation.expires_at_ms, record);
      break;
    case ReservationState::kUsageUnknown: {
      TALLY_ASSERT(entry != nullptr);
      pushDeadline(&hard_limit_queue_,
                   saturatingAdd(reservation.started_at_ms, entry->budget.hard_execution_limit_ms),
                   record);
      break;
    }
    default: break;  // terminal: closed_ (or the archive) keeps it until retention
  }
}

Status Ledger::finishRestore(uint64_t now_ms) {
  if (Status status = shards_.finishRestore(); !status.isOk()) return status;
  advance(now_ms);
  // The full audit first: besides every account's equation and `reserved`, it finds any
  // reservation holding units of a missing account, which the deadline queues below rely on.
  const AuditReport report = audit(now_ms_);
  if (!report.conserved) {
    return Status::corruption("restored ledger fails its audit: " + report.violations.front());
  }
  reservations_.forEach([&](const Record& record) {
    const Reservation& reservation = record.reservation;
    const AccountEntry* entry =
        reservation.state == ReservationState::kUsageUnknown
            ? accounts_.find(reservation.subject, reservation.route, reservation.policy_generation)
            : nullptr;
    enqueueDeadlines(record, entry);
  });
  std::vector<PeriodKey> periods_beyond_kept = std::move(periods_deleted_);
  (void)takeChangedRows();  // restored state is already durable
  periods_deleted_ = std::move(periods_beyond_kept);
  return Status::ok();
}

PolicyReply Ledger::publishPolicy(Policy policy, uint64_t now_ms) {
  advance(now_ms);
  return accounts_.publish(std::move(policy), now_ms_);
}

PolicyReply Ledger::rollbackPolicy(uint64_t now_ms) {
  advance(now_ms);
  return accounts_.rollback(now_ms_);
}

ReservationReply Ledger::reject(const ReserveRequest& request, const std::string& gateway_name,
                                uint64_t id_hash, Generation generation,
                                LimitingDimension dimension, int64_t retry_after_ms,
                                uint64_t now_ms) {
  // Stamp the epoch of the budget that refused it, or the hourly period when none matched.
  EpochPeriod period = EpochPeriod::kHour;
  if (const Policy* policy = accounts_.policy(generation)) {
    if (const Budget* budget = matchBudget(*policy, request.subject, request.route)) {
      period = budget->accounting_epoch;
    }
  }
  Reservation fresh = lifecycle::newRecord(request, now_ms);
  fresh.gateway_name = gateway_name;
  fresh.policy_generation = generation;
  fresh.accounting_epoch_ms = accountingEpochStartMs(now_ms, period);
  fresh.limiting_dimension = dimension;
  fresh.retry_after_ms = retry_after_ms;
  Record* record = reservations_.insert(std::move(fresh), id_hash);
  AccountHolder holder(this, record);
  return lifecycle::rejected(&record->reservation, &holder, now_ms);
}

ReservationReply Ledger::reserve(const ReserveRequest& request, uint64_t now_ms,
                                 const std::string& gateway_name) {
  now_ms = advance(now_ms);
  if (std::optional<ReservationReply> invalid = lifecycle::checkReserve(request)) {
    return *std::move(invalid);
  }
  // One hash for the duplicate check and the insert.
  const uint64_t id_hash = ReservationTable::hashOf(request.reservation_id);
  if (const Record* found = reservations_.find(request.reservation_id, id_hash)) {
    return lifecycle::repeatedReserve(found->reservation, request);
  }
  if (std::optional<Reservation> receipt = receipts_.find(request.reservation_id, id_hash)) {
    return lifecycle::repeatedReserve(*receipt, request);
  }
  if (reservations_.size() >= options_.reservations_max) {
    return {.code = ReplyCode::kResourceExhausted, .message = "reservation table is full"};
  }
  if (receipts_.bytes() >= options_.receipt_bytes_max) {
    return {.code = ReplyCode::kResourceExhausted,
            .message =
                "receipt memory is full (receipt_bytes_max): receipts of the idempotency "
                "window are compacted after retention_ms"};
  }

  bool table_full = false;
  Admission admission = accounts_.admit(request.subject, request.route, request.policy_generation,
                                        now_ms, &table_full, request.region);
  if (table_full)
    return {.code = ReplyCode::kResourceExhausted, .message = "account table is full"};
#ifdef TALLY_TEST_FAULTS
  if (faults_.admit_in_debt && admission.refused == LimitingDimension::kFrozenRoute) {
    admission.refused = LimitingDimension::kNone;  // deliberately wrong: ignores the route's debt
  }
#endif
  if (admission.refused != LimitingDimension::kNone) {
    // No budget or a draining generation: retrying the same request never helps.
    int64_t retry_after_ms = kRetryNever;
    if (admission.entry != nullptr) {
      const Account& account = admission.entry->account;
      retry_after_ms = retryAfterMs({.units = request.units,
                                     .available = account.balances().available,
                                     .debt = accounts_.debt({request.subject, request.route}),
                                     .refill_per_second = account.bucket().refill_per_second,
                                     .burst = account.bucket().burst});
    }
    ReservationReply rejected = reject(request, gateway_name, id_hash, admission.generation,
                                       admission.refused, retry_after_ms, now_ms);
    rejected.message = std::move(admission.message);
    return rejected;
  }

  AccountEntry& entry = *admission.entry;
  const Budget& budget = entry.budget;
  const AccountCode code = entry.account.reserve(request.units, budget.max_single_reservation);
  switch (code) {
    case AccountCode::kOk: accounts_.markChanged(&entry); break;
    case AccountCode::kAboveMaxSingle:
      return reject(request, gateway_name, id_hash, admission.generation,
                    LimitingDimension::kMaxSingleReservation, kRetryNever, now_ms);
    case AccountCode::kInsufficientAvailable: {
      const int64_t retry_after_ms = retryAfterMs({.units = request.units,
                                                   .available = entry.account.balances().available,
                                                   .debt = 0,
                                                   .refill_per_second = budget.refill_per_second,
                                                   .burst = budget.burst});
      return reject(request, gateway_name, id_hash, admission.generation,
                    LimitingDimension::kCapacity, retry_after_ms, now_ms);
    }
    case AccountCode::kOverflow:
      return {.code = ReplyCode::kArithmeticOverflow, .message = "reserved units overflow"};
    default: TALLY_UNREACHABLE();
  }
  // Point of no return: capacity is reduced; the receipt and the balance persist together.
  Reservation fresh = lifecycle::newRecord(request, now_ms);
  fresh.gateway_name = gateway_name;
  fresh.policy_generation = admission.generation;
  fresh.accounting_epoch_ms = accountingEpochStartMs(now_ms, budget.accounting_epoch);
  fresh.expires_at_ms = saturatingAdd(now_ms, budget.hold_ttl_ms);
  Record* record = reservations_.insert(std::move(fresh), id_hash);
  AccountHolder holder(this, record);
  return lifecycle::admitted(&record->reservation, &holder, now_ms);
}

template <typename Rule>
ReservationReply Ledger::applyToReservation(const std::string& reservation_id, uint64_t now_ms,
                                            Rule rule) {
  now_ms = advance(now_ms);
  Record* record = lookup(reservation_id);
  AccountHolder holder(this, record);
  return rule(record == nullptr ? nullptr : &record->reservation, &holder, now_ms);
}

ReservationReply Ledger::start(const StartRequest& request, uint64_t now_ms) {
  return applyToReservation(request.reservation_id, now_ms,
                            [&](Reservation* reservation, AccountHolder* holder, uint64_t now) {
                              return lifecycle::start(reservation, request, holder, now);
                            });
}

ReservationReply Ledger::release(const ReleaseRequest& request, uint64_t now_ms) {
  ReservationReply reply =
      applyToReservation(request.reservation_id, now_ms,
                         [&](Reservation* reservation, AccountHolder* holder, uint64_t now) {
                           return lifecycle::release(reservation, request, holder, now);
                         });
#ifdef TALLY_TEST_FAULTS
  if (faults_.double_refund_release && reply.duplicate &&
      reply.receipt.state == ReservationState::kReleased) {
    // Deliberately wrong: returns the units a second time (when `reserved` still has them,
    // which leaves `reserved` short of what live reservations hold).
    Record* record = lookup(request.reservation_id);
    (void)accountOf(record->reservation)->account.release(record->reservation.reserved_units);
    reply.refunded_units = record->reservation.reserved_units;
  }
#endif
  return reply;
}

ReservationReply Ledger::markUnknown(const MarkUnknownRequest& request, uint64_t now_ms) {
  ReservationReply reply =
      applyToReservation(request.reservation_id, now_ms,
                         [&](Reservation* reservation, AccountHolder* holder, uint64_t now) {
                           return lifecycle::markUnknown(reservation, request, holder, now);
                         });
#ifdef TALLY_TEST_FAULTS
  if (faults_.refund_usage_unknown && reply.code == ReplyCode::kOk && !reply.duplicate) {
    // Deliberately wrong: "a timeout is a refund".
    Record* record = lookup(request.reservation_id);
    (void)accountOf(record->reservation)->account.release(record->reservation.reserved_units);
    reply.refunded_units = record->reservation.reserved_units;
  }
#endif
  return reply;
}

ReservationReply Ledger::settle(const SettleRequest& request, uint64_t now_ms) {
  return applyReceipt(request.reservation_id, request.operation_id, request.actual_units, now_ms);
}

ReservationReply Ledger::reportOperation(const ReportOperationRequest& request, uint64_t now_ms) {
  return applyReceipt(request.reservation_id, request.operation_id, request.actual_units, now_ms);
}

ReservationReply Ledger::applyReceipt(const std::string& reservation_id,
                                      const std::string& operation_id, Units actual_units,
                                      uint64_t now_ms) {
  return applyToReservation(reservation_id, now_ms,
                            [&](Reservation* reservation, AccountHolder* holder, uint64_t now) {
                              return lifecycle::receipt(reservation, reservation_id, operation_id,
                                                        actual_units, holder, now);
                            });
}

ReservationReply Ledger::extend(const ExtendRequest& request, uint64_t now_ms) {
  return applyToReservation(request.reservation_id, now_ms,
                            [&](Reservation* reservation, AccountHolder* holder, uint64_t now) {
                              return lifecycle::extend(reservation, request, holder, now);
                            });
}

ReservationReply Ledger::query(const QueryRequest& request) const {
  return lifecycle::query(findReservation(request.reservation_id), request);
}

bool Ledger::beginExpiry(const std::string& reservation_id, uint64_t now_ms) {
  now_ms = advance(now_ms);
  Record* record = lookup(reservation_id);
  if (record == nullptr) return false;
  AccountHolder holder(this, record);
  return lifecycle::beginExpiry(&record->reservation, &holder, now_ms);
}

bool Ledger::completeExpiry(const std::string& reservation_id, uint64_t now_ms) {
  now_ms = advance(now_ms);
  Record* record = lookup(reservation_id);
  if (record == nullptr) return false;
  AccountHolder holder(this, record);
  return lifecycle::completeExpiry(&record->reservation, &holder, now_ms);
}

void Ledger::pushHardLimit(const Record& record) {
  const Reservation& reservation = record.reservation;
  const AccountEntry* entry =
      accounts_.find(reservation.subject, reservation.route, reservation.policy_generation);
  TALLY_ASSERT(entry != nullptr);  // a reservation that holds units always has its account
  pushDeadline(&hard_limit_queue_,
               saturatingAdd(reservation.started_at_ms, entry->budget.hard_execution_limit_ms),
               record);
}

bool Ledger::closeByHardLimit(Record* record, uint64_t now_ms) {
  Reservation* reservation = &record->reservation;
  const AccountEntry* owner =
      accounts_.find(reservation->subject, reservation->route, reservation->policy_generation);
  TALLY_ASSERT(owner != nullptr);
  if (now_ms < saturatingAdd(reservation->started_at_ms, owner->budget.hard_execution_limit_ms)) {
    return false;
  }
  AccountHolder holder(this, record);
  return lifecycle::closeByHardLimit(reservation, &holder, now_ms);
}

TickOutcome Ledger::tick(uint64_t now_ms, uint64_t items_max) {
  now_ms = advance(now_ms);
  TickOutcome outcome;
  // Queues hold stale entries (a reservation started, released or re-queued); each pop checks
  // the reservation's current state before acting.
  while (!expiry_queue_.empty() && expiry_queue_.top().at_ms <= now_ms &&
         outcome.expired < items_max) {
    Record* record = popDue(&expiry_queue_);
    if (record == nullptr) continue;
    AccountHolder holder(this, record);
#ifdef TALLY_TEST_FAULTS
    if (faults_.expire_started && record->reservation.state == ReservationState::kStarted &&
        record->reservation.expires_at_ms <= now_ms) {
      // Deliberately wrong: the work is running, and its units go back to available.
      record->reservation.state = ReservationState::kExpiring;  // forged: no STARTED → EXPIRING
    }
#endif
    if (lifecycle::expire(&record->reservation, &holder, now_ms)) ++outcome.expired;
  }
  while (!hard_limit_queue_.empty() && hard_limit_queue_.top().at_ms <= now_ms &&
         outcome.closed_by_hard_limit < items_max) {
    Record* record = popDue(&hard_limit_queue_);
    if (record != nullptr && record->reservation.state == ReservationState::kUsageUnknown &&
        closeByHardLimit(record, now_ms)) {
      ++outcome.closed_by_hard_limit;
    }
  }
  compactDeadlines();
  outcome.compacted = archiveClosed(now_ms, items_max);
  outcome.compacted += receipts_.compact(now_ms, items_max, &deleted_);
  const ShardRegistry::TickOutcome shards = shards_.tick(now_ms, items_max);
  outcome.shards_reminted = shards.reminted;
  outcome.shards_compacted = shards.compacted;
  outcome.periods_closed = closePeriods(now_ms, items_max);
  return outcome;
}

uint64_t Ledger::archiveClosed(uint64_t now_ms, uint64_t items_max) {
  uint64_t compacted = 0;
  size_t kept = 0;  // closed_[0, kept): still to archive at a later tick
  size_t next = 0;
  for (; next < closed_.size() && next - kept < items_max; ++next) {
    Record* record = reservations_.resolve(closed_[next]);
    if (record == nullptr) continue;  // archived or compacted already
    TALLY_ASSERT(isTerminal(record->reservation.state));
    const Reservation& reservation = record->reservation;
    const uint64_t keep_until_ms = keepUntil(reservation);
    if (keep_until_ms <= now_ms) {
      if (record->change_pending) std::erase(upserted_, record);  // deleted supersedes upserted
      deleted_.push_back(reservation.reservation_id);
      ++compacted;
    } else if (record->change_pending) {
      // Its final image is not taken yet: archived at a later tick, once the store has it.
      closed_[kept++] = closed_[next];
      continue;
    } else if (!receipts_.add(reservation, ReservationTable::hashOf(reservation.reservation_id),
                              keep_until_ms)) {
      closed_[kept++] = closed_[next];  // cannot be packed: stays live, tried again later
      continue;
    }
    const bool erased = reservations_.erase(reservation.reservation_id);
    TALLY_ASSERT(erased);
  }
  closed_.erase(closed_.begin() + static_cast<std::ptrdiff_t>(kept),
                closed_.begin() + static_cast<std::ptrdiff_t>(next));
  return compacted;
}

uint64_t Ledger::closePeriods(uint64_t now_ms, uint64_t items_max) {
  if (!period_sweeping_) {
    if (now_ms < period_sweep_due_ms_) return 0;
    period_sweeping_ = true;
    period_cursor_ = 0;
    // Day boundaries (00:00 UTC) are hour boundaries too: one sweep per hour covers both.
    period_sweep_due_ms_ =
        epochStartMs(accountingEpochOf(now_ms, EpochPeriod::kHour) + 1, EpochPeriod::kHour);
  }
  uint64_t closed = 0;
  uint64_t visited = 0;
  while (period_cursor_ < accounts_.accountCount() && visited < items_max) {
    AccountEntry* entry = accounts_.entryAt(period_cursor_++);
    ++visited;
    const EpochPeriod period = entry->budget.accounting_epoch;
    if (!periodDue(entry->period, period, now_ms)) continue;
    // Balances as of now, as audit reports them: the refill earned and the draining handovers
    // due (the same rebalance admission applies; it mints nothing that time has not earned).
    accounts_.rebalance(entry->key.subject, entry->key.route, now_ms);
    addPeriod(closePeriod(entry->key, period, entry->account.balances(), now_ms, &entry->period));
    accounts_.markChanged(entry);  // its open period is durable with it
    ++closed;
  }
  if (period_cursor_ >= accounts_.accountCount()) period_sweeping_ = false;
  return closed;
}

void Ledger::addPeriod(PeriodSnapshot snapshot) {
  std::optional<PeriodKey> dropped;
  const PeriodSnapshot& added = periods_.add(std::move(snapshot), &dropped);
  periods_upserted_.push_back(PeriodKey{.key = added.key, .epoch_first = added.epoch_first});
  if (dropped) periods_deleted_.push_back(*std::move(dropped));
}

Status Ledger::restorePeriodSnapshot(const PeriodSnapshot& snapshot) {
  const std::string name = snapshot.key.subject + "/" + snapshot.key.route + "@" +
                           std::to_string(snapshot.key.generation) + " epoch " +
                           std::to_string(snapshot.epoch_first);
  const AccountEntry* entry = accounts_.find(snapshot.key);
  if (entry == nullptr) {
    return Status::corruption("period snapshot " + name + " has no account");
  }
  if (snapshot.epoch_first > snapshot.epoch_last ||
      snapshot.epoch_last >= entry->period.epoch_first) {
    return Status::corruption("period snapshot " + name + " does not precede the account's " +
                              "open period (epoch " + std::to_string(entry->period.epoch_first) +
                              ")");
  }
  std::optional<PeriodKey> dropped;
  (void)periods_.add(snapshot, &dropped);
  // More kept than this build keeps (limits::kPeriodSnapshotsKept went down): the first batch
  // deletes the extra rows.
  if (dropped) periods_deleted_.push_back(*std::move(dropped));
  return Status::ok();
}

PeriodAudit Ledger::auditPeriods(const PeriodQuery& query, uint64_t now_ms) const {
  PeriodAudit out;
  out.report.as_of_ms = std::max(now_ms, now_ms_);
  auto selected = [&](const AccountKey& key) {
    return (query.subject.empty() || key.subject == query.subject) &&
           (query.route.empty() || key.route == query.route);
  };
  if (query.list) out.report.closed_periods = periods_.spans();
  for (const PeriodSpan& span : out.report.closed_periods) {
    out.report.conserved = out.report.conserved && span.conserved;
  }
  if (query.epoch) {
    out.report.period_epoch = query.epoch;
    for (const PeriodSnapshot* snapshot : periods_.covering(*query.epoch)) {
      if (!selected(snapshot->key)) continue;
      out.report.period_snapshots.push_back(*snapshot);
      if (!snapshot->conserved) {
        out.report.conserved = false;
        out.report.violations.push_back(snapshot->key.subject + "/" + snapshot->key.route + "@" +
                                        std::to_string(snapshot->key.generation) + " epochs " +
                                        std::to_string(snapshot->epoch_first) + ".." +
                                        std::to_string(snapshot->epoch_last) +
                                        ": the period's equation does not hold");
      }
    }
    if (out.report.period_snapshots.empty()) {
      out.found = false;
      const std::vector<PeriodSpan> spans = periods_.spans();
      out.message = "no closed accounting period covers epoch " + std::to_string(*query.epoch);
      if (!query.subject.empty() || !query.route.empty()) out.message += " for that subject/route";
      if (spans.empty()) {
        out.message += " (no period has been closed yet)";
      } else {
        uint64_t first = spans.front().epoch_first;
        uint64_t last = spans.front().epoch_last;
        for (const PeriodSpan& span : spans) {
          first = std::min(first, span.epoch_first);
          last = std::max(last, span.epoch_last);
        }
        out.message += " (kept: epochs " + std::to_string(first) + ".." + std::to_string(last) +
                       "; `tallyctl audit --periods` lists them)";
      }
    }
  }
  return out;
}

GatewayReply Ledger::enrollGateway(const std::string& gateway_name, const PublicKey& public_key,
                                   uint64_t now_ms) {
  if (operators_.holdsKey(public_key)) {
    return {.code = ReplyCode::kInvalidArgument,
            .message = "that key is an operator's: a gateway needs a key of its own"};
  }
  return shards_.enrollGateway(gateway_name, public_key, advance(now_ms));
}

OperatorReply Ledger::enrollOperator(const std::string& name, const PublicKey& public_key,
                                     OperatorRole role, uint64_t now_ms) {
  const bool is_gateway_key = shards_.gatewayWithKey(public_key) != nullptr;
  return operators_.enroll(name, public_key, role, is_gateway_key, advance(now_ms));
}

OperatorReply Ledger::setOperatorEnabled(const std::string& name, bool enabled, uint64_t now_ms) {
  advance(now_ms);
  return operators_.setEnabled(name, enabled);
}

uint64_t Ledger::appendAuditLog(AuditLogEntry entry, uint64_t now_ms) {
  entry.at_ms = advance(now_ms);
  return audit_log_.append(std::move(entry));
}

GatewayReply Ledger::setGatewayEnabled(const std::string& gateway_name, bool enabled,
                                       uint64_t now_ms) {
  advance(now_ms);
  return shards_.setGatewayEnabled(gateway_name, enabled);
}

GatewayReply Ledger::rotateGatewayKey(const std::string& gateway_name, const PublicKey& new_key,
                                      uint64_t overlap_ms, uint64_t now_ms) {
  return shards_.rotateGatewayKey(gateway_name, new_key, overlap_ms, advance(now_ms));
}

ShardReply Ledger::issueShard(const ShardIssueRequest& request, uint64_t now_ms) {
  return shards_.issue(request, advance(now_ms));
}

ShardReply Ledger::reportShard(const ShardReport& report, uint64_t now_ms) {
  return shards_.report(report, advance(now_ms));
}

ShardReply Ledger::revokeShards(const std::string& shard_id, const std::string& gateway_name,
                                uint64_t now_ms) {
  advance(now_ms);
  return shards_.revoke(shard_id, gateway_name);
}

ShardReply Ledger::writeOffShard(const std::string& shard_id, uint64_t now_ms) {
  return shards_.writeOff(shard_id, advance(now_ms));
}

namespace {

// What the live reservations hold, summed per account: an open-addressed table (linear probing,
// at most half full) keyed by views of the first reservation seen for each account, so the
// audit reads the reservations in place, copies no key and chases no node per reservation.
class HeldUnits {
 public:
  struct Entry {
    uint64_t hash = 0;
    const Reservation* key = nullptr;  // null: empty slot
    Units units = 0;
    bool taken = false;  // its account was seen
  };

  explicit HeldUnits(size_t accounts) {
    size_t capacity = 16;
    while (capacity < 2 * accounts) capacity *= 2;
    slots_.resize(capacity);
  }

  void add(const Reservation& reservation) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    const uint64_t hash =
        hashOf(reservation.subject, reservation.route, reservation.policy_generation);
    Entry& entry =
        slotFor(hash, reservation.subject, reservation.route, reservation.policy_generation);
    if (entry.key == nullptr) {
      entry = {.hash = hash, .key = &reservation, .units = 0, .taken = false};
      ++size_;
    }
    entry.units = saturatingAdd(entry.units, reservation.reserved_units);
  }

  // Removes and returns what reservations of this account hold (0 if none).
  Units take(const AccountKey& key) {
    Entry& entry = slotFor(hashOf(key.subject, key.route, key.generation), key.subject, key.route,
                           key.generation);
    if (entry.key == nullptr) return 0;
    const Units units = entry.units;
    entry.units = 0;
    entry.taken = true;
    return units;
  }

  // Accounts not taken, in key order.
  std::vector<std::pair<AccountKey, Units>> rest() const {
    std::vector<std::pair<AccountKey, Units>> out;
    for (const Entry& entry : slots_) {
      if (entry.key == nullptr || entry.taken) continue;
      out.push_back({AccountKey{entry.key->subject, entry.key->route, entry.key->policy_generation},
                     entry.units});
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static uint64_t hashOf(std::string_view subject, std::string_view route, Generation generation) {
    const uint64_t h = std::hash<std::string_view>{}(subject);
    const uint64_t r = std::hash<std::string_view>{}(route);
    return (h * 0x9e3779b97f4a7c15ULL) ^ (r + (h << 6) + (h >> 2)) ^
           (generation * 0xff51afd7ed558ccdULL);
  }

  Entry& slotFor(uint64_t hash, std::string_view subject, std::string_view route,
                 Generation generation) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      Entry& entry = slots_[i];
      if (entry.key == nullptr) return entry;
      if (entry.hash == hash && entry.key->policy_generation == generation &&
          entry.key->subject == subject && entry.key->route == route) {
        return entry;
      }
    }
  }

  void grow() {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(2 * old.size(), Entry{});
    const size_t mask = slots_.size() - 1;
    for (const Entry& entry : old) {
      if (entry.key == nullptr) continue;
      size_t i = entry.hash & mask;
      while (slots_[i].key != nullptr) i = (i + 1) & mask;
      slots_[i] = entry;
    }
  }

  std::vector<Entry> slots_;
  size_t size_ = 0;
};

}  // namespace

AuditReport Ledger::audit(uint64_t now_ms) const { return audit(now_ms, AccountFilter{}); }

AuditReport Ledger::audit(uint64_t now_ms, const AccountFilter& filter) const {
  AuditReport report;
  report.as_of_ms = std::max(now_ms, now_ms_);
  HeldUnits held(accounts_.accountCount());  // one pass over the live reservations
  reservations_.forEach([&](const Record& record) {
    if (holdsUnits(record.reservation.state)) held.add(record.reservation);
  });
  auto check = [&](const AccountKey& key, const Balances& balances, bool conserved,
                   std::vector<std::string>* violations) {
    const Units live = held.take(key);
    if (conserved && live == balances.reserved) return;
    const std::string name = key.subject + "/" + key.route + "@" + std::to_string(key.generation);
    if (!conserved) violations->push_back(name + ": conservation equation does not hold");
    if (live != balances.reserved) {
      violations->push_back(name + ": reserved " + std::to_string(balances.reserved) +
                            " but live reservations hold " + std::to_string(live));
    }
  };
  // The accounts the filter leaves out are checked all the same: the verdict is the ledger's.
  // One that reserves nothing and conserves is not looked up in `held` (a lookup per account
  // is most of a filtered audit's cost); live reservations of such an account are left over
  // in held.rest() and reported below under the same message.
  report.accounts = accounts_.view(
      report.as_of_ms, filter,
      [&](const AccountKey& key, const Balances& balances, bool conserved) {
        if (conserved && balances.reserved == 0) return;
        check(key, balances, conserved, &report.violations);
      },
      &report.more);
  std::sort(report.violations.begin(), report.violations.end());  // they came unordered
  for (const AccountView& view : report.accounts) {
    check(view.key, view.balances, view.conserved, &report.violations);
  }
  for (const auto& [key, units] : held.rest()) {
    const std::string name = key.subject + "/" + key.route + "@" + std::to_string(key.generation);
    if (accounts_.find(key) != nullptr) {  // an account the filter left out, reserving 0
      report.violations.push_back(name + ": reserved 0 but live reservations hold " +
                                  std::to_string(units));
    } else {
      report.violations.push_back(name + ": reservations hold " + std::to_string(units) +
                                  " units but there is no account");
    }
  }
  shards_.audit(&report);
  report.conserved = report.violations.empty();
  return report;
}

LedgerChanges Ledger::takeChanges() {
  LedgerChangedRows rows = takeChangedRows();
  LedgerChanges changes;
  changes.reservations_upserted.reserve(rows.reservations_upserted.size());
  for (const Reservation* reservation : rows.reservations_upserted) {
    changes.reservations_upserted.push_back(reservation->reservation_id);
  }
  changes.reservations_deleted = std::move(rows.reservations_deleted);
  changes.accounts.reserve(rows.accounts.size());
  for (const AccountEntry* entry : rows.accounts) changes.accounts.push_back(entry->key);
  changes.policies = rows.policies;
  for (const GatewayRecord* gateway : rows.shards.gateways) {
    changes.gateways.push_back(gateway->gateway_name);
  }
  for (const ShardRecord* shard : rows.shards.shards)
    changes.shards.push_back(shard->grant.shard_id);
  for (const FenceRecord& fence : rows.shards.fences) changes.fences.push_back(fence.key);
  changes.shards_deleted = rows.shards.deleted_shards;
  changes.shard_sequence = rows.shards.shard_sequence_changed;
  for (const PeriodSnapshot* snapshot : rows.period_snapshots) {
    changes.period_snapshots.push_back(
        {.key = snapshot->key, .epoch_first = snapshot->epoch_first});
  }
  changes.period_snapshots_deleted = std::move(rows.period_snapshots_deleted);
  for (const OperatorRecord* record : rows.operators) changes.operators.push_back(record->name);
  for (const AuditLogEntry* entry : rows.audit_log.appended) {
    changes.audit_log.push_back(entry->sequence);
  }
  changes.audit_log_kept_from = rows.audit_log.kept_from;
  return changes;
}

LedgerChangedRows Ledger::takeChangedRows() {
  LedgerChangedRows rows;
  rows.reservations_upserted.reserve(upserted_.size());
  for (Record* record : upserted_) {
    TALLY_ASSERT(record->change_pending);
    record->change_pending = false;
    rows.reservations_upserted.push_back(&record->reservation);
  }
  upserted_.clear();
  std::sort(rows.reservations_upserted.begin(), rows.reservations_upserted.end(),
            [](const Reservation* a, const Reservation* b) {
              return a->reservation_id < b->reservation_id;
            });
  rows.reservations_deleted = std::move(deleted_);
  deleted_.clear();
  rows.accounts = accounts_.takeChangedEntries();
  rows.policies = accounts_.takePoliciesChanged();
  rows.shards = shards_.takeChangedRows();
  for (const PeriodKey& key : periods_upserted_) {
    // Dropped again since (beyond the bound within one batch): only its deletion is written.
    if (const PeriodSnapshot* snapshot = periods_.find(key))
      rows.period_snapshots.push_back(snapshot);
  }
  periods_upserted_.clear();
  std::sort(rows.period_snapshots.begin(), rows.period_snapshots.end(),
            [](const PeriodSnapshot* a, const PeriodSnapshot* b) {
              return std::tie(a->key, a->epoch_first) < std::tie(b->key, b->epoch_first);
            });
  rows.period_snapshots_deleted = std::move(periods_deleted_);
  periods_deleted_.clear();
  std::sort(rows.period_snapshots_deleted.begin(), rows.period_snapshots_deleted.end());
  rows.operators = operators_.takeChanged();
  rows.audit_log = audit_log_.takeChanges();
  return rows;
}

}  // namespace tally
