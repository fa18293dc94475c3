#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/policy.h"
#include "shard/identity.h"
#include "wire/codec.h"
#include "wire/frame.h"

// Shared by the libFuzzer targets of tests/fuzz (docs/security.md "Fuzzing"): reading structured
// choices out of the fuzzer's bytes, the fixed keys and policy the stateful targets start from,
// and the checks every target applies to what it answers. A failed check aborts, which libFuzzer
// (and the corpus replay) reports as a finding.

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tally::fuzz {

// Reads choices from the fuzzer's input; past its end every read returns zero / empty.
class FuzzBytes {
 public:
  FuzzBytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return at_ >= size_; }
  uint8_t u8();
  uint16_t u16();  // little-endian
  // Up to `n` bytes (fewer at the end of the input).
  std::span<const uint8_t> bytes(size_t n);
  std::span<const uint8_t> rest() { return bytes(size_ - at_); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Prints `what` and aborts: the finding.
[[noreturn]] void fail(std::string_view what, std::string_view detail = {});

// Encodes `response` as the daemons do (one frame), decodes it back as their peers do and fails
// unless it decodes: what we send must be readable by our own clients. A reply too large for a
// frame is answered as both servers answer it (ledger/server.cc, agent/gateway_server.cc): an
// FRAME_TOO_LARGE error (wire::replyTooLarge), which must encode. `*too_large` (optional) says it
// happened.
std::vector<uint8_t> encodeAnswer(const wire::Response& response, bool* too_large = nullptr);
// The same for a request we send (the agent's forwarded requests and its own calls). With
// `too_large`, a request too large for a frame is not a finding: it returns nothing and says so
// (the agent's link refuses to send it, central-client/ledger_link.cc).
std::vector<uint8_t> encodeCall(const wire::Request& request, bool* too_large = nullptr);

// The keys of the stateful targets: the ledger's signing key (seed 1) and one enrolled gateway's
// (seed 2), so seeds can carry valid signatures.
const identity::KeyPair& ledgerKey();
const identity::KeyPair& gatewayKey();
inline constexpr std::string_view kGatewayName = "gw-fuzz";
inline constexpr uint64_t kT0Ms = 1'800'000'000'000;

// Two budgets (one with emergency shards) the ledger target publishes before the input.
Policy fuzzPolicy();

// A path naming a file that holds exactly `text` (an in-memory file, /proc/self/fd/N), for the
// loaders that read a path. Valid until the next call.
std::string memoryFile(std::span<const uint8_t> text);

}  // namespace tally::fuzz
