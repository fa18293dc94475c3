#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ledger/store.h"

// The stored records a restore cannot apply (docs/RUNBOOK.md "A record the ledger cannot
// apply"), and the repair that takes them out of the way while keeping the conservation
// equation. Pure functions over StoreContents: the shell (tally-ledger check / repair, and the
// restore before serving) loads, prints and commits.
//
// A record is bad when a value is beyond what any sequence of bounded requests can produce:
// a reservation's units above limits::kUnitsPerRequestMax, an account balance above
// limits::kBalanceUnitsMax, an account that does not conserve or has no budget, a policy that
// fails validation (e.g. a refill rate above today's maximum).

namespace tally::ledger {

struct BadRecord {
  std::string table;  // "policies", "accounts" or "reservations"
  std::string key;    // "generation 3", "tenant-7 /v1/chat @1", a reservation id
  std::string field;  // the store's field name, e.g. "actualUnits"
  std::string value;
  std::string why;

  bool operator==(const BadRecord&) const = default;
};

// "accounts tenant-7 /v1/chat @1: spent = 18446744073709551615: above the balance bound …"
std::string describe(const BadRecord& record);

// Every bad record, in table order (policies, accounts, reservations), then key order.
std::vector<BadRecord> findBadRecords(const StoreContents& contents);

// What repair does to one bad record, as written to DIR/quarantine.jsonl.
struct Correction {
  BadRecord record;
  std::string action;  // "quarantined", "rebased", "clamped", "released-as-spent"
  std::string before;  // the stored image, as text
  std::string after;   // the image written instead ("" when the record is removed)
};

struct RepairPlan {
  StoreBatch batch;                     // commit this to apply the repair
  std::vector<Correction> corrections;  // one per changed record
  std::vector<BadRecord> unrepairable;  // non-empty: commit nothing
};

// Corrections, each keeping every account's equation:
//  * a reservation with units beyond the bounds is quarantined (deleted); if it held units,
//    its account's `reserved` moves to `spent` (no capacity is created from a record that
//    cannot be trusted);
//  * an account with a balance beyond the bounds, or that does not conserve, is rebased:
//    available = min(available, burst), reserved = the units its remaining live reservations
//    hold, retiredForEmergency kept (its shards account for it), opening = their sum, every
//    other counter 0 (the old image, with its debt, stays in the quarantine log);
//  * a policy whose values exceed today's maxima has them clamped to the maxima.
RepairPlan planRepair(const StoreContents& contents);

// `contents` with `batch` applied the way the store applies it (upserts by key, deletions).
StoreContents applied(StoreContents contents, const StoreBatch& batch);

// One JSON object per line for DIR/quarantine.jsonl.
std::string quarantineLine(const Correction& correction, uint64_t at_ms);

}  // namespace tally::ledger
