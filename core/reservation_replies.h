#pragma once

#include <string>

#include "core/ledger_types.h"

// Building blocks of the answers the two reservation state machines give — the central Ledger
// and the agent's ShardBook — so that both phrase argument checks and replies the same way.

namespace tally::replies {

bool validId(const std::string& id, uint64_t bytes_max);
// Empty if both ids are within bounds (operation_id may be null); else what is wrong.
std::string checkIds(const std::string& reservation_id, const std::string* operation_id);

ReservationReply invalidArgument(std::string message);
// `what` names the kind of reservation in the message ("reservation", "shard reservation").
ReservationReply notFound(const std::string& reservation_id, const char* what = "reservation");
ReservationReply answer(ReplyCode code, const Reservation& receipt, bool duplicate = false,
                        Units refunded_units = 0);

// The answer to a start of a reservation that is no longer RESERVED (the same for central and
// shard reservations): a repeat of the winning start is a duplicate, another operation id lost
// the CAS, an expiry that won is EXPIRED, anything else is INVALID_STATE.
ReservationReply startOfUnreserved(const Reservation& reservation, const std::string& operation_id);

}  // namespace tally::replies
