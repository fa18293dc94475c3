#include "core/ledger.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/reservation_replies.h"
#include "core/retry_after.h"

namespace tally {
namespace {

using replies::answer;
using replies::checkIds;
using replies::invalidArgument;
using replies::notFound;
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

uint64_t Ledger::advance(uint64_t now_ms) {
  now_ms_ = std::max(now_ms_, now_ms);
  return now_ms_;
}

Ledger::Record* Ledger::lookup(const std::string& reservation_id) {
  return reservations_.find(reservation_id);
}

const Reservation* Ledger::findReservation(const std::string& reservation_id) const {
  const Record* record = reservations_.find(reservation_id);
  return record == nullptr ? nullptr : &record->reservation;
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

void Ledger::transition(Record* record, ReservationState to, uint64_t now_ms) {
  Reservation* reservation = &record->reservation;
  TALLY_ASSERT(canTransition(reservation->state, to));
  reservation->state = to;
  if (isTerminal(to) && reservation->closed_at_ms == 0) {
    reservation->closed_at_ms = now_ms;
    pushDeadline(&retention_queue_, saturatingAdd(now_ms, options_.retention_ms), *record);
  }
  touched(record);
}

void Ledger::pushDeadline(DeadlineQueue* queue, uint64_t at_ms, const Record& record) {
  queue->push({.at_ms = at_ms,
               .handle = ReservationTable::handleOf(record),
               .reservation_id = record.reservation.reservation_id});
}

Ledger::Record* Ledger::popDue(DeadlineQueue* queue) {
  const Deadline& top = queue->top();
  Record* record = reservations_.resolve(top.handle);
  // Compacted since it was queued: the id may name a later reservation by now; look it up.
  if (record == nullptr) record = lookup(top.reservation_id);
  queue->pop();
  return record;
}

Status Ledger::restoreReservation(const Reservation& reservation) {
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
  if (reservations_.find(reservation.reservation_id, hash) != nullptr) {
    return Status::corruption("reservation '" + reservation.reservation_id + "' stored twice");
  }
  (void)reservations_.insert(reservation, hash);
  now_ms_ = std::max(
      {now_ms_, reservation.created_at_ms, reservation.started_at_ms, reservation.closed_at_ms});
  return Status::ok();
}

void Ledger::enqueueDeadlines(const Record& record) {
  const Reservation& reservation = record.reservation;
  switch (reservation.state) {
    case ReservationState::kReserved:
    case ReservationState::kExpiring:  // a crash between the halves: the tick finishes it
      pushDeadline(&expiry_queue_, reservation.expires_at_ms, record);
      break;
    case ReservationState::kUsageUnknown: {
      const AccountEntry* entry =
          accounts_.find(reservation.subject, reservation.route, reservation.policy_generation);
      TALLY_ASSERT(entry != nullptr);
      pushDeadline(&hard_limit_queue_,
                   saturatingAdd(reservation.started_at_ms, entry->budget.hard_execution_limit_ms),
                   record);
      break;
    }
    default:
      if (isTerminal(reservation.state)) {
        pushDeadline(&retention_queue_,
                     saturatingAdd(reservation.closed_at_ms, options_.retention_ms), record);
      }
      break;
  }
}

Status Ledger::finishRestore(uint64_t now_ms) {
  Status orphan = Status::ok();
  reservations_.forEach([&](const Record& record) {
    const Reservation& reservation = record.reservation;
    if (orphan.isOk() && holdsUnits(reservation.state) &&
        accounts_.find(reservation.subject, reservation.route, reservation.policy_generation) ==
            nullptr) {
      orphan = Status::corruption("reservation '" + reservation.reservation_id +
                                  "' holds units of a missing account");
    }
  });
  if (!orphan.isOk()) return orphan;
  reservations_.forEach([&](const Record& record) { enqueueDeadlines(record); });
  if (Status status = shards_.finishRestore(); !status.isOk()) return status;
  advance(now_ms);
  const AuditReport report = audit(now_ms_);
  if (!report.conserved) {
    return Status::corruption("restored ledger fails its audit: " + report.violations.front());
  }
  (void)takeChangedRows();  // restored state is already durable
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

ReservationReply Ledger::reject(const ReserveRequest& request, uint64_t id_hash,
                                Generation generation, LimitingDimension dimension,
                                int64_t retry_after_ms, uint64_t now_ms) {
  // Stamp the epoch of the budget that refused it, or the hourly period when none matched.
  EpochPeriod period = EpochPeriod::kHour;
  if (const Policy* policy = accounts_.policy(generation)) {
    if (const Budget* budget = matchBudget(*policy, request.subject, request.route)) {
      period = budget->accounting_epoch;
    }
  }
  Record* rejected = reservations_.insert(
      Reservation{
          .reservation_id = request.reservation_id,
          .request_digest = request.request_digest,
          .subject = request.subject,
          .route = request.route,
          .policy_generation = generation,
          .accounting_epoch_ms = accountingEpochStartMs(now_ms, period),
          .reserved_units = request.units,
          .created_at_ms = now_ms,
          .limiting_dimension = dimension,
          .retry_after_ms = retry_after_ms,
      },
      id_hash);
  transition(rejected, ReservationState::kRejected, now_ms);
  return answer(ReplyCode::kRejected, rejected->reservation);
}

ReservationReply Ledger::reserve(const ReserveRequest& request, uint64_t now_ms) {
  now_ms = advance(now_ms);
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (request.units == 0) return invalidArgument("units must be positive");
  if (request.subject.empty() || request.subject.size() > limits::kSubjectBytesMax) {
    return invalidArgument("subject must be 1.." + std::to_string(limits::kSubjectBytesMax) +
                           " bytes");
  }
  if (request.route.empty() || request.route.size() > limits::kRouteBytesMax) {
    return invalidArgument("route must be 1.." + std::to_string(limits::kRouteBytesMax) + " bytes");
  }
  // One hash for the duplicate check and the insert.
  const uint64_t id_hash = ReservationTable::hashOf(request.reservation_id);
  if (const Record* found = reservations_.find(request.reservation_id, id_hash)) {
    const Reservation& existing = found->reservation;
    if (existing.request_digest != request.request_digest) {
      return answer(ReplyCode::kIdempotencyConflict, existing);
    }
    const ReplyCode code =
        existing.state == ReservationState::kRejected ? ReplyCode::kRejected : ReplyCode::kOk;
    return answer(code, existing, /*duplicate=*/true);
  }
  if (reservations_.size() >= options_.reservations_max) {
    return {.code = ReplyCode::kResourceExhausted, .message = "reservation table is full"};
  }

  bool table_full = false;
  Admission admission = accounts_.admit(request.subject, request.route, request.policy_generation,
                                        now_ms, &table_full);
  if (table_full)
    return {.code = ReplyCode::kResourceExhausted, .message = "account table is full"};
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
    return reject(request, id_hash, admission.generation, admission.refused, retry_after_ms,
                  now_ms);
  }

  AccountEntry& entry = *admission.entry;
  const Budget& budget = entry.budget;
  const AccountCode code = entry.account.reserve(request.units, budget.max_single_reservation);
  switch (code) {
    case AccountCode::kOk: accounts_.markChanged(&entry); break;
    case AccountCode::kAboveMaxSingle:
      return reject(request, id_hash, admission.generation,
                    LimitingDimension::kMaxSingleReservation, kRetryNever, now_ms);
    case AccountCode::kInsufficientAvailable: {
      const int64_t retry_after_ms = retryAfterMs({.units = request.units,
                                                   .available = entry.account.balances().available,
                                                   .debt = 0,
                                                   .refill_per_second = budget.refill_per_second,
                                                   .burst = budget.burst});
      return reject(request, id_hash, admission.generation, LimitingDimension::kCapacity,
                    retry_after_ms, now_ms);
    }
    case AccountCode::kOverflow:
      return {.code = ReplyCode::kArithmeticOverflow, .message = "reserved units overflow"};
    default: TALLY_UNREACHABLE();
  }
  // Point of no return: capacity is reduced; the receipt and the balance persist together.
  Record* record = reservations_.insert(
      Reservation{
          .reservation_id = request.reservation_id,
          .request_digest = request.request_digest,
          .subject = request.subject,
          .route = request.route,
          .policy_generation = admission.generation,
          .accounting_epoch_ms = accountingEpochStartMs(now_ms, budget.accounting_epoch),
          .reserved_units = request.units,
          .created_at_ms = now_ms,
          .expires_at_ms = saturatingAdd(now_ms, budget.hold_ttl_ms),
      },
      id_hash);
  transition(record, ReservationState::kReserved, now_ms);
  const Reservation& reservation = record->reservation;
  pushDeadline(&expiry_queue_, reservation.expires_at_ms, *record);
  return answer(ReplyCode::kOk, reservation);
}

ReservationReply Ledger::start(const StartRequest& request, uint64_t now_ms) {
  now_ms = advance(now_ms);
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Record* record = lookup(request.reservation_id);
  if (record == nullptr) return notFound(request.reservation_id);
  Reservation* reservation = &record->reservation;
  switch (reservation->state) {
    case ReservationState::kReserved:
      if (now_ms >= reservation->expires_at_ms) {
        // The hold ran out before the start arrived: the expiry wins the CAS.
        beginExpiry(record, now_ms);
        completeExpiry(record, now_ms);
        return answer(ReplyCode::kExpired, *reservation, false, reservation->refunded_units);
      }
      reservation->operation_id = request.operation_id;
      reservation->started_at_ms = now_ms;
      transition(record, ReservationState::kStarted, now_ms);
      return answer(ReplyCode::kOk, *reservation);
    default: return replies::startOfUnreserved(*reservation, request.operation_id);
  }
}

void Ledger::returnUnits(Record* record, ReservationState to, uint64_t now_ms) {
  Reservation* reservation = &record->reservation;
  AccountEntry* entry = accountOf(*reservation);
  const AccountCode code = entry->account.release(reservation->reserved_units);
  TALLY_ASSERT(code == AccountCode::kOk);  // `reserved` covers every live reservation
  reservation->refunded_units = reservation->reserved_units;
  transition(record, to, now_ms);
  accounts_.rebalance(reservation->subject, reservation->route, now_ms);
}

ReservationReply Ledger::release(const ReleaseRequest& request, uint64_t now_ms) {
  now_ms = advance(now_ms);
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Record* record = lookup(request.reservation_id);
  if (record == nullptr) return notFound(request.reservation_id);
  Reservation* reservation = &record->reservation;
  switch (reservation->state) {
    case ReservationState::kReserved:
      returnUnits(record, ReservationState::kReleased, now_ms);
      return answer(ReplyCode::kOk, *reservation, false, reservation->refunded_units);
    case ReservationState::kReleased:
      if (faults_.double_refund_release) {
        // Deliberately wrong: returns the units a second time (when `reserved` still has them,
        // which leaves `reserved` short of what live reservations hold).
        (void)accountOf(*reservation)->account.release(reservation->reserved_units);
        return answer(ReplyCode::kOk, *reservation, true, reservation->reserved_units);
      }
      return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
    case ReservationState::kExpiring:
    case ReservationState::kExpired: return answer(ReplyCode::kExpired, *reservation);
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
}

ReservationReply Ledger::markUnknown(const MarkUnknownRequest& request, uint64_t now_ms) {
  now_ms = advance(now_ms);
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Record* record = lookup(request.reservation_id);
  if (record == nullptr) return notFound(request.reservation_id);
  Reservation* reservation = &record->reservation;
  switch (reservation->state) {
    case ReservationState::kStarted: {
      if (reservation->operation_id != request.operation_id) {
        return answer(ReplyCode::kOperationConflict, *reservation);
      }
      transition(record, ReservationState::kUsageUnknown, now_ms);
      const AccountEntry* entry =
          accounts_.find(reservation->subject, reservation->route, reservation->policy_generation);
      TALLY_ASSERT(entry != nullptr);
      pushDeadline(&hard_limit_queue_,
                   saturatingAdd(reservation->started_at_ms, entry->budget.hard_execution_limit_ms),
                   *record);
      if (faults_.refund_usage_unknown) {
        // Deliberately wrong: "a timeout is a refund".
        AccountEntry* broken = accountOf(*reservation);
        (void)broken->account.release(reservation->reserved_units);
        return answer(ReplyCode::kOk, *reservation, false, reservation->reserved_units);
      }
      return answer(ReplyCode::kOk, *reservation);
    }
    case ReservationState::kUsageUnknown:
    case ReservationState::kSettled:
    case ReservationState::kSettledWithDebt:
      if (reservation->operation_id != request.operation_id) {
        return answer(ReplyCode::kOperationConflict, *reservation);
      }
      return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
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
  now_ms = advance(now_ms);
  if (std::string error = checkIds(reservation_id, &operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Record* record = lookup(reservation_id);
  if (record == nullptr) return notFound(reservation_id);
  const Reservation& reservation = record->reservation;
  const bool started = reservation.state == ReservationState::kStarted ||
                       reservation.state == ReservationState::kUsageUnknown;
  const bool settled = reservation.state == ReservationState::kSettled ||
                       reservation.state == ReservationState::kSettledWithDebt;
  if (!started && !settled) return answer(ReplyCode::kInvalidState, reservation);
  if (reservation.operation_id != operation_id) {
    return answer(ReplyCode::kOperationConflict, reservation);
  }
  if (started) return closeWithReceipt(record, actual_units, now_ms);
  if (reservation.closed_by_hard_limit && !reservation.late_receipt_applied) {
    return lateReceipt(record, actual_units, now_ms);
  }
  return answer(ReplyCode::kOk, reservation, /*duplicate=*/true);
}

ReservationReply Ledger::closeWithReceipt(Record* record, Units actual_units, uint64_t now_ms) {
  Reservation* reservation = &record->reservation;
  AccountEntry* entry = accountOf(*reservation);
  const SettleOutcome outcome =
      entry->account.settle(reservation->reserved_units, actual_units, entry->budget.max_overdraft);
  if (outcome.code == AccountCode::kOverflow) {
    return {.code = ReplyCode::kArithmeticOverflow,
            .receipt = *reservation,
            .message = "settled units overflow"};
  }
  TALLY_ASSERT(outcome.code == AccountCode::kOk);
  reservation->actual_units = actual_units;
  reservation->refunded_units = outcome.refunded;
  reservation->debt_units = outcome.debt_issued;
  reservation->overdraft_breach = outcome.overdraft_breach;
  // SPEC §4: any settle above the reservation is SETTLED_WITH_DEBT, whether `available`
  // covered the excess or overdraft did (debt_units says how much became debt).
  transition(record,
             actual_units > reservation->reserved_units ? ReservationState::kSettledWithDebt
                                                        : ReservationState::kSettled,
             now_ms);
  accounts_.rebalance(reservation->subject, reservation->route, now_ms);
  return answer(ReplyCode::kOk, *reservation, false, outcome.refunded);
}

ReservationReply Ledger::lateReceipt(Record* record, Units actual_units, uint64_t now_ms) {
  // Closed as fully consumed at the hard limit: a smaller actual refunds nothing (the units
  // were treated as spent), a larger one is charged like a settle above the reservation.
  Reservation* reservation = &record->reservation;
  reservation->late_receipt_applied = true;
  if (actual_units > reservation->reserved_units) {
    AccountEntry* entry = accountOf(*reservation);
    const SettleOutcome outcome = entry->account.chargeExtra(
        actual_units - reservation->reserved_units, entry->budget.max_overdraft);
    if (outcome.code == AccountCode::kOverflow) {
      reservation->late_receipt_applied = false;
      return {.code = ReplyCode::kArithmeticOverflow,
              .receipt = *reservation,
              .message = "settled units overflow"};
    }
    reservation->actual_units = actual_units;
    reservation->debt_units = outcome.debt_issued;
    reservation->overdraft_breach = outcome.overdraft_breach;
    transition(record, ReservationState::kSettledWithDebt, now_ms);
  }
  touched(record);
  return answer(ReplyCode::kOk, *reservation);
}

ReservationReply Ledger::query(const QueryRequest& request) const {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  const Reservation* reservation = findReservation(request.reservation_id);
  if (reservation == nullptr) return notFound(request.reservation_id);
  return answer(ReplyCode::kOk, *reservation);
}

bool Ledger::beginExpiry(const std::string& reservation_id, uint64_t now_ms) {
  now_ms = advance(now_ms);
  Record* record = lookup(reservation_id);
  return record != nullptr && beginExpiry(record, now_ms);
}

bool Ledger::beginExpiry(Record* record, uint64_t now_ms) {
  const Reservation& reservation = record->reservation;
  if (reservation.state != ReservationState::kReserved || now_ms < reservation.expires_at_ms) {
    return false;
  }
  transition(record, ReservationState::kExpiring, now_ms);
  return true;
}

bool Ledger::completeExpiry(const std::string& reservation_id, uint64_t now_ms) {
  now_ms = advance(now_ms);
  Record* record = lookup(reservation_id);
  return record != nullptr && completeExpiry(record, now_ms);
}

bool Ledger::completeExpiry(Record* record, uint64_t now_ms) {
  if (record->reservation.state != ReservationState::kExpiring) return false;
  returnUnits(record, ReservationState::kExpired, now_ms);
  return true;
}

bool Ledger::closeByHardLimit(Record* record, uint64_t now_ms) {
  Reservation* reservation = &record->reservation;
  const AccountEntry* owner =
      accounts_.find(reservation->subject, reservation->route, reservation->policy_generation);
  TALLY_ASSERT(owner != nullptr);
  if (now_ms < saturatingAdd(reservation->started_at_ms, owner->budget.hard_execution_limit_ms)) {
    return false;
  }
  AccountEntry* entry = accountOf(*reservation);
  const SettleOutcome outcome = entry->account.settle(
      reservation->reserved_units, reservation->reserved_units, entry->budget.max_overdraft);
  TALLY_ASSERT(outcome.code == AccountCode::kOk && outcome.refunded == 0);
  reservation->actual_units = reservation->reserved_units;
  reservation->closed_by_hard_limit = true;
  transition(record, ReservationState::kSettled, now_ms);
  return true;
}

TickOutcome Ledger::tick(uint64_t now_ms, uint64_t items_max) {
  now_ms = advance(now_ms);
  TickOutcome outcome;
  // Queues hold stale entries (a reservation started, released or re-queued); each pop checks
  // the reservation's current state before acting.
  while (!expiry_queue_.empty() && expiry_queue_.top().at_ms <= now_ms &&
         outcome.expired < items_max) {
    Record* record = popDue(&expiry_queue_);
    const bool claimed =
        record != nullptr &&
        (record->reservation.state == ReservationState::kExpiring || beginExpiry(record, now_ms));
    if (claimed && completeExpiry(record, now_ms)) ++outcome.expired;
  }
  while (!hard_limit_queue_.empty() && hard_limit_queue_.top().at_ms <= now_ms &&
         outcome.closed_by_hard_limit < items_max) {
    Record* record = popDue(&hard_limit_queue_);
    if (record != nullptr && record->reservation.state == ReservationState::kUsageUnknown &&
        closeByHardLimit(record, now_ms)) {
      ++outcome.closed_by_hard_limit;
    }
  }
  while (!retention_queue_.empty() && retention_queue_.top().at_ms <= now_ms &&
         outcome.compacted < items_max) {
    Record* record = popDue(&retention_queue_);
    if (record == nullptr || !isTerminal(record->reservation.state)) continue;
    if (record->change_pending) std::erase(upserted_, record);  // deleted supersedes upserted
    deleted_.push_back(record->reservation.reservation_id);
    const bool erased = reservations_.erase(deleted_.back());
    TALLY_ASSERT(erased);
    ++outcome.compacted;
  }
  const ShardRegistry::TickOutcome shards = shards_.tick(now_ms, items_max);
  outcome.shards_reminted = shards.reminted;
  outcome.shards_compacted = shards.compacted;
  return outcome;
}

GatewayReply Ledger::enrollGateway(const std::string& gateway_name, const PublicKey& public_key,
                                   uint64_t now_ms) {
  return shards_.enrollGateway(gateway_name, public_key, advance(now_ms));
}

GatewayReply Ledger::setGatewayEnabled(const std::string& gateway_name, bool enabled,
                                       uint64_t now_ms) {
  advance(now_ms);
  return shards_.setGatewayEnabled(gateway_name, enabled);
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

AuditReport Ledger::audit(uint64_t now_ms) const {
  AuditReport report;
  report.as_of_ms = std::max(now_ms, now_ms_);
  report.accounts = accounts_.view(report.as_of_ms);
  std::map<AccountKey, Units> held;
  reservations_.forEach([&](const Record& record) {
    const Reservation& reservation = record.reservation;
    if (!holdsUnits(reservation.state)) return;
    Units& sum =
        held[AccountKey{reservation.subject, reservation.route, reservation.policy_generation}];
    sum = saturatingAdd(sum, reservation.reserved_units);
  });
  for (const AccountView& view : report.accounts) {
    const std::string name =
        view.key.subject + "/" + view.key.route + "@" + std::to_string(view.key.generation);
    if (!view.conserved) {
      report.violations.push_back(name + ": conservation equation does not hold");
    }
    auto it = held.find(view.key);
    const Units live = it == held.end() ? 0 : it->second;
    if (live != view.balances.reserved) {
      report.violations.push_back(name + ": reserved " + std::to_string(view.balances.reserved) +
                                  " but live reservations hold " + std::to_string(live));
    }
    if (it != held.end()) held.erase(it);
  }
  for (const auto& [key, units] : held) {
    report.violations.push_back(key.subject + "/" + key.route + "@" +
                                std::to_string(key.generation) + ": reservations hold " +
                                std::to_string(units) + " units but there is no account");
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
  return rows;
}

}  // namespace tally
