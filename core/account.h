#pragma once

#include <cstdint>
#include <vector>

#include "core/types.h"

// One account of the central ledger: the balances of (subject, route, policyGeneration) and
// every balance operation of SPEC §4. An Account is a plain value: it owns nothing, reads no
// clock (time arrives as an argument) and is driven by exactly one owner (the Ledger, a test,
// or the simulator).
//
// Invariant, asserted after every mutation:
//   opening + minted + overdraftIssued
//     = available + reserved + spent + retiredForEmergency + overdraftRepaid + transferredOut
// Every operation either applies completely or, when its precondition fails or a balance would
// leave 64 bits, changes nothing and says why.

namespace tally {

struct Balances {
  Units opening = 0;
  Units minted = 0;
  Units overdraft_issued = 0;
  Units available = 0;
  Units reserved = 0;
  Units spent = 0;
  Units retired_for_emergency = 0;
  Units overdraft_repaid = 0;
  Units transferred_out = 0;  // non-zero only in an account that handed units to another

  bool operator==(const Balances&) const = default;
};

// The conservation equation, computed without overflow.
bool isConserved(const Balances& balances);

struct BucketParams {
  Units refill_per_second = 0;
  Units burst = 0;

  bool operator==(const BucketParams&) const = default;
};

enum class AccountCode : uint8_t {
  kOk = 0,
  kZeroUnits,              // a reservation or carve of 0 units
  kAboveMaxSingle,         // units > max single reservation
  kDebtOutstanding,        // admission while debt > 0
  kInsufficientAvailable,  // available < units
  kInsufficientReserved,   // reserved < units: a bug in the caller's bookkeeping
  kInsufficientRetired,    // retiredForEmergency < units
  kAboveMintRoom,          // a transfer that does not fit under the receiver's burst
  kOverflow,               // a balance would leave 64 bits
};

const char* accountCodeName(AccountCode code);

// Settles that left debt above the policy's max overdraft (SPEC §4 "breach"), counted per
// account for the audit and metrics. `units` sums, over those settles, the debt beyond
// max_overdraft right after each one. Durable with the account; no balance depends on it.
struct OverdraftBreaches {
  uint64_t count = 0;
  Units units = 0;

  bool operator==(const OverdraftBreaches&) const = default;
};

// The balances of `balances` above limits::kBalanceUnitsMax, by the store's field names. No
// operation produces one (Account refuses it as kOverflow), so a stored one is poison.
struct BalanceField {
  const char* name = "";
  Units value = 0;
};
std::vector<BalanceField> balancesAboveBound(const Balances& balances);

struct RefillOutcome {
  Units minted = 0;  // total minted by this refill
  Units repaid = 0;  // the part of it that repaid debt
};

struct SettleOutcome {
  AccountCode code = AccountCode::kOk;
  Units refunded = 0;              // reserved - actual, when actual <= reserved
  Units taken_from_available = 0;  // part of the excess covered by available
  Units debt_issued = 0;           // part of the excess recorded as overdraft
  bool overdraft_breach = false;   // debt after this settle exceeds the policy's max overdraft
                                   // (counted in Account::breaches())
};

class Account {
 public:
  // A new account. `opening` units start available (a subject/route seen for the first time
  // opens full: opening = burst; a later generation opens empty and receives transfers).
  static Account open(BucketParams bucket, Units opening, uint64_t now_ms);

  // Rebuilds an account from its durable record. Returns false in `ok` if the record does not
  // conserve (corruption), in which case the returned account must not be used.
  static Account restore(BucketParams bucket, const Balances& balances, uint64_t refill_clock_ms,
                         uint64_t refill_carry_unit_ms, bool* ok);
  void restoreBreaches(const OverdraftBreaches& breaches) { breaches_ = breaches; }

  const Balances& balances() const { return balances_; }
  const BucketParams& bucket() const { return bucket_; }
  Units debt() const { return balances_.overdraft_issued - balances_.overdraft_repaid; }
  const OverdraftBreaches& breaches() const { return breaches_; }
  uint64_t refillClockMs() const { return refill_clock_ms_; }
  // Sub-unit remainder of the last refill, in unit·ms / 1000 (always < 1000).
  uint64_t refillCarry() const { return refill_carry_; }

  // What minting may still add: debt to repay plus room under burst.
  Units mintRoom() const;

  // Mints up to refill_per_second · Δt: repays debt first, the rest goes to available, never
  // above burst. Time that passes while the bucket is full mints nothing later. A `now_ms`
  // earlier than the refill clock is ignored.
  RefillOutcome refill(uint64_t now_ms);

  // Moves the refill clock without minting (a draining account does not refill).
  void holdRefillClock(uint64_t now_ms);

  AccountCode reserve(Units units, Units max_single);
  // release and expire: the reservation's units return to available.
  AccountCode release(Units reserved_units);
  SettleOutcome settle(Units reserved_units, Units actual_units, Units max_overdraft);
  // A receipt arriving after a reservation was closed as fully consumed reports more than was
  // reserved: the extra is charged as a settle over reservation would charge it.
  SettleOutcome chargeExtra(Units extra_units, Units max_overdraft);

  AccountCode carve(Units shard_units);
  // Shard reconciliation (SPEC §6): units a shard's receipts prove consumed move from
  // retiredForEmergency to spent. kInsufficientRetired if fewer are retired.
  AccountCode recordShardSpent(Units units);
  // Usage a shard could not cover (overspend, or a conflict's union of receipts beyond what
  // the shard still holds retired): spent += units and overdraftIssued += units, so the debt
  // freezes admission for the subject/route until repaid, like any settle above reservation.
  AccountCode recordShardDebt(Units debt_units);

  // Cross-account moves. Each is one half of a paired entry; the caller applies both halves.
  AccountCode transferOutRetired(Units units);    // remint, source side
  AccountCode transferOutAvailable(Units units);  // generation switch / debt collection, source
  AccountCode receiveTransfer(Units units);       // destination: minted += units, debt first

 private:
  Account(BucketParams bucket, const Balances& balances, uint64_t refill_clock_ms,
          uint64_t refill_carry);
  // Applies `units` of new capacity: repays debt first, the rest to available.
  // Precondition: units <= mintRoom() (callers cap).
  [[nodiscard]] bool mint(Units units, Balances* next, Units* repaid) const;
  void commit(const Balances& next);
  SettleOutcome chargeExcess(Balances next, Units excess_units, Units max_overdraft);

  BucketParams bucket_;
  Balances balances_;
  uint64_t refill_clock_ms_ = 0;
  uint64_t refill_carry_ = 0;
  OverdraftBreaches breaches_;
};

}  // namespace tally
