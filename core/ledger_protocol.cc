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
    case ErrorCode::kNotPrimary: return "notPrimary";
  }
  return "invalid";
}

namespace {
constexpr const char* kNotPrimaryNames = "not the primary; the primary is ";
constexpr const char* kNotKnown = "not known";
}  // namespace

std::string notPrimaryMessage(const std::string& primary_address) {
  const size_t colon = primary_address.rfind(':');
  const bool known = colon != std::string::npos && colon > 0 &&
                     colon + 1 < primary_address.size() && primary_address.substr(colon + 1) != "0";
  return std::string(kNotPrimaryNames) + (known ? primary_address : std::string(kNotKnown));
}

std::string primaryNamedIn(const std::string& not_primary_message) {
  const std::string prefix = kNotPrimaryNames;
  if (not_primary_message.rfind(prefix, 0) != 0) return "";
  std::string named = not_primary_message.substr(prefix.size());
  if (named == kNotKnown || named.find(':') == std::string::npos ||
      named.find_first_of(" ;,") != std::string::npos) {
    return "";
  }
  return named;
}

}  // namespace tally
