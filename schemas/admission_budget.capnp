# admissionBudget.v1 (SPEC §3), mirrored by core/policy.h `Budget` and `Policy`.
#
# Evolution rules for every file in schemas/: only append fields, never renumber or retype one,
# never reorder enumerants. The first enumerant of every enum is a safe default, because a field
# that is absent on the wire reads as its default.

@0xdb3aeadde0285fab;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tally::schema");

enum EpochPeriod {
  # core EpochPeriod, same order.
  hour @0;
  day @1;
}

enum RolloutMode {
  # core RolloutMode, same order. Fields of this type default to `enforce` explicitly below.
  off @0;
  shadow @1;
  enforce @2;
}

struct EmergencyModeV1 {
  enabled @0 :Bool;            # off unless a policy turns it on
  shardUnits @1 :UInt64;
  shardTtlMs @2 :UInt64;
}

struct RolloutV1 {
  mode @0 :RolloutMode = enforce;  # core default
  percent @1 :UInt32 = 100;        # share of routes that enforce
}

struct AdmissionBudgetV1 {
  subjectPattern @0 :Text;         # "tenant-7", "tenant-*" or "*"
  route @1 :Text;
  region @2 :Text;
  unit @3 :Text;                   # capacity unit name, e.g. "tokens"
  refillPerSecond @4 :UInt64;
  burst @5 :UInt64;
  maxSingleReservation @6 :UInt64;
  holdTtlMs @7 :UInt64;            # RESERVED expiry
  hardExecutionLimitMs @8 :UInt64;
  maxOverdraft @9 :UInt64;
  priority @10 :UInt32;
  weight @11 :UInt32 = 1;
  fairnessBudgetPermille @12 :UInt32;
  estimatorDigest @13 :Text;
  accountingEpoch @14 :EpochPeriod;
  emergency @15 :EmergencyModeV1;
  rollout @16 :RolloutV1;
}

struct PolicyV1 {
  generation @0 :UInt64;           # assigned by the ledger at publish; 0 before
  budgets @1 :List(AdmissionBudgetV1);
}
