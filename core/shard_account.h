#pragma once

#include <cstdint>

#include "core/types.h"

// Local accounting of one emergency shard at the agent (SPEC §6):
//
//   allocated = localAvailable + localReserved + localSpent + localRetired
//
// asserted after every mutation. A shard can never spend more than it was allocated: a settle
// above the reservation takes the excess from localAvailable, and whatever localAvailable cannot
// cover is recorded as `overspent` (owed to the central ledger as debt at reconciliation),
// outside the equation. Closing a shard retires its localAvailable; units of reservations still
// STARTED or USAGE_UNKNOWN stay in localReserved until a receipt resolves them.
//
// A plain value with no clock and no I/O; the agent's shard store owns and persists it.

namespace tally {

struct ShardBalances {
  Units allocated = 0;
  Units local_available = 0;
  Units local_reserved = 0;
  Units local_spent = 0;
  Units local_retired = 0;
  Units overspent = 0;  // usage beyond what the shard could cover; becomes central debt

  bool operator==(const ShardBalances&) const = default;
};

bool isConserved(const ShardBalances& balances);

enum class ShardCode : uint8_t {
  kOk = 0,
  kZeroUnits,
  kClosed,                 // no admission from a closed shard
  kInsufficientAvailable,  // localAvailable < units
  kInsufficientReserved,   // localReserved < units: a bookkeeping bug in the caller
  kOverflow,
};

const char* shardCodeName(ShardCode code);

struct ShardSettleOutcome {
  ShardCode code = ShardCode::kOk;
  Units refunded = 0;
  Units taken_from_available = 0;
  Units overspent = 0;
};

class ShardAccount {
 public:
  static ShardAccount allocate(Units allocated_units);
  // Rebuilds from a durable record; `*ok` is false if it does not conserve.
  static ShardAccount restore(const ShardBalances& balances, bool closed, bool* ok);

  const ShardBalances& balances() const { return balances_; }
  bool closed() const { return closed_; }

  ShardCode reserve(Units units);
  // Release or local expiry of a RESERVED local reservation (also allowed after close: units
  // that come back after close are retired, not made available).
  ShardCode release(Units reserved_units);
  ShardSettleOutcome settle(Units reserved_units, Units actual_units);
  // Stops admission; localAvailable becomes localRetired. Idempotent.
  void close();

 private:
  explicit ShardAccount(const ShardBalances& balances, bool closed);
  void commit(const ShardBalances& next);

  ShardBalances balances_;
  bool closed_ = false;
};

}  // namespace tally
