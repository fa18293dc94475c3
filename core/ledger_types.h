#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/account.h"
#include "core/period_close.h"
#include "core/policy.h"
#include "core/reservation.h"
#include "core/shard_types.h"
#include "core/types.h"

// Requests and replies of the central ledger state machine (core/ledger.h). The wire layer
// converts Cap'n Proto messages to and from exactly these types.

namespace tally {

// Domain outcomes of one ledger operation. Not errors: every one is a legitimate answer.
enum class ReplyCode : uint8_t {
  kOk = 0,
  kRejected,             // admission refused; receipt carries limiting dimension, retry-after
  kIdempotencyConflict,  // same reservation id, different request digest
  kOperationConflict,    // bound to another operation id (the start CAS was lost)
  kExpired,              // the expiry won: the reservation is EXPIRING or EXPIRED
  kInvalidState,         // not allowed in the reservation's current state
  kNotFound,             // no such reservation (never seen, or compacted after retention)
  kInvalidArgument,      // malformed request: zero units, over-long id, empty field …
  kResourceExhausted,    // a bounded ledger table is full; nothing changed
  kArithmeticOverflow,   // a balance would leave 64 bits; nothing changed
  kQueued,  // agent: durably queued in its outbox; delivered to the ledger exactly once later
};

const char* replyCodeName(ReplyCode code);

struct ReserveRequest {
  std::string reservation_id;
  Digest request_digest{};
  std::string subject;
  std::string route;
  Units units = 0;
  Generation policy_generation = 0;  // 0: whatever generation is active
  uint32_t priority = 0;
  // The gateway's region ("" = the gateway does not say). Not a key: a budget fenced to
  // another region refuses the request (core/policy.h regionAdmits). Part of the canonical
  // digest when non-empty.
  std::string region;
};

struct StartRequest {
  std::string reservation_id;
  std::string operation_id;
};

struct SettleRequest {
  std::string reservation_id;
  std::string operation_id;
  Units actual_units = 0;
};

struct ReleaseRequest {
  std::string reservation_id;
};

struct MarkUnknownRequest {
  std::string reservation_id;
  std::string operation_id;
};

// An operation receipt: the executor's word on what a started operation consumed. The only
// thing that resolves USAGE_UNKNOWN.
struct ReportOperationRequest {
  std::string reservation_id;
  std::string operation_id;
  Units actual_units = 0;
};

struct QueryRequest {
  std::string reservation_id;
};

// Streaming top-up: a STARTED reservation grows to `reserved_units_total` (a new total, not an
// increment, so that a retry is idempotent) before the work exceeds its estimate. The difference
// is admitted like a reserve against the reservation's own account, or refused (kRejected with
// the limiting dimension and retry-after) leaving everything unchanged; a total the reservation
// already holds is a duplicate (nothing charged). SPEC §5; docs/protocol.md "extend".
struct ExtendRequest {
  std::string reservation_id;
  std::string operation_id;
  Units reserved_units_total = 0;
};

struct ReservationReply {
  ReplyCode code = ReplyCode::kOk;
  bool duplicate = false;    // repeated an earlier request; nothing changed
  Units refunded_units = 0;  // returned to available by this call (0 for every duplicate)
  Reservation receipt;       // state after the call; empty for kNotFound / kInvalidArgument
  std::string message;       // detail for kInvalidArgument and friends
};

enum class GenerationState : uint8_t { kActive = 0, kDraining, kDrained };
const char* generationStateName(GenerationState state);

struct PolicyReply {
  ReplyCode code = ReplyCode::kOk;
  Generation generation = 0;
  std::string message;
};

struct AccountView {
  AccountKey key;
  Balances balances;
  Units debt = 0;
  uint64_t accounting_epoch_ms = 0;
  GenerationState generation_state = GenerationState::kActive;
  bool conserved = true;
  OverdraftBreaches overdraft_breaches;  // settles that left debt above max overdraft

  bool operator==(const AccountView&) const = default;
};

struct AuditReport {
  // Balances are as of this ledger time: refill earned up to it is applied (projected; the
  // audit changes nothing), not as of each account's last touch.
  uint64_t as_of_ms = 0;
  std::vector<AccountView> accounts;
  // Every account conserves, no balance is negative, and each account's `reserved` equals the
  // sum of units held by its live reservations.
  bool conserved = true;
  std::vector<std::string> violations;  // human-readable, empty when conserved
  std::vector<ShardLedgerView> shards;  // every shard's central equation, sorted by id
  // Closed accounting periods (`audit --period` / `--periods`, core/period_close.h); empty in
  // the audit of current balances.
  std::optional<uint64_t> period_epoch;          // the epoch asked for
  std::vector<PeriodSnapshot> period_snapshots;  // every account's period covering it, by key
  std::vector<PeriodSpan> closed_periods;        // every closed period kept, ascending
  bool more = false;  // a paged audit (AuditRequest::routes_max): accounts after these remain
};

struct GatewayReply {
  ReplyCode code = ReplyCode::kOk;
  std::string message;
  std::vector<GatewayRecord> gateways;
  bool duplicate = false;
};

struct ShardReply {
  ReplyCode code = ReplyCode::kOk;
  std::string message;
  std::vector<ShardLedgerView> shards;
  bool duplicate = false;
  Units reminted_units = 0;  // by this call
  Units spent_units = 0;     // by this call
  Units debt_units = 0;      // by this call
  LimitingDimension limiting_dimension = LimitingDimension::kNone;
  bool permission_denied = false;  // unknown/disabled gateway or a bad signature
};

}  // namespace tally
