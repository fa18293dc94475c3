#include "core/local_book.h"

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"
#include "core/reservation_lifecycle.h"

namespace tally {
namespace {

constexpr const char* kWhat = "local reservation";

}  // namespace

class LocalBook::NoHolder final : public CapacityHolder {
 public:
  explicit NoHolder(LocalBook* book) : book_(book) {}

  void returnUnits(const Reservation& /*reservation*/, uint64_t /*now_ms*/) override {}

  // Nothing to overflow: the refund and the excess are differences of two bounded amounts.
  HolderSettle settle(const Reservation& reservation, Units actual_units,
                      uint64_t /*now_ms*/) override {
    const Units reserved = reservation.reserved_units;
    return {.refunded_units = actual_units < reserved ? reserved - actual_units : 0,
            .debt_units = actual_units > reserved ? actual_units - reserved : 0};
  }
  // Nothing to take the units from: every extend is admitted.
  HolderGrow grow(const Reservation& /*reservation*/, Units /*more_units*/, Units /*total_units*/,
                  uint64_t /*now_ms*/) override {
    return {};
  }
  HolderSettle consumeAll(const Reservation& /*reservation*/, uint64_t /*now_ms*/) override {
    return {};
  }
  HolderSettle chargeExtra(const Reservation& /*reservation*/, Units extra_units,
                           uint64_t /*now_ms*/) override {
    return {.debt_units = extra_units};
  }

  void changed(const Reservation& reservation, ReservationState from,
               uint64_t /*now_ms*/) override {
    const ReservationState to = reservation.state;
    if (to == from) return;
    if (from == ReservationState::kReserved) {
      book_->expiry_.erase({reservation.expires_at_ms, reservation.reservation_id});
    }
    if (to == ReservationState::kReserved) {
      book_->expiry_.emplace(reservation.expires_at_ms, reservation.reservation_id);
    }
    if (from == ReservationState::kUsageUnknown) {
      book_->hard_limit_.erase({book_->hardLimitAt(reservation), reservation.reservation_id});
    }
    if (to == ReservationState::kUsageUnknown) {
      book_->hard_limit_.emplace(book_->hardLimitAt(reservation), reservation.reservation_id);
    }
    if (isTerminal(to) && !isTerminal(from)) {
      book_->terminal_order_.push_back(reservation.reservation_id);
    }
  }

 private:
  LocalBook* book_;
};

LocalBook::LocalBook(LocalBookOptions options) : options_(options) {
  TALLY_ASSERT(options_.entries_max > 0);
  TALLY_ASSERT(options_.hard_execution_limit_ms > 0 &&
               options_.hard_execution_limit_ms <= limits::kHardExecutionLimitMsMax);
}

uint64_t LocalBook::hardLimitAt(const Reservation& reservation) const {
  return saturatingAdd(reservation.started_at_ms, options_.hard_execution_limit_ms);
}

Reservation* LocalBook::find(const std::string& reservation_id) {
  auto it = entries_.find(reservation_id);
  return it == entries_.end() ? nullptr : &it->second;
}

bool LocalBook::contains(const std::string& reservation_id) const {
  return entries_.contains(reservation_id);
}

bool LocalBook::makeRoom() {
  while (entries_.size() >= options_.entries_max && !terminal_order_.empty()) {
    const std::string victim = std::move(terminal_order_.front());
    terminal_order_.pop_front();
    entries_.erase(victim);
  }
  return entries_.size() < options_.entries_max;
}

ReservationReply LocalBook::admit(const ReserveRequest& request, const std::string& origin,
                                  uint64_t now_ms) {
  if (std::optional<ReservationReply> invalid = lifecycle::checkReserve(request)) {
    return *std::move(invalid);
  }
  if (const Reservation* existing = find(request.reservation_id)) {
    return lifecycle::repeatedReserve(*existing, request);
  }
  if (!makeRoom()) {
    // None is terminal: each one is RESERVED (until its hold expires), STARTED (until a settle,
    // a report or a mark-unknown; SPEC §5 never closes it on time alone) or USAGE_UNKNOWN
    // (until a receipt or the hard execution limit).
    return {.code = ReplyCode::kResourceExhausted,
            .message =
                "agent local reservation table is full: " + std::to_string(options_.entries_max) +
                " off/shadow reservations are still open (reserved, started or usage "
                "unknown)"};
  }
  Reservation fresh = lifecycle::newRecord(request, now_ms);
  fresh.policy_generation = request.policy_generation;
  fresh.expires_at_ms = saturatingAdd(now_ms, options_.hold_ttl_ms);
  fresh.origin = origin;
  auto [it, inserted] = entries_.emplace(request.reservation_id, std::move(fresh));
  TALLY_ASSERT(inserted);
  NoHolder holder(this);
  return lifecycle::admitted(&it->second, &holder, now_ms);
}

ReservationReply LocalBook::start(const StartRequest& request, uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::start(find(request.reservation_id), request, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::settle(const SettleRequest& request, uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::receipt(find(request.reservation_id), request.reservation_id,
                            request.operation_id, request.actual_units, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::reportOperation(const ReportOperationRequest& request,
                                            uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::receipt(find(request.reservation_id), request.reservation_id,
                            request.operation_id, request.actual_units, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::release(const ReleaseRequest& request, uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::release(find(request.reservation_id), request, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::markUnknown(const MarkUnknownRequest& request, uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::markUnknown(find(request.reservation_id), request, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::extend(const ExtendRequest& request, uint64_t now_ms) {
  NoHolder holder(this);
  return lifecycle::extend(find(request.reservation_id), request, &holder, now_ms, kWhat);
}

ReservationReply LocalBook::query(const QueryRequest& request) const {
  auto it = entries_.find(request.reservation_id);
  return lifecycle::query(it == entries_.end() ? nullptr : &it->second, request, kWhat);
}

uint64_t LocalBook::tick(uint64_t now_ms) {
  uint64_t closed = 0;
  NoHolder holder(this);
  while (!expiry_.empty() && expiry_.begin()->first <= now_ms) {
    Reservation* reservation = find(expiry_.begin()->second);
    TALLY_ASSERT(reservation != nullptr && reservation->state == ReservationState::kReserved);
    const bool done = lifecycle::expire(reservation, &holder, now_ms);  // leaves expiry_
    TALLY_ASSERT(done);
    ++closed;
  }
  while (!hard_limit_.empty() && hard_limit_.begin()->first <= now_ms) {
    Reservation* reservation = find(hard_limit_.begin()->second);
    TALLY_ASSERT(reservation != nullptr && reservation->state == ReservationState::kUsageUnknown);
    // Nothing holds the units, so nothing can overflow; leaves hard_limit_.
    const bool done = lifecycle::closeByHardLimit(reservation, &holder, now_ms);
    TALLY_ASSERT(done);
    ++closed;
  }
  return closed;
}

}  // namespace tally
