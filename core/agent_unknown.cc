#include "core/agent_unknown.h"

#include "core/assert.h"

namespace tally {
namespace {

// A reservation the ledger answered about exists, and so the debit happened, unless it says
// REJECTED; any other final word (an error code) reserved nothing either.
ReservationState stateOf(const ReservationReply* reply) {
  if (reply != nullptr && reply->code == ReplyCode::kOk &&
      reply->receipt.state != ReservationState::kRejected) {
    return ReservationState::kReserved;
  }
  return ReservationState::kRejected;
}

}  // namespace

bool UnknownReservations::onAnswerLost(const ReserveRequest& request, uint64_t now_ms) {
  if (entries_.contains(request.reservation_id)) return true;
  TALLY_ASSERT(canTransition(ReservationState::kRequested, ReservationState::kReservationUnknown));
  if (!ages_.add(request.reservation_id, now_ms)) return false;
  entries_.emplace(request.reservation_id, Entry{.request = request});
  return true;
}

std::optional<QueryRequest> UnknownReservations::resolve(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.resolving) return std::nullopt;
  it->second.resolving = true;
  return QueryRequest{.reservation_id = id};
}

UnknownQueryOutcome UnknownReservations::onQueryAnswer(const std::string& id,
                                                       const ReservationReply* reply) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
#ifdef TALLY_TEST_FAULTS
  if (faults_.resend_under_new_id) {
    ReserveRequest retry = it->second.request;
    retry.reservation_id += "-r1";
    return {.resend = retry};
  }
#endif
  if (reply != nullptr && reply->code == ReplyCode::kOk) {
    const ReservationState state = stateOf(reply);
    resolveInto(id, state);
    return {.resolved = state};
  }
  if (reply != nullptr && reply->code == ReplyCode::kNotFound) {
    return {.resend = it->second.request};  // the same request: same id, same digest
  }
  it->second.resolving = false;
  return {};
}

ReservationState UnknownReservations::onResendAnswer(const std::string& id,
                                                     const ReservationReply* reply) {
  const ReservationState state = stateOf(reply);
  if (entries_.contains(id)) resolveInto(id, state);
  return state;
}

#ifdef TALLY_TEST_FAULTS
void UnknownReservations::setFaultsForTesting(UnknownReservationsFaults faults) {
  faults_ = faults;
}
#endif

void UnknownReservations::onStepFailed(const std::string& id) {
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.resolving = false;
}

void UnknownReservations::onFoundElsewhere(const std::string& id, const ReservationReply& reply) {
  if (entries_.contains(id)) resolveInto(id, stateOf(&reply));
}

std::optional<ReservationReply> UnknownReservations::onGatewayQueryAnswer(
    const std::string& id, const ReservationReply* reply) {
  if (reply == nullptr || reply->code != ReplyCode::kOk || !entries_.contains(id)) {
    return std::nullopt;
  }
  onFoundElsewhere(id, *reply);
  return resolvedAnswer(*reply);
}

ReservationReply resolvedAnswer(ReservationReply reply) {
  reply.duplicate = true;
  reply.refunded_units = 0;
  return reply;
}

void UnknownReservations::resolveInto(const std::string& id, ReservationState state) {
  TALLY_ASSERT(canTransition(ReservationState::kReservationUnknown, state));
  entries_.erase(id);
  ages_.remove(id);
}

}  // namespace tally
