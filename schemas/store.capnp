# The ledger's durable record (ledger/sqlite_store.h), mirrored by ledger/store.h.
#
# One StoreBatchV1 is one row of the `log` table in DIR/ledger.db; the folded tables in
# DIR/tables.db hold one PolicyRecordV1, AccountRecordV1, ReservationRecordV1, GatewayRecordV1
# or ShardRecordV1 per row (fences are plain columns, the shard sequence a meta value). Every record is a full image:
# a later image of the same row replaces an earlier one. Each is stored in the packed
# serialization (capnp::writePackedMessage), one message per blob.
#
# These bytes live on disk for as long as a data dir does: only append fields, never renumber,
# retype or reorder them.

@0xc4d78f9948b6f3aa;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tally::schema");

using import "admission_budget.capnp".PolicyV1;
using import "limit_reservation.capnp".LimitReservationV1;
using Shard = import "emergency_shard.capnp";
using Protocol = import "protocol.capnp";

struct PolicyRecordV1 {
  policy @0 :PolicyV1;             # policy.generation is set
  republishedFrom @1 :UInt64;      # rollback source generation, 0 if none
}

struct AccountRecordV1 {
  # core AccountKey, Balances and the refill state of one Account.
  subject @0 :Text;
  route @1 :Text;
  generation @2 :UInt64;
  opening @3 :UInt64;
  minted @4 :UInt64;
  overdraftIssued @5 :UInt64;
  available @6 :UInt64;
  reserved @7 :UInt64;
  spent @8 :UInt64;
  retiredForEmergency @9 :UInt64;
  overdraftRepaid @10 :UInt64;
  transferredOut @11 :UInt64;
  refillClockMs @12 :UInt64;
  refillCarry @13 :UInt64;
  overdraftBreaches @14 :UInt64;     # core OverdraftBreaches: settles that left debt above
  overdraftBreachUnits @15 :UInt64;  # max overdraft, and the debt beyond it summed over them
  # core PeriodState: the accounting period open now (all zero: stored before periods existed).
  periodEpochFirst @16 :UInt64;
  periodOpenedAtMs @17 :UInt64;
  periodOpening @18 :Protocol.BalancesV1;
}

struct ReservationRecordV1 {
  # limitReservation.v1 plus the ledger-internal state it does not carry on the wire.
  reservation @0 :LimitReservationV1;
  lateReceiptApplied @1 :Bool;     # core Reservation::late_receipt_applied
}

struct StoreBatchV1 {
  # Within one batch, deletedReservations apply before the upserts (an id compacted and then
  # reused in the same batch ends up present).
  policies @0 :List(PolicyRecordV1);
  accounts @1 :List(AccountRecordV1);
  reservations @2 :List(ReservationRecordV1);
  deletedReservations @3 :List(Text);
  ledgerClockMs @4 :UInt64;        # the ledger clock's high-water mark at this batch
  gateways @5 :List(GatewayRecordV1);
  shards @6 :List(ShardRecordV1);
  fences @7 :List(FenceRecordV1);
  shardSequence @8 :UInt64;        # the last shard sequence number used (never decreases)
  deletedShards @9 :List(Text);    # compacted after retention (ids are never reused)
  periodSnapshots @10 :List(Protocol.PeriodSnapshotV1);  # closed accounting periods
  deletedPeriodSnapshots @11 :List(PeriodKeyV1);         # beyond retention
  operators @12 :List(Protocol.OperatorInfo);   # enrolled operators (docs/security.md)
  auditLog @13 :List(Protocol.AuditLogEntry);   # appended privileged actions, by sequence
  auditLogKeptFrom @14 :UInt64;                 # entries below it dropped (0: none)
}

struct PeriodKeyV1 {
  subject @0 :Text;
  route @1 :Text;
  generation @2 :UInt64;
  epochFirst @3 :UInt64;
}

struct GatewayRecordV1 {
  # core GatewayRecord.
  gatewayName @0 :Text;
  publicKey @1 :Data;              # Ed25519, 32 bytes
  enabled @2 :Bool;
  enrolledAtMs @3 :UInt64;
  previousPublicKey @4 :Data;      # a key rotation's replaced key; empty: none
  previousKeyUntilMs @5 :UInt64;
}

struct ShardRecordV1 {
  # core ShardRecord (core/shard_record.h): the ledger's side of one shard.
  grant @0 :Shard.EmergencyShardV1;           # as issued, ledger signature included
  issueRequest @1 :Shard.ShardIssueRequestV1;  # as received, gateway signature included
  state @2 :Protocol.ShardState;
  spentUnits @3 :UInt64;
  remintedUnits @4 :UInt64;
  retiredUnits @5 :UInt64;
  debtUnits @6 :UInt64;
  reported @7 :Bool;
  reportBootEpoch @8 :UInt64;
  # The last accepted report's balances (allocated is grant.allocatedUnits).
  reportedLocalAvailable @9 :UInt64;
  reportedLocalReserved @10 :UInt64;
  reportedLocalSpent @11 :UInt64;
  reportedLocalRetired @12 :UInt64;
  reportedOverspent @13 :UInt64;
  receipts @14 :List(LimitReservationV1);     # sorted by id
  remintDueAtMs @15 :UInt64;                  # deferred remint, 0: none
  remintTargetUnits @16 :UInt64;
}

struct FenceRecordV1 {
  subject @0 :Text;
  route @1 :Text;
  fence @2 :UInt64;
}
