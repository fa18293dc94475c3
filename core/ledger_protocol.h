#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/ledger_types.h"
#include "core/operator_types.h"
#include "core/policy.h"
#include "core/shard_types.h"
#include "core/types.h"

// Every request tally-ledger serves and every answer it gives, as core values: the protocol of
// schemas/protocol.capnp without its bytes. The wire layer (wire/codec.h) decodes into and
// encodes from exactly these types; core/ledger_requests.h answers them.
//
// The reservation, policy and shard requests are the Ledger's own types (core/ledger_types.h,
// core/shard_types.h); the rest are defined here.

namespace tally {

// --- Requests without a Ledger type of their own ---------------------------------------------

struct AuditRequest {
  std::string subject;  // empty: every subject
  std::string route;    // empty: every route
  // Closed accounting periods instead of current balances (`tallyctl audit --period/--periods`).
  std::optional<uint64_t> period;
  bool list_periods = false;
  // Paging: with routes_max > 0, the accounts of the first routes_max subject/routes after
  // (after_subject, after_route) in key order; AuditReport::more says whether any remain.
  std::string after_subject;
  std::string after_route;
  uint32_t routes_max = 0;
};
struct HealthRequest {};
struct PublishPolicyRequest {
  std::vector<Budget> budgets;  // the ledger assigns the generation
};
struct RollbackPolicyRequest {};
struct ShowPolicyRequest {
  Generation generation = 0;  // 0: the active generation
  // The asker (an agent's refresh) already holds this generation: when it is the answer, the
  // reply is OK with its generation and no document. 0: always the document.
  Generation unless_generation = 0;
};
// Gateways and emergency shards (SPEC §6). ShardIssueRequest and ShardReport are core types
// (core/shard_types.h): they travel signed.
struct EnrollGatewayRequest {
  std::string gateway_name;
  PublicKey public_key{};
  // `tallyctl gateway rotate`: public_key replaces the enrolled gateway's key, the old one
  // admitted for rotate_overlap_ms more (ShardRegistry::rotateGatewayKey).
  bool rotate = false;
  uint64_t rotate_overlap_ms = 0;
};
struct ListGatewaysRequest {};
struct SetGatewayEnabledRequest {
  std::string gateway_name;
  bool enabled = false;
};
struct ShardStatusRequest {
  std::string gateway_name;
  std::vector<std::string> shard_ids;
};
struct ListShardsRequest {
  std::string gateway_name;         // empty: every gateway
  std::optional<ShardState> state;  // none: every state
};
struct RevokeShardsRequest {
  std::string shard_id;      // exactly one of the two is set
  std::string gateway_name;  // every live shard of this gateway
};
struct WriteOffShardRequest {
  std::string shard_id;
};

// Operators and the audit log (docs/security.md "Operators", "Audit log").
struct EnrollOperatorRequest {
  std::string operator_name;
  PublicKey public_key{};
  OperatorRole role = OperatorRole::kAudit;
};
struct SetOperatorEnabledRequest {
  std::string operator_name;
  bool enabled = false;
};
struct ListOperatorsRequest {};
struct AuditLogRequest {
  uint64_t after_sequence = 0;  // the entries after it
  uint32_t entries_max = 0;     // 0: limits::kAuditLogEntriesPerReplyMax
};

// A request or response union member this build does not know (a newer peer), or the
// `unspecified` default of an empty message. Answered with ErrorCode::kUnknownMessage.
struct UnknownMessage {
  uint16_t which = 0;  // the raw union discriminant
};

// Every request of the protocol, in the order of the schema's union.
using LedgerRequest =
    std::variant<UnknownMessage, ReserveRequest, StartRequest, SettleRequest, ReleaseRequest,
                 QueryRequest, MarkUnknownRequest, ReportOperationRequest, AuditRequest,
                 HealthRequest, PublishPolicyRequest, RollbackPolicyRequest, ShowPolicyRequest,
                 EnrollGatewayRequest, ListGatewaysRequest, SetGatewayEnabledRequest,
                 ShardIssueRequest, ShardReport, ShardStatusRequest, ListShardsRequest,
                 RevokeShardsRequest, WriteOffShardRequest, ExtendRequest, EnrollOperatorRequest,
                 SetOperatorEnabledRequest, ListOperatorsRequest, AuditLogRequest>;

// --- Answers without a Ledger type of their own ----------------------------------------------

// Errors of the protocol rather than of the domain. The framing and decoding ones
// (kMalformedFrame, kFrameTooLarge, kInvalidArgument) are the wire layer's; core answers
// kUnknownMessage and kNotFound; the agent adds kUnavailable and kPermissionDenied.
enum class ErrorCode : uint8_t {
  kUnspecified = 0,
  kMalformedFrame,
  kFrameTooLarge,
  kUnknownMessage,
  kInvalidArgument,
  kUnavailable,
  kInternal,
  kPermissionDenied,  // agent: the peer's credentials are not allowed
  kNotFound,          // ledger: e.g. no closed accounting period covers the epoch asked for
  kNotPrimary,        // ledger: a standby (or a deposed primary); the message names the primary
};
const char* errorCodeName(ErrorCode code);

// The message of a kNotPrimary answer: "not the primary; the primary is HOST:PORT" when the
// answering ledger knows the primary's address (the lease's), else "not the primary; the
// primary is not known". An empty address, or one with port 0, is not known.
std::string notPrimaryMessage(const std::string& primary_address);
// The HOST:PORT such a message names, or "" if it names none (any other text).
std::string primaryNamedIn(const std::string& not_primary_message);

struct ErrorReply {
  ErrorCode code = ErrorCode::kUnspecified;
  std::string message;
};

struct HealthReply {
  std::string status;
  std::string version;
  uint64_t now_ms = 0;
};

// A PolicyReply and, for showPolicy only, the policy itself.
struct PolicyAnswer {
  PolicyReply reply;
  std::optional<Policy> policy;
};

// Every answer the ledger gives to a LedgerRequest.
using LedgerReply =
    std::variant<ReservationReply, PolicyAnswer, AuditReport, HealthReply, ErrorReply, GatewayReply,
                 ShardReply, OperatorReply, AuditLogReply>;

}  // namespace tally
