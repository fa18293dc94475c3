#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <capnp/message.h>

#include "core/ledger_protocol.h"
#include "core/ledger_types.h"
#include "core/limits.h"
#include "core/policy.h"
#include "core/reservation.h"
#include "core/shard_types.h"
#include "core/status.h"
#include "schemas/admission_budget.capnp.h"
#include "schemas/emergency_shard.capnp.h"
#include "schemas/limit_reservation.capnp.h"
#include "schemas/protocol.capnp.h"

// Conversions between Cap'n Proto messages (schemas/) and the core value types.
//
// Decoding is the trust boundary. Every toCore()/decode*() function:
//  * reads with explicit ReaderOptions (decodeReaderOptions());
//  * turns any kj::Exception thrown by Cap'n Proto on malformed bytes into kCorruption; no
//    other code in tally catches kj::Exception;
//  * checks what the schema cannot: text lengths against core/limits.h (kInvalidArgument naming
//    the field), digests of exactly 32 bytes, enum values this build knows.
// It never asserts on input. Semantic checks (empty ids, zero units, policy rules) belong to the
// state machines, which answer them with domain reply codes.
//
// Encoding (fromCore(), encode*()) trusts its input: it is our own state.

namespace tally::wire {

// Decode limits, applied at every decode site. The traversal limit allows reading a maximal
// default-sized frame several times over; the nesting limit is well above the schemas' depth
// (Response → PolicyReply → PolicyV1 → budgets → AdmissionBudgetV1 → RolloutV1 is 6).
inline constexpr uint64_t kDecodeTraversalLimitWords =
    4 * limits::kFrameBytesMaxDefault / sizeof(capnp::word);
inline constexpr int kDecodeNestingLimit = 16;
// …and at most this many words per word of the message itself (plus 64), whichever is less.
inline constexpr uint64_t kDecodeTraversalWordsPerMessageWord = 4;
capnp::ReaderOptions decodeReaderOptions();

// Bounds for wire text that core/limits.h has no maximum for.
inline constexpr uint64_t kOriginBytesMax = 128;  // an emergency shard id
inline constexpr uint64_t kEstimatorDigestBytesMax = 256;
inline constexpr uint64_t kMessageBytesMax = 4096;  // reply messages, violations, health text
inline constexpr uint64_t kViolationsMax = 10'000;
inline constexpr uint64_t kKeyIdBytesMax = 64;              // a ledger key id (16 hex chars)
inline constexpr uint64_t kShardRequestIdBytesMax = 128;    // ShardIssueRequest::request_id
inline constexpr uint64_t kShardIdsPerRequestMax = 10'000;  // ShardStatusRequest::shard_ids
inline constexpr uint64_t kShardsPerReplyMax = 100'000;     // ShardReply, AuditReply.shards
inline constexpr uint64_t kGatewaysPerReplyMax = 100'000;

// --- Messages: the core's protocol types (core/ledger_protocol.h) -----------------------------

using ::tally::AuditRequest;
using ::tally::EnrollGatewayRequest;
using ::tally::ErrorCode;
using ::tally::errorCodeName;
using ::tally::ErrorReply;
using ::tally::HealthReply;
using ::tally::HealthRequest;
using ::tally::ListGatewaysRequest;
using ::tally::ListShardsRequest;
using ::tally::PolicyAnswer;
using ::tally::PublishPolicyRequest;
using ::tally::RevokeShardsRequest;
using ::tally::RollbackPolicyRequest;
using ::tally::SetGatewayEnabledRequest;
using ::tally::ShardStatusRequest;
using ::tally::ShowPolicyRequest;
using ::tally::UnknownMessage;
using ::tally::WriteOffShardRequest;

using RequestBody = ::tally::LedgerRequest;

struct Request {
  uint64_t request_id = 0;
  RequestBody body;
};

using ResponseBody =
    std::variant<UnknownMessage, ReservationReply, PolicyAnswer, AuditReport, HealthReply,
                 ErrorReply, GatewayReply, ShardReply, OperatorReply, AuditLogReply>;

struct Response {
  uint64_t request_id = 0;
  ResponseBody body;
};

// --- Envelopes: one frame payload <-> one message ---------------------------------------------

// What a server learns from one request frame. `request_id` is set whenever the envelope could be
// read, so that even an invalid request is answered under its own id.
struct DecodedRequest {
  std::optional<uint64_t> request_id;
  Result<RequestBody> body;
};

DecodedRequest decodeRequest(std::span<const uint8_t> frame);
Result<Response> decodeResponse(std::span<const uint8_t> frame);
// The same, into *out, reusing what it holds: a caller decoding answer after answer into one
// Response reads each reservation reply in place (its strings' buffers kept), without the moves
// the Result form costs. On an error *out holds a partly read value.
Status decodeResponse(std::span<const uint8_t> frame, Response* out);

// Framed (length-prefixed) encodings; kResourceExhausted if above frame_bytes_max.
Result<std::vector<uint8_t>> encodeRequestFrame(
    const Request& request, uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault);
Result<std::vector<uint8_t>> encodeResponseFrame(
    const Response& response, uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault);

// Scratch space for encoding many messages in a row: each message's first segment is built in
// these (kept zeroed) words instead of a fresh calloc'd one. A message that outgrows them
// continues in allocated segments. Owned by one thread (a server's loop); not thread-safe.
class EncodeScratch {
 public:
  EncodeScratch() : words_(kWords) {}
  EncodeScratch(const EncodeScratch&) = delete;
  EncodeScratch& operator=(const EncodeScratch&) = delete;

  kj::ArrayPtr<capnp::word> firstSegment() { return kj::arrayPtr(words_.data(), words_.size()); }

 private:
  static constexpr size_t kWords = 1024;  // 8 KiB: any reservation reply fits in one segment
  std::vector<capnp::word> words_;        // value-initialized: zero
};

// Appends the framed encoding of `response` to `*out`: the same bytes as encodeResponseFrame,
// without the intermediate copies. kResourceExhausted, with `*out` unchanged, if the message is
// above frame_bytes_max. `scratch` (optional) is reused for the first segment.
Status encodeResponseFrameInto(const Response& response, std::vector<uint8_t>* out,
                               uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault,
                               EncodeScratch* scratch = nullptr);
// What a server sends instead of an answer that does not fit in one frame (`why`: the
// encoder's kResourceExhausted): FRAME_TOO_LARGE, saying how to ask for less. Always encodable.
Response replyTooLarge(uint64_t request_id, const Status& why);
// The same for a request: the bytes of encodeRequestFrame, appended to `*out`.
Status encodeRequestFrameInto(const Request& request, std::vector<uint8_t>* out,
                              uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault,
                              EncodeScratch* scratch = nullptr);

// The error a server answers with when decoding failed with `status`.
ErrorReply errorReplyFor(const Status& status);

// --- Per-type conversions ---------------------------------------------------------------------

Result<Budget> toCore(schema::AdmissionBudgetV1::Reader reader);
Result<Policy> toCore(schema::PolicyV1::Reader reader);
// Reservation::late_receipt_applied is ledger-internal: not part of limitReservation.v1, it reads
// as false (schemas/store.capnp persists it).
Result<Reservation> toCore(schema::LimitReservationV1::Reader reader);

Result<ReserveRequest> toCore(schema::ReserveRequest::Reader reader);
Result<StartRequest> toCore(schema::StartRequest::Reader reader);
Result<SettleRequest> toCore(schema::SettleRequest::Reader reader);
Result<ReleaseRequest> toCore(schema::ReleaseRequest::Reader reader);
Result<QueryRequest> toCore(schema::QueryRequest::Reader reader);
Result<MarkUnknownRequest> toCore(schema::MarkUnknownRequest::Reader reader);
Result<ReportOperationRequest> toCore(schema::ReportOperationRequest::Reader reader);
Result<ExtendRequest> toCore(schema::ExtendRequest::Reader reader);
Result<AuditRequest> toCore(schema::AuditRequest::Reader reader);
Result<PublishPolicyRequest> toCore(schema::PublishPolicyRequest::Reader reader);
Result<ShowPolicyRequest> toCore(schema::ShowPolicyRequest::Reader reader);
Result<Request> toCore(schema::Request::Reader reader);

Result<ReservationReply> toCore(schema::ReservationReply::Reader reader);
Result<PolicyAnswer> toCore(schema::PolicyReply::Reader reader);
Result<AuditReport> toCore(schema::AuditReply::Reader reader);
Result<HealthReply> toCore(schema::HealthReply::Reader reader);
Result<ErrorReply> toCore(schema::ErrorReply::Reader reader);
Result<Response> toCore(schema::Response::Reader reader);

// Gateways and emergency shards (SPEC §6). Public keys are exactly 32 bytes and signatures
// exactly 64 in what a peer asks of us (issue requests, reports and the grant inside a report);
// a grant in a reply (ShardInfo) may lack its signature, which then reads as all zeros (and
// verifies under no key). ShardReportV1 carries no `allocated` of its own: balances.allocated
// reads as shard.allocatedUnits. ShardAudit (AuditReply.shards) carries only the identifying
// fields of the grant (id, gateway name, subject, route, generation, allocated units); the rest
// of ShardLedgerView::grant and current_fence read as zero. ShardInfo carries all of it.
Result<ShardGrant> toCore(schema::EmergencyShardV1::Reader reader);
Result<ShardIssueRequest> toCore(schema::ShardIssueRequestV1::Reader reader);
Result<ShardReport> toCore(schema::ShardReportV1::Reader reader);
Result<GatewayRecord> toCore(schema::GatewayInfo::Reader reader);
Result<ShardLedgerView> toCore(schema::ShardInfo::Reader reader);
Result<ShardLedgerView> toCore(schema::ShardAudit::Reader reader);
Result<EnrollGatewayRequest> toCore(schema::EnrollGatewayRequest::Reader reader);
Result<SetGatewayEnabledRequest> toCore(schema::SetGatewayEnabledRequest::Reader reader);
Result<ShardStatusRequest> toCore(schema::ShardStatusRequest::Reader reader);
Result<ListShardsRequest> toCore(schema::ListShardsRequest::Reader reader);
Result<RevokeShardsRequest> toCore(schema::RevokeShardsRequest::Reader reader);
Result<WriteOffShardRequest> toCore(schema::WriteOffShardRequest::Reader reader);
Result<GatewayReply> toCore(schema::GatewayReply::Reader reader);
Result<ShardReply> toCore(schema::ShardReply::Reader reader);

// Operators and the audit log (wire/operator_codec.cc). Names are at most
// limits::kOperatorNameBytesMax bytes, an entry's texts limits::kAuditLogTextBytesMax, digests
// and keys exactly 32 bytes.
Result<OperatorRecord> toCore(schema::OperatorInfo::Reader reader);
Result<AuditLogEntry> toCore(schema::AuditLogEntry::Reader reader);
Result<EnrollOperatorRequest> toCore(schema::EnrollOperatorRequest::Reader reader);
Result<SetOperatorEnabledRequest> toCore(schema::SetOperatorEnabledRequest::Reader reader);
Result<AuditLogRequest> toCore(schema::AuditLogRequest::Reader reader);
Result<OperatorReply> toCore(schema::OperatorReply::Reader reader);
Result<AuditLogReply> toCore(schema::AuditLogReply::Reader reader);
void fromCore(const OperatorRecord& record, schema::OperatorInfo::Builder builder);
void fromCore(const AuditLogEntry& entry, schema::AuditLogEntry::Builder builder);
void fromCore(const EnrollOperatorRequest& request, schema::EnrollOperatorRequest::Builder builder);
void fromCore(const SetOperatorEnabledRequest& request,
              schema::SetOperatorEnabledRequest::Builder builder);
void fromCore(const AuditLogRequest& request, schema::AuditLogRequest::Builder builder);
void fromCore(const OperatorReply& reply, schema::OperatorReply::Builder builder);
void fromCore(const AuditLogReply& reply, schema::AuditLogReply::Builder builder);

void fromCore(const Budget& budget, schema::AdmissionBudgetV1::Builder builder);
void fromCore(const Policy& policy, schema::PolicyV1::Builder builder);
void fromCore(const Reservation& reservation, schema::LimitReservationV1::Builder builder);

void fromCore(const ReserveRequest& request, schema::ReserveRequest::Builder builder);
void fromCore(const StartRequest& request, schema::StartRequest::Builder builder);
void fromCore(const SettleRequest& request, schema::SettleRequest::Builder builder);
void fromCore(const ReleaseRequest& request, schema::ReleaseRequest::Builder builder);
void fromCore(const QueryRequest& request, schema::QueryRequest::Builder builder);
void fromCore(const MarkUnknownRequest& request, schema::MarkUnknownRequest::Builder builder);
void fromCore(const ReportOperationRequest& request,
              schema::ReportOperationRequest::Builder builder);
void fromCore(const ExtendRequest& request, schema::ExtendRequest::Builder builder);
void fromCore(const AuditRequest& request, schema::AuditRequest::Builder builder);
void fromCore(const PublishPolicyRequest& request, schema::PublishPolicyRequest::Builder builder);
void fromCore(const ShowPolicyRequest& request, schema::ShowPolicyRequest::Builder builder);
void fromCore(const Request& request, schema::Request::Builder builder);

void fromCore(const ReservationReply& reply, schema::ReservationReply::Builder builder);
void fromCore(const PolicyAnswer& answer, schema::PolicyReply::Builder builder);
void fromCore(const AuditReport& report, schema::AuditReply::Builder builder);
void fromCore(const HealthReply& reply, schema::HealthReply::Builder builder);
void fromCore(const ErrorReply& reply, schema::ErrorReply::Builder builder);
void fromCore(const Response& response, schema::Response::Builder builder);

void fromCore(const ShardGrant& grant, schema::EmergencyShardV1::Builder builder);
void fromCore(const ShardIssueRequest& request, schema::ShardIssueRequestV1::Builder builder);
void fromCore(const ShardReport& report, schema::ShardReportV1::Builder builder);
void fromCore(const GatewayRecord& record, schema::GatewayInfo::Builder builder);
void fromCore(const ShardLedgerView& view, schema::ShardInfo::Builder builder);
void fromCore(const ShardLedgerView& view, schema::ShardAudit::Builder builder);
void fromCore(const EnrollGatewayRequest& request, schema::EnrollGatewayRequest::Builder builder);
void fromCore(const SetGatewayEnabledRequest& request,
              schema::SetGatewayEnabledRequest::Builder builder);
void fromCore(const ShardStatusRequest& request, schema::ShardStatusRequest::Builder builder);
void fromCore(const ListShardsRequest& request, schema::ListShardsRequest::Builder builder);
void fromCore(const RevokeShardsRequest& request, schema::RevokeShardsRequest::Builder builder);
void fromCore(const WriteOffShardRequest& request, schema::WriteOffShardRequest::Builder builder);
void fromCore(const GatewayReply& reply, schema::GatewayReply::Builder builder);
void fromCore(const ShardReply& reply, schema::ShardReply::Builder builder);

}  // namespace tally::wire
