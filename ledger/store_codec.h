#pragma once

#include <cstdint>
#include <span>

#include <capnp/common.h>
#include <kj/array.h>

#include "core/reservation.h"
#include "core/status.h"
#include "ledger/store.h"

// The byte encodings of the ledger's durable record (schemas/store.capnp): one StoreBatchV1 per
// log row, one PolicyRecordV1 / AccountRecordV1 / ReservationRecordV1 per table row. Blobs are
// the packed Cap'n Proto serialization (about half the bytes of unpacked for these records).
//
// Decoding is a trust boundary (the file may be damaged): every decode*() reads with explicit
// ReaderOptions sized from the blob, catches kj::Exception, and reports any malformed input,
// including values the wire layer refuses (over-long text, unknown enumerants), as kCorruption.
// Encoding trusts its input: it is the ledger's own state.

namespace tally::ledger {

using Blob = kj::Array<kj::byte>;

// Bytes of a blob, for binding to SQLite.
inline std::span<const uint8_t> blobBytes(const Blob& blob) { return {blob.begin(), blob.size()}; }

Blob encodeBatch(const StoreBatch& batch);
Blob encodePolicyRecord(const PolicyRecord& record);
Blob encodeAccountRecord(const AccountRecord& record);
Blob encodeReservationRecord(const Reservation& reservation);

Result<StoreBatch> decodeBatch(std::span<const uint8_t> bytes);
Result<PolicyRecord> decodePolicyRecord(std::span<const uint8_t> bytes);
Result<AccountRecord> decodeAccountRecord(std::span<const uint8_t> bytes);
Result<Reservation> decodeReservationRecord(std::span<const uint8_t> bytes);

}  // namespace tally::ledger
