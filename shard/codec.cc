#include "shard/codec.h"

#include <algorithm>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize-packed.h>
#include <kj/exception.h>
#include <kj/io.h>

#include "schemas/emergency_shard.capnp.h"
#include "schemas/limit_reservation.capnp.h"
#include "wire/codec.h"
#include "wire/packed_message.h"
#include "wire/scratch_message.h"

namespace tally::agent {
namespace {

// Traversal budget per packed byte, as in the ledger's store: a zero run packs 256 words into
// 2 bytes, so the budget is generous but still bounds what a damaged blob can allocate.
constexpr uint64_t kTraversalWordsPerBlobByte = 8;

template <typename Root, typename T>
std::vector<uint8_t> encodeAs(const T& value) {
  wire::ScratchMessage message;
  wire::fromCore(value, message.builder().initRoot<Root>());
  kj::VectorOutputStream output(capnp::computeSerializedSizeInWords(message.builder()) *
                                sizeof(capnp::word));
  capnp::writePackedMessage(output, message.builder());
  const kj::ArrayPtr<kj::byte> bytes = output.getArray();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

// The decode boundary: kj::Exception stops here. (Unpacking copies into aligned memory.)
template <typename Root, typename T>
Result<T> decodeAs(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::corruption("empty blob");
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = std::max<uint64_t>(wire::kDecodeTraversalLimitWords,
                                                       kTraversalWordsPerBlobByte * bytes.size());
    options.nestingLimit = wire::kDecodeNestingLimit;
    kj::ArrayInputStream input(kj::ArrayPtr<const kj::byte>(bytes.data(), bytes.size()));
    capnp::PackedMessageReader message(input, options);
    if (size_t trailing = wire::packedTrailingBytes(message, input); trailing != 0) {
      return Status::corruption("blob has " + std::to_string(trailing) + " trailing bytes");
    }
    Result<T> result = wire::toCore(message.getRoot<Root>());
    if (!result.isOk()) return Status::corruption(result.status().message());
    return result;
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed blob: ") + exception.getDescription().cStr());
  }
}

}  // namespace

std::vector<uint8_t> encodeGrant(const ShardGrant& grant) {
  return encodeAs<schema::EmergencyShardV1>(grant);
}

Result<ShardGrant> decodeGrant(std::span<const uint8_t> bytes) {
  return decodeAs<schema::EmergencyShardV1, ShardGrant>(bytes);
}

std::vector<uint8_t> encodeShardReservation(const Reservation& reservation) {
  return encodeAs<schema::LimitReservationV1>(reservation);
}

Result<Reservation> decodeShardReservation(std::span<const uint8_t> bytes) {
  return decodeAs<schema::LimitReservationV1, Reservation>(bytes);
}

}  // namespace tally::agent
