#include "net/prometheus.h"

#include <cctype>
#include <cstdio>
#include <type_traits>
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

namespace {

// Every value of the code's uint8_t, so that a code from the wire outside the enum gets the
// name its *Name function gives it, not a read past the table.
template <typename Code, typename Label>
std::array<std::string, 256> labelsOf(Label label) {
  static_assert(std::is_same_v<std::underlying_type_t<Code>, uint8_t>);
  std::array<std::string, 256> labels;
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = label(static_cast<Code>(i));
  return labels;
}

std::string_view errorOutcome(wire::ErrorCode code) {
  static const std::array<std::string, 256> labels = labelsOf<wire::ErrorCode>(
      [](wire::ErrorCode c) { return std::string("error_") + wire::errorCodeName(c); });
  return labels[static_cast<uint8_t>(code)];
}

}  // namespace

std::string_view replyCodeOutcome(ReplyCode code) {
  static const std::array<std::string, 256> labels =
      labelsOf<ReplyCode>([](ReplyCode c) { return promLower(replyCodeName(c)); });
  return labels[static_cast<uint8_t>(code)];
}

std::string_view outcomeName(const wire::ResponseBody& body) {
  if (const auto* reply = std::get_if<ReservationReply>(&body)) {
    if (reply->code == ReplyCode::kOk && reply->receipt.state == ReservationState::kRejected) {
      return "rejected";
    }
    return replyCodeOutcome(reply->code);
  }
  if (const auto* error = std::get_if<wire::ErrorReply>(&body)) return errorOutcome(error->code);
  if (const auto* policy = std::get_if<wire::PolicyAnswer>(&body)) {
    return replyCodeOutcome(policy->reply.code);
  }
  return "ok";
}

std::string outcomeLabel(const wire::ResponseBody& body) { return std::string(outcomeName(body)); }

}  // namespace tally::net
