#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/account.h"
#include "core/ledger_types.h"
#include "core/period_close.h"
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
// Index: accounts are grouped by subject/route in a hash map looked up through string views (no
// temporary keys), each group holding its generations in ascending order, so an admission costs
// one lookup. The map is unordered; view() and takeChanged*() sort by key, so every output is
// deterministic. Accounts are never removed, and an AccountEntry never moves.
//
// Invariant: every account conserves after every call; no `available` is negative (unsigned,
// and every subtraction is checked).

namespace tally {

struct AccountEntry {
  AccountKey key;
  Budget budget;  // copy of the budget that governs this account
  Account account;
  PeriodState period;  // the accounting period open now (core/period_close.h)
  // The book's bookkeeping: true while the entry is listed for takeChangedEntries().
  bool change_pending = false;
};

// What governs an admission for (subject, route) right now.
struct Admission {
  LimitingDimension refused = LimitingDimension::kNone;  // kNone: admissible account found
  Generation generation = 0;      // the matched generation (also for refusals, where known)
  AccountEntry* entry = nullptr;  // the active account, refilled and rebalanced
  std::string message;            // why, when the reason is more than the dimension (a region)
};

class AccountBook {
 public:
  AccountBook() = default;
  AccountBook(const AccountBook&) = delete;
  AccountBook& operator=(const AccountBook&) = delete;

  // Validates and publishes; the previous active generation starts draining. Every account is
  // first refilled up to `now_ms` (what the outgoing generation earned is handed over).
  PolicyReply publish(Policy policy, uint64_t now_ms);
  // Republishes the policy before the active one as a new generation (refilling first, too).
  PolicyReply rollback(uint64_t now_ms);

  // Rebuilding from the durable record, before serving. Policies first (any order), then
  // accounts. Errors name what is inconsistent; the shell refuses to start on any.
  Status restorePolicy(Policy policy, Generation republished_from);
  Status restoreAccount(const AccountKey& key, const Balances& balances, uint64_t refill_clock_ms,
                        uint64_t refill_carry, const OverdraftBreaches& breaches = {},
                        const PeriodState& period = {});

  Generation activeGeneration() const { return active_generation_; }
  Generation republishedFrom(Generation generation) const;
  std::vector<Generation> generations() const;
  const Policy* policy(Generation generation) const;
  GenerationState generationState(Generation generation) const;

  // Finds, opens if needed, refills and rebalances the account that may admit for
  // (subject, route). `pinned_generation` 0 means "the active one". Returns the refusal
  // dimension when nothing may be admitted (no budget, draining generation, debt). A budget
  // fenced to another region than the request's `region` ("": none said, as for a shard
  // carve) is kNoBudget with a message, and opens no account (core/policy.h regionAdmits).
  Admission admit(const std::string& subject, const std::string& route,
                  Generation pinned_generation, uint64_t now_ms, bool* table_full,
                  std::string_view region = {});

  AccountEntry* find(const AccountKey& key);
  const AccountEntry* find(const AccountKey& key) const;
  // The same, without building a key (the ledger looks accounts up by a reservation's fields).
  AccountEntry* find(std::string_view subject, std::string_view route, Generation generation);
  const AccountEntry* find(std::string_view subject, std::string_view route,
                           Generation generation) const;

  // Refills the active account of (subject, route) and moves draining balances (see above).
  // Call after any refund into an account of a draining generation.
  void rebalance(const SubjectRoute& subject_route, uint64_t now_ms);
  void rebalance(std::string_view subject, std::string_view route, uint64_t now_ms);

  // Rebalances every subject/route: each active account refilled up to `now_ms`.
  void refillAll(uint64_t now_ms);

  // Debt summed over every generation of (subject, route).
  Units debt(const SubjectRoute& subject_route) const;

  // Emergency carve (SPEC §4 "carve shard") from an existing account. Refused while the
  // subject/route owes debt. Whether emergency mode allows it is the caller's policy check.
  AccountCode carve(const AccountKey& key, Units shard_units, uint64_t now_ms);
  // Remint: `units` proven unused return from `source`'s retiredForEmergency to the active
  // generation's account, as far as its burst allows. What does not fit stays retired.
  AccountCode remint(const AccountKey& source, Units units, uint64_t now_ms, Units* reminted);

  // Audit of balances only (the Ledger adds the reservation cross-check), sorted by key, as of
  // `now_ms`: refill and handovers earned by then are projected onto copies; nothing changes.
  std::vector<AccountView> view(uint64_t now_ms) const;
  // The same, listing only the accounts `filter` selects (`tallyctl audit --subject/--route`):
  // every other account is projected all the same — its generation's draining state and the
  // audit's verdict depend on it — but only handed to `other` (key, projected balances,
  // conserved), in no particular order, without being copied into a view or sorted.
  using OtherAccount = std::function<void(const AccountKey&, const Balances&, bool conserved)>;
  // A paged filter lists the first routes_max selected routes in key order, and sets `*more`
  // (optional) when selected routes remain after them.
  std::vector<AccountView> view(uint64_t now_ms, const AccountFilter& filter,
                                const OtherAccount& other, bool* more = nullptr) const;

  // Records that `entry`'s balances changed (the Ledger calls it for every balance operation it
  // applies to an AccountEntry directly).
  void markChanged(AccountEntry* entry);
  // Keys whose balances changed since the last call (for the durable store), sorted.
  std::vector<AccountKey> takeChangedAccounts();
  // The same entries themselves, sorted by key; valid as long as the book (accounts are never
  // removed), their balances only until the next mutating call.
  std::vector<const AccountEntry*> takeChangedEntries();
  bool takePoliciesChanged();

  size_t accountCount() const { return account_count_; }
  // Every account in the order it was opened or restored (stable: accounts are never removed),
  // for sweeps that visit each account over several calls (the period close).
  AccountEntry* entryAt(size_t index) { return entries_[index]; }

 private:
  struct GenerationEntry {
    Policy policy;
    Generation republished_from = 0;  // rollback source, 0 if none
  };

  // Every account of one subject/route, ascending by generation. Entries live on the heap so
  // that pointers to them survive the list growing.
  struct RouteAccounts {
    std::vector<std::unique_ptr<AccountEntry>> by_generation;

    AccountEntry* find(Generation generation) const;
  };
  // Looks routes up by views of their strings: no temporary keys on the hot path.
  struct RouteView {
    std::string_view subject;
    std::string_view route;
  };
  struct RouteHash {
    using is_transparent = void;
    size_t operator()(RouteView view) const;
    size_t operator()(const SubjectRoute& key) const {
      return (*this)(RouteView{key.subject, key.route});
    }
  };
  struct RouteEqual {
    using is_transparent = void;
    static RouteView viewOf(RouteView view) { return view; }
    static RouteView viewOf(const SubjectRoute& key) { return {key.subject, key.route}; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      const RouteView x = viewOf(a);
      const RouteView y = viewOf(b);
      return x.subject == y.subject && x.route == y.route;
    }
  };
  using RouteMap = std::unordered_map<SubjectRoute, RouteAccounts, RouteHash, RouteEqual>;

  RouteAccounts* findRoute(std::string_view subject, std::string_view route);
  const RouteAccounts* findRoute(std::string_view subject, std::string_view route) const;
  // Inserts `entry` into its route's list (created if needed), keeping generations ascending.
  // False if that generation already has an account.
  bool insertEntry(std::unique_ptr<AccountEntry> entry);
  AccountEntry* openAccount(const AccountKey& key, const Budget& budget, uint64_t now_ms,
                            bool* table_full);
  void rebalance(const RouteAccounts& route_accounts, uint64_t now_ms);
  Units debt(const RouteAccounts& route_accounts) const;

  std::map<Generation, GenerationEntry> generations_;
  Generation active_generation_ = 0;
  RouteMap routes_;
  size_t account_count_ = 0;
  std::vector<AccountEntry*> entries_;           // opening order
  std::vector<AccountEntry*> changed_accounts_;  // each with change_pending set
  bool policies_changed_ = false;
};

}  // namespace tally
