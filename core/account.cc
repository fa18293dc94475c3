#include "core/account.h"

#include <algorithm>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"

namespace tally {
namespace {

using u128 = unsigned __int128;

// Adds `delta` to `*field`; false if the result would exceed the balance bound (which is far
// below 2^64, so a record the ledger writes is always one its restore accepts).
[[nodiscard]] bool add(Units* field, Units delta) {
  auto sum = checkedAdd(*field, delta);
  if (!sum || *sum > limits::kBalanceUnitsMax) return false;
  *field = *sum;
  return true;
}

// Subtracts `delta` from `*field`; false if the result would be negative.
[[nodiscard]] bool sub(Units* field, Units delta) {
  auto difference = checkedSub(*field, delta);
  if (!difference) return false;
  *field = *difference;
  return true;
}

constexpr uint64_t kMsPerSecond = 1000;

}  // namespace

bool isConserved(const Balances& b) {
  const u128 sources = u128{b.opening} + b.minted + b.overdraft_issued;
  const u128 uses = u128{b.available} + b.reserved + b.spent + b.retired_for_emergency +
                    b.overdraft_repaid + b.transferred_out;
  return sources == uses && b.overdraft_repaid <= b.overdraft_issued;
}

std::vector<BalanceField> balancesAboveBound(const Balances& b) {
  const BalanceField all[] = {
      {"opening", b.opening},
      {"minted", b.minted},
      {"overdraftIssued", b.overdraft_issued},
      {"available", b.available},
      {"reserved", b.reserved},
      {"spent", b.spent},
      {"retiredForEmergency", b.retired_for_emergency},
      {"overdraftRepaid", b.overdraft_repaid},
      {"transferredOut", b.transferred_out},
  };
  std::vector<BalanceField> above;
  for (const BalanceField& field : all) {
    if (field.value > limits::kBalanceUnitsMax) above.push_back(field);
  }
  return above;
}

const char* accountCodeName(AccountCode code) {
  switch (code) {
    case AccountCode::kOk: return "ok";
    case AccountCode::kZeroUnits: return "zero-units";
    case AccountCode::kAboveMaxSingle: return "above-max-single";
    case AccountCode::kDebtOutstanding: return "debt-outstanding";
    case AccountCode::kInsufficientAvailable: return "insufficient-available";
    case AccountCode::kInsufficientReserved: return "insufficient-reserved";
    case AccountCode::kInsufficientRetired: return "insufficient-retired";
    case AccountCode::kAboveMintRoom: return "above-mint-room";
    case AccountCode::kOverflow: return "overflow";
  }
  return "unknown";
}

Account::Account(BucketParams bucket, const Balances& balances, uint64_t refill_clock_ms,
                 uint64_t refill_carry)
    : bucket_(bucket),
      balances_(balances),
      refill_clock_ms_(refill_clock_ms),
      refill_carry_(refill_carry) {}

Account Account::open(BucketParams bucket, Units opening, uint64_t now_ms) {
  Balances balances;
  balances.opening = opening;
  balances.available = opening;
  Account account(bucket, balances, now_ms, 0);
  TALLY_ASSERT(isConserved(account.balances_));
  return account;
}

Account Account::restore(BucketParams bucket, const Balances& balances, uint64_t refill_clock_ms,
                         uint64_t refill_carry_unit_ms, bool* ok) {
  *ok = isConserved(balances) && refill_carry_unit_ms < kMsPerSecond;
  return Account(bucket, balances, refill_clock_ms, *ok ? refill_carry_unit_ms : 0);
}

void Account::commit(const Balances& next) {
  TALLY_ASSERT(isConserved(next));
  balances_ = next;
}

Units Account::mintRoom() const {
  const Units headroom =
      balances_.available < bucket_.burst ? bucket_.burst - balances_.available : 0;
  return saturatingAdd(debt(), headroom);
}

bool Account::mint(Units units, Balances* next, Units* repaid) const {
  TALLY_ASSERT(units <= mintRoom());
  *repaid = std::min(units, debt());
  return add(&next->minted, units) && add(&next->overdraft_repaid, *repaid) &&
         add(&next->available, units - *repaid);
}

RefillOutcome Account::refill(uint64_t now_ms) {
  if (now_ms <= refill_clock_ms_) return {};
  const uint64_t elapsed_ms = now_ms - refill_clock_ms_;
  refill_clock_ms_ = now_ms;
  const Units room = mintRoom();
  if (room == 0 || bucket_.refill_per_second == 0) {
    refill_carry_ = 0;  // a full bucket does not bank time
    return {};
  }
  const u128 unit_ms = u128{elapsed_ms} * bucket_.refill_per_second + refill_carry_;
  const u128 mintable = unit_ms / kMsPerSecond;
  Units units = room;
  if (mintable < room) {
    units = static_cast<Units>(mintable);
    refill_carry_ = static_cast<uint64_t>(unit_ms % kMsPerSecond);
  } else {
    refill_carry_ = 0;
  }
  if (units == 0) return {};
  Balances next = balances_;
  Units repaid = 0;
  if (!mint(units, &next, &repaid)) {
    // Cumulative minted left 64 bits (policy limits make this centuries away). Minting stops;
    // nothing is lost and the equation still holds.
    refill_carry_ = 0;
    return {};
  }
  commit(next);
  return {.minted = units, .repaid = repaid};
}

void Account::holdRefillClock(uint64_t now_ms) {
  if (now_ms > refill_clock_ms_) refill_clock_ms_ = now_ms;
  refill_carry_ = 0;
}

AccountCode Account::reserve(Units units, Units max_single) {
  if (units == 0) return AccountCode::kZeroUnits;
  if (units > max_single) return AccountCode::kAboveMaxSingle;
  if (debt() > 0) return AccountCode::kDebtOutstanding;
  if (balances_.available < units) return AccountCode::kInsufficientAvailable;
  Balances next = balances_;
  if (!sub(&next.available, units)) TALLY_UNREACHABLE();
  if (!add(&next.reserved, units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::release(Units reserved_units) {
  Balances next = balances_;
  if (!sub(&next.reserved, reserved_units)) return AccountCode::kInsufficientReserved;
  if (!add(&next.available, reserved_units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

SettleOutcome Account::chargeExcess(Balances next, Units excess_units, Units max_overdraft) {
  SettleOutcome outcome;
  outcome.taken_from_available = std::min(excess_units, next.available);
  outcome.debt_issued = excess_units - outcome.taken_from_available;
  next.available -= outcome.taken_from_available;
  if (!add(&next.overdraft_issued, outcome.debt_issued)) {
    return {.code = AccountCode::kOverflow};
  }
  commit(next);
  outcome.overdraft_breach = debt() > max_overdraft;
  if (outcome.overdraft_breach) {
    breaches_.count = saturatingAdd(breaches_.count, 1);
    breaches_.units = saturatingAdd(breaches_.units, debt() - max_overdraft);
  }
  return outcome;
}

SettleOutcome Account::settle(Units reserved_units, Units actual_units, Units max_overdraft) {
  Balances next = balances_;
  if (!sub(&next.reserved, reserved_units)) return {.code = AccountCode::kInsufficientReserved};
  if (!add(&next.spent, actual_units)) return {.code = AccountCode::kOverflow};
  if (actual_units <= reserved_units) {
    const Units refund = reserved_units - actual_units;
    if (!add(&next.available, refund)) return {.code = AccountCode::kOverflow};
    commit(next);
    return {.refunded = refund};
  }
  return chargeExcess(next, actual_units - reserved_units, max_overdraft);
}

SettleOutcome Account::chargeExtra(Units extra_units, Units max_overdraft) {
  Balances next = balances_;
  if (!add(&next.spent, extra_units)) return {.code = AccountCode::kOverflow};
  return chargeExcess(next, extra_units, max_overdraft);
}

AccountCode Account::carve(Units shard_units) {
  if (shard_units == 0) return AccountCode::kZeroUnits;
  Balances next = balances_;
  if (!sub(&next.available, shard_units)) return AccountCode::kInsufficientAvailable;
  if (!add(&next.retired_for_emergency, shard_units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::recordShardSpent(Units units) {
  Balances next = balances_;
  if (!sub(&next.retired_for_emergency, units)) return AccountCode::kInsufficientRetired;
  if (!add(&next.spent, units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::recordShardDebt(Units debt_units) {
  Balances next = balances_;
  if (!add(&next.spent, debt_units)) return AccountCode::kOverflow;
  if (!add(&next.overdraft_issued, debt_units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::transferOutRetired(Units units) {
  Balances next = balances_;
  if (!sub(&next.retired_for_emergency, units)) return AccountCode::kInsufficientRetired;
  if (!add(&next.transferred_out, units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::transferOutAvailable(Units units) {
  Balances next = balances_;
  if (!sub(&next.available, units)) return AccountCode::kInsufficientAvailable;
  if (!add(&next.transferred_out, units)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

AccountCode Account::receiveTransfer(Units units) {
  if (units > mintRoom()) return AccountCode::kAboveMintRoom;
  Balances next = balances_;
  Units repaid = 0;
  if (!mint(units, &next, &repaid)) return AccountCode::kOverflow;
  commit(next);
  return AccountCode::kOk;
}

}  // namespace tally
