#include "central-client/ledger_addresses.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <variant>

#include "core/assert.h"
#include "core/ledger_protocol.h"

namespace tally::client {

namespace {

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

}  // namespace

Result<std::vector<Endpoint>> parseLedgerAddresses(std::string_view text) {
  std::vector<Endpoint> addresses;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    const std::string_view item =
        trimmed(text.substr(begin, comma == std::string_view::npos ? text.npos : comma - begin));
    if (item.empty()) {
      return Status::invalidArgument("'" + std::string(text) + "': an empty ledger address");
    }
    Result<Endpoint> parsed = parseTcpEndpoint(item);
    if (!parsed.isOk()) return parsed.status();
    if (std::find(addresses.begin(), addresses.end(), parsed.value()) != addresses.end()) {
      return Status::invalidArgument("'" + std::string(text) + "': " + std::string(item) +
                                     " is given twice");
    }
    addresses.push_back(std::move(parsed).value());
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return addresses;
}

std::string ledgerAddressesName(const std::vector<Endpoint>& addresses) {
  std::string out;
  for (const Endpoint& address : addresses) {
    if (!out.empty()) out += ",";
    out += endpointName(address);
  }
  return out;
}

AddressRotation::AddressRotation(std::vector<Endpoint> addresses, bool follow_unlisted)
    : addresses_(std::move(addresses)), follow_unlisted_(follow_unlisted) {
  TALLY_ASSERT(!addresses_.empty());
}

void AddressRotation::onUnreachable() {
  // A named primary that cannot be reached: back to the list, after the one that named it.
  named_.reset();
  index_ = (index_ + 1) % addresses_.size();
}

void AddressRotation::onNotPrimary(const std::string& message) {
  const std::string named_text = primaryNamedIn(message);
  Result<Endpoint> named = named_text.empty() ? Result<Endpoint>(Status::notFound("none"))
                                              : parseTcpEndpoint(named_text);
  if (!named.isOk() || named.value() == current()) {
    onUnreachable();
    return;
  }
  const auto it = std::find(addresses_.begin(), addresses_.end(), named.value());
  if (it != addresses_.end()) {
    named_.reset();
    index_ = static_cast<size_t>(it - addresses_.begin());
    return;
  }
  if (!follow_unlisted_) {
    onUnreachable();
    return;
  }
  named_ = std::move(named).value();
}

bool isNotPrimary(const wire::Response& response, std::string* message) {
  const auto* error = std::get_if<wire::ErrorReply>(&response.body);
  if (error == nullptr || error->code != wire::ErrorCode::kNotPrimary) return false;
  if (message != nullptr) *message = error->message;
  return true;
}

Result<wire::Response> callThePrimary(const std::vector<Endpoint>& addresses,
                                      const wire::RequestBody& body, uint64_t timeout_ms,
                                      const ConnectFn& connect) {
  if (addresses.empty()) return Status::invalidArgument("no ledger address");
  const auto started = std::chrono::steady_clock::now();
  auto left_ms = [&]() -> uint64_t {
    const auto spent = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 std::chrono::steady_clock::now() - started)
                                                 .count());
    return spent < timeout_ms ? timeout_ms - spent : 0;
  };
  AddressRotation rotation(addresses, /*follow_unlisted=*/false);
  std::optional<Result<wire::Response>> last;
  // Each listed address once (a standby's named primary is one of them).
  const size_t attempts = addresses.size();
  for (size_t attempt = 0; attempt < attempts; ++attempt) {
    const uint64_t budget_ms = left_ms();
    if (budget_ms == 0) break;
    const Endpoint target = rotation.current();
    Result<std::unique_ptr<BlockingClient>> connection =
        connect ? connect(target, budget_ms) : BlockingClient::connect(target, budget_ms);
    if (!connection.isOk()) {
      if (!last.has_value() || !last->isOk()) last = connection.status();
      rotation.onUnreachable();
      continue;
    }
    Result<wire::Response> answer =
        connection.value()->call(body, std::max<uint64_t>(left_ms(), 1));
    std::string message;
    if (answer.isOk() && isNotPrimary(answer.value(), &message)) {
      last = std::move(answer);
      rotation.onNotPrimary(message);
      continue;
    }
    return answer;  // the primary's answer, or an error after the request was sent
  }
  if (last.has_value()) return std::move(*last);
  return Status::unavailable("no answer from the ledger at " + ledgerAddressesName(addresses) +
                             " within " + std::to_string(timeout_ms) + " ms");
}

}  // namespace tally::client
