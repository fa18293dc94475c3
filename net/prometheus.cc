#include "net/prometheus.h"

#include <cctype>
#include <cstdio>
#include <variant>

namespace tally::net {

std::string promLower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

void promHeader(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void promSample(std::string* out, const std::string& name, const std::string& labels,
                const std::string& value) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " " + value + "\n";
}

std::string promSeconds(uint64_t us) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", static_cast<double>(us) / 1e6);
  return buffer;
}

std::string outcomeLabel(const wire::ResponseBody& body) {
  if (const auto* reply = std::get_if<ReservationReply>(&body)) {
    if (reply->code == ReplyCode::kOk && reply->receipt.state == ReservationState::kRejected) {
      return "rejected";
    }
    return promLower(replyCodeName(reply->code));
  }
  if (const auto* error = std::get_if<wire::ErrorReply>(&body)) {
    return std::string("error_") + wire::errorCodeName(error->code);
  }
  if (const auto* policy = std::get_if<wire::PolicyAnswer>(&body)) {
    return promLower(replyCodeName(policy->reply.code));
  }
  return "ok";
}

}  // namespace tally::net
