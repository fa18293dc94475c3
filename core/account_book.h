#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/account.h"
#include "core/ledger_types.h"
#include "core/policy.h"
#include "core/types.h"

// The central ledger's accounts and policy generations (SPEC §3, §4). Owns every Account and
// every published Policy; pure and single-threaded (owned by one Ledger).
//
// Generations: publishing makes a new ACTIVE generation; every older one is DRAINING. A
// draining account admits nothing and does not refill; it hands its `available` (and every
// later refund) to the active generation's account of the same subject/route, up to that
// account's burst, and the active account pays off a draining account's debt. Each such move
// is one paired entry (transferredOut on one side, minted on the other), so the sum over a
// subject/route's accounts obeys the equation with no transfer term left over.
//
// Invariant: every account conserves after every call; no `available` is negative (unsigned,
// and every subtraction is checked).

namespace tally {

struct AccountEntry {
  AccountKey key;
  Budget budget;  // copy of the budget that governs this account
  Account account;
};

// What governs an admission for (subject, route) right now.
struct Admission {
  LimitingDimension refused = LimitingDimension::kNone;  // kNone: admissible account found
  Generation generation = 0;      // the matched generation (also for refusals, where known)
  AccountEntry* entry = nullptr;  // the active account, refilled and rebalanced
};

class AccountBook {
 public:
  AccountBook() = default;
  AccountBook(const AccountBook&) = delete;
  AccountBook& operator=(const AccountBook&) = delete;

  // Validates and publishes; the previous active generation starts draining.
  PolicyReply publish(Policy policy);
  // Republishes the policy before the active one as a new generation.
  PolicyReply rollback();

  // Rebuilding from the durable record, before serving. Policies first (any order), then
  // accounts. Errors name what is inconsistent; the shell refuses to start on any.
  Status restorePolicy(Policy policy, Generation republished_from);
  Status restoreAccount(const AccountKey& key, const Balances& balances, uint64_t refill_clock_ms,
                        uint64_t refill_carry);

  Generation activeGeneration() const { return active_generation_; }
  Generation republishedFrom(Generation generation) const;
  std::vector<Generation> generations() const;
  const Policy* policy(Generation generation) const;
  GenerationState generationState(Generation generation) const;

  // Finds, opens if needed, refills and rebalances the account that may admit for
  // (subject, route). `pinned_generation` 0 means "the active one". Returns the refusal
  // dimension when nothing may be admitted (no budget, draining generation, debt).
  Admission admit(const std::string& subject, const std::string& route,
                  Generation pinned_generation, uint64_t now_ms, bool* table_full);

  AccountEntry* find(const AccountKey& key);
  const AccountEntry* find(const AccountKey& key) const;

  // Refills the active account of (subject, route) and moves draining balances (see above).
  // Call after any refund into an account of a draining generation.
  void rebalance(const SubjectRoute& subject_route, uint64_t now_ms);

  // Debt summed over every generation of (subject, route).
  Units debt(const SubjectRoute& subject_route) const;

  // Emergency carve (SPEC §4 "carve shard") from an existing account. Refused while the
  // subject/route owes debt. Whether emergency mode allows it is the caller's policy check.
  AccountCode carve(const AccountKey& key, Units shard_units, uint64_t now_ms);
  // Remint: `units` proven unused return from `source`'s retiredForEmergency to the active
  // generation's account, as far as its burst allows. What does not fit stays retired.
  AccountCode remint(const AccountKey& source, Units units, uint64_t now_ms, Units* reminted);

  // Audit of balances only (the Ledger adds the reservation cross-check).
  std::vector<AccountView> view(uint64_t now_ms) const;

  // Records that `key`'s balances changed (the Ledger calls it for every balance operation it
  // applies to an AccountEntry directly).
  void markChanged(const AccountKey& key);
  // Keys whose balances changed since the last call (for the durable store).
  std::vector<AccountKey> takeChangedAccounts();
  bool takePoliciesChanged();

  size_t accountCount() const { return accounts_.size(); }

 private:
  struct GenerationEntry {
    Policy policy;
    Generation republished_from = 0;  // rollback source, 0 if none
  };

  AccountEntry* openAccount(const AccountKey& key, const Budget& budget, uint64_t now_ms,
                            bool* table_full);
  // Moves `units` from `from.available` to `to` as one paired entry. Both or neither change.
  bool transferAvailable(AccountEntry* from, AccountEntry* to, Units units);

  std::map<Generation, GenerationEntry> generations_;
  Generation active_generation_ = 0;
  std::map<AccountKey, AccountEntry> accounts_;
  // Generations that have an account for each subject/route, ascending.
  std::map<SubjectRoute, std::vector<Generation>> generations_by_route_;
  std::set<AccountKey> changed_accounts_;
  bool policies_changed_ = false;
};

}  // namespace tally
