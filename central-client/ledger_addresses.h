#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/status.h"
#include "wire/codec.h"

// Several ledger addresses (docs/scale-out.md "Standbys that answer"): a primary and its
// standbys, given as `--ledger HOST:PORT,HOST:PORT` (or the agent's `ledger` config key). A
// client talks to one at a time and moves on when it is not the primary:
//  * a refused or failed connect (or a lost connection): the next address in the list;
//  * an answer NOT_PRIMARY naming the primary ("not the primary; the primary is H:P"): that
//    address (the list's entry if it is one, else, for the agent, the named address itself),
//    or the next address when it names none.
// A NOT_PRIMARY answer is never a decision on the request: the standby applied nothing, and the
// client sends the request again, with the same ids, to the primary.

namespace tally::client {

// "HOST:PORT" or a comma-separated list of them ([IPV6]:PORT works; spaces around items are
// ignored). kInvalidArgument naming the bad item for an empty list or item, a bad address or a
// repeated one.
Result<std::vector<Endpoint>> parseLedgerAddresses(std::string_view text);
// "H:P,H:P" (IPv6 in brackets), for logs and messages.
std::string ledgerAddressesName(const std::vector<Endpoint>& addresses);

// Which address to use now and after a failure. Pure; the list is never empty.
class AddressRotation {
 public:
  // follow_unlisted: a named primary that is not in the list is tried too (the agent); without
  // it (tallyctl) only the list's addresses are, so that an operator sees which one answered.
  AddressRotation(std::vector<Endpoint> addresses, bool follow_unlisted);

  const Endpoint& current() const { return named_.has_value() ? *named_ : addresses_[index_]; }
  size_t size() const { return addresses_.size(); }
  // The current address could not be reached (refused, timed out, lost).
  void onUnreachable();
  // The current address answered NOT_PRIMARY with `message` (core: notPrimaryMessage).
  void onNotPrimary(const std::string& message);

 private:
  std::vector<Endpoint> addresses_;
  bool follow_unlisted_;
  size_t index_ = 0;               // into addresses_: the current one, or the one that named
  std::optional<Endpoint> named_;  // a primary named by a standby that is not in the list
};

// tallyctl's call through a list: connects to the current address, sends `body`, and moves on
// (AddressRotation, listed addresses only) on a failed connect or a NOT_PRIMARY answer, until
// an answer from a primary, or each address was tried, or `timeout_ms` is spent. The
// last NOT_PRIMARY answer is returned when no primary answered; the last connect error when
// nothing answered. `connect` opens one connection (BlockingClient::connect by default).
using ConnectFn =
    std::function<Result<std::unique_ptr<BlockingClient>>(const Endpoint&, uint64_t timeout_ms)>;
Result<wire::Response> callThePrimary(const std::vector<Endpoint>& addresses,
                                      const wire::RequestBody& body, uint64_t timeout_ms,
                                      const ConnectFn& connect = nullptr);

// True for a NOT_PRIMARY answer; *message gets its text.
bool isNotPrimary(const wire::Response& response, std::string* message = nullptr);

}  // namespace tally::client
