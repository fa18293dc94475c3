#include "agent/local_reservations.h"

#include "core/assert.h"

namespace tally::agent {
namespace {

ReservationReply notFound(const std::string& id) {
  return {.code = ReplyCode::kNotFound, .message = "no local reservation " + id};
}

ReservationReply withReceipt(ReplyCode code, const Reservation& r, std::string message = {}) {
  return {.code = code, .receipt = r, .message = std::move(message)};
}

ReservationReply duplicateOf(const Reservation& r) {
  return {.code = ReplyCode::kOk, .duplicate = true, .refunded_units = 0, .receipt = r};
}

}  // namespace

LocalReservations::LocalReservations(LocalReservationsOptions options) : options_(options) {
  TALLY_ASSERT(options_.entries_max > 0);
}

Reservation* LocalReservations::find(const std::string& id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

bool LocalReservations::contains(const std::string& reservation_id) const {
  return entries_.contains(reservation_id);
}

bool LocalReservations::makeRoom() {
  while (entries_.size() >= options_.entries_max && !terminal_order_.empty()) {
    const std::string victim = std::move(terminal_order_.front());
    terminal_order_.pop_front();
    entries_.erase(victim);
  }
  return entries_.size() < options_.entries_max;
}

void LocalReservations::becameTerminal(const std::string& id) { terminal_order_.push_back(id); }

ReservationReply LocalReservations::admit(const ReserveRequest& request, const std::string& origin,
                                          uint64_t now_ms) {
  if (const Reservation* existing = find(request.reservation_id)) {
    if (existing->request_digest != request.request_digest) {
      return withReceipt(ReplyCode::kIdempotencyConflict, *existing,
                         "same reservation id, different request digest");
    }
    return duplicateOf(*existing);
  }
  if (request.reservation_id.empty() || request.units == 0) {
    return {.code = ReplyCode::kInvalidArgument,
            .message = "reservation id and units must be non-empty"};
  }
  if (!makeRoom()) {
    return {.code = ReplyCode::kResourceExhausted,
            .message = "agent local reservation table is full"};
  }
  Reservation r{.reservation_id = request.reservation_id,
                .request_digest = request.request_digest,
                .subject = request.subject,
                .route = request.route,
                .policy_generation = request.policy_generation,
                .reserved_units = request.units,
                .created_at_ms = now_ms,
                .state = ReservationState::kReserved,
                .origin = origin};
  auto [it, inserted] = entries_.emplace(r.reservation_id, std::move(r));
  TALLY_ASSERT(inserted);
  return withReceipt(ReplyCode::kOk, it->second);
}

ReservationReply LocalReservations::start(const StartRequest& request, uint64_t now_ms) {
  Reservation* r = find(request.reservation_id);
  if (r == nullptr) return notFound(request.reservation_id);
  if (r->state == ReservationState::kReserved) {
    TALLY_ASSERT(canTransition(r->state, ReservationState::kStarted));
    r->state = ReservationState::kStarted;
    r->operation_id = request.operation_id;
    r->started_at_ms = now_ms;
    return withReceipt(ReplyCode::kOk, *r);
  }
  if (r->operation_id == request.operation_id) return duplicateOf(*r);
  if (!r->operation_id.empty()) {
    return withReceipt(ReplyCode::kOperationConflict, *r, "bound to another operation id");
  }
  return withReceipt(ReplyCode::kInvalidState, *r,
                     std::string("cannot start from ") + reservationStateName(r->state));
}

ReservationReply LocalReservations::finish(Reservation* r, const std::string& operation_id,
                                           Units actual_units, uint64_t now_ms) {
  if (!operation_id.empty() && r->operation_id != operation_id) {
    return withReceipt(ReplyCode::kOperationConflict, *r, "bound to another operation id");
  }
  const ReservationState next = actual_units > r->reserved_units
                                    ? ReservationState::kSettledWithDebt
                                    : ReservationState::kSettled;
  TALLY_ASSERT(canTransition(r->state, next));
  r->state = next;
  r->actual_units = actual_units;
  r->refunded_units = actual_units >= r->reserved_units ? 0 : r->reserved_units - actual_units;
  r->debt_units = actual_units > r->reserved_units ? actual_units - r->reserved_units : 0;
  r->closed_at_ms = now_ms;
  becameTerminal(r->reservation_id);
  return {.code = ReplyCode::kOk, .refunded_units = r->refunded_units, .receipt = *r};
}

ReservationReply LocalReservations::settle(const SettleRequest& request, uint64_t now_ms) {
  Reservation* r = find(request.reservation_id);
  if (r == nullptr) return notFound(request.reservation_id);
  if (isTerminal(r->state)) {
    if (r->state == ReservationState::kSettled || r->state == ReservationState::kSettledWithDebt) {
      return duplicateOf(*r);
    }
    return withReceipt(ReplyCode::kInvalidState, *r,
                       std::string("cannot settle from ") + reservationStateName(r->state));
  }
  if (r->state != ReservationState::kStarted && r->state != ReservationState::kUsageUnknown) {
    return withReceipt(ReplyCode::kInvalidState, *r,
                       std::string("cannot settle from ") + reservationStateName(r->state));
  }
  return finish(r, request.operation_id, request.actual_units, now_ms);
}

ReservationReply LocalReservations::reportOperation(const ReportOperationRequest& request,
                                                    uint64_t now_ms) {
  return settle(SettleRequest{.reservation_id = request.reservation_id,
                              .operation_id = request.operation_id,
                              .actual_units = request.actual_units},
                now_ms);
}

ReservationReply LocalReservations::release(const ReleaseRequest& request, uint64_t now_ms) {
  Reservation* r = find(request.reservation_id);
  if (r == nullptr) return notFound(request.reservation_id);
  if (r->state == ReservationState::kReleased) return duplicateOf(*r);
  if (r->state != ReservationState::kReserved) {
    return withReceipt(ReplyCode::kInvalidState, *r,
                       std::string("cannot release from ") + reservationStateName(r->state));
  }
  TALLY_ASSERT(canTransition(r->state, ReservationState::kReleased));
  r->state = ReservationState::kReleased;
  r->refunded_units = r->reserved_units;
  r->closed_at_ms = now_ms;
  becameTerminal(r->reservation_id);
  return {.code = ReplyCode::kOk, .refunded_units = r->refunded_units, .receipt = *r};
}

ReservationReply LocalReservations::markUnknown(const MarkUnknownRequest& request,
                                                uint64_t /*now_ms*/) {
  Reservation* r = find(request.reservation_id);
  if (r == nullptr) return notFound(request.reservation_id);
  if (r->state == ReservationState::kUsageUnknown) return duplicateOf(*r);
  if (r->state != ReservationState::kStarted) {
    return withReceipt(ReplyCode::kInvalidState, *r,
                       std::string("cannot mark unknown from ") + reservationStateName(r->state));
  }
  if (r->operation_id != request.operation_id) {
    return withReceipt(ReplyCode::kOperationConflict, *r, "bound to another operation id");
  }
  TALLY_ASSERT(canTransition(r->state, ReservationState::kUsageUnknown));
  r->state = ReservationState::kUsageUnknown;
  return withReceipt(ReplyCode::kOk, *r);
}

ReservationReply LocalReservations::query(const QueryRequest& request) const {
  auto it = entries_.find(request.reservation_id);
  if (it == entries_.end()) return notFound(request.reservation_id);
  return withReceipt(ReplyCode::kOk, it->second);
}

}  // namespace tally::agent
