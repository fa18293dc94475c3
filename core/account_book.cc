#include "core/account_book.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"

namespace tally {
namespace {

bool keyLess(const AccountEntry* a, const AccountEntry* b) { return a->key < b->key; }

// A request from another region than the one `budget` is fenced to: "no budget" for it, said
// with both regions, and no account opened.
Admission regionFenced(const Budget& budget, std::string_view region, Generation generation) {
  return {.refused = LimitingDimension::kNoBudget,
          .generation = generation,
          .message = regionRefusal(budget, region)};
}

// Moves `units` from `from.available` to `to` as one paired entry. Both or neither change.
template <typename Entry, typename OnChange>
bool transferAvailable(Entry* from, Entry* to, Units units, OnChange&& changed) {
  TALLY_ASSERT(from != to);
  Account from_next = from->account;
  Account to_next = to->account;
  if (from_next.transferOutAvailable(units) != AccountCode::kOk) return false;
  if (to_next.receiveTransfer(units) != AccountCode::kOk) return false;
  from->account = from_next;
  to->account = to_next;
  changed(from);
  changed(to);
  return true;
}

// What the audit projects of an entry: the rebalance rule reads and moves only these (a copy
// of the whole entry would copy its key's and budget's strings, at every audit).
struct ProjectedAccount {
  Generation generation = 0;
  Account account;
};

// The rebalance rule (see the header) on one subject/route's accounts, ascending by generation.
// `changed` is called for every entry whose durable state moved. One rule for the book's own
// accounts and for the audit's projected copies of them.
AccountEntry* entryOf(const std::unique_ptr<AccountEntry>& owned) { return owned.get(); }
ProjectedAccount* entryOf(ProjectedAccount& copy) { return &copy; }
Generation generationOf(const AccountEntry* entry) { return entry->key.generation; }
Generation generationOf(const ProjectedAccount* copy) { return copy->generation; }

template <typename List, typename OnChange>
void rebalanceEntries(List& list, Generation active_generation, uint64_t now_ms,
                      OnChange&& changed) {
  if (list.empty()) return;
  decltype(entryOf(list.back())) active = nullptr;
  if (generationOf(entryOf(list.back())) == active_generation) {
    active = entryOf(list.back());
    const uint64_t clock_before = active->account.refillClockMs();
    const uint64_t carry_before = active->account.refillCarry();
    (void)active->account.refill(now_ms);
    if (active->account.refillClockMs() != clock_before ||
        active->account.refillCarry() != carry_before) {
      changed(active);  // the refill clock is durable state too
    }
  }
  for (auto& item : list) {
    auto* draining = entryOf(item);
    if (generationOf(draining) == active_generation) continue;
    if (now_ms > draining->account.refillClockMs() || draining->account.refillCarry() != 0) {
      draining->account.holdRefillClock(now_ms);
      changed(draining);
    }
    if (active == nullptr) continue;
    const Units handed =
        std::min(draining->account.balances().available, active->account.mintRoom());
    if (handed > 0) (void)transferAvailable(draining, active, handed, changed);
    const Units repaid = std::min(draining->account.debt(), active->account.balances().available);
    if (repaid > 0) (void)transferAvailable(active, draining, repaid, changed);
  }
}

}  // namespace

const char* generationStateName(GenerationState state) {
  switch (state) {
    case GenerationState::kActive: return "ACTIVE";
    case GenerationState::kDraining: return "DRAINING";
    case GenerationState::kDrained: return "DRAINED";
  }
  return "UNKNOWN";
}

PolicyReply AccountBook::publish(Policy policy, uint64_t now_ms) {
  if (Status status = validatePolicy(policy); !status.isOk()) {
    return {.code = ReplyCode::kInvalidArgument, .message = status.message()};
  }
  if (generations_.size() >= limits::kGenerationsMax) {
    return {.code = ReplyCode::kResourceExhausted, .message = "too many policy generations"};
  }
  // The outgoing generation stops refilling the moment it starts draining: mint what it has
  // earned up to now first, or the handover would carry only what it had at its last touch.
  refillAll(now_ms);
  const Generation generation = active_generation_ + 1;
  policy.generation = generation;
  generations_.emplace(generation, GenerationEntry{.policy = std::move(policy)});
  active_generation_ = generation;
  policies_changed_ = true;
  return {.code = ReplyCode::kOk, .generation = generation};
}

PolicyReply AccountBook::rollback(uint64_t now_ms) {
  if (generations_.size() < 2) {
    return {.code = ReplyCode::kInvalidState, .message = "no earlier policy to roll back to"};
  }
  // The generation before the active one, following earlier rollbacks back to their source so
  // that two rollbacks in a row do not bounce between the same two policies.
  const GenerationEntry& active = generations_.at(active_generation_);
  Generation target = active_generation_ - 1;
  if (active.republished_from != 0) target = active.republished_from - 1;
  if (target == 0) {
    return {.code = ReplyCode::kInvalidState, .message = "no earlier policy to roll back to"};
  }
  Policy republished = generations_.at(target).policy;
  PolicyReply reply = publish(std::move(republished), now_ms);
  if (reply.code == ReplyCode::kOk) generations_.at(reply.generation).republished_from = target;
  return reply;
}

Status AccountBook::restorePolicy(Policy policy, Generation republished_from) {
  const Generation generation = policy.generation;
  if (generation == 0) return Status::corruption("stored policy has generation 0");
  if (Status status = validatePolicy(policy); !status.isOk()) {
    return Status::corruption("stored policy generation " + std::to_string(generation) +
                              " is invalid: " + status.message());
  }
  if (!generations_
           .emplace(generation, GenerationEntry{.policy = std::move(policy),
                                                .republished_from = republished_from})
           .second) {
    return Status::corruption("policy generation " + std::to_string(generation) + " stored twice");
  }
  active_generation_ = std::max(active_generation_, generation);
  return Status::ok();
}

Status AccountBook::restoreAccount(const AccountKey& key, const Balances& balances,
                                   uint64_t refill_clock_ms, uint64_t refill_carry,
                                   const OverdraftBreaches& breaches, const PeriodState& period) {
  const std::string name = key.subject + "/" + key.route + "@" + std::to_string(key.generation);
  const Policy* owner = policy(key.generation);
  const Budget* budget = owner == nullptr ? nullptr : matchBudget(*owner, key.subject, key.route);
  if (budget == nullptr) {
    return Status::corruption("account " + name + " has no budget in its generation");
  }
  bool ok = false;
  const BucketParams bucket{.refill_per_second = budget->refill_per_second, .burst = budget->burst};
  Account account = Account::restore(bucket, balances, refill_clock_ms, refill_carry, &ok);
  if (!ok) return Status::corruption("account " + name + " does not conserve");
  if (const std::vector<BalanceField> above = balancesAboveBound(balances); !above.empty()) {
    return Status::corruption("account " + name + " " + above.front().name + " " +
                              std::to_string(above.front().value) + " is above the balance bound " +
                              std::to_string(limits::kBalanceUnitsMax));
  }
  account.restoreBreaches(breaches);
  // The period's opening balances are an earlier image of this account: they must conserve and
  // no cumulative balance may have gone down since (legacy: all zero, which always holds).
  if (!isConserved(period.opening) || !periodActivity(period.opening, balances)) {
    return Status::corruption("account " + name + " has an accounting period opening (epoch " +
                              std::to_string(period.epoch_first) +
                              ") that is not an earlier image of its balances");
  }
  if (!insertEntry(std::make_unique<AccountEntry>(
          AccountEntry{.key = key, .budget = *budget, .account = account, .period = period}))) {
    return Status::corruption("account " + name + " stored twice");
  }
  return Status::ok();
}

size_t AccountBook::RouteHash::operator()(RouteView view) const {
  const size_t subject = std::hash<std::string_view>{}(view.subject);
  const size_t route = std::hash<std::string_view>{}(view.route);
  return subject ^ (route + 0x9e3779b97f4a7c15ULL + (subject << 6) + (subject >> 2));
}

AccountEntry* AccountBook::RouteAccounts::find(Generation generation) const {
  // Few generations per route, and the one asked for is nearly always the last (active).
  for (auto it = by_generation.rbegin(); it != by_generation.rend(); ++it) {
    if ((*it)->key.generation == generation) return it->get();
    if ((*it)->key.generation < generation) break;
  }
  return nullptr;
}

AccountBook::RouteAccounts* AccountBook::findRoute(std::string_view subject,
                                                   std::string_view route) {
  auto it = routes_.find(RouteView{subject, route});
  return it == routes_.end() ? nullptr : &it->second;
}

const AccountBook::RouteAccounts* AccountBook::findRoute(std::string_view subject,
                                                         std::string_view route) const {
  auto it = routes_.find(RouteView{subject, route});
  return it == routes_.end() ? nullptr : &it->second;
}

bool AccountBook::insertEntry(std::unique_ptr<AccountEntry> entry) {
  RouteAccounts* accounts = findRoute(entry->key.subject, entry->key.route);
  if (accounts == nullptr) {
    accounts = &routes_[SubjectRoute{entry->key.subject, entry->key.route}];
  } else if (accounts->find(entry->key.generation) != nullptr) {
    return false;
  }
  auto& list = accounts->by_generation;
  const Generation generation = entry->key.generation;
  auto at = std::upper_bound(
      list.begin(), list.end(), generation,
      [](Generation g, const std::unique_ptr<AccountEntry>& e) { return g < e->key.generation; });
  entries_.push_back(entry.get());
  list.insert(at, std::move(entry));
  ++account_count_;
  return true;
}

Generation AccountBook::republishedFrom(Generation generation) const {
  auto it = generations_.find(generation);
  return it == generations_.end() ? 0 : it->second.republished_from;
}

std::vector<Generation> AccountBook::generations() const {
  std::vector<Generation> all;
  all.reserve(generations_.size());
  for (const auto& [generation, entry] : generations_) all.push_back(generation);
  return all;
}

const Policy* AccountBook::policy(Generation generation) const {
  auto it = generations_.find(generation);
  return it == generations_.end() ? nullptr : &it->second.policy;
}

GenerationState AccountBook::generationState(Generation generation) const {
  if (generation == active_generation_) return GenerationState::kActive;
  for (const auto& [route, route_accounts] : routes_) {
    const AccountEntry* entry = route_accounts.find(generation);
    if (entry == nullptr) continue;
    const Balances& b = entry->account.balances();
    if (b.reserved != 0 || b.retired_for_emergency != 0 || entry->account.debt() != 0) {
      return GenerationState::kDraining;
    }
  }
  return GenerationState::kDrained;
}

AccountEntry* AccountBook::find(const AccountKey& key) {
  return find(key.subject, key.route, key.generation);
}

const AccountEntry* AccountBook::find(const AccountKey& key) const {
  return find(key.subject, key.route, key.generation);
}

AccountEntry* AccountBook::find(std::string_view subject, std::string_view route,
                                Generation generation) {
  const RouteAccounts* route_accounts = findRoute(subject, route);
  return route_accounts == nullptr ? nullptr : route_accounts->find(generation);
}

const AccountEntry* AccountBook::find(std::string_view subject, std::string_view route,
                                      Generation generation) const {
  const RouteAccounts* route_accounts = findRoute(subject, route);
  return route_accounts == nullptr ? nullptr : route_accounts->find(generation);
}

void AccountBook::markChanged(AccountEntry* entry) {
  if (entry->change_pending) return;
  entry->change_pending = true;
  changed_accounts_.push_back(entry);
}

AccountEntry* AccountBook::openAccount(const AccountKey& key, const Budget& budget, uint64_t now_ms,
                                       bool* table_full) {
  if (account_count_ >= limits::kAccountsMax) {
    *table_full = true;
    return nullptr;
  }
  // Only a subject/route seen for the first time opens full; a later generation's account
  // opens empty and is filled by transfers from the draining one and by its own refill.
  const RouteAccounts* existing = findRoute(key.subject, key.route);
  const Units opening = existing == nullptr || existing->by_generation.empty() ? budget.burst : 0;
  const BucketParams bucket{.refill_per_second = budget.refill_per_second, .burst = budget.burst};
  // Its first accounting period starts now, from nothing: the opening shows as that period's
  // activity (Δopening).
  auto owned = std::make_unique<AccountEntry>(
      AccountEntry{.key = key,
                   .budget = budget,
                   .account = Account::open(bucket, opening, now_ms),
                   .period = {.epoch_first = accountingEpochOf(now_ms, budget.accounting_epoch),
                              .opened_at_ms = now_ms}});
  AccountEntry* entry = owned.get();
  const bool inserted = insertEntry(std::move(owned));
  TALLY_ASSERT(inserted);
  markChanged(entry);
  return entry;
}

Admission AccountBook::admit(const std::string& subject, const std::string& route,
                             Generation pinned_generation, uint64_t now_ms, bool* table_full,
                             std::string_view region) {
  *table_full = false;
  if (active_generation_ == 0) return {.refused = LimitingDimension::kNoBudget};
  if (pinned_generation != 0 && pinned_generation != active_generation_) {
    const bool known = generations_.contains(pinned_generation);
    return {
        .refused = known ? LimitingDimension::kGenerationDraining : LimitingDimension::kNoBudget,
        .generation = pinned_generation};
  }
  RouteAccounts* route_accounts = findRoute(subject, route);
  AccountEntry* entry =
      route_accounts == nullptr ? nullptr : route_accounts->find(active_generation_);
  if (entry == nullptr) {
    const Budget* budget = matchBudget(generations_.at(active_generation_).policy, subject, route);
    if (budget == nullptr) {
      // A draining generation may still govern this subject/route: say so, not "no budget".
      for (auto it = generations_.rbegin(); it != generations_.rend(); ++it) {
        if (matchBudget(it->second.policy, subject, route) != nullptr) {
          return {.refused = LimitingDimension::kGenerationDraining, .generation = it->first};
        }
      }
      return {.refused = LimitingDimension::kNoBudget, .generation = active_generation_};
    }
    if (!regionAdmits(*budget, region)) return regionFenced(*budget, region, active_generation_);
    entry =
        openAccount(AccountKey{subject, route, active_generation_}, *budget, now_ms, table_full);
    if (entry == nullptr) return {.refused = LimitingDimension::kNone};
    route_accounts = findRoute(subject, route);
    TALLY_ASSERT(route_accounts != nullptr);
  } else if (!regionAdmits(entry->budget, region)) {
    return regionFenced(entry->budget, region, active_generation_);
  }
  rebalance(*route_accounts, now_ms);
  Admission admission{.generation = active_generation_, .entry = entry};
  if (entry->account.debt() > 0) {
    admission.refused = LimitingDimension::kDebt;
  } else if (debt(*route_accounts) > 0) {
    admission.refused = LimitingDimension::kFrozenRoute;
  }
  return admission;
}

void AccountBook::refillAll(uint64_t now_ms) {
  for (const auto& [route, route_accounts] : routes_) rebalance(route_accounts, now_ms);
}

void AccountBook::rebalance(const SubjectRoute& subject_route, uint64_t now_ms) {
  rebalance(subject_route.subject, subject_route.route, now_ms);
}

void AccountBook::rebalance(std::string_view subject, std::string_view route, uint64_t now_ms) {
  if (const RouteAccounts* route_accounts = findRoute(subject, route)) {
    rebalance(*route_accounts, now_ms);
  }
}

void AccountBook::rebalance(const RouteAccounts& route_accounts, uint64_t now_ms) {
  rebalanceEntries(route_accounts.by_generation, active_generation_, now_ms,
                   [this](AccountEntry* entry) { markChanged(entry); });
}

Units AccountBook::debt(const SubjectRoute& subject_route) const {
  const RouteAccounts* route_accounts = findRoute(subject_route.subject, subject_route.route);
  return route_accounts == nullptr ? 0 : debt(*route_accounts);
}

Units AccountBook::debt(const RouteAccounts& route_accounts) const {
  Units total = 0;
  for (const std::unique_ptr<AccountEntry>& entry : route_accounts.by_generation) {
    total = saturatingAdd(total, entry->account.debt());
  }
  return total;
}

AccountCode AccountBook::carve(const AccountKey& key, Units shard_units, uint64_t now_ms) {
  AccountEntry* entry = find(key);
  if (entry == nullptr) return AccountCode::kInsufficientAvailable;
  const SubjectRoute subject_route{key.subject, key.route};
  rebalance(subject_route, now_ms);
  if (debt(subject_route) > 0) return AccountCode::kDebtOutstanding;
  const AccountCode code = entry->account.carve(shard_units);
  if (code == AccountCode::kOk) markChanged(entry);
  return code;
}

AccountCode AccountBook::remint(const AccountKey& source, Units units, uint64_t now_ms,
                                Units* reminted) {
  *reminted = 0;
  AccountEntry* from = find(source);
  if (from == nullptr || from->account.balances().retired_for_emergency < units) {
    return AccountCode::kInsufficientRetired;
  }
  const SubjectRoute subject_route{source.subject, source.route};
  rebalance(subject_route, now_ms);
  AccountEntry* to = find(AccountKey{source.subject, source.route, active_generation_});
  if (to == nullptr) {
    const Policy* active = policy(active_generation_);
    const Budget* budget =
        active == nullptr ? nullptr : matchBudget(*active, source.subject, source.route);
    if (budget == nullptr) return AccountCode::kOk;  // nowhere to go: stays retired
    bool table_full = false;
    to = openAccount(AccountKey{source.subject, source.route, active_generation_}, *budget, now_ms,
                     &table_full);
    if (to == nullptr) return AccountCode::kOk;
  }
  const Units fit = std::min(units, to->account.mintRoom());
  if (fit == 0) return AccountCode::kOk;
  Account from_next = from->account;
  if (AccountCode code = from_next.transferOutRetired(fit); code != AccountCode::kOk) return code;
  if (from == to) {
    if (AccountCode code = from_next.receiveTransfer(fit); code != AccountCode::kOk) return code;
    from->account = from_next;
  } else {
    Account to_next = to->account;
    if (AccountCode code = to_next.receiveTransfer(fit); code != AccountCode::kOk) return code;
    from->account = from_next;
    to->account = to_next;
    markChanged(to);
  }
  markChanged(from);
  *reminted = fit;
  return AccountCode::kOk;
}

std::vector<AccountView> AccountBook::view(uint64_t now_ms) const {
  return view(now_ms, AccountFilter{}, [](const AccountKey&, const Balances&, bool) {});
}

std::vector<AccountView> AccountBook::view(uint64_t now_ms, const AccountFilter& filter,
                                           const OtherAccount& other, bool* more) const {
  // As of now_ms: each subject/route's accounts are copied and rebalanced (refill up to now,
  // draining handovers and debt collection) by the rule admission applies, leaving the book as
  // it is. Debt that refill has already repaid is not reported. One route's copies at a time.
  // Listed in key order: routes by (subject, route), each route's accounts ascending by
  // generation as by_generation keeps them (the index itself is unordered).
  std::vector<const RouteMap::value_type*> ordered;
  std::set<Generation> holding;  // non-active generations that still hold anything
  std::vector<ProjectedAccount> copies;
  auto project = [&](const RouteMap::value_type& route) {
    copies.clear();
    for (const std::unique_ptr<AccountEntry>& entry : route.second.by_generation) {
      copies.push_back({.generation = entry->key.generation, .account = entry->account});
    }
    rebalanceEntries(copies, active_generation_, now_ms, [](ProjectedAccount*) {});
  };
  auto holds = [](const Account& account) {
    const Balances& b = account.balances();
    return b.reserved != 0 || b.retired_for_emergency != 0 || account.debt() != 0;
  };
  // Projection moves available and repays debt; it never changes reserved or
  // retiredForEmergency, and keeps the equation. So a route left out without debt is checked
  // as it stands, without copies; one with debt is projected, as its holding may have been
  // repaid.
  auto leftOut = [&](const RouteMap::value_type& route) {
    const std::vector<std::unique_ptr<AccountEntry>>& entries = route.second.by_generation;
    const bool owes = std::any_of(entries.begin(), entries.end(),
                                  [](const auto& entry) { return entry->account.debt() != 0; });
    if (owes) project(route);
    for (size_t i = 0; i < entries.size(); ++i) {
      const AccountEntry& entry = *entries[i];
      const Account& account = owes ? copies[i].account : entry.account;
      if (holds(account)) holding.insert(entry.key.generation);
      other(entry.key, account.balances(), isConserved(account.balances()));
    }
  };
  ordered.reserve(filter.all() ? routes_.size() : 0);
  for (const RouteMap::value_type& route : routes_) {
    if (filter.matches(route.first)) {
      ordered.push_back(&route);
    } else {
      leftOut(route);
    }
  }
  auto by_key = [](const RouteMap::value_type* a, const RouteMap::value_type* b) {
    return a->first < b->first;
  };
  if (more != nullptr) *more = false;
  if (filter.paged() && ordered.size() > filter.routes_max) {
    // The page is the first routes_max in key order; the routes after it are left out.
    std::nth_element(ordered.begin(), ordered.begin() + filter.routes_max, ordered.end(), by_key);
    for (auto it = ordered.begin() + filter.routes_max; it != ordered.end(); ++it) leftOut(**it);
    ordered.resize(filter.routes_max);
    if (more != nullptr) *more = true;
  }
  std::sort(ordered.begin(), ordered.end(), by_key);
  std::vector<AccountView> views;
  views.reserve(filter.all() ? account_count_ : ordered.size());
  for (const RouteMap::value_type* route : ordered) {
    const std::vector<std::unique_ptr<AccountEntry>>& entries = route->second.by_generation;
    project(*route);
    for (size_t i = 0; i < entries.size(); ++i) {
      const AccountEntry& entry = *entries[i];
      const Account& account = copies[i].account;
      TALLY_ASSERT(i == 0 || entries[i - 1]->key.generation < entry.key.generation);
      const Balances& b = account.balances();
      if (holds(account)) holding.insert(entry.key.generation);
      views.push_back(AccountView{
          .key = entry.key,
          .balances = b,
          .debt = account.debt(),
          .accounting_epoch_ms = accountingEpochStartMs(now_ms, entry.budget.accounting_epoch),
          .conserved = isConserved(b),
          .overdraft_breaches = account.breaches(),
      });
    }
  }
  for (AccountView& view : views) {
    if (view.key.generation == active_generation_) continue;
    view.generation_state = holding.contains(view.key.generation) ? GenerationState::kDraining
                                                                  : GenerationState::kDrained;
  }
  return views;
}

std::vector<AccountKey> AccountBook::takeChangedAccounts() {
  const std::vector<const AccountEntry*> entries = takeChangedEntries();
  std::vector<AccountKey> keys;
  keys.reserve(entries.size());
  for (const AccountEntry* entry : entries) keys.push_back(entry->key);
  return keys;
}

std::vector<const AccountEntry*> AccountBook::takeChangedEntries() {
  std::vector<const AccountEntry*> entries;
  entries.reserve(changed_accounts_.size());
  for (AccountEntry* entry : changed_accounts_) {
    TALLY_ASSERT(entry->change_pending);
    entry->change_pending = false;
    entries.push_back(entry);
  }
  changed_accounts_.clear();
  std::sort(entries.begin(), entries.end(), keyLess);
  return entries;
}

bool AccountBook::takePoliciesChanged() { return std::exchange(policies_changed_, false); }

}  // namespace tally
