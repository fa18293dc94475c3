# limitReservation.v1 (SPEC §5), mirrored by core/reservation.h `Reservation`.
# Only append fields; never renumber, retype or reorder enumerants.

@0xaf132e558bedad30;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tally::schema");

enum ReservationState {
  # core ReservationState, same order.
  requested @0;
  reserved @1;
  started @2;
  settled @3;
  settledWithDebt @4;
  rejected @5;
  released @6;
  expiring @7;
  expired @8;
  usageUnknown @9;
  reservationUnknown @10;
}

enum LimitingDimension {
  # core LimitingDimension, same order.
  none @0;
  capacity @1;
  debt @2;
  frozenRoute @3;
  maxSingleReservation @4;
  generationDraining @5;
  noBudget @6;
  ledgerUnavailable @7;            # agent: the ledger is unreachable; retry later
}

struct LimitReservationV1 {
  reservationId @0 :Text;          # chosen by the caller, at most 128 bytes
  requestDigest @1 :Data;          # sha256 of the canonical request, exactly 32 bytes
  subject @2 :Text;
  route @3 :Text;
  policyGeneration @4 :UInt64;
  accountingEpochMs @5 :UInt64;    # start of the accounting period it was admitted in
  reservedUnits @6 :UInt64;
  actualUnits @7 :UInt64;
  refundedUnits @8 :UInt64;
  debtUnits @9 :UInt64;
  operationId @10 :Text;
  createdAtMs @11 :UInt64;
  expiresAtMs @12 :UInt64;
  startedAtMs @13 :UInt64;
  closedAtMs @14 :UInt64;
  state @15 :ReservationState;
  origin @16 :Text;                # empty: central; otherwise the emergency shard id
  closedByHardLimit @17 :Bool;
  overdraftBreach @18 :Bool;
  limitingDimension @19 :LimitingDimension;  # rejections only
  retryAfterMs @20 :Int64;         # rejections only; -1: never under this policy
  # The request's own fields the idempotency check compares (core Reservation::priority,
  # requested_generation). requestFieldsKnown is false in records written before they were:
  # a repeat of such a reservation is compared on digest, subject, route and units only.
  priority @21 :UInt32;
  requestedGeneration @22 :UInt64;  # the request's generation pin; 0: the active one
  requestFieldsKnown @23 :Bool;
  region @24 :Text;                # the request's region ("" = none); compared by every repeat
  # (records written before it existed were written for requests without a region)
  gatewayName @25 :Text;           # the gateway whose connection reserved it ("" = none: an
  # operator, an --insecure link, or a record written before reservations were bound)
}
