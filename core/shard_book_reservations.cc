// The local reservations of ShardBook (core/shard_book.h): the ledger's state machine and
// idempotency over the units of a shard. The shards themselves, boot and reports are in
// shard_book.cc.
#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/reservation_replies.h"
#include "core/shard_book.h"

namespace tally {
namespace {

using replies::answer;
using replies::checkIds;
using replies::invalidArgument;
using replies::validId;

ReservationReply notFound(const std::string& reservation_id) {
  return replies::notFound(reservation_id, "shard reservation");
}

}  // namespace

// --- local reservations ----------------------------------------------------------------------

void ShardBook::transition(Reservation* reservation, ReservationState to, uint64_t now_ms) {
  TALLY_ASSERT(canTransition(reservation->state, to));
  Shard& shard = shardOf(*reservation);
  const bool held_before = holdsUnits(reservation->state);
  if (reservation->state == ReservationState::kReserved) {
    expiry_.erase({reservation->expires_at_ms, reservation->reservation_id});
  }
  reservation->state = to;
  if (isTerminal(to) && reservation->closed_at_ms == 0) reservation->closed_at_ms = now_ms;
  if (to == ReservationState::kReserved) {
    expiry_.emplace(reservation->expires_at_ms, reservation->reservation_id);
  }
  if (held_before && !holdsUnits(to)) {
    TALLY_ASSERT(shard.held_units >= reservation->reserved_units);
    shard.held_units -= reservation->reserved_units;
    // A report the ledger holds shows this receipt holding: it must hear the outcome.
    if (shard.account.closed() && !shard.record.quarantined &&
        !(shard.record.ledger_known && isFinalShardState(shard.record.ledger_state))) {
      shard.record.report_pending = true;
    }
    touchShard(reservation->origin);
  }
  touchReservation(reservation->reservation_id);
}

ShardBook::Shard* ShardBook::pickShard(const ReserveRequest& request, uint64_t now_ms) {
  // The usable shard with enough units that expires first: it is the one most likely to be
  // wasted otherwise.
  Shard* best = nullptr;
  for (const std::string& id : openShardsOf({request.subject, request.route})) {
    Shard& shard = *lookupShard(id);
    const ShardGrant& grant = shard.record.grant;
    const bool usable = faults_.admit_from_unusable
                            ? !shard.account.closed() && !shard.record.quarantined
                            : isUsable(shard, now_ms);
    if (!usable) continue;
    if (shard.account.balances().local_available < request.units) continue;
    if (shard.reservation_ids.size() >= options_.reservations_per_shard_max) continue;
    if (request.policy_generation != 0 && request.policy_generation != grant.policy_generation) {
      continue;
    }
    if (best == nullptr || grant.expires_at_ms < best->record.grant.expires_at_ms) best = &shard;
  }
  return best;
}

std::optional<ReservationReply> ShardBook::reserve(const ReserveRequest& request, uint64_t now_ms) {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  if (const Reservation* existing = findReservation(request.reservation_id)) {
    if (existing->request_digest != request.request_digest) {
      return answer(ReplyCode::kIdempotencyConflict, *existing);
    }
    return answer(ReplyCode::kOk, *existing, /*duplicate=*/true);
  }
  if (request.units == 0) return invalidArgument("units must be positive");
  if (reservations_.size() >= options_.reservations_max) return std::nullopt;
  Shard* shard = pickShard(request, now_ms);
  if (shard == nullptr) return std::nullopt;
  const ShardCode code = shard->account.reserve(request.units);
  TALLY_ASSERT(code == ShardCode::kOk);  // pickShard checked available and open
  // Point of no return: the shard's units are reserved; the receipt and balances persist
  // together (takeChanges names both).
  const ShardGrant& grant = shard->record.grant;
  Reservation reservation{
      .reservation_id = request.reservation_id,
      .request_digest = request.request_digest,
      .subject = request.subject,
      .route = request.route,
      .policy_generation = grant.policy_generation,
      .accounting_epoch_ms = grant.accounting_epoch_ms,
      .reserved_units = request.units,
      .created_at_ms = now_ms,
      .expires_at_ms = std::min(saturatingAdd(now_ms, options_.hold_ttl_ms), grant.expires_at_ms),
      .origin = grant.shard_id,
  };
  shard->record.used = true;
  shard->held_units += request.units;
  shard->reservation_ids.insert(request.reservation_id);
  touchShard(grant.shard_id);
  auto [it, inserted] = reservations_.emplace(request.reservation_id, std::move(reservation));
  TALLY_ASSERT(inserted);
  transition(&it->second, ReservationState::kReserved, now_ms);
  checkShard(*shard);
  return answer(ReplyCode::kOk, it->second);
}

void ShardBook::returnUnits(Reservation* reservation, ReservationState to, uint64_t now_ms) {
  Shard& shard = shardOf(*reservation);
  const ShardCode code = shard.account.release(reservation->reserved_units);
  TALLY_ASSERT(code == ShardCode::kOk);  // localReserved covers every holding reservation
  reservation->refunded_units = reservation->reserved_units;
  transition(reservation, to, now_ms);
  checkShard(shard);
}

ReservationReply ShardBook::start(const StartRequest& request, uint64_t now_ms) {
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Reservation* reservation = lookup(request.reservation_id);
  if (reservation == nullptr) return notFound(request.reservation_id);
  switch (reservation->state) {
    case ReservationState::kReserved:
      if (now_ms >= reservation->expires_at_ms) {
        // The hold ran out before the start arrived: the expiry wins the CAS.
        transition(reservation, ReservationState::kExpiring, now_ms);
        returnUnits(reservation, ReservationState::kExpired, now_ms);
        return answer(ReplyCode::kExpired, *reservation, false, reservation->refunded_units);
      }
      reservation->operation_id = request.operation_id;
      reservation->started_at_ms = now_ms;
      transition(reservation, ReservationState::kStarted, now_ms);
      return answer(ReplyCode::kOk, *reservation);
    default: return replies::startOfUnreserved(*reservation, request.operation_id);
  }
}

ReservationReply ShardBook::release(const ReleaseRequest& request, uint64_t now_ms) {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Reservation* reservation = lookup(request.reservation_id);
  if (reservation == nullptr) return notFound(request.reservation_id);
  switch (reservation->state) {
    case ReservationState::kReserved:
      returnUnits(reservation, ReservationState::kReleased, now_ms);
      return answer(ReplyCode::kOk, *reservation, false, reservation->refunded_units);
    case ReservationState::kReleased:
      // Deliberately wrong under the fault: claims a second refund.
      return answer(ReplyCode::kOk, *reservation, true,
                    faults_.refund_duplicate_release ? reservation->reserved_units : 0);
    case ReservationState::kExpiring:
    case ReservationState::kExpired: return answer(ReplyCode::kExpired, *reservation);
    default: return answer(ReplyCode::kInvalidState, *reservation);
  }
}

ReservationReply ShardBook::markUnknown(const MarkUnknownRequest& request, uint64_t now_ms) {
  if (std::string error = checkIds(request.reservation_id, &request.operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Reservation* reservation = lookup(request.reservation_id);
  if (reservation == nullptr) return notFound(request.reservation_id);
  switch (reservation->state) {
    case ReservationState::kStarted:
      if (reservation->operation_id != request.operation_id) {
        return answer(ReplyCode::kOperationConflict, *reservation);
      }
      // A timeout is not a refund: the units stay in localReserved until a receipt arrives.
      transition(reservation, ReservationState::kUsageUnknown, now_ms);
      checkShard(shardOf(*reservation));
      return answer(ReplyCode::kOk, *reservation);
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

ReservationReply ShardBook::settle(const SettleRequest& request, uint64_t now_ms) {
  return applyReceipt(request.reservation_id, request.operation_id, request.actual_units, now_ms);
}

ReservationReply ShardBook::reportOperation(const ReportOperationRequest& request,
                                            uint64_t now_ms) {
  return applyReceipt(request.reservation_id, request.operation_id, request.actual_units, now_ms);
}

ReservationReply ShardBook::applyReceipt(const std::string& reservation_id,
                                         const std::string& operation_id, Units actual_units,
                                         uint64_t now_ms) {
  if (std::string error = checkIds(reservation_id, &operation_id); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  Reservation* reservation = lookup(reservation_id);
  if (reservation == nullptr) return notFound(reservation_id);
  const bool started = reservation->state == ReservationState::kStarted ||
                       reservation->state == ReservationState::kUsageUnknown;
  const bool settled = reservation->state == ReservationState::kSettled ||
                       reservation->state == ReservationState::kSettledWithDebt;
  if (!started && !settled) return answer(ReplyCode::kInvalidState, *reservation);
  if (reservation->operation_id != operation_id) {
    return answer(ReplyCode::kOperationConflict, *reservation);
  }
  if (settled) return answer(ReplyCode::kOk, *reservation, /*duplicate=*/true);
  Shard& shard = shardOf(*reservation);
  const ShardSettleOutcome outcome =
      shard.account.settle(reservation->reserved_units, actual_units);
  if (outcome.code == ShardCode::kOverflow) {
    return {.code = ReplyCode::kArithmeticOverflow,
            .receipt = *reservation,
            .message = "overspent units overflow"};
  }
  TALLY_ASSERT(outcome.code == ShardCode::kOk);
  reservation->actual_units = actual_units;
  reservation->refunded_units = outcome.refunded;
  reservation->debt_units = outcome.overspent;
  transition(reservation,
             actual_units > reservation->reserved_units ? ReservationState::kSettledWithDebt
                                                        : ReservationState::kSettled,
             now_ms);
  checkShard(shard);
  return answer(ReplyCode::kOk, *reservation, false, outcome.refunded);
}

ReservationReply ShardBook::query(const QueryRequest& request) const {
  if (std::string error = checkIds(request.reservation_id, nullptr); !error.empty()) {
    return invalidArgument(std::move(error));
  }
  const Reservation* reservation = findReservation(request.reservation_id);
  if (reservation == nullptr) return notFound(request.reservation_id);
  return answer(ReplyCode::kOk, *reservation);
}

}  // namespace tally
