#pragma once

// What the tallyctl unit tests share: parsing a command line that must (or must not) parse, and a
// transport that records the request a command sends and answers with a canned response.

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctl/args.h"
#include "ctl/commands.h"

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

namespace tally::ctl::test_support {

// RFC 8032 test 1's public key: a well-formed Ed25519 key for the gateway commands.
inline const std::string kRfc8032PublicKey = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";

// `args`, which must parse (a failed EXPECT otherwise, and an empty Invocation).
inline Invocation invocation(std::vector<std::string_view> args) {
  Result<Invocation> inv = parseArgs(args);
  EXPECT_TRUE(inv.isOk()) << inv.status().toString();
  return inv.isOk() ? inv.value() : Invocation{};
}

// The usage error for `args`, which must not parse: an INVALID_ARGUMENT with a message.
inline std::string usageError(std::vector<std::string_view> args) {
  Result<Invocation> inv = parseArgs(args);
  std::string joined;
  for (std::string_view a : args) joined += std::string(a) + " ";
  EXPECT_FALSE(inv.isOk()) << joined;
  if (inv.isOk()) return "";
  EXPECT_EQ(inv.status().code(), StatusCode::kInvalidArgument);
  return inv.status().message();
}

// A transport that records the request and answers with `answer`.
struct FakePeer {
  std::optional<wire::RequestBody> request;
  Result<wire::Response> answer = Status::unavailable("connection refused");

  CallFn fn() {
    return [this](const wire::RequestBody& body) {
      request = body;
      return answer;
    };
  }
};

// Runs the command `args` against `peer`.
inline CommandOutput run(FakePeer& peer, std::vector<std::string_view> args) {
  return runCommand(invocation(args), peer.fn());
}

}  // namespace tally::ctl::test_support
