#include "wire/digest.h"

#include <capnp/message.h>
#include <openssl/evp.h>

#include "core/assert.h"
#include "schemas/protocol.capnp.h"
#include "wire/scratch_message.h"

namespace tally::wire {
namespace {

// OpenSSL's SHA-256 uses the CPU's SHA extensions where it has them: a request digest's ~120
// bytes took 190 ns against libsodium's portable code's 600 on the benchmark machine
// (docs/PERFORMANCE.md). Fetched once: EVP_sha256() would look the algorithm up on every call.
const EVP_MD* sha256Algorithm() {
  static EVP_MD* const algorithm = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  TALLY_ASSERT(algorithm != nullptr);
  return algorithm;
}

capnp::Text::Reader textOf(const std::string& value) {
  return capnp::Text::Reader(value.data(), value.size());
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Digest sha256(std::span<const uint8_t> bytes) {
  Digest digest{};
  unsigned int length = 0;
  // Fails only when memory runs out: whatever the bytes, the digest is defined.
  TALLY_ASSERT(EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, sha256Algorithm(),
                          nullptr) == 1);
  TALLY_ASSERT(length == digest.size());
  return digest;
}

Digest sha256(std::string_view bytes) {
  return sha256(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

Digest canonicalRequestDigest(const ReserveRequest& request) {
  ScratchMessage message;
  auto canonical = message.builder().initRoot<schema::CanonicalReserve>();
  canonical.setReservationId(textOf(request.reservation_id));
  canonical.setSubject(textOf(request.subject));
  canonical.setRoute(textOf(request.route));
  canonical.setUnits(request.units);
  canonical.setPolicyGeneration(request.policy_generation);
  canonical.setPriority(request.priority);
  // Unset when empty (an empty Text would be a non-null pointer): the digest of a request
  // without a region is the one it had before regions existed.
  if (!request.region.empty()) canonical.setRegion(textOf(request.region));
  // Canonical form: one segment, no padding or far pointers, fields in schema order, so the
  // bytes depend only on the values.
  kj::Array<capnp::word> words = capnp::canonicalize(canonical.asReader());
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  return sha256(std::span<const uint8_t>(bytes.begin(), bytes.size()));
}

std::string digestHex(const Digest& digest) {
  static constexpr char kHexDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(digest.size() * 2);
  for (uint8_t byte : digest) {
    hex.push_back(kHexDigits[byte >> 4]);
    hex.push_back(kHexDigits[byte & 0x0f]);
  }
  return hex;
}

Result<Digest> parseDigestHex(std::string_view hex) {
  Digest digest{};
  if (hex.size() != digest.size() * 2) {
    return Status::invalidArgument("digest must be " + std::to_string(digest.size() * 2) +
                                   " hex characters, got " + std::to_string(hex.size()));
  }
  for (size_t i = 0; i < digest.size(); ++i) {
    const int high = hexValue(hex[2 * i]);
    const int low = hexValue(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return Status::invalidArgument("digest has a non-hex character at offset " +
                                     std::to_string(high < 0 ? 2 * i : 2 * i + 1));
    }
    digest[i] = static_cast<uint8_t>((high << 4) | low);
  }
  return digest;
}

}  // namespace tally::wire
