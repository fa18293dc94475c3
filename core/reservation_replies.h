#pragma once

#include <string>

#include "core/ledger_types.h"

// Building blocks of the answers of the reservation lifecycle (core/reservation_lifecycle.h) and
// the tables that use it, so that all phrase argument checks and replies the same way.

namespace tally::replies {

bool validId(const std::string& id, uint64_t bytes_max);
// Empty if both ids are within bounds (operation_id may be null); else what is wrong.
std::string checkIds(const std::string& reservation_id, const std::string* operation_id);

ReservationReply invalidArgument(std::string message);
// `what` names the kind of reservation in the message ("reservation", "shard reservation").
ReservationReply notFound(const std::string& reservation_id, const char* what = "reservation");
ReservationReply answer(ReplyCode code, const Reservation& receipt, bool duplicate = false,
                        Units refunded_units = 0);

}  // namespace tally::replies
