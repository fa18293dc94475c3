#include "ledger/store_codec.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <capnp/message.h>
#include <capnp/serialize-packed.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include "core/assert.h"
#include "core/limits.h"
#include "schemas/store.capnp.h"
#include "wire/codec.h"
#include "wire/enum_mapping.h"
#include "wire/packed_message.h"
#include "wire/period_codec.h"

namespace tally::ledger {
namespace {

// Rough sizes of one encoded item, so that a batch usually fits the first segment.
constexpr uint64_t kWordsPerAccount = 24;
constexpr uint64_t kWordsPerReservation = 48;
constexpr uint64_t kWordsPerPolicy = 256;
constexpr uint64_t kWordsPerDeletion = 20;
constexpr uint64_t kWordsPerGateway = 20;
constexpr uint64_t kWordsPerAuditLogEntry = 64;
constexpr uint64_t kWordsPerShard = 160;
constexpr uint64_t kWordsPerFence = 12;
constexpr uint64_t kWordsPerPeriodSnapshot = 40;
constexpr uint64_t kWordsOverhead = 64;
// Largest first segment sized from the estimate; a larger batch grows more segments.
constexpr uint64_t kFirstSegmentWordsMax = uint64_t{1} << 24;

// Traversal budget per packed byte. Our records pack to about half their size (ids, digests and
// counters are rarely zero); 8 words (64 bytes) per packed byte leaves a wide margin for
// zero-heavy records while still bounding what a damaged blob can make the reader allocate
// (a zero run packs 256 words into 2 bytes, so the budget cannot be "every possible word").
constexpr uint64_t kTraversalWordsPerBlobByte = 8;

capnp::Text::Reader textOf(const std::string& value) {
  return capnp::Text::Reader(value.data(), value.size());
}

Status asCorruption(const Status& status) {
  if (status.code() == StatusCode::kCorruption) return status;
  return Status::corruption(status.message());
}

// Limits for reading one blob, sized from it.
capnp::ReaderOptions readerOptions(size_t blob_bytes) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      std::max<uint64_t>(wire::kDecodeTraversalLimitWords, kTraversalWordsPerBlobByte * blob_bytes);
  options.nestingLimit = wire::kDecodeNestingLimit;
  return options;
}

// Unpacked words a packed message of this size or smaller is read into without allocating: a
// restart decodes a million table rows, and one heap allocation each was measurable. Each thread
// (the loop's restore, the fold thread) has its own; withRoot() is not re-entered while one is
// read.
constexpr size_t kScratchWords = 1024;  // 8 KiB: every table row
thread_local capnp::word scratch_words[kScratchWords];

// One blob's message, in either form (store_codec.h, kFlatMarkerBytes): a flat one is read in
// place (copied first only when `bytes` is not word-aligned), a packed one is unpacked into
// `scratch` or the heap. May throw kj::Exception (call it inside a decode boundary); a blob that
// holds more than one message is refused. Non-movable: the readers point into its members.
class BlobMessage {
 public:
  BlobMessage(std::span<const uint8_t> bytes, kj::ArrayPtr<capnp::word> scratch) {
    if (bytes.empty()) KJ_FAIL_REQUIRE("empty blob");
    if (!isFlat(bytes)) {
      input_.emplace(kj::ArrayPtr<const kj::byte>(bytes.data(), bytes.size()));
      packed_.emplace(*input_, readerOptions(bytes.size()), scratch);
      if (size_t trailing = wire::packedTrailingBytes(*packed_, *input_); trailing != 0) {
        KJ_FAIL_REQUIRE("message is followed by trailing bytes", trailing);
      }
      return;
    }
    const std::span<const uint8_t> flat = bytes.subspan(kFlatMarkerBytes);
    if (flat.size() % sizeof(capnp::word) != 0) {
      KJ_FAIL_REQUIRE("flat message is not whole words", flat.size());
    }
    const size_t words = flat.size() / sizeof(capnp::word);
    const capnp::word* begin = reinterpret_cast<const capnp::word*>(flat.data());
    if (reinterpret_cast<uintptr_t>(flat.data()) % alignof(capnp::word) != 0) {
      aligned_ = kj::heapArray<capnp::word>(words);
      std::memcpy(aligned_.begin(), flat.data(), flat.size());
      begin = aligned_.begin();
    }
    flat_.emplace(kj::arrayPtr(begin, words), readerOptions(bytes.size()));
    if (const capnp::word* end = flat_->getEnd(); end != begin + words) {
      KJ_FAIL_REQUIRE("message is followed by trailing bytes",
                      (begin + words - end) * sizeof(capnp::word));
    }
  }
  BlobMessage(const BlobMessage&) = delete;
  BlobMessage& operator=(const BlobMessage&) = delete;

  capnp::MessageReader& reader() {
    if (flat_.has_value()) return *flat_;
    return *packed_;
  }

 private:
  static bool isFlat(std::span<const uint8_t> bytes) {
    // A packed message never starts with a zero byte: its first word, the segment table,
    // holds the first segment's size, never zero, so its tag byte is not zero.
    return bytes.size() >= kFlatMarkerBytes &&
           std::all_of(bytes.begin(), bytes.begin() + kFlatMarkerBytes,
                       [](uint8_t byte) { return byte == 0; });
  }

  std::optional<kj::ArrayInputStream> input_;
  std::optional<capnp::PackedMessageReader> packed_;
  kj::Array<capnp::word> aligned_;
  std::optional<capnp::FlatArrayMessageReader> flat_;
};

// Reads the message in `bytes` with limits sized from the blob, and hands its root to `read`.
// This is the decode boundary: kj::Exception stops here. `read` copies what it keeps out of the
// message: the scratch words are reused by the next call.
template <typename Root, typename T, typename F>
Result<T> withRoot(std::span<const uint8_t> bytes, F&& read) {
  if (bytes.empty()) return Status::corruption("empty blob");
  try {
    BlobMessage message(bytes, kj::arrayPtr(scratch_words, kScratchWords));
    Result<T> result = read(message.reader().getRoot<Root>());
    if (!result.isOk()) return asCorruption(result.status());
    return result;
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed message: ") +
                              exception.getDescription().cStr());
  }
}

// --- Builders ---------------------------------------------------------------------------------

// A record the decoder would refuse must never reach the disk: it would make the data dir
// unloadable. The ledger bounds all of these at its input, so a violation is a bug.
void assertStorable(const Budget& budget) {
  TALLY_ASSERT(budget.subject_pattern.size() <= limits::kSubjectBytesMax);
  TALLY_ASSERT(budget.route.size() <= limits::kRouteBytesMax);
  TALLY_ASSERT(budget.region.size() <= limits::kRegionBytesMax);
  TALLY_ASSERT(budget.unit.size() <= limits::kUnitNameBytesMax);
  TALLY_ASSERT(budget.estimator_digest.size() <= wire::kEstimatorDigestBytesMax);
}

void assertStorable(const Reservation& reservation) {
  TALLY_ASSERT(reservation.reservation_id.size() <= limits::kReservationIdBytesMax);
  TALLY_ASSERT(reservation.subject.size() <= limits::kSubjectBytesMax);
  TALLY_ASSERT(reservation.route.size() <= limits::kRouteBytesMax);
  TALLY_ASSERT(reservation.operation_id.size() <= limits::kOperationIdBytesMax);
  TALLY_ASSERT(reservation.origin.size() <= wire::kOriginBytesMax);
  TALLY_ASSERT(reservation.region.size() <= limits::kRegionBytesMax);
}

void buildPolicy(const PolicyRecord& record, schema::PolicyRecordV1::Builder builder) {
  TALLY_ASSERT(record.policy.budgets.size() <= limits::kBudgetsPerPolicyMax);
  for (const Budget& budget : record.policy.budgets) assertStorable(budget);
  wire::fromCore(record.policy, builder.initPolicy());
  builder.setRepublishedFrom(record.republished_from);
}

void buildAccount(const AccountRecord& record, schema::AccountRecordV1::Builder builder) {
  TALLY_ASSERT(record.key.subject.size() <= limits::kSubjectBytesMax);
  TALLY_ASSERT(record.key.route.size() <= limits::kRouteBytesMax);
  builder.setSubject(textOf(record.key.subject));
  builder.setRoute(textOf(record.key.route));
  builder.setGeneration(record.key.generation);
  const Balances& b = record.balances;
  builder.setOpening(b.opening);
  builder.setMinted(b.minted);
  builder.setOverdraftIssued(b.overdraft_issued);
  builder.setAvailable(b.available);
  builder.setReserved(b.reserved);
  builder.setSpent(b.spent);
  builder.setRetiredForEmergency(b.retired_for_emergency);
  builder.setOverdraftRepaid(b.overdraft_repaid);
  builder.setTransferredOut(b.transferred_out);
  builder.setRefillClockMs(record.refill_clock_ms);
  builder.setRefillCarry(record.refill_carry);
  builder.setOverdraftBreaches(record.breaches.count);
  builder.setOverdraftBreachUnits(record.breaches.units);
  builder.setPeriodEpochFirst(record.period.epoch_first);
  builder.setPeriodOpenedAtMs(record.period.opened_at_ms);
  wire::fromCore(record.period.opening, builder.initPeriodOpening());
}

void assertStorable(const AccountKey& key) {
  TALLY_ASSERT(key.subject.size() <= limits::kSubjectBytesMax);
  TALLY_ASSERT(key.route.size() <= limits::kRouteBytesMax);
}

void buildPeriodKey(const PeriodKey& key, schema::PeriodKeyV1::Builder builder) {
  assertStorable(key.key);
  builder.setSubject(textOf(key.key.subject));
  builder.setRoute(textOf(key.key.route));
  builder.setGeneration(key.key.generation);
  builder.setEpochFirst(key.epoch_first);
}

void buildPeriodSnapshot(const PeriodSnapshot& snapshot,
                         schema::PeriodSnapshotV1::Builder builder) {
  assertStorable(snapshot.key);
  TALLY_ASSERT(snapshot.epoch_first <= snapshot.epoch_last);
  wire::fromCore(snapshot, builder);
}

void buildReservation(const Reservation& reservation,
                      schema::ReservationRecordV1::Builder builder) {
  assertStorable(reservation);
  wire::fromCore(reservation, builder.initReservation());
  builder.setLateReceiptApplied(reservation.late_receipt_applied);
}

capnp::Data::Reader dataOf(const uint8_t* bytes, size_t size) {
  return capnp::Data::Reader(bytes, size);
}

void buildGateway(const GatewayRecord& record, schema::GatewayRecordV1::Builder builder) {
  TALLY_ASSERT(record.gateway_name.size() <= limits::kGatewayNameBytesMax);
  builder.setGatewayName(textOf(record.gateway_name));
  builder.setPublicKey(dataOf(record.public_key.data(), record.public_key.size()));
  builder.setEnabled(record.enabled);
  builder.setEnrolledAtMs(record.enrolled_at_ms);
  if (record.previous_public_key != PublicKey{}) {
    builder.setPreviousPublicKey(
        dataOf(record.previous_public_key.data(), record.previous_public_key.size()));
  }
  builder.setPreviousKeyUntilMs(record.previous_key_until_ms);
}

void buildShard(const ShardRecord& record, schema::ShardRecordV1::Builder builder) {
  wire::fromCore(record.grant, builder.initGrant());
  wire::fromCore(record.issue_request, builder.initIssueRequest());
  builder.setState(wire::enumFromCore(record.state));
  builder.setSpentUnits(record.spent_units);
  builder.setRemintedUnits(record.reminted_units);
  builder.setRetiredUnits(record.retired_units);
  builder.setDebtUnits(record.debt_units);
  builder.setReported(record.reported);
  builder.setReportBootEpoch(record.report_boot_epoch);
  const ShardBalances& b = record.last_reported;
  builder.setReportedLocalAvailable(b.local_available);
  builder.setReportedLocalReserved(b.local_reserved);
  builder.setReportedLocalSpent(b.local_spent);
  builder.setReportedLocalRetired(b.local_retired);
  builder.setReportedOverspent(b.overspent);
  auto receipts = builder.initReceipts(static_cast<unsigned>(record.receipts.size()));
  for (size_t i = 0; i < record.receipts.size(); ++i) {
    assertStorable(record.receipts[i]);
    wire::fromCore(record.receipts[i], receipts[static_cast<unsigned>(i)]);
  }
  builder.setRemintDueAtMs(record.remint_due_at_ms);
  builder.setRemintTargetUnits(record.remint_target_units);
}

void buildFence(const FenceRecord& record, schema::FenceRecordV1::Builder builder) {
  TALLY_ASSERT(record.key.subject.size() <= limits::kSubjectBytesMax);
  TALLY_ASSERT(record.key.route.size() <= limits::kRouteBytesMax);
  builder.setSubject(textOf(record.key.subject));
  builder.setRoute(textOf(record.key.route));
  builder.setFence(record.fence);
}

Blob finish(capnp::MessageBuilder& message) {
  kj::VectorOutputStream output(capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word));
  capnp::writePackedMessage(output, message);
  return kj::heapArray<kj::byte>(output.getArray());
}

// --- Readers (may throw kj::Exception; called only inside withRoot) ---------------------------

Result<PolicyRecord> readPolicy(schema::PolicyRecordV1::Reader reader) {
  Result<Policy> policy = wire::toCore(reader.getPolicy());
  if (!policy.isOk()) return Status::corruption("policy: " + policy.status().message());
  return PolicyRecord{.policy = std::move(policy).value(),
                      .republished_from = reader.getRepublishedFrom()};
}

Result<AccountRecord> readAccount(schema::AccountRecordV1::Reader reader) {
  AccountRecord record;
  if (reader.getSubject().size() > limits::kSubjectBytesMax ||
      reader.getRoute().size() > limits::kRouteBytesMax) {
    return Status::corruption("account: subject or route longer than allowed");
  }
  record.key.subject.assign(reader.getSubject().begin(), reader.getSubject().size());
  record.key.route.assign(reader.getRoute().begin(), reader.getRoute().size());
  record.key.generation = reader.getGeneration();
  Balances& b = record.balances;
  b.opening = reader.getOpening();
  b.minted = reader.getMinted();
  b.overdraft_issued = reader.getOverdraftIssued();
  b.available = reader.getAvailable();
  b.reserved = reader.getReserved();
  b.spent = reader.getSpent();
  b.retired_for_emergency = reader.getRetiredForEmergency();
  b.overdraft_repaid = reader.getOverdraftRepaid();
  b.transferred_out = reader.getTransferredOut();
  record.refill_clock_ms = reader.getRefillClockMs();
  record.refill_carry = reader.getRefillCarry();
  record.breaches = {.count = reader.getOverdraftBreaches(),
                     .units = reader.getOverdraftBreachUnits()};
  record.period.epoch_first = reader.getPeriodEpochFirst();
  record.period.opened_at_ms = reader.getPeriodOpenedAtMs();
  // Absent in an account stored before periods existed: all zero.
  if (Status status = wire::readBalances(reader.getPeriodOpening(), &record.period.opening);
      !status.isOk()) {
    return Status::corruption("account period opening: " + status.message());
  }
  return record;
}

Result<PeriodSnapshot> readPeriodSnapshot(schema::PeriodSnapshotV1::Reader reader) {
  PeriodSnapshot snapshot;
  if (Status status = wire::readPeriodSnapshot(reader, &snapshot); !status.isOk()) {
    return Status::corruption("period snapshot: " + status.message());
  }
  return snapshot;
}

Result<OperatorRecord> readOperatorRecord(schema::OperatorInfo::Reader reader) {
  Result<OperatorRecord> record = wire::toCore(reader);
  if (!record.isOk()) return Status::corruption("operator: " + record.status().message());
  return record;
}

Result<AuditLogEntry> readAuditLogEntry(schema::AuditLogEntry::Reader reader) {
  Result<AuditLogEntry> entry = wire::toCore(reader);
  if (!entry.isOk()) return Status::corruption("audit log entry: " + entry.status().message());
  return entry;
}

Result<PeriodKey> readPeriodKey(schema::PeriodKeyV1::Reader reader) {
  if (reader.getSubject().size() > limits::kSubjectBytesMax ||
      reader.getRoute().size() > limits::kRouteBytesMax) {
    return Status::corruption("period key: subject or route longer than allowed");
  }
  PeriodKey key;
  key.key.subject.assign(reader.getSubject().begin(), reader.getSubject().size());
  key.key.route.assign(reader.getRoute().begin(), reader.getRoute().size());
  key.key.generation = reader.getGeneration();
  key.epoch_first = reader.getEpochFirst();
  return key;
}

Result<Reservation> readReservation(schema::ReservationRecordV1::Reader reader) {
  Result<Reservation> reservation = wire::toCore(reader.getReservation());
  if (!reservation.isOk()) {
    return Status::corruption("reservation: " + reservation.status().message());
  }
  reservation.value().late_receipt_applied = reader.getLateReceiptApplied();
  return reservation;
}

Result<GatewayRecord> readGateway(schema::GatewayRecordV1::Reader reader) {
  GatewayRecord record;
  if (reader.getGatewayName().size() > limits::kGatewayNameBytesMax) {
    return Status::corruption("gateway: name longer than allowed");
  }
  if (reader.getPublicKey().size() != record.public_key.size()) {
    return Status::corruption("gateway: public key is not 32 bytes");
  }
  record.gateway_name.assign(reader.getGatewayName().begin(), reader.getGatewayName().size());
  std::memcpy(record.public_key.data(), reader.getPublicKey().begin(), record.public_key.size());
  record.enabled = reader.getEnabled();
  record.enrolled_at_ms = reader.getEnrolledAtMs();
  if (const capnp::Data::Reader previous = reader.getPreviousPublicKey(); previous.size() != 0) {
    if (previous.size() != record.previous_public_key.size()) {
      return Status::corruption("gateway: previous public key is not 32 bytes");
    }
    std::memcpy(record.previous_public_key.data(), previous.begin(),
                record.previous_public_key.size());
  }
  record.previous_key_until_ms = reader.getPreviousKeyUntilMs();
  return record;
}

Result<ShardRecord> readShard(schema::ShardRecordV1::Reader reader) {
  ShardRecord record;
  Result<ShardGrant> grant = wire::toCore(reader.getGrant());
  if (!grant.isOk()) return Status::corruption("shard grant: " + grant.status().message());
  record.grant = std::move(grant).value();
  Result<ShardIssueRequest> request = wire::toCore(reader.getIssueRequest());
  if (!request.isOk()) {
    return Status::corruption("shard issue request: " + request.status().message());
  }
  record.issue_request = std::move(request).value();
  std::optional<ShardState> state = wire::enumToCore(reader.getState());
  if (!state) return Status::corruption("shard: unknown state");
  record.state = *state;
  record.spent_units = reader.getSpentUnits();
  record.reminted_units = reader.getRemintedUnits();
  record.retired_units = reader.getRetiredUnits();
  record.debt_units = reader.getDebtUnits();
  record.reported = reader.getReported();
  record.report_boot_epoch = reader.getReportBootEpoch();
  record.last_reported = ShardBalances{.allocated = record.grant.allocated_units,
                                       .local_available = reader.getReportedLocalAvailable(),
                                       .local_reserved = reader.getReportedLocalReserved(),
                                       .local_spent = reader.getReportedLocalSpent(),
                                       .local_retired = reader.getReportedLocalRetired(),
                                       .overspent = reader.getReportedOverspent()};
  if (!record.reported) record.last_reported = ShardBalances{};
  if (reader.getReceipts().size() > limits::kShardReceiptsPerReportMax) {
    return Status::corruption("shard: too many receipts");
  }
  record.receipts.reserve(reader.getReceipts().size());
  for (auto receipt : reader.getReceipts()) {
    Result<Reservation> decoded = wire::toCore(receipt);
    if (!decoded.isOk()) return Status::corruption("shard receipt: " + decoded.status().message());
    record.receipts.push_back(std::move(decoded).value());
  }
  record.remint_due_at_ms = reader.getRemintDueAtMs();
  record.remint_target_units = reader.getRemintTargetUnits();
  return record;
}

Result<FenceRecord> readFence(schema::FenceRecordV1::Reader reader) {
  if (reader.getSubject().size() > limits::kSubjectBytesMax ||
      reader.getRoute().size() > limits::kRouteBytesMax) {
    return Status::corruption("fence: subject or route longer than allowed");
  }
  FenceRecord record;
  record.key.subject.assign(reader.getSubject().begin(), reader.getSubject().size());
  record.key.route.assign(reader.getRoute().begin(), reader.getRoute().size());
  record.fence = reader.getFence();
  return record;
}

// Decodes every element of `list` with `read` into `out`.
template <typename List, typename T, typename F>
Status readAll(List list, F&& read, std::vector<T>* out) {
  out->reserve(list.size());
  for (auto item : list) {
    Result<T> record = read(item);
    if (!record.isOk()) return record.status();
    out->push_back(std::move(record).value());
  }
  return Status::ok();
}

Result<StoreBatch> readBatch(schema::StoreBatchV1::Reader reader) {
  StoreBatch batch;
  batch.policies.reserve(reader.getPolicies().size());
  for (auto policy : reader.getPolicies()) {
    Result<PolicyRecord> record = readPolicy(policy);
    if (!record.isOk()) return record.status();
    batch.policies.push_back(std::move(record).value());
  }
  batch.accounts.reserve(reader.getAccounts().size());
  for (auto account : reader.getAccounts()) {
    Result<AccountRecord> record = readAccount(account);
    if (!record.isOk()) return record.status();
    batch.accounts.push_back(std::move(record).value());
  }
  batch.reservations.reserve(reader.getReservations().size());
  for (auto reservation : reader.getReservations()) {
    Result<Reservation> record = readReservation(reservation);
    if (!record.isOk()) return record.status();
    batch.reservations.push_back(std::move(record).value());
  }
  batch.deleted_reservations.reserve(reader.getDeletedReservations().size());
  for (capnp::Text::Reader id : reader.getDeletedReservations()) {
    if (id.size() > limits::kReservationIdBytesMax) {
      return Status::corruption("deletedReservations: id longer than allowed");
    }
    batch.deleted_reservations.emplace_back(id.begin(), id.size());
  }
  batch.ledger_clock_ms = reader.getLedgerClockMs();
  if (Status status = readAll(reader.getGateways(), readGateway, &batch.gateways); !status.isOk()) {
    return status;
  }
  if (Status status = readAll(reader.getShards(), readShard, &batch.shards); !status.isOk()) {
    return status;
  }
  if (Status status = readAll(reader.getFences(), readFence, &batch.fences); !status.isOk()) {
    return status;
  }
  batch.shard_sequence = reader.getShardSequence();
  batch.deleted_shards.reserve(reader.getDeletedShards().size());
  for (capnp::Text::Reader id : reader.getDeletedShards()) {
    if (id.size() > wire::kOriginBytesMax) {
      return Status::corruption("deletedShards: id longer than allowed");
    }
    batch.deleted_shards.emplace_back(id.begin(), id.size());
  }
  if (Status status =
          readAll(reader.getPeriodSnapshots(), readPeriodSnapshot, &batch.period_snapshots);
      !status.isOk()) {
    return status;
  }
  if (Status status = readAll(reader.getDeletedPeriodSnapshots(), readPeriodKey,
                              &batch.deleted_period_snapshots);
      !status.isOk()) {
    return status;
  }
  if (Status status = readAll(reader.getOperators(), readOperatorRecord, &batch.operators);
      !status.isOk()) {
    return status;
  }
  if (Status status = readAll(reader.getAuditLog(), readAuditLogEntry, &batch.audit_log);
      !status.isOk()) {
    return status;
  }
  batch.audit_log_kept_from = reader.getAuditLogKeptFrom();
  return batch;
}

uint64_t batchWordsEstimate(const StoreBatch& batch) {
  return kWordsOverhead + kWordsPerPolicy * batch.policies.size() +
         kWordsPerAccount * batch.accounts.size() +
         kWordsPerReservation * batch.reservations.size() +
         kWordsPerDeletion * batch.deleted_reservations.size() +
         kWordsPerGateway * batch.gateways.size() + kWordsPerShard * batch.shards.size() +
         kWordsPerFence * batch.fences.size() +
         kWordsPerPeriodSnapshot * batch.period_snapshots.size() +
         kWordsPerDeletion * batch.deleted_period_snapshots.size() +
         kWordsPerGateway * batch.operators.size() +
         kWordsPerAuditLogEntry * batch.audit_log.size();
}

void buildBatch(const StoreBatch& batch, schema::StoreBatchV1::Builder builder) {
  auto policies = builder.initPolicies(static_cast<unsigned>(batch.policies.size()));
  for (size_t i = 0; i < batch.policies.size(); ++i) buildPolicy(batch.policies[i], policies[i]);
  auto accounts = builder.initAccounts(static_cast<unsigned>(batch.accounts.size()));
  for (size_t i = 0; i < batch.accounts.size(); ++i) buildAccount(batch.accounts[i], accounts[i]);
  auto reservations = builder.initReservations(static_cast<unsigned>(batch.reservations.size()));
  for (size_t i = 0; i < batch.reservations.size(); ++i) {
    buildReservation(batch.reservations[i], reservations[i]);
  }
  auto deleted =
      builder.initDeletedReservations(static_cast<unsigned>(batch.deleted_reservations.size()));
  for (size_t i = 0; i < batch.deleted_reservations.size(); ++i) {
    TALLY_ASSERT(batch.deleted_reservations[i].size() <= limits::kReservationIdBytesMax);
    deleted.set(static_cast<unsigned>(i), textOf(batch.deleted_reservations[i]));
  }
  builder.setLedgerClockMs(batch.ledger_clock_ms);
  auto gateways = builder.initGateways(static_cast<unsigned>(batch.gateways.size()));
  for (size_t i = 0; i < batch.gateways.size(); ++i) {
    buildGateway(batch.gateways[i], gateways[static_cast<unsigned>(i)]);
  }
  auto shards = builder.initShards(static_cast<unsigned>(batch.shards.size()));
  for (size_t i = 0; i < batch.shards.size(); ++i) {
    buildShard(batch.shards[i], shards[static_cast<unsigned>(i)]);
  }
  auto fences = builder.initFences(static_cast<unsigned>(batch.fences.size()));
  for (size_t i = 0; i < batch.fences.size(); ++i) {
    buildFence(batch.fences[i], fences[static_cast<unsigned>(i)]);
  }
  builder.setShardSequence(batch.shard_sequence);
  auto deleted_shards =
      builder.initDeletedShards(static_cast<unsigned>(batch.deleted_shards.size()));
  for (size_t i = 0; i < batch.deleted_shards.size(); ++i) {
    TALLY_ASSERT(batch.deleted_shards[i].size() <= wire::kOriginBytesMax);
    deleted_shards.set(static_cast<unsigned>(i), textOf(batch.deleted_shards[i]));
  }
  auto snapshots =
      builder.initPeriodSnapshots(static_cast<unsigned>(batch.period_snapshots.size()));
  for (size_t i = 0; i < batch.period_snapshots.size(); ++i) {
    buildPeriodSnapshot(batch.period_snapshots[i], snapshots[static_cast<unsigned>(i)]);
  }
  auto deleted_periods = builder.initDeletedPeriodSnapshots(
      static_cast<unsigned>(batch.deleted_period_snapshots.size()));
  for (size_t i = 0; i < batch.deleted_period_snapshots.size(); ++i) {
    buildPeriodKey(batch.deleted_period_snapshots[i], deleted_periods[static_cast<unsigned>(i)]);
  }
  auto operators = builder.initOperators(static_cast<unsigned>(batch.operators.size()));
  for (size_t i = 0; i < batch.operators.size(); ++i) {
    wire::fromCore(batch.operators[i], operators[static_cast<unsigned>(i)]);
  }
  auto audit_log = builder.initAuditLog(static_cast<unsigned>(batch.audit_log.size()));
  for (size_t i = 0; i < batch.audit_log.size(); ++i) {
    wire::fromCore(batch.audit_log[i], audit_log[static_cast<unsigned>(i)]);
  }
  builder.setAuditLogKeptFrom(batch.audit_log_kept_from);
}

}  // namespace

// A kj output stream over a byte vector that keeps its capacity between messages.
class BatchEncoder::Output final : public kj::BufferedOutputStream {
 public:
  void clear() { filled_ = 0; }
  void reserve(size_t bytes) {
    if (buffer_.size() < bytes) buffer_.resize(bytes);
  }
  void release() { buffer_ = {}; }
  size_t capacity() const { return buffer_.size(); }
  std::span<const uint8_t> bytes() const { return {buffer_.data(), filled_}; }

  kj::ArrayPtr<kj::byte> getWriteBuffer() override {
    if (filled_ == buffer_.size()) grow(filled_ + 1);
    return kj::arrayPtr(buffer_.data() + filled_, buffer_.size() - filled_);
  }
  void write(const void* source, size_t size) override {
    if (source == buffer_.data() + filled_ && size <= buffer_.size() - filled_) {
      filled_ += size;  // written into getWriteBuffer()'s space
      return;
    }
    if (buffer_.size() - filled_ < size) grow(filled_ + size);
    std::memcpy(buffer_.data() + filled_, source, size);
    filled_ += size;
  }

 private:
  void grow(size_t bytes_min) { buffer_.resize(std::max(bytes_min, buffer_.size() * 2)); }

  std::vector<uint8_t> buffer_;
  size_t filled_ = 0;
};

BatchEncoder::BatchEncoder() : output_(std::make_unique<Output>()) {}
BatchEncoder::~BatchEncoder() = default;

std::span<const uint8_t> BatchEncoder::encode(const StoreBatch& batch) {
  const uint64_t words = std::min<uint64_t>(batchWordsEstimate(batch), kFirstSegmentWordsMax);
  if (first_segment_.size() < words) {
    first_segment_ = kj::heapArray<capnp::word>(words);
    std::memset(first_segment_.begin(), 0, first_segment_.size() * sizeof(capnp::word));
  }
  // The previous batch's bytes are no longer the caller's: a buffer a huge batch grew goes.
  if (output_->capacity() > kKeptBytesMax) output_->release();
  output_->clear();
  {
    // Zeroes what it used of first_segment_ again when destroyed.
    capnp::MallocMessageBuilder message(first_segment_.asPtr());
    buildBatch(batch, message.initRoot<schema::StoreBatchV1>());
    output_->reserve(kFlatMarkerBytes +
                     capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word));
    static constexpr std::array<kj::byte, kFlatMarkerBytes> kMarker{};
    output_->write(kMarker.data(), kMarker.size());
    capnp::writeMessage(*output_, message);
  }
  if (first_segment_.size() * sizeof(capnp::word) > kKeptBytesMax) first_segment_ = nullptr;
  return output_->bytes();
}

Blob encodeBatch(const StoreBatch& batch) {
  BatchEncoder encoder;
  const std::span<const uint8_t> bytes = encoder.encode(batch);
  return kj::heapArray<kj::byte>(bytes.data(), bytes.size());
}

Blob encodePeriodSnapshotRecord(const PeriodSnapshot& snapshot) {
  capnp::MallocMessageBuilder message(kWordsPerPeriodSnapshot * 2);
  buildPeriodSnapshot(snapshot, message.initRoot<schema::PeriodSnapshotV1>());
  return finish(message);
}

Result<PeriodSnapshot> decodePeriodSnapshotRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::PeriodSnapshotV1, PeriodSnapshot>(bytes, readPeriodSnapshot);
}

Blob encodeOperatorRecord(const OperatorRecord& record) {
  capnp::MallocMessageBuilder message(kWordsPerGateway * 2);
  wire::fromCore(record, message.initRoot<schema::OperatorInfo>());
  return finish(message);
}

Result<OperatorRecord> decodeOperatorRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::OperatorInfo, OperatorRecord>(bytes, readOperatorRecord);
}

Blob encodeAuditLogEntry(const AuditLogEntry& entry) {
  capnp::MallocMessageBuilder message(kWordsPerAuditLogEntry * 2);
  wire::fromCore(entry, message.initRoot<schema::AuditLogEntry>());
  return finish(message);
}

Result<AuditLogEntry> decodeAuditLogEntry(std::span<const uint8_t> bytes) {
  return withRoot<schema::AuditLogEntry, AuditLogEntry>(bytes, readAuditLogEntry);
}

Blob encodePolicyRecord(const PolicyRecord& record) {
  capnp::MallocMessageBuilder message(kWordsPerPolicy);
  buildPolicy(record, message.initRoot<schema::PolicyRecordV1>());
  return finish(message);
}

Blob encodeAccountRecord(const AccountRecord& record) {
  capnp::MallocMessageBuilder message(kWordsPerAccount * 2);
  buildAccount(record, message.initRoot<schema::AccountRecordV1>());
  return finish(message);
}

Blob encodeReservationRecord(const Reservation& reservation) {
  capnp::MallocMessageBuilder message(kWordsPerReservation * 2);
  buildReservation(reservation, message.initRoot<schema::ReservationRecordV1>());
  return finish(message);
}

Blob encodeGatewayRecord(const GatewayRecord& record) {
  capnp::MallocMessageBuilder message(kWordsPerGateway * 2);
  buildGateway(record, message.initRoot<schema::GatewayRecordV1>());
  return finish(message);
}

Blob encodeShardRecord(const ShardRecord& record) {
  capnp::MallocMessageBuilder message(kWordsPerShard * 2);
  buildShard(record, message.initRoot<schema::ShardRecordV1>());
  return finish(message);
}

Result<GatewayRecord> decodeGatewayRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::GatewayRecordV1, GatewayRecord>(bytes, readGateway);
}

Result<ShardRecord> decodeShardRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::ShardRecordV1, ShardRecord>(bytes, readShard);
}

Result<StoreBatch> decodeBatch(std::span<const uint8_t> bytes) {
  return withRoot<schema::StoreBatchV1, StoreBatch>(bytes, readBatch);
}

Result<PolicyRecord> decodePolicyRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::PolicyRecordV1, PolicyRecord>(bytes, readPolicy);
}

Result<AccountRecord> decodeAccountRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::AccountRecordV1, AccountRecord>(bytes, readAccount);
}

Result<Reservation> decodeReservationRecord(std::span<const uint8_t> bytes) {
  return withRoot<schema::ReservationRecordV1, Reservation>(bytes, readReservation);
}

// --- BatchFolder ------------------------------------------------------------------------------

// One added blob and its message; the readers in Index point into them. Non-movable.
struct BatchFolder::Message {
  explicit Message(Blob blob) : bytes(kj::mv(blob)), message(blobBytes(bytes), nullptr) {}
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;

  kj::Array<kj::byte> bytes;
  BlobMessage message;
};

// The latest image of each row, as readers into the messages. nullopt: deleted.
struct BatchFolder::Index {
  using AccountKeyView = std::tuple<std::string_view, std::string_view, uint64_t>;
  std::unordered_map<std::string_view, std::optional<schema::ReservationRecordV1::Reader>>
      reservations;
  std::map<AccountKeyView, schema::AccountRecordV1::Reader> accounts;
  std::map<uint64_t, schema::PolicyRecordV1::Reader> policies;
  std::map<std::string_view, schema::GatewayRecordV1::Reader> gateways;
  std::map<std::string_view, std::optional<schema::ShardRecordV1::Reader>> shards;
  std::map<std::pair<std::string_view, std::string_view>, schema::FenceRecordV1::Reader> fences;
  using PeriodKeyView = std::tuple<std::string_view, std::string_view, uint64_t, uint64_t>;
  std::map<PeriodKeyView, std::optional<schema::PeriodSnapshotV1::Reader>> period_snapshots;
  std::map<std::string_view, schema::OperatorInfo::Reader> operators;
  std::map<uint64_t, schema::AuditLogEntry::Reader> audit_log;
  uint64_t audit_log_kept_from = 0;
  uint64_t ledger_clock_ms = 0;
  uint64_t shard_sequence = 0;
};

namespace {
std::string_view viewOf(capnp::Text::Reader text) { return {text.begin(), text.size()}; }
}  // namespace

BatchFolder::BatchFolder() : index_(std::make_unique<Index>()) {}
BatchFolder::~BatchFolder() = default;

Status BatchFolder::add(Blob blob) {
  if (blob.size() == 0) return Status::corruption("empty blob");
  try {
    auto message = std::make_unique<Message>(kj::mv(blob));
    auto batch = message->message.reader().getRoot<schema::StoreBatchV1>();
    Index& index = *index_;
    // Deletions first: an id compacted and then reused within the batch ends up present.
    for (capnp::Text::Reader id : batch.getDeletedReservations()) {
      if (id.size() > limits::kReservationIdBytesMax) {
        return Status::corruption("deletedReservations: id longer than allowed");
      }
      index.reservations[viewOf(id)] = std::nullopt;
    }
    for (auto record : batch.getReservations()) {
      index.reservations[viewOf(record.getReservation().getReservationId())] = record;
    }
    for (auto record : batch.getAccounts()) {
      index.accounts.insert_or_assign(
          Index::AccountKeyView{viewOf(record.getSubject()), viewOf(record.getRoute()),
                                record.getGeneration()},
          record);
    }
    for (auto record : batch.getPolicies()) {
      index.policies.insert_or_assign(record.getPolicy().getGeneration(), record);
    }
    for (auto record : batch.getGateways()) {
      index.gateways.insert_or_assign(viewOf(record.getGatewayName()), record);
    }
    for (capnp::Text::Reader id : batch.getDeletedShards()) {
      if (id.size() > wire::kOriginBytesMax) {
        return Status::corruption("deletedShards: id longer than allowed");
      }
      index.shards.insert_or_assign(viewOf(id), std::nullopt);
    }
    for (auto record : batch.getShards()) {
      index.shards.insert_or_assign(viewOf(record.getGrant().getShardId()), record);
    }
    for (auto record : batch.getFences()) {
      index.fences.insert_or_assign(
          std::pair{viewOf(record.getSubject()), viewOf(record.getRoute())}, record);
    }
    // Deletions first, as for reservations.
    for (auto key : batch.getDeletedPeriodSnapshots()) {
      index.period_snapshots.insert_or_assign(
          Index::PeriodKeyView{viewOf(key.getSubject()), viewOf(key.getRoute()),
                               key.getGeneration(), key.getEpochFirst()},
          std::nullopt);
    }
    for (auto record : batch.getPeriodSnapshots()) {
      index.period_snapshots.insert_or_assign(
          Index::PeriodKeyView{viewOf(record.getSubject()), viewOf(record.getRoute()),
                               record.getPolicyGeneration(), record.getEpochFirst()},
          record);
    }
    for (auto record : batch.getOperators()) {
      index.operators.insert_or_assign(viewOf(record.getOperatorName()), record);
    }
    // Drops first, as deletions: the appends of the batch are above its kept_from.
    if (uint64_t kept_from = batch.getAuditLogKeptFrom(); kept_from > index.audit_log_kept_from) {
      index.audit_log_kept_from = kept_from;
      index.audit_log.erase(index.audit_log.begin(), index.audit_log.lower_bound(kept_from));
    }
    for (auto entry : batch.getAuditLog()) {
      index.audit_log.insert_or_assign(entry.getSequence(), entry);
    }
    index.ledger_clock_ms = std::max(index.ledger_clock_ms, batch.getLedgerClockMs());
    index.shard_sequence = std::max(index.shard_sequence, batch.getShardSequence());
    messages_.push_back(std::move(message));
    return Status::ok();
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed message: ") +
                              exception.getDescription().cStr());
  }
}

Result<StoreBatch> BatchFolder::finish() const {
  StoreBatch batch;
  if (Status status = finishInto(&batch); !status.isOk()) return status;
  return batch;
}

Status BatchFolder::finishInto(StoreBatch* out) const {
  const Index& index = *index_;
  StoreBatch& batch = *out;
  batch.clear();
  try {
    batch.policies.reserve(index.policies.size());
    for (const auto& [generation, reader] : index.policies) {
      Result<PolicyRecord> record = readPolicy(reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.policies.push_back(std::move(record).value());
    }
    batch.accounts.reserve(index.accounts.size());
    for (const auto& [key, reader] : index.accounts) {
      Result<AccountRecord> record = readAccount(reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.accounts.push_back(std::move(record).value());
    }
    batch.reservations.reserve(index.reservations.size());
    for (const auto& [id, reader] : index.reservations) {
      if (!reader) {
        batch.deleted_reservations.emplace_back(id);
        continue;
      }
      Result<Reservation> record = readReservation(*reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.reservations.push_back(std::move(record).value());
    }
    for (const auto& [name, reader] : index.gateways) {
      Result<GatewayRecord> record = readGateway(reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.gateways.push_back(std::move(record).value());
    }
    for (const auto& [id, reader] : index.shards) {
      if (!reader) {
        batch.deleted_shards.emplace_back(id);
        continue;
      }
      Result<ShardRecord> record = readShard(*reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.shards.push_back(std::move(record).value());
    }
    for (const auto& [key, reader] : index.fences) {
      Result<FenceRecord> record = readFence(reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.fences.push_back(std::move(record).value());
    }
    for (const auto& [key, reader] : index.period_snapshots) {
      if (!reader) {
        batch.deleted_period_snapshots.push_back(
            PeriodKey{.key = {.subject = std::string(std::get<0>(key)),
                              .route = std::string(std::get<1>(key)),
                              .generation = std::get<2>(key)},
                      .epoch_first = std::get<3>(key)});
        continue;
      }
      Result<PeriodSnapshot> record = readPeriodSnapshot(*reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.period_snapshots.push_back(std::move(record).value());
    }
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed message: ") +
                              exception.getDescription().cStr());
  }
  try {
    for (const auto& [name, reader] : index.operators) {
      Result<OperatorRecord> record = readOperatorRecord(reader);
      if (!record.isOk()) return asCorruption(record.status());
      batch.operators.push_back(std::move(record).value());
    }
    for (const auto& [sequence, reader] : index.audit_log) {
      Result<AuditLogEntry> entry = readAuditLogEntry(reader);
      if (!entry.isOk()) return asCorruption(entry.status());
      batch.audit_log.push_back(std::move(entry).value());
    }
  } catch (const kj::Exception& exception) {
    return Status::corruption(std::string("malformed message: ") +
                              exception.getDescription().cStr());
  }
  batch.audit_log_kept_from = index.audit_log_kept_from;
  batch.ledger_clock_ms = index.ledger_clock_ms;
  batch.shard_sequence = index.shard_sequence;
  return Status::ok();
}

}  // namespace tally::ledger
