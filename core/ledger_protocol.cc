#include "core/ledger_protocol.h"

namespace tally {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUnspecified: return "unspecified";
    case ErrorCode::kMalformedFrame: return "malformedFrame";
    case ErrorCode::kFrameTooLarge: return "frameTooLarge";
    case ErrorCode::kUnknownMessage: return "unknownMessage";
    case ErrorCode::kInvalidArgument: return "invalidArgument";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal";
    case ErrorCode::kPermissionDenied: return "permissionDenied";
    case ErrorCode::kNotFound: return "notFound";
  }
  return "invalid";
}

}  // namespace tally
