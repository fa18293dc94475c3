#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/reservation.h"
#include "core/shard_types.h"
#include "core/status.h"

// Byte encodings of the shard store's blobs: a grant as EmergencyShardV1 and a shard
// reservation as LimitReservationV1 (schemas/), packed Cap'n Proto, as the ledger's store does.
//
// Decoding is a trust boundary (the file may be damaged or tampered with): explicit
// ReaderOptions sized from the blob, kj::Exception caught here, anything malformed is
// kCorruption. A grant that decodes is still only trusted once its signature verifies (the
// shard book does that at restore).

namespace tally::agent {

std::vector<uint8_t> encodeGrant(const ShardGrant& grant);
Result<ShardGrant> decodeGrant(std::span<const uint8_t> bytes);

std::vector<uint8_t> encodeShardReservation(const Reservation& reservation);
Result<Reservation> decodeShardReservation(std::span<const uint8_t> bytes);

}  // namespace tally::agent
