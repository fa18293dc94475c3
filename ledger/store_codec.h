#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <capnp/common.h>
#include <kj/array.h>

#include "core/reservation.h"
#include "core/status.h"
#include "ledger/store.h"

// The byte encodings of the ledger's durable record (schemas/store.capnp): one StoreBatchV1 per
// log row, one PolicyRecordV1 / AccountRecordV1 / ReservationRecordV1 / GatewayRecordV1 /
// ShardRecordV1 per table row. Table rows are the packed Cap'n Proto serialization (about half
// the bytes of unpacked for these records). A log batch is flat: kFlatMarkerBytes zero bytes,
// then the standard (unpacked) serialization, which costs twice the bytes but neither packing
// on the commit path nor unpacking in the fold; a packed message never starts with a zero byte,
// so every decoder below reads either form (the log of schema version 6 held packed batches).
//
// Decoding is a trust boundary (the file may be damaged): every decode*() reads with explicit
// ReaderOptions sized from the blob, catches kj::Exception, and reports any malformed input,
// including values the wire layer refuses (over-long text, unknown enumerants), as kCorruption.
// Encoding trusts its input: it is the ledger's own state.

namespace tally::ledger {

using Blob = kj::Array<kj::byte>;

// The zero bytes a flat blob starts with: one word, so the message after them stays aligned.
inline constexpr size_t kFlatMarkerBytes = 8;

// Bytes of a blob, for binding to SQLite.
inline std::span<const uint8_t> blobBytes(const Blob& blob) { return {blob.begin(), blob.size()}; }

Blob encodeBatch(const StoreBatch& batch);

// The flat StoreBatchV1 of a batch, into buffers it keeps from one batch to the next: once
// warm, a commit's encoding allocates nothing (a fresh message builder zeroes its first segment
// and the blob is copied once more). A buffer that a huge batch grew past kKeptBytesMax is
// released by the next encode(). Not thread-safe. encodeBatch() is a fresh encoder's bytes.
class BatchEncoder {
 public:
  static constexpr size_t kKeptBytesMax = size_t{4} << 20;

  BatchEncoder();
  ~BatchEncoder();
  BatchEncoder(const BatchEncoder&) = delete;
  BatchEncoder& operator=(const BatchEncoder&) = delete;

  // The flat StoreBatchV1 of `batch`, valid until the next encode() or the encoder's
  // destruction.
  std::span<const uint8_t> encode(const StoreBatch& batch);

 private:
  class Output;
  kj::Array<capnp::word> first_segment_;  // all zero between calls
  std::unique_ptr<Output> output_;
};
Blob encodePolicyRecord(const PolicyRecord& record);
Blob encodeAccountRecord(const AccountRecord& record);
Blob encodeReservationRecord(const Reservation& reservation);
Blob encodeGatewayRecord(const GatewayRecord& record);
Blob encodeOperatorRecord(const OperatorRecord& record);
Blob encodeAuditLogEntry(const AuditLogEntry& entry);
Blob encodeShardRecord(const ShardRecord& record);
Blob encodePeriodSnapshotRecord(const PeriodSnapshot& snapshot);  // Protocol.PeriodSnapshotV1

Result<StoreBatch> decodeBatch(std::span<const uint8_t> bytes);
Result<PolicyRecord> decodePolicyRecord(std::span<const uint8_t> bytes);
Result<AccountRecord> decodeAccountRecord(std::span<const uint8_t> bytes);
Result<Reservation> decodeReservationRecord(std::span<const uint8_t> bytes);
Result<GatewayRecord> decodeGatewayRecord(std::span<const uint8_t> bytes);
Result<OperatorRecord> decodeOperatorRecord(std::span<const uint8_t> bytes);
Result<AuditLogEntry> decodeAuditLogEntry(std::span<const uint8_t> bytes);
Result<ShardRecord> decodeShardRecord(std::span<const uint8_t> bytes);
Result<PeriodSnapshot> decodePeriodSnapshotRecord(std::span<const uint8_t> bytes);

// Folds a run of encoded batches (oldest first) into their net effect: the latest image of every
// row they touch, and the reservation ids whose last change deleted them. Superseded images are
// only located (their keys are read, their bodies are not decoded), so a run that rewrites the
// same rows many times costs one full decode per row: finish() decodes each latest image, the
// read-back check of what the fold writes. Keeps every added blob (a packed one unpacked) until
// destroyed.
// Not thread-safe; unusable after a failure.
class BatchFolder {
 public:
  BatchFolder();
  ~BatchFolder();
  BatchFolder(const BatchFolder&) = delete;
  BatchFolder& operator=(const BatchFolder&) = delete;

  // Adds the next batch of the run (keeping `blob`). kCorruption for a malformed blob.
  Status add(Blob blob);
  // The net effect as one batch: `deleted_reservations` and `reservations` are disjoint, so it
  // applies like any other batch. kCorruption if a latest image does not decode.
  Result<StoreBatch> finish() const;
  // The same into *batch, cleared first (StoreBatch::clear: its lists keep their capacity).
  // On an error *batch holds part of the net effect.
  Status finishInto(StoreBatch* batch) const;
  size_t batches() const { return messages_.size(); }

 private:
  struct Message;
  struct Index;
  std::vector<std::unique_ptr<Message>> messages_;
  std::unique_ptr<Index> index_;
};

}  // namespace tally::ledger
