#include "core/shard_account.h"

#include <algorithm>

#include "core/assert.h"
#include "core/checked_math.h"

namespace tally {

bool isConserved(const ShardBalances& b) {
  using u128 = unsigned __int128;
  const u128 parts = u128{b.local_available} + b.local_reserved + b.local_spent + b.local_retired;
  return parts == b.allocated;
}

const char* shardCodeName(ShardCode code) {
  switch (code) {
    case ShardCode::kOk: return "ok";
    case ShardCode::kZeroUnits: return "zero-units";
    case ShardCode::kClosed: return "closed";
    case ShardCode::kInsufficientAvailable: return "insufficient-available";
    case ShardCode::kInsufficientReserved: return "insufficient-reserved";
    case ShardCode::kOverflow: return "overflow";
  }
  return "unknown";
}

ShardAccount::ShardAccount(const ShardBalances& balances, bool closed)
    : balances_(balances), closed_(closed) {}

ShardAccount ShardAccount::allocate(Units allocated_units) {
  return ShardAccount(
      ShardBalances{.allocated = allocated_units, .local_available = allocated_units}, false);
}

ShardAccount ShardAccount::restore(const ShardBalances& balances, bool closed, bool* ok) {
  *ok = isConserved(balances) && (!closed || balances.local_available == 0);
  return ShardAccount(balances, closed);
}

void ShardAccount::commit(const ShardBalances& next) {
  TALLY_ASSERT(isConserved(next));
  TALLY_ASSERT(!closed_ || next.local_available == 0);
  balances_ = next;
}

ShardCode ShardAccount::reserve(Units units) {
  if (units == 0) return ShardCode::kZeroUnits;
  if (closed_) return ShardCode::kClosed;
  if (balances_.local_available < units) return ShardCode::kInsufficientAvailable;
  ShardBalances next = balances_;
  next.local_available -= units;
  next.local_reserved += units;  // cannot overflow: bounded by allocated
  commit(next);
  return ShardCode::kOk;
}

ShardCode ShardAccount::release(Units reserved_units) {
  if (balances_.local_reserved < reserved_units) return ShardCode::kInsufficientReserved;
  ShardBalances next = balances_;
  next.local_reserved -= reserved_units;
  if (closed_) {
    next.local_retired += reserved_units;
  } else {
    next.local_available += reserved_units;
  }
  commit(next);
  return ShardCode::kOk;
}

ShardSettleOutcome ShardAccount::settle(Units reserved_units, Units actual_units) {
  if (balances_.local_reserved < reserved_units) return {.code = ShardCode::kInsufficientReserved};
  ShardBalances next = balances_;
  next.local_reserved -= reserved_units;
  ShardSettleOutcome outcome;
  if (actual_units <= reserved_units) {
    outcome.refunded = reserved_units - actual_units;
    next.local_spent += actual_units;
    if (closed_) {
      next.local_retired += outcome.refunded;
    } else {
      next.local_available += outcome.refunded;
    }
  } else {
    const Units excess = actual_units - reserved_units;
    outcome.taken_from_available = std::min(excess, next.local_available);
    outcome.overspent = excess - outcome.taken_from_available;
    next.local_available -= outcome.taken_from_available;
    next.local_spent += reserved_units + outcome.taken_from_available;
    auto overspent = checkedAdd(next.overspent, outcome.overspent);
    if (!overspent) return {.code = ShardCode::kOverflow};
    next.overspent = *overspent;
  }
  commit(next);
  return outcome;
}

void ShardAccount::close() {
  if (closed_) return;
  ShardBalances next = balances_;
  next.local_retired += next.local_available;
  next.local_available = 0;
  closed_ = true;
  commit(next);
}

}  // namespace tally
