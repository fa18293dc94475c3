#include "core/reservation_replies.h"

#include <utility>

#include "core/limits.h"

namespace tally::replies {

bool validId(const std::string& id, uint64_t bytes_max) {
  return !id.empty() && id.size() <= bytes_max;
}

std::string checkIds(const std::string& reservation_id, const std::string* operation_id) {
  if (!validId(reservation_id, limits::kReservationIdBytesMax)) {
    return "reservation id must be 1.." + std::to_string(limits::kReservationIdBytesMax) + " bytes";
  }
  if (operation_id != nullptr && !validId(*operation_id, limits::kOperationIdBytesMax)) {
    return "operation id must be 1.." + std::to_string(limits::kOperationIdBytesMax) + " bytes";
  }
  return {};
}

ReservationReply invalidArgument(std::string message) {
  return {.code = ReplyCode::kInvalidArgument, .message = std::move(message)};
}

ReservationReply notFound(const std::string& reservation_id, const char* what) {
  return {.code = ReplyCode::kNotFound,
          .message = std::string("no ") + what + " '" + reservation_id + "'"};
}

ReservationReply answer(ReplyCode code, const Reservation& receipt, bool duplicate,
                        Units refunded_units) {
  return {
      .code = code, .duplicate = duplicate, .refunded_units = refunded_units, .receipt = receipt};
}

}  // namespace tally::replies
