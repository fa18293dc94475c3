#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "core/account.h"
#include "core/policy.h"
#include "core/types.h"

// Accounting-period close (SPEC §4, docs/LEDGER.md "Accounting periods"). Pure: no clock, no I/O.
//
// Epochs: the accounting epoch of a time is floor(now_ms / period_ms) with now_ms Unix
// milliseconds and period_ms 3,600,000 ("hour") or 86,400,000 ("day"). Unix time has no leap
// seconds, so day epochs start at 00:00 UTC and hour epochs on the UTC hour; epoch 0 began at
// 1970-01-01T00:00Z.
//
// Every account's balances are cumulative (opening, minted, overdraftIssued, spent,
// overdraftRepaid and transferredOut only grow; available, reserved and retiredForEmergency are
// the stocks). A period therefore needs no counters of its own: it is the pair of the account's
// balances at its start (`opening`) and at its close (`closing`), and its activity is their
// difference. closing(n) is opening(n+1) by construction, and each period checks
//
//   stock(opening) + Δopening + Δminted + ΔoverdraftIssued
//       = stock(closing) + Δspent + ΔoverdraftRepaid + ΔtransferredOut
//   debt(closing) = debt(opening) + ΔoverdraftIssued − ΔoverdraftRepaid
//
// with stock = available + reserved + retiredForEmergency, which is SPEC §4's equation over the
// period (it follows from the equation holding at both ends, and fails if a cumulative balance
// ever went down).

namespace tally {

// The accounting epoch `now_ms` falls in, and where an epoch starts.
uint64_t accountingEpochOf(uint64_t now_ms, EpochPeriod period);
uint64_t epochStartMs(uint64_t epoch, EpochPeriod period);

// The open (not yet closed) period of one account, durable with the account.
// epoch_first = 0 with opened_at_ms = 0 is an account stored before periods existed: its first
// period covers everything since the account opened (opening balances all zero).
struct PeriodState {
  uint64_t epoch_first = 0;   // the epoch this period began in
  uint64_t opened_at_ms = 0;  // ledger time it began: the previous close, or the account's open
  Balances opening;           // the account's balances at that time (zero for a new account)

  bool operator==(const PeriodState&) const = default;
};

// What a period changed: the differences of the cumulative balances.
struct PeriodActivity {
  Units opened = 0;  // Δopening: the account opened (full, for a first-seen subject/route)
  Units minted = 0;  // refill, remints and transfers received
  Units spent = 0;
  Units debt_issued = 0;  // ΔoverdraftIssued
  Units debt_repaid = 0;  // ΔoverdraftRepaid
  Units transferred_out = 0;

  bool operator==(const PeriodActivity&) const = default;
};

// One closed period of one account: a durable, immutable record.
struct PeriodSnapshot {
  AccountKey key;
  EpochPeriod epoch_period = EpochPeriod::kHour;
  uint64_t epoch_first = 0;  // epochs [epoch_first, epoch_last] are covered (a gap: see below)
  uint64_t epoch_last = 0;
  uint64_t opened_at_ms = 0;
  uint64_t closed_at_ms = 0;
  Balances opening;
  Balances closing;
  bool conserved = true;  // both ends conserve and the period's equation holds (checkPeriod)

  bool operator==(const PeriodSnapshot&) const = default;
};

// A snapshot's identity: one account, one first epoch.
struct PeriodKey {
  AccountKey key;
  uint64_t epoch_first = 0;

  auto operator<=>(const PeriodKey&) const = default;
};

inline Units stockOf(const Balances& b) {
  return b.available + b.reserved + b.retired_for_emergency;  // each <= kBalanceUnitsMax
}
inline Units debtOf(const Balances& b) {
  return b.overdraft_issued >= b.overdraft_repaid ? b.overdraft_issued - b.overdraft_repaid : 0;
}

// One closed period as the list of periods shows it: its span and how many accounts it closed.
struct PeriodSpan {
  EpochPeriod epoch_period = EpochPeriod::kHour;
  uint64_t epoch_first = 0;
  uint64_t epoch_last = 0;
  uint64_t accounts = 0;
  bool conserved = true;  // every one of those accounts' snapshots

  bool operator==(const PeriodSpan&) const = default;
};

// The period's activity; nullopt if a cumulative balance went down (the period does not hold).
std::optional<PeriodActivity> periodActivity(const Balances& opening, const Balances& closing);
// Both ends conserve, no cumulative balance went down, and the period equation above holds.
bool checkPeriod(const Balances& opening, const Balances& closing);

// Closes `state` at `now_ms`: the snapshot of the period from state.epoch_first up to the
// epoch before `now_ms`'s (one snapshot for the whole span: a ledger that was down across
// several boundaries closes them as one period, whose activity is everything since the last
// close), and `state` becomes the period that starts now with `closing` as its opening.
// Precondition: accountingEpochOf(now_ms, period) > state->epoch_first, or a legacy state.
PeriodSnapshot closePeriod(const AccountKey& key, EpochPeriod period, const Balances& closing,
                           uint64_t now_ms, PeriodState* state);
// True when the period open in `state` has crossed a boundary by `now_ms`.
bool periodDue(const PeriodState& state, EpochPeriod period, uint64_t now_ms);

// The closed periods kept in memory (for `tallyctl audit --period`) and in the store: the last
// limits::kPeriodSnapshotsKept of each account. Pure bookkeeping: it never changes a balance.
class PeriodBook {
 public:
  // Adds a snapshot (closing or restoring; a later image of the same PeriodKey replaces it) and
  // returns it; drops the account's oldest beyond the bound and names it in `*dropped`.
  // References stay valid until that snapshot is dropped.
  const PeriodSnapshot& add(PeriodSnapshot snapshot, std::optional<PeriodKey>* dropped);

  // Every kept snapshot covering `epoch` (epoch_first <= epoch <= epoch_last), sorted by key.
  std::vector<const PeriodSnapshot*> covering(uint64_t epoch) const;
  const PeriodSnapshot* find(const PeriodKey& key) const;
  // Every distinct closed period kept, ascending (the list of closed periods).
  std::vector<PeriodSpan> spans() const;
  // The most recent close, if any (metrics).
  const PeriodSnapshot* latest() const { return latest_; }
  size_t size() const { return size_; }

 private:
  std::map<AccountKey, std::map<uint64_t, PeriodSnapshot>> by_account_;  // by epoch_first
  const PeriodSnapshot* latest_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tally
