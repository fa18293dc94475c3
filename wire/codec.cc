#include "wire/codec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include "wire/enum_mapping.h"
#include "wire/field_codec.h"
#include "wire/frame.h"
#include "wire/period_codec.h"
#include "wire/scratch_message.h"

namespace tally::wire {
namespace {

using field::catchDecodeErrors;
using field::checkListSize;
using field::checkReceiptUnits;
using field::dataOf;
using field::readEnum;
using field::readText;
using field::readUnits;
using field::textOf;
using field::withContext;

Status readDigest(capnp::Data::Reader data, const char* name, Digest* out) {
  return field::readBytes(data, name, out);
}

// --- Decode boundary --------------------------------------------------------------------------

// Runs `read` on the message in `frame`. Cap'n Proto reads words in place, so a frame at a
// word-aligned address (a FrameDecoder frame is its own heap allocation) is read where it is;
// one at any other offset of a buffer is copied into word-aligned memory first. R is what `read`
// returns: a Result<T>, or a Status when it reads into a caller's object.
template <typename R, typename F>
R withMessage(std::span<const uint8_t> frame, F&& read) {
  if (frame.empty() || frame.size() % sizeof(capnp::word) != 0) {
    return Status::corruption("message of " + std::to_string(frame.size()) +
                              " bytes is not a positive whole number of 8-byte words");
  }
  kj::Array<capnp::word> copy;
  kj::ArrayPtr<const capnp::word> words;
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(capnp::word) == 0) {
    words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(frame.data()),
                         frame.size() / sizeof(capnp::word));
  } else {
    copy = kj::heapArray<capnp::word>(frame.size() / sizeof(capnp::word));
    std::memcpy(copy.begin(), frame.data(), frame.size());
    words = copy.asPtr();
  }
  // A message may read at most a few times its own size: a small frame must not decode into a
  // large value (a list of N empty structs costs nothing on the wire and N elements here;
  // capnp charges each one word of this limit). Found by tests/fuzz agent_core.
  capnp::ReaderOptions options = decodeReaderOptions();
  options.traversalLimitInWords = std::min<uint64_t>(
      options.traversalLimitInWords, kDecodeTraversalWordsPerMessageWord * words.size() + 64);
  return catchDecodeErrors([&]() -> R {
    capnp::FlatArrayMessageReader message(words, options);
    if (message.getEnd() != words.end()) {
      return Status::corruption(
          "message is followed by " +
          std::to_string((words.end() - message.getEnd()) * sizeof(capnp::word)) +
          " trailing bytes");
    }
    return read(message);
  });
}

// --- Policy and reservation -------------------------------------------------------------------

Status readBudget(schema::AdmissionBudgetV1::Reader reader, Budget* out) {
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getSubjectPattern(), limits::kSubjectBytesMax,
                                      "subjectPattern", &out->subject_pattern));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out->route));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRegion(), limits::kRegionBytesMax, "region", &out->region));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getUnit(), limits::kUnitNameBytesMax, "unit", &out->unit));
  out->refill_per_second = reader.getRefillPerSecond();
  out->burst = reader.getBurst();
  out->max_single_reservation = reader.getMaxSingleReservation();
  out->hold_ttl_ms = reader.getHoldTtlMs();
  out->hard_execution_limit_ms = reader.getHardExecutionLimitMs();
  out->max_overdraft = reader.getMaxOverdraft();
  out->priority = reader.getPriority();
  out->weight = reader.getWeight();
  out->fairness_budget_permille = reader.getFairnessBudgetPermille();
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getEstimatorDigest(), kEstimatorDigestBytesMax,
                                      "estimatorDigest", &out->estimator_digest));
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getAccountingEpoch(), "accountingEpoch", &out->accounting_epoch));
  auto emergency = reader.getEmergency();
  out->emergency.enabled = emergency.getEnabled();
  out->emergency.shard_units = emergency.getShardUnits();
  out->emergency.shard_ttl_ms = emergency.getShardTtlMs();
  auto rollout = reader.getRollout();
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(rollout.getMode(), "rollout.mode", &out->rollout.mode));
  out->rollout.percent = rollout.getPercent();
  return Status::ok();
}

Status readBudgets(capnp::List<schema::AdmissionBudgetV1>::Reader list, std::vector<Budget>* out) {
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(list.size(), limits::kBudgetsPerPolicyMax, "budgets"));
  out->reserve(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    Budget budget;
    if (Status status = readBudget(list[i], &budget); !status.isOk()) {
      return withContext(status, "budgets[" + std::to_string(i) + "]");
    }
    out->push_back(std::move(budget));
  }
  return Status::ok();
}

Result<Budget> readBudget(schema::AdmissionBudgetV1::Reader reader) {
  Budget budget;
  TALLY_WIRE_RETURN_IF_ERROR(readBudget(reader, &budget));
  return budget;
}

Result<Policy> readPolicy(schema::PolicyV1::Reader reader) {
  Policy policy;
  policy.generation = reader.getGeneration();
  TALLY_WIRE_RETURN_IF_ERROR(readBudgets(reader.getBudgets(), &policy.budgets));
  return policy;
}

// Into *out, every field (a reused object keeps its strings' buffers): decoding in place, not
// moving the result through each layer, is most of what reading a reply costs (a Reservation's
// eight strings move field by field; docs/PERFORMANCE.md).
Status readReservation(schema::LimitReservationV1::Reader reader, Reservation* reservation) {
  // Every field is read below but this one, which is not on the wire: the strings keep their
  // buffers when `reservation` is reused (tally-bench decodes every answer into one).
  // CodecResponse.DecodingIntoOneResponseGivesWhatAFreshDecodeGives checks that nothing is left.
  reservation->late_receipt_applied = false;
  Reservation& out = *reservation;
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getReservationId(), limits::kReservationIdBytesMax,
                                      "reservationId", &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readDigest(reader.getRequestDigest(), "requestDigest", &out.request_digest));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out.route));
  out.policy_generation = reader.getPolicyGeneration();
  out.accounting_epoch_ms = reader.getAccountingEpochMs();
  // Unbounded here: the ledger's store reads its records through this too, and a restore names
  // a stored value above the bounds itself. Receipts from a peer go through checkReceiptUnits.
  out.reserved_units = reader.getReservedUnits();
  out.actual_units = reader.getActualUnits();
  out.refunded_units = reader.getRefundedUnits();
  out.debt_units = reader.getDebtUnits();
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getOperationId(), limits::kOperationIdBytesMax,
                                      "operationId", &out.operation_id));
  out.created_at_ms = reader.getCreatedAtMs();
  out.expires_at_ms = reader.getExpiresAtMs();
  out.started_at_ms = reader.getStartedAtMs();
  out.closed_at_ms = reader.getClosedAtMs();
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getState(), "state", &out.state));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getOrigin(), kOriginBytesMax, "origin", &out.origin));
  out.closed_by_hard_limit = reader.getClosedByHardLimit();
  out.overdraft_breach = reader.getOverdraftBreach();
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getLimitingDimension(), "limitingDimension", &out.limiting_dimension));
  out.priority = reader.getPriority();
  out.requested_generation = reader.getRequestedGeneration();
  out.request_fields_known = reader.getRequestFieldsKnown();
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRegion(), limits::kRegionBytesMax, "region", &out.region));
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getGatewayName(), limits::kGatewayNameBytesMax,
                                      "gatewayName", &out.gateway_name));
  out.retry_after_ms = reader.getRetryAfterMs();
  return Status::ok();
}

Result<Reservation> readReservation(schema::LimitReservationV1::Reader reader) {
  Reservation out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservation(reader, &out));
  return out;
}

// --- Requests ---------------------------------------------------------------------------------

Status readReservationId(capnp::Text::Reader text, std::string* out) {
  return readText(text, limits::kReservationIdBytesMax, "reservationId", out);
}

Status readOperationId(capnp::Text::Reader text, std::string* out) {
  return readText(text, limits::kOperationIdBytesMax, "operationId", out);
}

Result<ReserveRequest> readReserve(schema::ReserveRequest::Reader reader) {
  ReserveRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readDigest(reader.getRequestDigest(), "requestDigest", &out.request_digest));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out.route));
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(reader.getUnits(), "units", &out.units));
  out.policy_generation = reader.getPolicyGeneration();
  out.priority = reader.getPriority();
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRegion(), limits::kRegionBytesMax, "region", &out.region));
  return out;
}

Result<StartRequest> readStart(schema::StartRequest::Reader reader) {
  StartRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readOperationId(reader.getOperationId(), &out.operation_id));
  return out;
}

Result<SettleRequest> readSettle(schema::SettleRequest::Reader reader) {
  SettleRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readOperationId(reader.getOperationId(), &out.operation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(reader.getActualUnits(), "actualUnits", &out.actual_units));
  return out;
}

Result<ReleaseRequest> readRelease(schema::ReleaseRequest::Reader reader) {
  ReleaseRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  return out;
}

Result<QueryRequest> readQuery(schema::QueryRequest::Reader reader) {
  QueryRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  return out;
}

Result<MarkUnknownRequest> readMarkUnknown(schema::MarkUnknownRequest::Reader reader) {
  MarkUnknownRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readOperationId(reader.getOperationId(), &out.operation_id));
  return out;
}

Result<ReportOperationRequest> readReportOperation(schema::ReportOperationRequest::Reader reader) {
  ReportOperationRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readOperationId(reader.getOperationId(), &out.operation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readUnits(reader.getActualUnits(), "actualUnits", &out.actual_units));
  return out;
}

Result<ExtendRequest> readExtend(schema::ExtendRequest::Reader reader) {
  ExtendRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationId(reader.getReservationId(), &out.reservation_id));
  TALLY_WIRE_RETURN_IF_ERROR(readOperationId(reader.getOperationId(), &out.operation_id));
  TALLY_WIRE_RETURN_IF_ERROR(
      readUnits(reader.getReservedUnitsTotal(), "reservedUnitsTotal", &out.reserved_units_total));
  return out;
}

Result<AuditRequest> readAudit(schema::AuditRequest::Reader reader) {
  AuditRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out.route));
  if (reader.getPeriodSet()) out.period = reader.getPeriod();
  out.list_periods = reader.getListPeriods();
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getAfterSubject(), limits::kSubjectBytesMax,
                                      "afterSubject", &out.after_subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getAfterRoute(), limits::kRouteBytesMax, "afterRoute", &out.after_route));
  out.routes_max = reader.getRoutesMax();
  return out;
}

Result<PublishPolicyRequest> readPublishPolicy(schema::PublishPolicyRequest::Reader reader) {
  PublishPolicyRequest out;
  TALLY_WIRE_RETURN_IF_ERROR(readBudgets(reader.getBudgets(), &out.budgets));
  return out;
}

Result<ShowPolicyRequest> readShowPolicy(schema::ShowPolicyRequest::Reader reader) {
  return ShowPolicyRequest{.generation = reader.getGeneration(),
                           .unless_generation = reader.getUnlessGeneration()};
}

template <typename Variant, typename T>
Result<Variant> lift(Result<T> result) {
  if (!result.isOk()) return result.status();
  return Variant(std::move(result).value());
}

Result<RequestBody> readRequestBody(schema::Request::Reader reader) {
  switch (reader.which()) {
    case schema::Request::UNSPECIFIED: return RequestBody(UnknownMessage{});
    case schema::Request::RESERVE: return lift<RequestBody>(readReserve(reader.getReserve()));
    case schema::Request::START: return lift<RequestBody>(readStart(reader.getStart()));
    case schema::Request::SETTLE: return lift<RequestBody>(readSettle(reader.getSettle()));
    case schema::Request::RELEASE: return lift<RequestBody>(readRelease(reader.getRelease()));
    case schema::Request::QUERY: return lift<RequestBody>(readQuery(reader.getQuery()));
    case schema::Request::MARK_UNKNOWN:
      return lift<RequestBody>(readMarkUnknown(reader.getMarkUnknown()));
    case schema::Request::REPORT_OPERATION:
      return lift<RequestBody>(readReportOperation(reader.getReportOperation()));
    case schema::Request::AUDIT: return lift<RequestBody>(readAudit(reader.getAudit()));
    case schema::Request::HEALTH: return RequestBody(HealthRequest{});
    case schema::Request::PUBLISH_POLICY:
      return lift<RequestBody>(readPublishPolicy(reader.getPublishPolicy()));
    case schema::Request::ROLLBACK_POLICY: return RequestBody(RollbackPolicyRequest{});
    case schema::Request::SHOW_POLICY:
      return lift<RequestBody>(readShowPolicy(reader.getShowPolicy()));
    case schema::Request::ENROLL_GATEWAY:
      return lift<RequestBody>(toCore(reader.getEnrollGateway()));
    case schema::Request::LIST_GATEWAYS: return RequestBody(ListGatewaysRequest{});
    case schema::Request::SET_GATEWAY_ENABLED:
      return lift<RequestBody>(toCore(reader.getSetGatewayEnabled()));
    case schema::Request::ISSUE_SHARD: return lift<RequestBody>(toCore(reader.getIssueShard()));
    case schema::Request::REPORT_SHARD: return lift<RequestBody>(toCore(reader.getReportShard()));
    case schema::Request::SHARD_STATUS: return lift<RequestBody>(toCore(reader.getShardStatus()));
    case schema::Request::LIST_SHARDS: return lift<RequestBody>(toCore(reader.getListShards()));
    case schema::Request::REVOKE_SHARDS: return lift<RequestBody>(toCore(reader.getRevokeShards()));
    case schema::Request::WRITE_OFF_SHARD:
      return lift<RequestBody>(toCore(reader.getWriteOffShard()));
    case schema::Request::EXTEND: return lift<RequestBody>(readExtend(reader.getExtend()));
    case schema::Request::ENROLL_OPERATOR:
      return lift<RequestBody>(toCore(reader.getEnrollOperator()));
    case schema::Request::SET_OPERATOR_ENABLED:
      return lift<RequestBody>(toCore(reader.getSetOperatorEnabled()));
    case schema::Request::LIST_OPERATORS: return RequestBody(ListOperatorsRequest{});
    case schema::Request::AUDIT_LOG: return lift<RequestBody>(toCore(reader.getAuditLog()));
  }
  // A member appended by a newer peer.
  return RequestBody(UnknownMessage{.which = static_cast<uint16_t>(reader.which())});
}

Result<Request> readRequest(schema::Request::Reader reader) {
  Result<RequestBody> body = readRequestBody(reader);
  if (!body.isOk()) return body.status();
  return Request{.request_id = reader.getRequestId(), .body = std::move(body).value()};
}

// --- Replies ----------------------------------------------------------------------------------

Status readReservationReply(schema::ReservationReply::Reader reader, ReservationReply* out) {
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out->code));
  out->duplicate = reader.getDuplicate();
  out->refunded_units = reader.getRefundedUnits();
  if (reader.hasReceipt()) {
    if (Status s = readReservation(reader.getReceipt(), &out->receipt); !s.isOk()) {
      return withContext(std::move(s), "receipt");
    }
    if (Status s = checkReceiptUnits(out->receipt); !s.isOk()) {
      return withContext(std::move(s), "receipt");
    }
  } else {
    out->receipt = Reservation{};
  }
  return readText(reader.getMessage(), kMessageBytesMax, "message", &out->message);
}

Result<ReservationReply> readReservationReply(schema::ReservationReply::Reader reader) {
  ReservationReply out;
  TALLY_WIRE_RETURN_IF_ERROR(readReservationReply(reader, &out));
  return out;
}

Result<PolicyAnswer> readPolicyReply(schema::PolicyReply::Reader reader) {
  PolicyAnswer out;
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out.reply.code));
  out.reply.generation = reader.getGeneration();
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getMessage(), kMessageBytesMax, "message", &out.reply.message));
  if (reader.hasPolicy()) {
    Result<Policy> policy = readPolicy(reader.getPolicy());
    if (!policy.isOk()) return withContext(policy.status(), "policy");
    out.policy = std::move(policy).value();
  }
  return out;
}

Status readAccount(schema::AccountAudit::Reader reader, AccountView* out) {
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getSubject(), limits::kSubjectBytesMax, "subject", &out->key.subject));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getRoute(), limits::kRouteBytesMax, "route", &out->key.route));
  out->key.generation = reader.getPolicyGeneration();
  out->accounting_epoch_ms = reader.getAccountingEpochMs();
  TALLY_WIRE_RETURN_IF_ERROR(
      readEnum(reader.getGenerationState(), "generationState", &out->generation_state));
  out->debt = reader.getDebt();
  Balances& balances = out->balances;
  balances.opening = reader.getOpening();
  balances.minted = reader.getMinted();
  balances.overdraft_issued = reader.getOverdraftIssued();
  balances.available = reader.getAvailable();
  balances.reserved = reader.getReserved();
  balances.spent = reader.getSpent();
  balances.retired_for_emergency = reader.getRetiredForEmergency();
  balances.overdraft_repaid = reader.getOverdraftRepaid();
  balances.transferred_out = reader.getTransferredOut();
  out->conserved = reader.getConserved();
  out->overdraft_breaches = {.count = reader.getOverdraftBreaches(),
                             .units = reader.getOverdraftBreachUnits()};
  return Status::ok();
}

Result<AuditReport> readAuditReply(schema::AuditReply::Reader reader) {
  AuditReport out;
  auto accounts = reader.getAccounts();
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(accounts.size(), limits::kAccountsMax, "accounts"));
  out.accounts.reserve(accounts.size());
  for (uint32_t i = 0; i < accounts.size(); ++i) {
    AccountView view;
    if (Status status = readAccount(accounts[i], &view); !status.isOk()) {
      return withContext(status, "accounts[" + std::to_string(i) + "]");
    }
    out.accounts.push_back(std::move(view));
  }
  out.conserved = reader.getConserved();
  out.as_of_ms = reader.getAsOfMs();
  auto violations = reader.getViolations();
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(violations.size(), kViolationsMax, "violations"));
  out.violations.reserve(violations.size());
  for (uint32_t i = 0; i < violations.size(); ++i) {
    std::string violation;
    TALLY_WIRE_RETURN_IF_ERROR(
        readText(violations[i], kMessageBytesMax, "violations[]", &violation));
    out.violations.push_back(std::move(violation));
  }
  auto shards = reader.getShards();
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(shards.size(), kShardsPerReplyMax, "shards"));
  out.shards.reserve(shards.size());
  for (uint32_t i = 0; i < shards.size(); ++i) {
    Result<ShardLedgerView> shard = toCore(shards[i]);
    if (!shard.isOk()) return withContext(shard.status(), "shards[" + std::to_string(i) + "]");
    out.shards.push_back(std::move(shard).value());
  }
  if (reader.getPeriodSet()) out.period_epoch = reader.getPeriodEpoch();
  auto snapshots = reader.getPeriodSnapshots();
  TALLY_WIRE_RETURN_IF_ERROR(
      checkListSize(snapshots.size(), limits::kAccountsMax, "periodSnapshots"));
  out.period_snapshots.resize(snapshots.size());
  for (uint32_t i = 0; i < snapshots.size(); ++i) {
    if (Status status = readPeriodSnapshot(snapshots[i], &out.period_snapshots[i]);
        !status.isOk()) {
      return withContext(status, "periodSnapshots[" + std::to_string(i) + "]");
    }
  }
  auto periods = reader.getClosedPeriods();
  TALLY_WIRE_RETURN_IF_ERROR(checkListSize(periods.size(), limits::kAccountsMax, "closedPeriods"));
  out.closed_periods.resize(periods.size());
  for (uint32_t i = 0; i < periods.size(); ++i) {
    if (Status status = readClosedPeriod(periods[i], &out.closed_periods[i]); !status.isOk()) {
      return withContext(status, "closedPeriods[" + std::to_string(i) + "]");
    }
  }
  out.more = reader.getMore();
  return out;
}

Result<HealthReply> readHealthReply(schema::HealthReply::Reader reader) {
  HealthReply out;
  TALLY_WIRE_RETURN_IF_ERROR(readText(reader.getStatus(), kMessageBytesMax, "status", &out.status));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getVersion(), kMessageBytesMax, "version", &out.version));
  out.now_ms = reader.getNowMs();
  return out;
}

Result<ErrorReply> readErrorReply(schema::ErrorReply::Reader reader) {
  ErrorReply out;
  TALLY_WIRE_RETURN_IF_ERROR(readEnum(reader.getCode(), "code", &out.code));
  TALLY_WIRE_RETURN_IF_ERROR(
      readText(reader.getMessage(), kMessageBytesMax, "message", &out.message));
  return out;
}

Result<ResponseBody> readResponseBody(schema::Response::Reader reader) {
  switch (reader.which()) {
    case schema::Response::UNSPECIFIED: return ResponseBody(UnknownMessage{});
    case schema::Response::RESERVATION:
      return lift<ResponseBody>(readReservationReply(reader.getReservation()));
    case schema::Response::POLICY: return lift<ResponseBody>(readPolicyReply(reader.getPolicy()));
    case schema::Response::AUDIT: return lift<ResponseBody>(readAuditReply(reader.getAudit()));
    case schema::Response::HEALTH: return lift<ResponseBody>(readHealthReply(reader.getHealth()));
    case schema::Response::ERROR: return lift<ResponseBody>(readErrorReply(reader.getError()));
    case schema::Response::GATEWAY: return lift<ResponseBody>(toCore(reader.getGateway()));
    case schema::Response::SHARD: return lift<ResponseBody>(toCore(reader.getShard()));
    case schema::Response::OPERATORS: return lift<ResponseBody>(toCore(reader.getOperators()));
    case schema::Response::AUDIT_LOG: return lift<ResponseBody>(toCore(reader.getAuditLog()));
  }
  return ResponseBody(UnknownMessage{.which = static_cast<uint16_t>(reader.which())});
}

// A reservation reply, nearly every answer, is read into *out's body in place (into the one it
// already holds, if any); the rest, rare, are read whole and moved there.
Status readResponse(schema::Response::Reader reader, Response* out) {
  out->request_id = reader.getRequestId();
  if (reader.which() == schema::Response::RESERVATION) {
    auto* reply = std::get_if<ReservationReply>(&out->body);
    if (reply == nullptr) reply = &out->body.emplace<ReservationReply>();
    return readReservationReply(reader.getReservation(), reply);
  }
  Result<ResponseBody> body = readResponseBody(reader);
  if (!body.isOk()) return body.status();
  out->body = std::move(body).value();
  return Status::ok();
}

Result<Response> readResponse(schema::Response::Reader reader) {
  Response out;
  TALLY_WIRE_RETURN_IF_ERROR(readResponse(reader, &out));
  return out;
}

}  // namespace

capnp::ReaderOptions decodeReaderOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kDecodeTraversalLimitWords;
  options.nestingLimit = kDecodeNestingLimit;
  return options;
}

// --- Envelopes --------------------------------------------------------------------------------

DecodedRequest decodeRequest(std::span<const uint8_t> frame) {
  std::optional<uint64_t> request_id;
  Result<RequestBody> body = withMessage<Result<RequestBody>>(
      frame, [&](capnp::MessageReader& message) -> Result<RequestBody> {
        auto root = message.getRoot<schema::Request>();
        request_id = root.getRequestId();
        return readRequestBody(root);
      });
  return DecodedRequest{.request_id = request_id, .body = std::move(body)};
}

Result<Response> decodeResponse(std::span<const uint8_t> frame) {
  Response out;
  TALLY_WIRE_RETURN_IF_ERROR(decodeResponse(frame, &out));
  return out;
}

Status decodeResponse(std::span<const uint8_t> frame, Response* out) {
  return withMessage<Status>(frame, [out](capnp::MessageReader& message) {
    return readResponse(message.getRoot<schema::Response>(), out);
  });
}

Result<std::vector<uint8_t>> encodeRequestFrame(const Request& request, uint64_t frame_bytes_max) {
  ScratchMessage message;
  fromCore(request, message.builder().initRoot<schema::Request>());
  return encodeFrame(message.builder(), frame_bytes_max);
}

Result<std::vector<uint8_t>> encodeResponseFrame(const Response& response,
                                                 uint64_t frame_bytes_max) {
  ScratchMessage message;
  fromCore(response, message.builder().initRoot<schema::Response>());
  return encodeFrame(message.builder(), frame_bytes_max);
}

Response replyTooLarge(uint64_t request_id, const Status& why) {
  return Response{
      .request_id = request_id,
      .body = ErrorReply{.code = ErrorCode::kFrameTooLarge,
                         .message = "the answer does not fit in one frame (" + why.message() +
                                    "); ask for less: an audit takes --subject or --route"}};
}

Status encodeResponseFrameInto(const Response& response, std::vector<uint8_t>* out,
                               uint64_t frame_bytes_max, EncodeScratch* scratch) {
  if (scratch == nullptr) {
    ScratchMessage message;
    fromCore(response, message.builder().initRoot<schema::Response>());
    return appendFrame(message.builder(), frame_bytes_max, out);
  }
  // The builder zeroes what it used of the scratch when it is destroyed, ready for the next.
  capnp::MallocMessageBuilder message(scratch->firstSegment());
  fromCore(response, message.initRoot<schema::Response>());
  return appendFrame(message, frame_bytes_max, out);
}

Status encodeRequestFrameInto(const Request& request, std::vector<uint8_t>* out,
                              uint64_t frame_bytes_max, EncodeScratch* scratch) {
  if (scratch == nullptr) {
    ScratchMessage message;
    fromCore(request, message.builder().initRoot<schema::Request>());
    return appendFrame(message.builder(), frame_bytes_max, out);
  }
  capnp::MallocMessageBuilder message(scratch->firstSegment());
  fromCore(request, message.initRoot<schema::Request>());
  return appendFrame(message, frame_bytes_max, out);
}

ErrorReply errorReplyFor(const Status& status) {
  ErrorCode code = ErrorCode::kInternal;
  switch (status.code()) {
    case StatusCode::kCorruption: code = ErrorCode::kMalformedFrame; break;
    case StatusCode::kResourceExhausted: code = ErrorCode::kFrameTooLarge; break;
    case StatusCode::kInvalidArgument: code = ErrorCode::kInvalidArgument; break;
    case StatusCode::kUnavailable: code = ErrorCode::kUnavailable; break;
    default: break;
  }
  return ErrorReply{.code = code, .message = status.message()};
}

// --- toCore: each guarded, since a caller may hand us a reader over untrusted bytes ----------

Result<Budget> toCore(schema::AdmissionBudgetV1::Reader reader) {
  return catchDecodeErrors([&] { return readBudget(reader); });
}
Result<Policy> toCore(schema::PolicyV1::Reader reader) {
  return catchDecodeErrors([&] { return readPolicy(reader); });
}
Result<Reservation> toCore(schema::LimitReservationV1::Reader reader) {
  return catchDecodeErrors([&] { return readReservation(reader); });
}
Result<ReserveRequest> toCore(schema::ReserveRequest::Reader reader) {
  return catchDecodeErrors([&] { return readReserve(reader); });
}
Result<StartRequest> toCore(schema::StartRequest::Reader reader) {
  return catchDecodeErrors([&] { return readStart(reader); });
}
Result<SettleRequest> toCore(schema::SettleRequest::Reader reader) {
  return catchDecodeErrors([&] { return readSettle(reader); });
}
Result<ReleaseRequest> toCore(schema::ReleaseRequest::Reader reader) {
  return catchDecodeErrors([&] { return readRelease(reader); });
}
Result<QueryRequest> toCore(schema::QueryRequest::Reader reader) {
  return catchDecodeErrors([&] { return readQuery(reader); });
}
Result<MarkUnknownRequest> toCore(schema::MarkUnknownRequest::Reader reader) {
  return catchDecodeErrors([&] { return readMarkUnknown(reader); });
}
Result<ReportOperationRequest> toCore(schema::ReportOperationRequest::Reader reader) {
  return catchDecodeErrors([&] { return readReportOperation(reader); });
}
Result<ExtendRequest> toCore(schema::ExtendRequest::Reader reader) {
  return catchDecodeErrors([&] { return readExtend(reader); });
}
Result<AuditRequest> toCore(schema::AuditRequest::Reader reader) {
  return catchDecodeErrors([&] { return readAudit(reader); });
}
Result<PublishPolicyRequest> toCore(schema::PublishPolicyRequest::Reader reader) {
  return catchDecodeErrors([&] { return readPublishPolicy(reader); });
}
Result<ShowPolicyRequest> toCore(schema::ShowPolicyRequest::Reader reader) {
  return catchDecodeErrors([&] { return readShowPolicy(reader); });
}
Result<Request> toCore(schema::Request::Reader reader) {
  return catchDecodeErrors([&] { return readRequest(reader); });
}
Result<ReservationReply> toCore(schema::ReservationReply::Reader reader) {
  return catchDecodeErrors([&] { return readReservationReply(reader); });
}
Result<PolicyAnswer> toCore(schema::PolicyReply::Reader reader) {
  return catchDecodeErrors([&] { return readPolicyReply(reader); });
}
Result<AuditReport> toCore(schema::AuditReply::Reader reader) {
  return catchDecodeErrors([&] { return readAuditReply(reader); });
}
Result<HealthReply> toCore(schema::HealthReply::Reader reader) {
  return catchDecodeErrors([&] { return readHealthReply(reader); });
}
Result<ErrorReply> toCore(schema::ErrorReply::Reader reader) {
  return catchDecodeErrors([&] { return readErrorReply(reader); });
}
Result<Response> toCore(schema::Response::Reader reader) {
  return catchDecodeErrors([&] { return readResponse(reader); });
}

// --- fromCore ---------------------------------------------------------------------------------

void fromCore(const Budget& budget, schema::AdmissionBudgetV1::Builder builder) {
  builder.setSubjectPattern(textOf(budget.subject_pattern));
  builder.setRoute(textOf(budget.route));
  builder.setRegion(textOf(budget.region));
  builder.setUnit(textOf(budget.unit));
  builder.setRefillPerSecond(budget.refill_per_second);
  builder.setBurst(budget.burst);
  builder.setMaxSingleReservation(budget.max_single_reservation);
  builder.setHoldTtlMs(budget.hold_ttl_ms);
  builder.setHardExecutionLimitMs(budget.hard_execution_limit_ms);
  builder.setMaxOverdraft(budget.max_overdraft);
  builder.setPriority(budget.priority);
  builder.setWeight(budget.weight);
  builder.setFairnessBudgetPermille(budget.fairness_budget_permille);
  builder.setEstimatorDigest(textOf(budget.estimator_digest));
  builder.setAccountingEpoch(enumFromCore(budget.accounting_epoch));
  auto emergency = builder.initEmergency();
  emergency.setEnabled(budget.emergency.enabled);
  emergency.setShardUnits(budget.emergency.shard_units);
  emergency.setShardTtlMs(budget.emergency.shard_ttl_ms);
  auto rollout = builder.initRollout();
  rollout.setMode(enumFromCore(budget.rollout.mode));
  rollout.setPercent(budget.rollout.percent);
}

void fromCore(const Policy& policy, schema::PolicyV1::Builder builder) {
  builder.setGeneration(policy.generation);
  auto budgets = builder.initBudgets(static_cast<capnp::uint>(policy.budgets.size()));
  for (size_t i = 0; i < policy.budgets.size(); ++i) {
    fromCore(policy.budgets[i], budgets[static_cast<capnp::uint>(i)]);
  }
}

void fromCore(const Reservation& reservation, schema::LimitReservationV1::Builder builder) {
  builder.setReservationId(textOf(reservation.reservation_id));
  builder.setRequestDigest(dataOf(reservation.request_digest));
  builder.setSubject(textOf(reservation.subject));
  builder.setRoute(textOf(reservation.route));
  builder.setPolicyGeneration(reservation.policy_generation);
  builder.setAccountingEpochMs(reservation.accounting_epoch_ms);
  builder.setReservedUnits(reservation.reserved_units);
  builder.setActualUnits(reservation.actual_units);
  builder.setRefundedUnits(reservation.refunded_units);
  builder.setDebtUnits(reservation.debt_units);
  builder.setOperationId(textOf(reservation.operation_id));
  builder.setCreatedAtMs(reservation.created_at_ms);
  builder.setExpiresAtMs(reservation.expires_at_ms);
  builder.setStartedAtMs(reservation.started_at_ms);
  builder.setClosedAtMs(reservation.closed_at_ms);
  builder.setState(enumFromCore(reservation.state));
  builder.setOrigin(textOf(reservation.origin));
  builder.setClosedByHardLimit(reservation.closed_by_hard_limit);
  builder.setOverdraftBreach(reservation.overdraft_breach);
  builder.setLimitingDimension(enumFromCore(reservation.limiting_dimension));
  builder.setPriority(reservation.priority);
  builder.setRequestedGeneration(reservation.requested_generation);
  builder.setRequestFieldsKnown(reservation.request_fields_known);
  if (!reservation.region.empty()) builder.setRegion(textOf(reservation.region));
  if (!reservation.gateway_name.empty()) builder.setGatewayName(textOf(reservation.gateway_name));
  builder.setRetryAfterMs(reservation.retry_after_ms);
}

void fromCore(const ReserveRequest& request, schema::ReserveRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setRequestDigest(dataOf(request.request_digest));
  builder.setSubject(textOf(request.subject));
  builder.setRoute(textOf(request.route));
  builder.setUnits(request.units);
  builder.setPolicyGeneration(request.policy_generation);
  builder.setPriority(request.priority);
  if (!request.region.empty()) builder.setRegion(textOf(request.region));
}

void fromCore(const StartRequest& request, schema::StartRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setOperationId(textOf(request.operation_id));
}

void fromCore(const SettleRequest& request, schema::SettleRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setOperationId(textOf(request.operation_id));
  builder.setActualUnits(request.actual_units);
}

void fromCore(const ReleaseRequest& request, schema::ReleaseRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
}

void fromCore(const QueryRequest& request, schema::QueryRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
}

void fromCore(const MarkUnknownRequest& request, schema::MarkUnknownRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setOperationId(textOf(request.operation_id));
}

void fromCore(const ReportOperationRequest& request,
              schema::ReportOperationRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setOperationId(textOf(request.operation_id));
  builder.setActualUnits(request.actual_units);
}

void fromCore(const ExtendRequest& request, schema::ExtendRequest::Builder builder) {
  builder.setReservationId(textOf(request.reservation_id));
  builder.setOperationId(textOf(request.operation_id));
  builder.setReservedUnitsTotal(request.reserved_units_total);
}

void fromCore(const AuditRequest& request, schema::AuditRequest::Builder builder) {
  builder.setSubject(textOf(request.subject));
  builder.setRoute(textOf(request.route));
  if (request.period) {
    builder.setPeriod(*request.period);
    builder.setPeriodSet(true);
  }
  builder.setListPeriods(request.list_periods);
  builder.setAfterSubject(textOf(request.after_subject));
  builder.setAfterRoute(textOf(request.after_route));
  builder.setRoutesMax(request.routes_max);
}

void fromCore(const PublishPolicyRequest& request, schema::PublishPolicyRequest::Builder builder) {
  auto budgets = builder.initBudgets(static_cast<capnp::uint>(request.budgets.size()));
  for (size_t i = 0; i < request.budgets.size(); ++i) {
    fromCore(request.budgets[i], budgets[static_cast<capnp::uint>(i)]);
  }
}

void fromCore(const ShowPolicyRequest& request, schema::ShowPolicyRequest::Builder builder) {
  builder.setGeneration(request.generation);
  builder.setUnlessGeneration(request.unless_generation);
}

void fromCore(const Request& request, schema::Request::Builder builder) {
  builder.setRequestId(request.request_id);
  struct Visitor {
    schema::Request::Builder builder;
    // An unknown member cannot be re-encoded; it goes out as the `unspecified` default.
    void operator()(const UnknownMessage&) { builder.setUnspecified(); }
    void operator()(const ReserveRequest& body) { fromCore(body, builder.initReserve()); }
    void operator()(const StartRequest& body) { fromCore(body, builder.initStart()); }
    void operator()(const SettleRequest& body) { fromCore(body, builder.initSettle()); }
    void operator()(const ReleaseRequest& body) { fromCore(body, builder.initRelease()); }
    void operator()(const QueryRequest& body) { fromCore(body, builder.initQuery()); }
    void operator()(const MarkUnknownRequest& body) { fromCore(body, builder.initMarkUnknown()); }
    void operator()(const ReportOperationRequest& body) {
      fromCore(body, builder.initReportOperation());
    }
    void operator()(const ExtendRequest& body) { fromCore(body, builder.initExtend()); }
    void operator()(const AuditRequest& body) { fromCore(body, builder.initAudit()); }
    void operator()(const HealthRequest&) { builder.initHealth(); }
    void operator()(const PublishPolicyRequest& body) {
      fromCore(body, builder.initPublishPolicy());
    }
    void operator()(const RollbackPolicyRequest&) { builder.initRollbackPolicy(); }
    void operator()(const ShowPolicyRequest& body) { fromCore(body, builder.initShowPolicy()); }
    void operator()(const EnrollGatewayRequest& body) {
      fromCore(body, builder.initEnrollGateway());
    }
    void operator()(const ListGatewaysRequest&) { builder.initListGateways(); }
    void operator()(const SetGatewayEnabledRequest& body) {
      fromCore(body, builder.initSetGatewayEnabled());
    }
    void operator()(const ShardIssueRequest& body) { fromCore(body, builder.initIssueShard()); }
    void operator()(const ShardReport& body) { fromCore(body, builder.initReportShard()); }
    void operator()(const ShardStatusRequest& body) { fromCore(body, builder.initShardStatus()); }
    void operator()(const ListShardsRequest& body) { fromCore(body, builder.initListShards()); }
    void operator()(const RevokeShardsRequest& body) { fromCore(body, builder.initRevokeShards()); }
    void operator()(const WriteOffShardRequest& body) {
      fromCore(body, builder.initWriteOffShard());
    }
    void operator()(const EnrollOperatorRequest& body) {
      fromCore(body, builder.initEnrollOperator());
    }
    void operator()(const SetOperatorEnabledRequest& body) {
      fromCore(body, builder.initSetOperatorEnabled());
    }
    void operator()(const ListOperatorsRequest&) { builder.initListOperators(); }
    void operator()(const AuditLogRequest& body) { fromCore(body, builder.initAuditLog()); }
  };
  std::visit(Visitor{builder}, request.body);
}

void fromCore(const ReservationReply& reply, schema::ReservationReply::Builder builder) {
  builder.setCode(enumFromCore(reply.code));
  builder.setDuplicate(reply.duplicate);
  builder.setRefundedUnits(reply.refunded_units);
  fromCore(reply.receipt, builder.initReceipt());
  builder.setMessage(textOf(reply.message));
}

void fromCore(const PolicyAnswer& answer, schema::PolicyReply::Builder builder) {
  builder.setCode(enumFromCore(answer.reply.code));
  builder.setGeneration(answer.reply.generation);
  builder.setMessage(textOf(answer.reply.message));
  if (answer.policy) fromCore(*answer.policy, builder.initPolicy());
}

void fromCore(const AuditReport& report, schema::AuditReply::Builder builder) {
  auto accounts = builder.initAccounts(static_cast<capnp::uint>(report.accounts.size()));
  for (size_t i = 0; i < report.accounts.size(); ++i) {
    const AccountView& view = report.accounts[i];
    auto account = accounts[static_cast<capnp::uint>(i)];
    account.setSubject(textOf(view.key.subject));
    account.setRoute(textOf(view.key.route));
    account.setPolicyGeneration(view.key.generation);
    account.setAccountingEpochMs(view.accounting_epoch_ms);
    account.setGenerationState(enumFromCore(view.generation_state));
    account.setDebt(view.debt);
    account.setOpening(view.balances.opening);
    account.setMinted(view.balances.minted);
    account.setOverdraftIssued(view.balances.overdraft_issued);
    account.setAvailable(view.balances.available);
    account.setReserved(view.balances.reserved);
    account.setSpent(view.balances.spent);
    account.setRetiredForEmergency(view.balances.retired_for_emergency);
    account.setOverdraftRepaid(view.balances.overdraft_repaid);
    account.setTransferredOut(view.balances.transferred_out);
    account.setConserved(view.conserved);
    account.setOverdraftBreaches(view.overdraft_breaches.count);
    account.setOverdraftBreachUnits(view.overdraft_breaches.units);
  }
  builder.setConserved(report.conserved);
  builder.setAsOfMs(report.as_of_ms);
  auto violations = builder.initViolations(static_cast<capnp::uint>(report.violations.size()));
  for (size_t i = 0; i < report.violations.size(); ++i) {
    violations.set(static_cast<capnp::uint>(i), textOf(report.violations[i]));
  }
  auto shards = builder.initShards(static_cast<capnp::uint>(report.shards.size()));
  for (size_t i = 0; i < report.shards.size(); ++i) {
    fromCore(report.shards[i], shards[static_cast<capnp::uint>(i)]);
  }
  if (report.period_epoch) {
    builder.setPeriodEpoch(*report.period_epoch);
    builder.setPeriodSet(true);
  }
  auto snapshots =
      builder.initPeriodSnapshots(static_cast<capnp::uint>(report.period_snapshots.size()));
  for (size_t i = 0; i < report.period_snapshots.size(); ++i) {
    fromCore(report.period_snapshots[i], snapshots[static_cast<capnp::uint>(i)]);
  }
  auto periods = builder.initClosedPeriods(static_cast<capnp::uint>(report.closed_periods.size()));
  for (size_t i = 0; i < report.closed_periods.size(); ++i) {
    fromCore(report.closed_periods[i], periods[static_cast<capnp::uint>(i)]);
  }
  builder.setMore(report.more);
}

void fromCore(const HealthReply& reply, schema::HealthReply::Builder builder) {
  builder.setStatus(textOf(reply.status));
  builder.setVersion(textOf(reply.version));
  builder.setNowMs(reply.now_ms);
}

void fromCore(const ErrorReply& reply, schema::ErrorReply::Builder builder) {
  builder.setCode(enumFromCore(reply.code));
  builder.setMessage(textOf(reply.message));
}

void fromCore(const Response& response, schema::Response::Builder builder) {
  builder.setRequestId(response.request_id);
  struct Visitor {
    schema::Response::Builder builder;
    void operator()(const UnknownMessage&) { builder.setUnspecified(); }
    void operator()(const ReservationReply& body) { fromCore(body, builder.initReservation()); }
    void operator()(const PolicyAnswer& body) { fromCore(body, builder.initPolicy()); }
    void operator()(const AuditReport& body) { fromCore(body, builder.initAudit()); }
    void operator()(const HealthReply& body) { fromCore(body, builder.initHealth()); }
    void operator()(const ErrorReply& body) { fromCore(body, builder.initError()); }
    void operator()(const GatewayReply& body) { fromCore(body, builder.initGateway()); }
    void operator()(const ShardReply& body) { fromCore(body, builder.initShard()); }
    void operator()(const OperatorReply& body) { fromCore(body, builder.initOperators()); }
    void operator()(const AuditLogReply& body) { fromCore(body, builder.initAuditLog()); }
  };
  std::visit(Visitor{builder}, response.body);
}

}  // namespace tally::wire

#undef TALLY_WIRE_RETURN_IF_ERROR
