# The request/response envelope spoken by tally-ledger, tally-agent and tallyctl, mirrored by
# core/ledger_types.h. Each message travels as one frame (wire/frame.h): a 4-byte little-endian
# length, then the message in the standard unpacked serialization.
#
# Only append fields and union members; never renumber, retype or reorder enumerants. Requests
# carry an id chosen by the client and may be pipelined; the response echoes the id.

@0xa6d69c091cc39c30;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tally::schema");

using Budget = import "admission_budget.capnp";
using Reservation = import "limit_reservation.capnp";
using Shard = import "emergency_shard.capnp";

# --- Canonical request digest ----------------------------------------------------------------

struct CanonicalReserve {
  # The identifying fields of a reserve request. Its canonical encoding (capnp::canonicalize) is
  # what wire/digest.cc hashes into the request digest. NEVER change this struct: every stored
  # digest and every peer depends on its exact layout (tests/wire/digest_test.cc pins it).
  reservationId @0 :Text;
  subject @1 :Text;
  route @2 :Text;
  units @3 :UInt64;
  policyGeneration @4 :UInt64;
  priority @5 :UInt32;
  region @6 :Text;
  # Appended, and left unset when empty: canonical form drops a null pointer, so a request
  # without a region keeps exactly the digest it had before this field existed.
}

# --- Requests --------------------------------------------------------------------------------

struct ReserveRequest {
  reservationId @0 :Text;
  requestDigest @1 :Data;          # sha256 of CanonicalReserve, exactly 32 bytes
  subject @2 :Text;
  route @3 :Text;
  units @4 :UInt64;
  policyGeneration @5 :UInt64;     # 0: whatever generation is active
  priority @6 :UInt32;
  region @7 :Text;                 # "" = none; a fence, not a key (docs/LEDGER.md "Regions")
}

struct StartRequest {
  reservationId @0 :Text;
  operationId @1 :Text;
}

struct SettleRequest {
  reservationId @0 :Text;
  operationId @1 :Text;
  actualUnits @2 :UInt64;
}

struct ReleaseRequest {
  reservationId @0 :Text;
}

struct QueryRequest {
  reservationId @0 :Text;
}

struct MarkUnknownRequest {
  reservationId @0 :Text;
  operationId @1 :Text;
}

struct ReportOperationRequest {
  # An operation receipt: the only thing that resolves USAGE_UNKNOWN.
  reservationId @0 :Text;
  operationId @1 :Text;
  actualUnits @2 :UInt64;
}

struct ExtendRequest {
  # Streaming top-up of a STARTED reservation (docs/protocol.md "extend"): the new total, not an
  # increment, so that a retry with the same fields is a duplicate and charges nothing.
  reservationId @0 :Text;
  operationId @1 :Text;
  reservedUnitsTotal @2 :UInt64;
}

struct AuditRequest {
  subject @0 :Text;                # empty: every subject
  route @1 :Text;                  # empty: every route
  # Closed accounting periods (docs/LEDGER.md "Accounting periods") instead of current balances:
  period @2 :UInt64;               # with periodSet: every account's closed period covering it
  periodSet @3 :Bool;
  listPeriods @4 :Bool;            # the list of closed periods kept (closedPeriods)
  # Paging (docs/LEDGER.md "Audit"): with routesMax > 0, only the accounts of the first routesMax
  # subject/routes after (afterSubject, afterRoute) in key order; the reply says whether more
  # follow. The next page starts after the last account listed.
  afterSubject @5 :Text;
  afterRoute @6 :Text;
  routesMax @7 :UInt32;
}

struct HealthRequest {}

struct PublishPolicyRequest {
  # A PolicyV1 without its generation: the ledger assigns the next one.
  budgets @0 :List(Budget.AdmissionBudgetV1);
}

struct RollbackPolicyRequest {
  # Republishes the previous policy as a new generation; the current one drains.
}

struct ShowPolicyRequest {
  generation @0 :UInt64;           # 0: the active generation
  unlessGeneration @1 :UInt64;     # the asker holds this one: if it is the answer, OK without
                                   # the document (0: always the document)
}

# --- Gateways and emergency shards (SPEC §6) --------------------------------------------------

struct EnrollGatewayRequest {
  gatewayName @0 :Text;            # tallyctl gateway enroll --id NAME
  publicKey @1 :Data;              # Ed25519, 32 bytes
  rotate @2 :Bool;                 # tallyctl gateway rotate: publicKey replaces the enrolled key
  rotateOverlapMs @3 :UInt64;      # ... which stays admitted this long (or until the new is used)
}

struct ListGatewaysRequest {}

struct SetGatewayEnabledRequest {
  gatewayName @0 :Text;
  enabled @1 :Bool;                # false: tallyctl gateway disable
}

struct ShardStatusRequest {
  # An agent asking, at each contact, what became of its shards (revoked, reconciled, fence).
  gatewayName @0 :Text;
  shardIds @1 :List(Text);
}

struct ListShardsRequest {
  gatewayName @0 :Text;            # empty: every gateway
  state @1 :Text;                  # empty: every state; else a ShardState wire name, e.g. "ISSUED"
}

struct RevokeShardsRequest {
  # Exactly one of the two is set.
  shardId @0 :Text;
  gatewayName @1 :Text;            # every live shard of this gateway
}

struct WriteOffShardRequest {
  shardId @0 :Text;
}

# --- Operators and the audit log (docs/security.md "Operators", "Audit log") ------------------

enum OperatorRole {
  audit @0;                        # the reads
  policy @1;                       # the reads, policy publish and rollback
  shards @2;                       # the reads, shard revoke and write-off
  admin @3;                        # every request
}

struct EnrollOperatorRequest {
  operatorName @0 :Text;           # tallyctl operator enroll --name NAME
  publicKey @1 :Data;              # Ed25519, 32 bytes
  role @2 :OperatorRole;
}

struct SetOperatorEnabledRequest {
  operatorName @0 :Text;
  enabled @1 :Bool;                # false: tallyctl operator disable
}

struct ListOperatorsRequest {}

struct AuditLogRequest {
  afterSequence @0 :UInt64;        # the entries after it (0: from the oldest kept)
  entriesMax @1 :UInt32;           # 0: the ledger's maximum per reply (1,000)
}

struct Request {
  requestId @0 :UInt64;
  union {
    unspecified @1 :Void;          # default: an empty message is no request at all
    reserve @2 :ReserveRequest;
    start @3 :StartRequest;
    settle @4 :SettleRequest;
    release @5 :ReleaseRequest;
    query @6 :QueryRequest;
    markUnknown @7 :MarkUnknownRequest;
    reportOperation @8 :ReportOperationRequest;
    audit @9 :AuditRequest;
    health @10 :HealthRequest;
    publishPolicy @11 :PublishPolicyRequest;
    rollbackPolicy @12 :RollbackPolicyRequest;
    showPolicy @13 :ShowPolicyRequest;
    enrollGateway @14 :EnrollGatewayRequest;
    listGateways @15 :ListGatewaysRequest;
    setGatewayEnabled @16 :SetGatewayEnabledRequest;
    issueShard @17 :Shard.ShardIssueRequestV1;
    reportShard @18 :Shard.ShardReportV1;
    shardStatus @19 :ShardStatusRequest;
    listShards @20 :ListShardsRequest;
    revokeShards @21 :RevokeShardsRequest;
    writeOffShard @22 :WriteOffShardRequest;
    extend @23 :ExtendRequest;
    enrollOperator @24 :EnrollOperatorRequest;
    setOperatorEnabled @25 :SetOperatorEnabledRequest;
    listOperators @26 :ListOperatorsRequest;
    auditLog @27 :AuditLogRequest;
  }
}

# --- Responses -------------------------------------------------------------------------------

enum ReplyCode {
  # core ReplyCode, same order.
  ok @0;
  rejected @1;
  idempotencyConflict @2;
  operationConflict @3;
  expired @4;
  invalidState @5;
  notFound @6;
  invalidArgument @7;
  resourceExhausted @8;
  arithmeticOverflow @9;
  queued @10;                      # agent: durably queued, delivered exactly once later
}

enum GenerationState {
  # core GenerationState, same order.
  active @0;
  draining @1;
  drained @2;
}

struct ReservationReply {
  code @0 :ReplyCode;
  duplicate @1 :Bool;              # repeated an earlier request; nothing changed
  refundedUnits @2 :UInt64;        # returned to available by this call
  receipt @3 :Reservation.LimitReservationV1;
  message @4 :Text;
}

struct PolicyReply {
  code @0 :ReplyCode;
  generation @1 :UInt64;
  message @2 :Text;
  policy @3 :Budget.PolicyV1;      # showPolicy only
}

struct AccountAudit {
  subject @0 :Text;
  route @1 :Text;
  policyGeneration @2 :UInt64;
  accountingEpochMs @3 :UInt64;
  generationState @4 :GenerationState;
  debt @5 :UInt64;
  opening @6 :UInt64;
  minted @7 :UInt64;
  overdraftIssued @8 :UInt64;
  available @9 :UInt64;
  reserved @10 :UInt64;
  spent @11 :UInt64;
  retiredForEmergency @12 :UInt64;
  overdraftRepaid @13 :UInt64;
  transferredOut @14 :UInt64;
  conserved @15 :Bool;
  overdraftBreaches @16 :UInt64;     # settles that left debt above the budget's max overdraft
  overdraftBreachUnits @17 :UInt64;  # the debt beyond max overdraft, summed over those settles
}

enum ShardState {
  # core ShardState, same order. Wire/JSON names: ISSUED, REVOKED, RECONCILING, RECONCILED,
  # CONFLICT, WRITTEN_OFF.
  issued @0;
  revoked @1;
  reconciling @2;                  # reported; STARTED/UNKNOWN receipts keep units retired
  reconciled @3;                   # every receipt terminal; nothing of it is retired any more
  conflict @4;                     # two gateways/boot epochs or overspend: nothing reminted
  writtenOff @5;                   # expired unreported; its units stay retired for ever
}

struct ShardAudit {
  # The central side of one shard: allocated = spent + reminted + retired.
  shardId @0 :Text;
  gatewayName @1 :Text;
  subject @2 :Text;
  route @3 :Text;
  policyGeneration @4 :UInt64;
  state @5 :ShardState;
  allocatedUnits @6 :UInt64;
  spentUnits @7 :UInt64;           # recorded from terminal receipts
  remintedUnits @8 :UInt64;        # proven unused and returned to the current generation
  retiredUnits @9 :UInt64;         # still in retiredForEmergency (pending, unreported, written off)
  debtUnits @10 :UInt64;           # overspend recorded as debt
  writtenOff @11 :Bool;
  conserved @12 :Bool;
  # The agent's last report (zeros if none): allocated = available + reserved + spent + retired.
  reportedLocalAvailable @13 :UInt64;
  reportedLocalReserved @14 :UInt64;
  reportedLocalSpent @15 :UInt64;
  reportedLocalRetired @16 :UInt64;
  reported @17 :Bool;
  reportedOverspent @18 :UInt64;   # the last report's usage beyond the shard (outside the equation)
}

struct AuditReply {
  accounts @0 :List(AccountAudit);
  conserved @1 :Bool;
  violations @2 :List(Text);       # human-readable, empty when conserved
  shards @3 :List(ShardAudit);
  asOfMs @4 :UInt64;               # ledger time the balances are as of (refill applied up to it)
  periodEpoch @5 :UInt64;          # with periodSet: the epoch asked for
  periodSet @6 :Bool;
  periodSnapshots @7 :List(PeriodSnapshotV1);  # sorted by subject, route, generation
  closedPeriods @8 :List(ClosedPeriodV1);      # listPeriods only, ascending
  more @9 :Bool;                   # paged: accounts after this page's last remain
}

struct BalancesV1 {
  # core Balances: SPEC §4's terms, cumulative except available, reserved, retiredForEmergency.
  opening @0 :UInt64;
  minted @1 :UInt64;
  overdraftIssued @2 :UInt64;
  available @3 :UInt64;
  reserved @4 :UInt64;
  spent @5 :UInt64;
  retiredForEmergency @6 :UInt64;
  overdraftRepaid @7 :UInt64;
  transferredOut @8 :UInt64;
}

struct PeriodSnapshotV1 {
  # One account's closed accounting period (core PeriodSnapshot): its balances at the period's
  # start and at its close; the period's activity is their difference. Also the store's record.
  subject @0 :Text;
  route @1 :Text;
  policyGeneration @2 :UInt64;
  accountingEpoch @3 :Budget.EpochPeriod;
  epochFirst @4 :UInt64;           # epochs [epochFirst, epochLast]: more than one after a gap
  epochLast @5 :UInt64;
  openedAtMs @6 :UInt64;
  closedAtMs @7 :UInt64;
  opening @8 :BalancesV1;
  closing @9 :BalancesV1;
  conserved @10 :Bool;             # both ends conserve and the period's equation holds
}

struct ClosedPeriodV1 {
  accountingEpoch @0 :Budget.EpochPeriod;
  epochFirst @1 :UInt64;
  epochLast @2 :UInt64;
  accounts @3 :UInt64;             # snapshots kept for this span
  conserved @4 :Bool;
}

struct HealthReply {
  status @0 :Text;
  version @1 :Text;
  nowMs @2 :UInt64;
}

enum ErrorCode {
  unspecified @0;
  malformedFrame @1;               # bytes that are not a valid message
  frameTooLarge @2;                # the length prefix exceeded frame_bytes_max
  unknownMessage @3;               # a request kind this peer does not know
  invalidArgument @4;              # a field out of bounds (over-long id, bad digest length, …)
  unavailable @5;                  # retry later (e.g. the ledger is unreachable)
  internal @6;
  permissionDenied @7;             # agent: the peer's uid/gid is not allowed
  notFound @8;                     # ledger: e.g. no closed accounting period covers that epoch
  notPrimary @9;                   # ledger: a standby or deposed primary; message names the primary
}

struct ErrorReply {
  code @0 :ErrorCode;
  message @1 :Text;
}

struct GatewayInfo {
  gatewayName @0 :Text;
  publicKey @1 :Data;
  enabled @2 :Bool;
  enrolledAtMs @3 :UInt64;
  previousPublicKey @4 :Data;      # a rotation's replaced key (empty: none) ...
  previousKeyUntilMs @5 :UInt64;   # ... admitted until then, or until publicKey is first used
}

struct GatewayReply {
  code @0 :ReplyCode;              # notFound, idempotencyConflict (name enrolled with another key) …
  message @1 :Text;
  gateways @2 :List(GatewayInfo);
  duplicate @3 :Bool;
}

struct ShardInfo {
  shard @0 :Shard.EmergencyShardV1;  # as issued, ledger signature included
  state @1 :ShardState;
  currentFence @2 :UInt64;         # the subject/route's fence now; above shard.fence: stop using it
  audit @3 :ShardAudit;
}

struct ShardReply {
  code @0 :ReplyCode;              # rejected (with limitingDimension), permissionDenied …
  message @1 :Text;
  shards @2 :List(ShardInfo);      # issueShard: the one shard; others: what the request names
  duplicate @3 :Bool;              # a repeated issue or report; nothing changed
  remintedUnits @4 :UInt64;        # reportShard: returned to the current generation by this call
  spentUnits @5 :UInt64;           # reportShard: recorded as spent by this call
  debtUnits @6 :UInt64;            # reportShard: overspend recorded as debt by this call
  limitingDimension @7 :Reservation.LimitingDimension;  # issueShard refusals
  permissionDenied @8 :Bool;       # unknown or disabled gateway, or a bad signature
}

struct OperatorInfo {
  operatorName @0 :Text;
  publicKey @1 :Data;
  role @2 :OperatorRole;
  enabled @3 :Bool;
  enrolledAtMs @4 :UInt64;         # 0: the first operator (the ledger's operator key)
}

struct OperatorReply {
  code @0 :ReplyCode;              # notFound, idempotencyConflict, invalidArgument …
  message @1 :Text;
  operators @2 :List(OperatorInfo);
  duplicate @3 :Bool;
}

struct AuditLogEntry {
  sequence @0 :UInt64;
  atMs @1 :UInt64;                 # the ledger clock
  actor @2 :Text;                  # operator or gateway name; empty: an --insecure connection
  actorKind @3 :Text;              # operator, gateway, nobody, unauthenticated
  actorRole @4 :Text;              # an operator's role
  action @5 :Text;                 # "policy publish", "gateway disable", …
  target @6 :Text;                 # what it named
  outcome @7 :Text;                # ok, ok duplicate, refused, or a reply code's name
  detail @8 :Text;                 # the refusal's or the reply's message
  requestDigest @9 :Data;          # SHA-256 of the request's frame (its Cap'n Proto message)
}

struct AuditLogReply {
  entries @0 :List(AuditLogEntry);  # ascending sequence
  more @1 :Bool;                   # entries after the last one remain
  firstKeptSequence @2 :UInt64;    # older ones were dropped past retention
  lastSequence @3 :UInt64;         # the newest entry's (0: none written yet)
}

struct Response {
  requestId @0 :UInt64;
  union {
    unspecified @1 :Void;          # default: an empty message is no response at all
    reservation @2 :ReservationReply;
    policy @3 :PolicyReply;
    audit @4 :AuditReply;
    health @5 :HealthReply;
    error @6 :ErrorReply;
    gateway @7 :GatewayReply;
    shard @8 :ShardReply;
    operators @9 :OperatorReply;
    auditLog @10 :AuditLogReply;
  }
}
