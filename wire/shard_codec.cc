// Conversions of the gateway and emergency-shard messages (SPEC §6); declared in wire/codec.h.

#include <string>
#include <utility>

#include "wire/codec.h"
#include "wire/enum_mapping.h"
#include "wire/field_codec.h"

namespace tally::wire {
namespace {

using field::catchDecodeErrors;
using field::checkListSize;
using field::checkReceiptUnits;
using field::dataOf;
using field::readBytes;
using field::readEnum;
using field::readList;
using field::readText;
using field::readUnits;
using field::textOf;
using field::withContext;

// Whether an absent signature is acceptable (reads as all zeros): only in our own replies.
enum class SignatureRule : uint8_t { kRequired, kOptional };

Status readSignature(capnp::Data::Reader data, SignatureRule rule, const char* name,
                     Signature* out) {
  if (data.size() == 0 && rule == SignatureRule::kOptional) {
    *out = Signature{};
    return Status::ok();
  }
  return readBytes(data, name, out);
}

Status readShardId(capnp::Text::Reader text, const char* name, std::string* out) {
  return readText(text, kOriginBytesMax, name, out);
}

Status readGatewayName(capnp::Text::Reader text, const char* name, std::string* out) {
  return readText(text, limits::kGatewayNameBytesMax, name, out);
}

Status readGrant(schema::EmergencyShardV1::Reader reader, SignatureRule rule, ShardGrant* out) {
  TALLY_WIRE_RETURN_IF_ERROR(readShardId(reader.getShardId(), "shardId", &out->shard_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out->subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out->route));
  out->policy_generation = reader.getPolicyGeneration();
  out->accounting_epoch_ms = reader.getAccountingEpochMs();
  TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getGatewayId(), "gatewayId", &out->gateway_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out->gateway_name));
  out->gateway_boot_epoch = reader.getGatewayBootEpoch();
  out->fence = reader.getFence();
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getAllocatedUnits(), "allocatedUnits", &out->allocated_units));
  out->issued_at_ms = reader.getIssuedAtMs();
  out->expires_at_ms = reader.getExpiresAtMs();
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getLedgerKeyId(), kKeyIdBytesMax, "ledgerKeyId", &out->ledger_key_id));
  return readSignature(reader.getSignature(), rule, "signature", &out->signature);
}

Result<ShardIssueRequest> readIssueRequest(schema::ShardIssueRequestV1::Reader reader) {
  ShardIssueRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRequestId(), kShardRequestIdBytesMax, "requestId", &out.request_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getGatewayId(), "gatewayId", &out.gateway_id));
  out.gateway_boot_epoch = reader.getGatewayBootEpoch();
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out.route));
  TALLY_WIRE_RETURN_IF_ERROR(
      readSignature(reader.getSignature(), SignatureRule::kRequired, "signature", &out.signature));
  return out;
}

Result<ShardReport> readReport(schema::ShardReportV1::Reader reader) {
  ShardReport out;
  if (Status status = readGrant(reader.getShard(), SignatureRule::kRequired, &out.shard);
      !status.isOk()) {
    return withContext(status, "shard");
  }
  out.balances.allocated = out.shard.allocated_units;
  ShardBalances& balances = out.balances;
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getLocalAvailable(), "localAvailable", &balances.local_available));
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getLocalReserved(), "localReserved", &balances.local_reserved));
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getLocalSpent(), "localSpent", &balances.local_spent));
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getLocalRetired(), "localRetired", &balances.local_retired));
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getOverspentUnits(), "overspentUnits", &balances.overspent));
  auto receipts = reader.getReceipts();
  // Checked before anything of the list is converted.
  TALLY_WIRE_RETURN_IF_ERROR(
      checkListSize(receipts.size(), limits::kShardReceiptsPerReportMax, "receipts"));
  out.receipts.reserve(receipts.size());
  for (uint32_t i = 0; i < receipts.size(); ++i) {
    Result<Reservation> receipt = toCore(receipts[i]);
    if (!receipt.isOk())
      return withContext(receipt.status(), "receipts[" + std::to_string(i) + "]");
    if (Status status = checkReceiptUnits(receipt.value()); !status.isOk()) {
      return withContext(status, "receipts[" + std::to_string(i) + "]");
    }
    out.receipts.push_back(std::move(receipt).value());
  }
  out.gateway_boot_epoch = reader.getGatewayBootEpoch();
  out.reported_at_ms = reader.getReportedAtMs();
  TALLY_WIRE_RETURN_IF_ERROR(
      readSignature(reader.getSignature(), SignatureRule::kRequired, "signature", &out.signature));
  return out;
}

Result<GatewayRecord> readGateway(schema::GatewayInfo::Reader reader) {
  GatewayRecord out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getPublicKey(), "publicKey", &out.public_key));
  out.enabled = reader.getEnabled();
  out.enrolled_at_ms = reader.getEnrolledAtMs();
  if (reader.hasPreviousPublicKey() && reader.getPreviousPublicKey().size() != 0) {
    TALLY_WIRE_RETURN_IF_ERROR(
        readBytes(reader.getPreviousPublicKey(), "previousPublicKey", &out.previous_public_key));
  }
  out.previous_key_until_ms = reader.getPreviousKeyUntilMs();
  return out;
}

// The numbers of a ShardAudit; the grant's identifying fields are read by the caller.
void readAuditNumbers(schema::ShardAudit::Reader reader, ShardLedgerView* out) {
  out->spent_units = reader.getSpentUnits();
  out->reminted_units = reader.getRemintedUnits();
  out->retired_units = reader.getRetiredUnits();
  out->debt_units = reader.getDebtUnits();
  out->written_off = reader.getWrittenOff();
  out->conserved = reader.getConserved();
  out->reported = reader.getReported();
  out->last_reported = {.allocated = out->reported ? reader.getAllocatedUnits() : 0,
                        .local_available = reader.getReportedLocalAvailable(),
                        .local_reserved = reader.getReportedLocalReserved(),
                        .local_spent = reader.getReportedLocalSpent(),
                        .local_retired = reader.getReportedLocalRetired(),
                        .overspent = reader.getReportedOverspent()};
}

Result<ShardLedgerView> readShardAudit(schema::ShardAudit::Reader reader) {
  ShardLedgerView out;
  ShardGrant& grant = out.grant;
  TALLY_WIRE_RETURN_IF_ERROR(readShardId(reader.getShardId(), "shardId", &grant.shard_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &grant.gateway_name));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &grant.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &grant.route));
  grant.policy_generation = reader.getPolicyGeneration();
  grant.allocated_units = reader.getAllocatedUnits();
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getState(), "state", &out.state));
  readAuditNumbers(reader, &out);
  return out;
}

Result<ShardLedgerView> readShardInfo(schema::ShardInfo::Reader reader) {
  ShardLedgerView out;
  if (Status status = readGrant(reader.getShard(), SignatureRule::kOptional, &out.grant);
      !status.isOk()) {
    return withContext(status, "shard");
  }
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getState(), "state", &out.state));
  out.current_fence = reader.getCurrentFence();
  readAuditNumbers(reader.getAudit(), &out);
  return out;
}

Result<GatewayReply> readGatewayReply(schema::GatewayReply::Reader reader) {
  GatewayReply out;
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out.code));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getMessage(), kMessageBytesMax, "message", &out.message));
  TALLY_WIRE_RETURN_IF_ERROR(
      readList(reader.getGateways(), kGatewaysPerReplyMax, "gateways", readGateway, &out.gateways));
  out.duplicate = reader.getDuplicate();
  return out;
}

Result<ShardReply> readShardReply(schema::ShardReply::Reader reader) {
  ShardReply out;
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out.code));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getMessage(), kMessageBytesMax, "message", &out.message));
  TALLY_WIRE_RETURN_IF_ERROR(
      readList(reader.getShards(), kShardsPerReplyMax, "shards", readShardInfo, &out.shards));
  out.duplicate = reader.getDuplicate();
  out.reminted_units = reader.getRemintedUnits();
  out.spent_units = reader.getSpentUnits();
  out.debt_units = reader.getDebtUnits();
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getLimitingDimension(), "limitingDimension", &out.limiting_dimension));
  out.permission_denied = reader.getPermissionDenied();
  return out;
}

// --- Requests ---------------------------------------------------------------------------------

Result<EnrollGatewayRequest> readEnroll(schema::EnrollGatewayRequest::Reader reader) {
  EnrollGatewayRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getPublicKey(), "publicKey", &out.public_key));
  out.rotate = reader.getRotate();
  out.rotate_overlap_ms = reader.getRotateOverlapMs();
  return out;
}

Result<SetGatewayEnabledRequest> readSetEnabled(schema::SetGatewayEnabledRequest::Reader reader) {
  SetGatewayEnabledRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  out.enabled = reader.getEnabled();
  return out;
}

Result<ShardStatusRequest> readStatus(schema::ShardStatusRequest::Reader reader) {
  ShardStatusRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  auto ids = reader.getShardIds();
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(ids.size(), kShardIdsPerRequestMax, "shardIds"));
  out.shard_ids.resize(ids.size());
  for (uint32_t i = 0; i < ids.size(); ++i) {
    const std::string name = "shardIds[" + std::to_string(i) + "]";
    TALLY_WIRE_RETURN_IF_ERROR(readShardId(ids[i], name.c_str(), &out.shard_ids[i]));
  }
  return out;
}

Result<ListShardsRequest> readListShards(schema::ListShardsRequest::Reader reader) {
  ListShardsRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  const capnp::Text::Reader state = reader.getState();
  if (state.size() > 0) {
    ShardState parsed = ShardState::kIssued;
    if (!parseShardState(std::string(state.begin(), state.size()), &parsed)) {
      constexpr size_t kShownBytesMax = 32;
      return Status::invalidArgument(
          "state: unknown shard state \"" +
          std::string(state.begin(), std::min<size_t>(state.size(), kShownBytesMax)) + "\"");
    }
    out.state = parsed;
  }
  return out;
}

Result<RevokeShardsRequest> readRevoke(schema::RevokeShardsRequest::Reader reader) {
  RevokeShardsRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readShardId(reader.getShardId(), "shardId", &out.shard_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readGatewayName(reader.getGatewayName(), "gatewayName", &out.gateway_name));
  return out;
}

Result<WriteOffShardRequest> readWriteOff(schema::WriteOffShardRequest::Reader reader) {
  WriteOffShardRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readShardId(reader.getShardId(), "shardId", &out.shard_id));
  return out;
}

// --- Writers ----------------------------------------------------------------------------------

void writeAudit(const ShardLedgerView& view, schema::ShardAudit::Builder builder) {
  const ShardGrant& grant = view.grant;
  builder.setShardId(textOf(grant.shard_id));
  builder.setGatewayName(textOf(grant.gateway_name));
  builder.setSubject(textOf(grant.subject));
  builder.setRoute(textOf(grant.route));
  builder.setPolicyGeneration(grant.policy_generation);
  builder.setState(enumFromCore(view.state));
  builder.setAllocatedUnits(grant.allocated_units);
  builder.setSpentUnits(view.spent_units);
  builder.setRemintedUnits(view.reminted_units);
  builder.setRetiredUnits(view.retired_units);
  builder.setDebtUnits(view.debt_units);
  builder.setWrittenOff(view.written_off);
  builder.setConserved(view.conserved);
  builder.setReported(view.reported);
  builder.setReportedLocalAvailable(view.last_reported.local_available);
  builder.setReportedLocalReserved(view.last_reported.local_reserved);
  builder.setReportedLocalSpent(view.last_reported.local_spent);
  builder.setReportedLocalRetired(view.last_reported.local_retired);
  builder.setReportedOverspent(view.last_reported.overspent);
}

}  // namespace

// --- toCore: each guarded, since a caller may hand us a reader over untrusted bytes ----------

Result<ShardGrant> toCore(schema::EmergencyShardV1::Reader reader) {
  return catchDecodeErrors([&]() -> Result<ShardGrant> {
    ShardGrant grant;
    TALLY_WIRE_RETURN_IF_ERROR(readGrant(reader, SignatureRule::kRequired, &grant));
    return grant;
  });
}
Result<ShardIssueRequest> toCore(schema::ShardIssueRequestV1::Reader reader) {
  return catchDecodeErrors([&] { return readIssueRequest(reader); });
}
Result<ShardReport> toCore(schema::ShardReportV1::Reader reader) {
  return catchDecodeErrors([&] { return readReport(reader); });
}
Result<GatewayRecord> toCore(schema::GatewayInfo::Reader reader) {
  return catchDecodeErrors([&] { return readGateway(reader); });
}
Result<ShardLedgerView> toCore(schema::ShardInfo::Reader reader) {
  return catchDecodeErrors([&] { return readShardInfo(reader); });
}
Result<ShardLedgerView> toCore(schema::ShardAudit::Reader reader) {
  return catchDecodeErrors([&] { return readShardAudit(reader); });
}
Result<EnrollGatewayRequest> toCore(schema::EnrollGatewayRequest::Reader reader) {
  return catchDecodeErrors([&] { return readEnroll(reader); });
}
Result<SetGatewayEnabledRequest> toCore(schema::SetGatewayEnabledRequest::Reader reader) {
  return catchDecodeErrors([&] { return readSetEnabled(reader); });
}
Result<ShardStatusRequest> toCore(schema::ShardStatusRequest::Reader reader) {
  return catchDecodeErrors([&] { return readStatus(reader); });
}
Result<ListShardsRequest> toCore(schema::ListShardsRequest::Reader reader) {
  return catchDecodeErrors([&] { return readListShards(reader); });
}
Result<RevokeShardsRequest> toCore(schema::RevokeShardsRequest::Reader reader) {
  return catchDecodeErrors([&] { return readRevoke(reader); });
}
Result<WriteOffShardRequest> toCore(schema::WriteOffShardRequest::Reader reader) {
  return catchDecodeErrors([&] { return readWriteOff(reader); });
}
Result<GatewayReply> toCore(schema::GatewayReply::Reader reader) {
  return catchDecodeErrors([&] { return readGatewayReply(reader); });
}
Result<ShardReply> toCore(schema::ShardReply::Reader reader) {
  return catchDecodeErrors([&] { return readShardReply(reader); });
}

// --- fromCore ---------------------------------------------------------------------------------

void fromCore(const ShardGrant& grant, schema::EmergencyShardV1::Builder builder) {
  builder.setShardId(textOf(grant.shard_id));
  builder.setSubject(textOf(grant.subject));
  builder.setRoute(textOf(grant.route));
  builder.setPolicyGeneration(grant.policy_generation);
  builder.setAccountingEpochMs(grant.accounting_epoch_ms);
  builder.setGatewayId(dataOf(grant.gateway_id));
  builder.setGatewayBootEpoch(grant.gateway_boot_epoch);
  builder.setFence(grant.fence);
  builder.setAllocatedUnits(grant.allocated_units);
  builder.setIssuedAtMs(grant.issued_at_ms);
  builder.setExpiresAtMs(grant.expires_at_ms);
  builder.setLedgerKeyId(textOf(grant.ledger_key_id));
  builder.setSignature(dataOf(grant.signature));
  builder.setGatewayName(textOf(grant.gateway_name));
}

void fromCore(const ShardIssueRequest& request, schema::ShardIssueRequestV1::Builder builder) {
  builder.setRequestId(textOf(request.request_id));
  builder.setGatewayName(textOf(request.gateway_name));
  builder.setGatewayId(dataOf(request.gateway_id));
  builder.setGatewayBootEpoch(request.gateway_boot_epoch);
  builder.setSubject(textOf(request.subject));
  builder.setRoute(textOf(request.route));
  builder.setSignature(dataOf(request.signature));
}

void fromCore(const ShardReport& report, schema::ShardReportV1::Builder builder) {
  fromCore(report.shard, builder.initShard());
  builder.setLocalAvailable(report.balances.local_available);
  builder.setLocalReserved(report.balances.local_reserved);
  builder.setLocalSpent(report.balances.local_spent);
  builder.setLocalRetired(report.balances.local_retired);
  auto receipts = builder.initReceipts(static_cast<capnp::uint>(report.receipts.size()));
  for (size_t i = 0; i < report.receipts.size(); ++i) {
    fromCore(report.receipts[i], receipts[static_cast<capnp::uint>(i)]);
  }
  builder.setGatewayBootEpoch(report.gateway_boot_epoch);
  builder.setSignature(dataOf(report.signature));
  builder.setOverspentUnits(report.balances.overspent);
  builder.setReportedAtMs(report.reported_at_ms);
}

void fromCore(const GatewayRecord& record, schema::GatewayInfo::Builder builder) {
  builder.setGatewayName(textOf(record.gateway_name));
  builder.setPublicKey(dataOf(record.public_key));
  builder.setEnabled(record.enabled);
  builder.setEnrolledAtMs(record.enrolled_at_ms);
  if (record.previous_public_key != PublicKey{}) {
    builder.setPreviousPublicKey(dataOf(record.previous_public_key));
  }
  builder.setPreviousKeyUntilMs(record.previous_key_until_ms);
}

void fromCore(const ShardLedgerView& view, schema::ShardInfo::Builder builder) {
  fromCore(view.grant, builder.initShard());
  builder.setState(enumFromCore(view.state));
  builder.setCurrentFence(view.current_fence);
  writeAudit(view, builder.initAudit());
}

void fromCore(const ShardLedgerView& view, schema::ShardAudit::Builder builder) {
  writeAudit(view, builder);
}

void fromCore(const EnrollGatewayRequest& request, schema::EnrollGatewayRequest::Builder builder) {
  builder.setGatewayName(textOf(request.gateway_name));
  builder.setPublicKey(dataOf(request.public_key));
  builder.setRotate(request.rotate);
  builder.setRotateOverlapMs(request.rotate_overlap_ms);
}

void fromCore(const SetGatewayEnabledRequest& request,
              schema::SetGatewayEnabledRequest::Builder builder) {
  builder.setGatewayName(textOf(request.gateway_name));
  builder.setEnabled(request.enabled);
}

void fromCore(const ShardStatusRequest& request, schema::ShardStatusRequest::Builder builder) {
  builder.setGatewayName(textOf(request.gateway_name));
  auto ids = builder.initShardIds(static_cast<capnp::uint>(request.shard_ids.size()));
  for (size_t i = 0; i < request.shard_ids.size(); ++i) {
    ids.set(static_cast<capnp::uint>(i), textOf(request.shard_ids[i]));
  }
}

void fromCore(const ListShardsRequest& request, schema::ListShardsRequest::Builder builder) {
  builder.setGatewayName(textOf(request.gateway_name));
  if (request.state) builder.setState(shardStateName(*request.state));
}

void fromCore(const RevokeShardsRequest& request, schema::RevokeShardsRequest::Builder builder) {
  builder.setShardId(textOf(request.shard_id));
  builder.setGatewayName(textOf(request.gateway_name));
}

void fromCore(const WriteOffShardRequest& request, schema::WriteOffShardRequest::Builder builder) {
  builder.setShardId(textOf(request.shard_id));
}

void fromCore(const GatewayReply& reply, schema::GatewayReply::Builder builder) {
  builder.setCode(enumFromCore(reply.code));
  builder.setMessage(textOf(reply.message));
  auto gateways = builder.initGateways(static_cast<capnp::uint>(reply.gateways.size()));
  for (size_t i = 0; i < reply.gateways.size(); ++i) {
    fromCore(reply.gateways[i], gateways[static_cast<capnp::uint>(i)]);
  }
  builder.setDuplicate(reply.duplicate);
}

void fromCore(const ShardReply& reply, schema::ShardReply::Builder builder) {
  builder.setCode(enumFromCore(reply.code));
  builder.setMessage(textOf(reply.message));
  auto shards = builder.initShards(static_cast<capnp::uint>(reply.shards.size()));
  for (size_t i = 0; i < reply.shards.size(); ++i) {
    fromCore(reply.shards[i], shards[static_cast<capnp::uint>(i)]);
  }
  builder.setDuplicate(reply.duplicate);
  builder.setRemintedUnits(reply.reminted_units);
  builder.setSpentUnits(reply.spent_units);
  builder.setDebtUnits(reply.debt_units);
  builder.setLimitingDimension(enumFromCore(reply.limiting_dimension));
  builder.setPermissionDenied(reply.permission_denied);
}

}  // namespace tally::wire
