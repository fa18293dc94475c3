// Conversions of the operator and audit-log messages (docs/security.md "Operators", "Audit
// log"); declared in wire/codec.h.

#include <optional>
#include <string>
#include <utility>

#include "wire/codec.h"
#include "wire/field_codec.h"

namespace tally::wire {
namespace {

using field::catchDecodeErrors;
using field::dataOf;
using field::readBytes;
using field::readEnum;
using field::readList;
using field::readText;
using field::textOf;

std::optional<OperatorRole> roleToCore(schema::OperatorRole value) {
  switch (value) {
    case schema::OperatorRole::AUDIT: return OperatorRole::kAudit;
    case schema::OperatorRole::POLICY: return OperatorRole::kPolicy;
    case schema::OperatorRole::SHARDS: return OperatorRole::kShards;
    case schema::OperatorRole::ADMIN: return OperatorRole::kAdmin;
  }
  return std::nullopt;
}

schema::OperatorRole roleFromCore(OperatorRole value) {
  switch (value) {
    case OperatorRole::kAudit: return schema::OperatorRole::AUDIT;
    case OperatorRole::kPolicy: return schema::OperatorRole::POLICY;
    case OperatorRole::kShards: return schema::OperatorRole::SHARDS;
    case OperatorRole::kAdmin: return schema::OperatorRole::ADMIN;
  }
  return schema::OperatorRole::AUDIT;
}

Status readRole(schema::OperatorRole value, OperatorRole* out) {
  std::optional<OperatorRole> role = roleToCore(value);
  if (!role) {
    return Status::invalidArgument("role: unknown value " +
                                   std::to_string(static_cast<uint16_t>(value)));
  }
  *out = *role;
  return Status::ok();
}

Status readOperatorName(capnp::Text::Reader text, std::string* out) {
  return readText(text, limits::kOperatorNameBytesMax, "operatorName", out);
}

Result<OperatorRecord> readOperator(schema::OperatorInfo::Reader reader) {
  OperatorRecord out;
  TALLY_WIRE_RETURN_IF_ERROR(readOperatorName(reader.getOperatorName(), &out.name));
  TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getPublicKey(), "publicKey", &out.public_key));
  TALLY_WIRE_RETURN_IF_ERROR(readRole(reader.getRole(), &out.role));
  out.enabled = reader.getEnabled();
  out.enrolled_at_ms = reader.getEnrolledAtMs();
  return out;
}

Result<AuditLogEntry> readEntry(schema::AuditLogEntry::Reader reader) {
  constexpr uint64_t kTextMax = limits::kAuditLogTextBytesMax;
  AuditLogEntry out;
  out.sequence = reader.getSequence();
  out.at_ms = reader.getAtMs();
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getActor(), kTextMax, "actor", &out.actor));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getActorKind(), kTextMax, "actorKind", &out.actor_kind));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getActorRole(), kTextMax, "actorRole", &out.actor_role));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getAction(), kTextMax, "action", &out.action));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getTarget(), kTextMax, "target", &out.target));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getOutcome(), kTextMax, "outcome", &out.outcome));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getDetail(), kTextMax, "detail", &out.detail));
  TALLY_WIRE_RETURN_IF_ERROR(
      readBytes(reader.getRequestDigest(), "requestDigest", &out.request_digest));
  return out;
}

}  // namespace

Result<OperatorRecord> toCore(schema::OperatorInfo::Reader reader) {
  return catchDecodeErrors([&] { return readOperator(reader); });
}

Result<AuditLogEntry> toCore(schema::AuditLogEntry::Reader reader) {
  return catchDecodeErrors([&] { return readEntry(reader); });
}

Result<EnrollOperatorRequest> toCore(schema::EnrollOperatorRequest::Reader reader) {
  return catchDecodeErrors([&]() -> Result<EnrollOperatorRequest> {
    EnrollOperatorRequest out;
    TALLY_WIRE_RETURN_IF_ERROR(readOperatorName(reader.getOperatorName(), &out.operator_name));
    TALLY_WIRE_RETURN_IF_ERROR(readBytes(reader.getPublicKey(), "publicKey", &out.public_key));
    TALLY_WIRE_RETURN_IF_ERROR(readRole(reader.getRole(), &out.role));
    return out;
  });
}

Result<SetOperatorEnabledRequest> toCore(schema::SetOperatorEnabledRequest::Reader reader) {
  return catchDecodeErrors([&]() -> Result<SetOperatorEnabledRequest> {
    SetOperatorEnabledRequest out;
    TALLY_WIRE_RETURN_IF_ERROR(readOperatorName(reader.getOperatorName(), &out.operator_name));
    out.enabled = reader.getEnabled();
    return out;
  });
}

Result<AuditLogRequest> toCore(schema::AuditLogRequest::Reader reader) {
  return AuditLogRequest{.after_sequence = reader.getAfterSequence(),
                         .entries_max = reader.getEntriesMax()};
}

Result<OperatorReply> toCore(schema::OperatorReply::Reader reader) {
  return catchDecodeErrors([&]() -> Result<OperatorReply> {
    OperatorReply out;
    TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out.code));
    TALLY_WIRE_RETURN_IF_ERROR(
        readText(reader.getMessage(), kMessageBytesMax, "message", &out.message));
    TALLY_WIRE_RETURN_IF_ERROR(readList(reader.getOperators(), limits::kOperatorsMax + 1,
                                        "operators", readOperator, &out.operators));
    out.duplicate = reader.getDuplicate();
    return out;
  });
}

Result<AuditLogReply> toCore(schema::AuditLogReply::Reader reader) {
  return catchDecodeErrors([&]() -> Result<AuditLogReply> {
    AuditLogReply out;
    TALLY_WIRE_RETURN_IF_ERROR(readList(reader.getEntries(), limits::kAuditLogEntriesPerReplyMax,
                                        "entries", readEntry, &out.entries));
    out.more = reader.getMore();
    out.first_kept_sequence = reader.getFirstKeptSequence();
    out.last_sequence = reader.getLastSequence();
    return out;
  });
}

void fromCore(const OperatorRecord& record, schema::OperatorInfo::Builder builder) {
  builder.setOperatorName(textOf(record.name));
  builder.setPublicKey(dataOf(record.public_key));
  builder.setRole(roleFromCore(record.role));
  builder.setEnabled(record.enabled);
  builder.setEnrolledAtMs(record.enrolled_at_ms);
}

void fromCore(const AuditLogEntry& entry, schema::AuditLogEntry::Builder builder) {
  builder.setSequence(entry.sequence);
  builder.setAtMs(entry.at_ms);
  builder.setActor(textOf(entry.actor));
  builder.setActorKind(textOf(entry.actor_kind));
  builder.setActorRole(textOf(entry.actor_role));
  builder.setAction(textOf(entry.action));
  builder.setTarget(textOf(entry.target));
  builder.setOutcome(textOf(entry.outcome));
  builder.setDetail(textOf(entry.detail));
  builder.setRequestDigest(dataOf(entry.request_digest));
}

void fromCore(const EnrollOperatorRequest& request,
              schema::EnrollOperatorRequest::Builder builder) {
  builder.setOperatorName(textOf(request.operator_name));
  builder.setPublicKey(dataOf(request.public_key));
  builder.setRole(roleFromCore(request.role));
}

void fromCore(const SetOperatorEnabledRequest& request,
              schema::SetOperatorEnabledRequest::Builder builder) {
  builder.setOperatorName(textOf(request.operator_name));
  builder.setEnabled(request.enabled);
}

void fromCore(const AuditLogRequest& request, schema::AuditLogRequest::Builder builder) {
  builder.setAfterSequence(request.after_sequence);
  builder.setEntriesMax(request.entries_max);
}

void fromCore(const OperatorReply& reply, schema::OperatorReply::Builder builder) {
  builder.setCode(enumFromCore(reply.code));
  builder.setMessage(textOf(reply.message));
  auto operators = builder.initOperators(static_cast<capnp::uint>(reply.operators.size()));
  for (size_t i = 0; i < reply.operators.size(); ++i) {
    fromCore(reply.operators[i], operators[static_cast<capnp::uint>(i)]);
  }
  builder.setDuplicate(reply.duplicate);
}

void fromCore(const AuditLogReply& reply, schema::AuditLogReply::Builder builder) {
  auto entries = builder.initEntries(static_cast<capnp::uint>(reply.entries.size()));
  for (size_t i = 0; i < reply.entries.size(); ++i) {
    fromCore(reply.entries[i], entries[static_cast<capnp::uint>(i)]);
  }
  builder.setMore(reply.more);
  builder.setFirstKeptSequence(reply.first_kept_sequence);
  builder.setLastSequence(reply.last_sequence);
}

}  // namespace tally::wire
