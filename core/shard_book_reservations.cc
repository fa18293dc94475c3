// The local reservations of ShardBook (core/shard_book.h): the one reservation lifecycle
// (core/reservation_lifecycle.h) over the units of a shard. The shards themselves, boot and
// reports are in shard_book.cc.
#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/reservation_lifecycle.h"
#include "core/shard_book.h"

namespace tally {
namespace {

constexpr const char* kWhat = "shard reservation";

}  // namespace

class ShardBook::ShardHolder final : public CapacityHolder {
 public:
  ShardHolder(ShardBook* book, Shard* shard) : book_(book), shard_(shard) {}

  void returnUnits(const Reservation& reservation, uint64_t /*now_ms*/) override {
    const ShardCode code = shard_->account.release(reservation.reserved_units);
    TALLY_ASSERT(code == ShardCode::kOk);  // localReserved covers every holding reservation
  }

  HolderSettle settle(const Reservation& reservation, Units actual_units,
                      uint64_t /*now_ms*/) override {
    const ShardSettleOutcome outcome =
        shard_->account.settle(reservation.reserved_units, actual_units);
    if (outcome.code == ShardCode::kOverflow) return {.code = HolderCode::kOverflow};
    TALLY_ASSERT(outcome.code == ShardCode::kOk);
    return {.refunded_units = outcome.refunded, .debt_units = outcome.overspent};
  }

  // A shard has no hard execution limit and so no late receipts: the lifecycle never asks.
  HolderSettle consumeAll(const Reservation& reservation, uint64_t now_ms) override {
    return settle(reservation, reservation.reserved_units, now_ms);
  }
  HolderSettle chargeExtra(const Reservation& /*reservation*/, Units /*extra_units*/,
                           uint64_t /*now_ms*/) override {
    TALLY_UNREACHABLE();
  }

  void changed(const Reservation& reservation, ReservationState from,
               uint64_t /*now_ms*/) override {
    const std::string& id = reservation.reservation_id;
    const ReservationState to = reservation.state;
    if (from == ReservationState::kReserved && to != from) {
      book_->expiry_.erase({reservation.expires_at_ms, id});
    }
    if (to == ReservationState::kReserved && to != from) {
      book_->expiry_.emplace(reservation.expires_at_ms, id);
    }
    if (holdsUnits(from) && !holdsUnits(to)) {
      TALLY_ASSERT(shard_->held_units >= reservation.reserved_units);
      shard_->held_units -= reservation.reserved_units;
      // A report the ledger holds shows this receipt holding: it must hear the outcome.
      HeldShardRecord& record = shard_->record;
      if (shard_->account.closed() && !record.quarantined && !isFinalShard(record)) {
        record.report_pending = true;
      }
      book_->touchShard(reservation.origin);
    }
    book_->touchReservation(id);
    book_->checkShard(*shard_);
  }

 private:
  ShardBook* book_;
  Shard* shard_;  // null only for a request about an unknown id (never called then)
};

#ifdef TALLY_TEST_FAULTS
void ShardBook::setFaultsForTesting(ShardBookFaults faults) { faults_ = faults; }
#endif

ShardBook::Shard* ShardBook::pickShard(const ReserveRequest& request, uint64_t now_ms) {
  // The usable shard with enough units that expires first: it is the one most likely to be
  // wasted otherwise.
  Shard* best = nullptr;
  for (const std::string& id : openShardsOf({request.subject, request.route})) {
    Shard& shard = *lookupShard(id);
    const ShardGrant& grant = shard.record.grant;
    bool usable = isUsable(shard, now_ms);
#ifdef TALLY_TEST_FAULTS
    if (faults_.admit_from_unusable) usable = !shard.account.closed() && !shard.record.quarantined;
#endif
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
  if (std::optional<ReservationReply> invalid = lifecycle::checkReserve(request)) return invalid;
  if (const Reservation* existing = findReservation(request.reservation_id)) {
    return lifecycle::repeatedReserve(*existing, request);
  }
  if (reservations_.size() >= options_.reservations_max) return std::nullopt;
  Shard* shard = pickShard(request, now_ms);
  if (shard == nullptr) return std::nullopt;
  const ShardCode code = shard->account.reserve(request.units);
  TALLY_ASSERT(code == ShardCode::kOk);  // pickShard checked available and open
  // Point of no return: the shard's units are reserved; the receipt and balances persist
  // together (takeChanges names both).
  const ShardGrant& grant = shard->record.grant;
  Reservation fresh = lifecycle::newRecord(request, now_ms);
  fresh.policy_generation = grant.policy_generation;
  fresh.accounting_epoch_ms = grant.accounting_epoch_ms;
  fresh.expires_at_ms = std::min(saturatingAdd(now_ms, options_.hold_ttl_ms), grant.expires_at_ms);
  fresh.origin = grant.shard_id;
  shard->record.used = true;
  shard->held_units += request.units;
  shard->reservation_ids.insert(request.reservation_id);
  touchShard(grant.shard_id);
  auto [it, inserted] = reservations_.emplace(request.reservation_id, std::move(fresh));
  TALLY_ASSERT(inserted);
  ShardHolder holder(this, shard);
  return lifecycle::admitted(&it->second, &holder, now_ms);
}

ReservationReply ShardBook::start(const StartRequest& request, uint64_t now_ms) {
  Reservation* reservation = lookup(request.reservation_id);
  ShardHolder holder(this, reservation == nullptr ? nullptr : &shardOf(*reservation));
  return lifecycle::start(reservation, request, &holder, now_ms, kWhat);
}

ReservationReply ShardBook::release(const ReleaseRequest& request, uint64_t now_ms) {
  Reservation* reservation = lookup(request.reservation_id);
  ShardHolder holder(this, reservation == nullptr ? nullptr : &shardOf(*reservation));
  ReservationReply reply = lifecycle::release(reservation, request, &holder, now_ms, kWhat);
#ifdef TALLY_TEST_FAULTS
  if (faults_.refund_duplicate_release && reply.duplicate) {
    reply.refunded_units = reservation->reserved_units;  // deliberately wrong: a second refund
  }
#endif
  return reply;
}

ReservationReply ShardBook::markUnknown(const MarkUnknownRequest& request, uint64_t now_ms) {
  Reservation* reservation = lookup(request.reservation_id);
  ShardHolder holder(this, reservation == nullptr ? nullptr : &shardOf(*reservation));
  return lifecycle::markUnknown(reservation, request, &holder, now_ms, kWhat);
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
  Reservation* reservation = lookup(reservation_id);
  ShardHolder holder(this, reservation == nullptr ? nullptr : &shardOf(*reservation));
  return lifecycle::receipt(reservation, reservation_id, operation_id, actual_units, &holder,
                            now_ms, kWhat);
}

ReservationReply ShardBook::query(const QueryRequest& request) const {
  return lifecycle::query(findReservation(request.reservation_id), request, kWhat);
}

uint64_t ShardBook::expireDue(uint64_t now_ms) {
  uint64_t expired = 0;
  while (!expiry_.empty() && expiry_.begin()->first <= now_ms) {
    Reservation* reservation = lookup(expiry_.begin()->second);
    TALLY_ASSERT(reservation != nullptr);
    TALLY_ASSERT(reservation->state == ReservationState::kReserved ||
                 reservation->state == ReservationState::kExpiring);
    // RESERVED leaves expiry_ on its transition; one restored EXPIRING (a crash between the
    // halves) leaves it here.
    if (reservation->state == ReservationState::kExpiring) expiry_.erase(expiry_.begin());
    ShardHolder holder(this, &shardOf(*reservation));
    const bool done = lifecycle::expire(reservation, &holder, now_ms);
    TALLY_ASSERT(done);  // due: expiresAt ≤ now_ms
    ++expired;
  }
  return expired;
}

}  // namespace tally
