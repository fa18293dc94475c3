# emergencyShard.v1 (SPEC §6) and the agent's reconciliation report.
# Only append fields; never renumber, retype or reorder enumerants.
#
# Signatures are Ed25519 (libsodium crypto_sign_detached) over a domain-separation prefix
# ("tally.emergencyShard.v1", "tally.shardReport.v1" or "tally.shardIssue.v1", then one zero
# byte) followed by capnp::canonicalize() of a copy of the struct whose `signature` field is
# cleared (null). The prefix keeps a signature on one kind of message from verifying as another.
# Appending a field changes the canonical bytes only for messages that set it, so old signatures
# stay verifiable.

@0xf83d124afece82b7;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tally::schema");

using import "limit_reservation.capnp".LimitReservationV1;

struct EmergencyShardV1 {
  shardId @0 :Text;
  subject @1 :Text;
  route @2 :Text;
  policyGeneration @3 :UInt64;
  accountingEpochMs @4 :UInt64;
  gatewayId @5 :Data;              # the gateway's Ed25519 public key, 32 bytes
  gatewayBootEpoch @6 :UInt64;
  fence @7 :UInt64;
  allocatedUnits @8 :UInt64;
  issuedAtMs @9 :UInt64;
  expiresAtMs @10 :UInt64;
  ledgerKeyId @11 :Text;           # which ledger signing key; agents hold its public half
  signature @12 :Data;             # by the ledger key, 64 bytes
  gatewayName @13 :Text;           # the enrolled gateway's name (tallyctl gateway enroll --id)
}

struct ShardReportV1 {
  # Sent by the agent on reconnect, after it stopped admitting from the shard.
  # allocatedUnits = localAvailable + localReserved + localSpent + localRetired.
  shard @0 :EmergencyShardV1;      # as issued, ledger signature included
  localAvailable @1 :UInt64;
  localReserved @2 :UInt64;
  localSpent @3 :UInt64;
  localRetired @4 :UInt64;
  receipts @5 :List(LimitReservationV1);  # every reservation admitted from the shard
  gatewayBootEpoch @6 :UInt64;     # the boot epoch of the agent that sends the report
  signature @7 :Data;              # by the gateway key (shard.gatewayId), 64 bytes
  overspentUnits @8 :UInt64;       # usage the shard could not cover (core ShardBalances::overspent)
  reportedAtMs @9 :UInt64;         # the agent's wall clock when it built the report
}

struct ShardIssueRequestV1 {
  # A healthy agent asking the ledger for a shard, signed by its gateway key so that only an
  # enrolled, enabled gateway can have capacity carved for it. Idempotent per requestId (the
  # agent makes it unique per process start: a cloned data dir never shares one).
  requestId @0 :Text;
  gatewayName @1 :Text;
  gatewayId @2 :Data;              # the gateway's Ed25519 public key, 32 bytes
  gatewayBootEpoch @3 :UInt64;
  subject @4 :Text;
  route @5 :Text;
  signature @6 :Data;              # by the gateway key, 64 bytes
}
