#include "tests/fuzz/fuzz_support.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tally::fuzz {

uint8_t FuzzBytes::u8() { return at_ < size_ ? data_[at_++] : 0; }

uint16_t FuzzBytes::u16() {
  const uint16_t low = u8();
  return static_cast<uint16_t>(low | (static_cast<uint16_t>(u8()) << 8));
}

std::span<const uint8_t> FuzzBytes::bytes(size_t n) {
  const size_t take = std::min(n, size_ - std::min(at_, size_));
  std::span<const uint8_t> out(data_ + at_, take);
  at_ += take;
  return out;
}

void fail(std::string_view what, std::string_view detail) {
  std::fprintf(stderr, "fuzz finding: %.*s: %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

namespace {

std::span<const uint8_t> payloadOf(const std::vector<uint8_t>& frame) {
  return std::span<const uint8_t>(frame).subspan(wire::kFrameHeaderBytes);
}

}  // namespace

std::vector<uint8_t> encodeAnswer(const wire::Response& response, bool* too_large) {
  Result<std::vector<uint8_t>> frame = wire::encodeResponseFrame(response);
  if (too_large != nullptr) *too_large = false;
  if (!frame.isOk() && frame.status().code() == StatusCode::kResourceExhausted) {
    if (too_large != nullptr) *too_large = true;
    frame = wire::encodeResponseFrame(wire::replyTooLarge(response.request_id, frame.status()));
  }
  if (!frame.isOk()) fail("encodeResponseFrame", frame.status().toString());
  Result<wire::Response> back = wire::decodeResponse(payloadOf(frame.value()));
  if (!back.isOk()) fail("our own response does not decode", back.status().toString());
  if (back.value().request_id != response.request_id) fail("response request id changed");
  return std::move(frame).value();
}

std::vector<uint8_t> encodeCall(const wire::Request& request, bool* too_large) {
  Result<std::vector<uint8_t>> frame = wire::encodeRequestFrame(request);
  if (too_large != nullptr) {
    *too_large = !frame.isOk() && frame.status().code() == StatusCode::kResourceExhausted;
    if (*too_large) return {};
  }
  if (!frame.isOk()) fail("encodeRequestFrame", frame.status().toString());
  wire::DecodedRequest back = wire::decodeRequest(payloadOf(frame.value()));
  if (!back.body.isOk()) fail("our own request does not decode", back.body.status().toString());
  if (back.request_id != request.request_id) fail("request id changed");
  return std::move(frame).value();
}

const identity::KeyPair& ledgerKey() {
  static const identity::KeyPair key = [] {
    identity::Seed seed{};
    seed.fill(1);
    return identity::keyPairFromSeed(seed);
  }();
  return key;
}

const identity::KeyPair& gatewayKey() {
  static const identity::KeyPair key = [] {
    identity::Seed seed{};
    seed.fill(2);
    return identity::keyPairFromSeed(seed);
  }();
  return key;
}

Policy fuzzPolicy() {
  Policy policy;
  policy.budgets.push_back(Budget{
      .subject_pattern = "tenant-a",
      .route = "chat",
      .unit = "tokens",
      .refill_per_second = 10,
      .burst = 1000,
      .max_single_reservation = 500,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 50,
      .emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = 60'000},
  });
  policy.budgets.push_back(Budget{
      .subject_pattern = "*",
      .route = "embed",
      .unit = "requests",
      .refill_per_second = 1,
      .burst = 20,
      .max_single_reservation = 5,
      .hold_ttl_ms = 1'000,
      .hard_execution_limit_ms = 5'000,
  });
  return policy;
}

std::string memoryFile(std::span<const uint8_t> text) {
  static int fd = -1;
  if (fd < 0) {
    fd = memfd_create("tally-fuzz", 0);
    if (fd < 0) fail("memfd_create");
  }
  if (ftruncate(fd, 0) != 0) fail("ftruncate");
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n =
        pwrite(fd, text.data() + written, text.size() - written, static_cast<off_t>(written));
    if (n <= 0) fail("pwrite");
    written += static_cast<size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace tally::fuzz
