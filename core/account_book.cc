#include "core/account_book.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"

namespace tally {

const char* generationStateName(GenerationState state) {
  switch (state) {
    case GenerationState::kActive: return "ACTIVE";
    case GenerationState::kDraining: return "DRAINING";
    case GenerationState::kDrained: return "DRAINED";
  }
  return "UNKNOWN";
}

PolicyReply AccountBook::publish(Policy policy) {
  if (Status status = validatePolicy(policy); !status.isOk()) {
    return {.code = ReplyCode::kInvalidArgument, .message = status.message()};
  }
  if (generations_.size() >= limits::kGenerationsMax) {
    return {.code = ReplyCode::kResourceExhausted, .message = "too many policy generations"};
  }
  const Generation generation = active_generation_ + 1;
  policy.generation = generation;
  generations_.emplace(generation, GenerationEntry{.policy = std::move(policy)});
  active_generation_ = generation;
  policies_changed_ = true;
  return {.code = ReplyCode::kOk, .generation = generation};
}

PolicyReply AccountBook::rollback() {
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
  PolicyReply reply = publish(std::move(republished));
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
                                   uint64_t refill_clock_ms, uint64_t refill_carry) {
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
  if (!accounts_.emplace(key, AccountEntry{.key = key, .budget = *budget, .account = account})
           .second) {
    return Status::corruption("account " + name + " stored twice");
  }
  auto& generations = generations_by_route_[SubjectRoute{key.subject, key.route}];
  generations.insert(std::upper_bound(generations.begin(), generations.end(), key.generation),
                     key.generation);
  return Status::ok();
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
  for (const auto& [key, entry] : accounts_) {
    if (key.generation != generation) continue;
    const Balances& b = entry.account.balances();
    if (b.reserved != 0 || b.retired_for_emergency != 0 || entry.account.debt() != 0) {
      return GenerationState::kDraining;
    }
  }
  return GenerationState::kDrained;
}

AccountEntry* AccountBook::find(const AccountKey& key) {
  auto it = accounts_.find(key);
  return it == accounts_.end() ? nullptr : &it->second;
}

const AccountEntry* AccountBook::find(const AccountKey& key) const {
  auto it = accounts_.find(key);
  return it == accounts_.end() ? nullptr : &it->second;
}

void AccountBook::markChanged(const AccountKey& key) { changed_accounts_.insert(key); }

AccountEntry* AccountBook::openAccount(const AccountKey& key, const Budget& budget, uint64_t now_ms,
                                       bool* table_full) {
  if (accounts_.size() >= limits::kAccountsMax) {
    *table_full = true;
    return nullptr;
  }
  auto& generations = generations_by_route_[SubjectRoute{key.subject, key.route}];
  // Only a subject/route seen for the first time opens full; a later generation's account
  // opens empty and is filled by transfers from the draining one and by its own refill.
  const Units opening = generations.empty() ? budget.burst : 0;
  const BucketParams bucket{.refill_per_second = budget.refill_per_second, .burst = budget.burst};
  auto [it, inserted] = accounts_.emplace(
      key, AccountEntry{
               .key = key, .budget = budget, .account = Account::open(bucket, opening, now_ms)});
  TALLY_ASSERT(inserted);
  generations.insert(std::upper_bound(generations.begin(), generations.end(), key.generation),
                     key.generation);
  markChanged(key);
  return &it->second;
}

Admission AccountBook::admit(const std::string& subject, const std::string& route,
                             Generation pinned_generation, uint64_t now_ms, bool* table_full) {
  *table_full = false;
  if (active_generation_ == 0) return {.refused = LimitingDimension::kNoBudget};
  if (pinned_generation != 0 && pinned_generation != active_generation_) {
    const bool known = generations_.contains(pinned_generation);
    return {
        .refused = known ? LimitingDimension::kGenerationDraining : LimitingDimension::kNoBudget,
        .generation = pinned_generation};
  }
  const AccountKey key{subject, route, active_generation_};
  AccountEntry* entry = find(key);
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
    entry = openAccount(key, *budget, now_ms, table_full);
    if (entry == nullptr) return {.refused = LimitingDimension::kNone};
  }
  const SubjectRoute subject_route{subject, route};
  rebalance(subject_route, now_ms);
  Admission admission{.generation = active_generation_, .entry = entry};
  if (entry->account.debt() > 0) {
    admission.refused = LimitingDimension::kDebt;
  } else if (debt(subject_route) > 0) {
    admission.refused = LimitingDimension::kFrozenRoute;
  }
  return admission;
}

bool AccountBook::transferAvailable(AccountEntry* from, AccountEntry* to, Units units) {
  TALLY_ASSERT(from != to);
  Account from_next = from->account;
  Account to_next = to->account;
  if (from_next.transferOutAvailable(units) != AccountCode::kOk) return false;
  if (to_next.receiveTransfer(units) != AccountCode::kOk) return false;
  from->account = from_next;
  to->account = to_next;
  markChanged(from->key);
  markChanged(to->key);
  return true;
}

void AccountBook::rebalance(const SubjectRoute& subject_route, uint64_t now_ms) {
  auto it = generations_by_route_.find(subject_route);
  if (it == generations_by_route_.end()) return;
  AccountEntry* active = nullptr;
  if (it->second.back() == active_generation_) {
    active = find(AccountKey{subject_route.subject, subject_route.route, active_generation_});
    TALLY_ASSERT(active != nullptr);
    const uint64_t clock_before = active->account.refillClockMs();
    const uint64_t carry_before = active->account.refillCarry();
    (void)active->account.refill(now_ms);
    if (active->account.refillClockMs() != clock_before ||
        active->account.refillCarry() != carry_before) {
      markChanged(active->key);  // the refill clock is durable state too
    }
  }
  for (Generation generation : it->second) {
    if (generation == active_generation_) continue;
    AccountEntry* draining =
        find(AccountKey{subject_route.subject, subject_route.route, generation});
    TALLY_ASSERT(draining != nullptr);
    if (now_ms > draining->account.refillClockMs() || draining->account.refillCarry() != 0) {
      draining->account.holdRefillClock(now_ms);
      markChanged(draining->key);
    }
    if (active == nullptr) continue;
    const Units handed =
        std::min(draining->account.balances().available, active->account.mintRoom());
    if (handed > 0) (void)transferAvailable(draining, active, handed);
    const Units repaid = std::min(draining->account.debt(), active->account.balances().available);
    if (repaid > 0) (void)transferAvailable(active, draining, repaid);
  }
}

Units AccountBook::debt(const SubjectRoute& subject_route) const {
  auto it = generations_by_route_.find(subject_route);
  if (it == generations_by_route_.end()) return 0;
  Units total = 0;
  for (Generation generation : it->second) {
    const AccountEntry* entry =
        find(AccountKey{subject_route.subject, subject_route.route, generation});
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
  if (code == AccountCode::kOk) markChanged(key);
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
    markChanged(to->key);
  }
  markChanged(from->key);
  *reminted = fit;
  return AccountCode::kOk;
}

std::vector<AccountView> AccountBook::view(uint64_t now_ms) const {
  // One pass to learn which non-active generations still hold anything.
  std::set<Generation> holding;
  for (const auto& [key, entry] : accounts_) {
    const Balances& b = entry.account.balances();
    if (b.reserved != 0 || b.retired_for_emergency != 0 || entry.account.debt() != 0) {
      holding.insert(key.generation);
    }
  }
  std::vector<AccountView> views;
  views.reserve(accounts_.size());
  for (const auto& [key, entry] : accounts_) {
    GenerationState state = GenerationState::kActive;
    if (key.generation != active_generation_) {
      state =
          holding.contains(key.generation) ? GenerationState::kDraining : GenerationState::kDrained;
    }
    views.push_back(AccountView{
        .key = key,
        .balances = entry.account.balances(),
        .debt = entry.account.debt(),
        .accounting_epoch_ms = accountingEpochStartMs(now_ms, entry.budget.accounting_epoch),
        .generation_state = state,
        .conserved = isConserved(entry.account.balances()),
    });
  }
  return views;
}

std::vector<AccountKey> AccountBook::takeChangedAccounts() {
  std::vector<AccountKey> keys(changed_accounts_.begin(), changed_accounts_.end());
  changed_accounts_.clear();
  return keys;
}

bool AccountBook::takePoliciesChanged() { return std::exchange(policies_changed_, false); }

}  // namespace tally
