#include "core/period_close.h"

#include <algorithm>
#include <iterator>
#include <tuple>

#include "core/assert.h"
#include "core/limits.h"

namespace tally {
namespace {

using u128 = unsigned __int128;

}  // namespace

uint64_t accountingEpochOf(uint64_t now_ms, EpochPeriod period) {
  return now_ms / epochPeriodMs(period);
}

uint64_t epochStartMs(uint64_t epoch, EpochPeriod period) {
  const uint64_t period_ms = epochPeriodMs(period);
  return epoch > UINT64_MAX / period_ms ? UINT64_MAX : epoch * period_ms;
}

std::optional<PeriodActivity> periodActivity(const Balances& opening, const Balances& closing) {
  if (closing.opening < opening.opening || closing.minted < opening.minted ||
      closing.spent < opening.spent || closing.overdraft_issued < opening.overdraft_issued ||
      closing.overdraft_repaid < opening.overdraft_repaid ||
      closing.transferred_out < opening.transferred_out) {
    return std::nullopt;
  }
  return PeriodActivity{.opened = closing.opening - opening.opening,
                        .minted = closing.minted - opening.minted,
                        .spent = closing.spent - opening.spent,
                        .debt_issued = closing.overdraft_issued - opening.overdraft_issued,
                        .debt_repaid = closing.overdraft_repaid - opening.overdraft_repaid,
                        .transferred_out = closing.transferred_out - opening.transferred_out};
}

bool checkPeriod(const Balances& opening, const Balances& closing) {
  if (!isConserved(opening) || !isConserved(closing)) return false;
  const std::optional<PeriodActivity> activity = periodActivity(opening, closing);
  if (!activity) return false;
  const u128 in = u128{opening.available} + opening.reserved + opening.retired_for_emergency +
                  activity->opened + activity->minted + activity->debt_issued;
  const u128 out = u128{closing.available} + closing.reserved + closing.retired_for_emergency +
                   activity->spent + activity->debt_repaid + activity->transferred_out;
  const u128 debt_in = u128{debtOf(opening)} + activity->debt_issued;
  const u128 debt_out = u128{debtOf(closing)} + activity->debt_repaid;
  return in == out && debt_in == debt_out;
}

bool periodDue(const PeriodState& state, EpochPeriod period, uint64_t now_ms) {
  const uint64_t current = accountingEpochOf(now_ms, period);
  return current > state.epoch_first;
}

PeriodSnapshot closePeriod(const AccountKey& key, EpochPeriod period, const Balances& closing,
                           uint64_t now_ms, PeriodState* state) {
  const uint64_t current = accountingEpochOf(now_ms, period);
  TALLY_ASSERT(current > state->epoch_first);
  PeriodSnapshot snapshot{.key = key,
                          .epoch_period = period,
                          .epoch_first = state->epoch_first,
                          .epoch_last = current - 1,
                          .opened_at_ms = state->opened_at_ms,
                          .closed_at_ms = now_ms,
                          .opening = state->opening,
                          .closing = closing,
                          .conserved = checkPeriod(state->opening, closing)};
  *state = PeriodState{.epoch_first = current, .opened_at_ms = now_ms, .opening = closing};
  return snapshot;
}

const PeriodSnapshot& PeriodBook::add(PeriodSnapshot snapshot, std::optional<PeriodKey>* dropped) {
  dropped->reset();
  std::map<uint64_t, PeriodSnapshot>& kept = by_account_[snapshot.key];
  const uint64_t epoch_first = snapshot.epoch_first;
  auto [it, inserted] = kept.insert_or_assign(epoch_first, std::move(snapshot));
  if (inserted) ++size_;
  const PeriodSnapshot* added = &it->second;
  if (kept.size() > limits::kPeriodSnapshotsKept) {
    auto oldest = kept.begin();
    *dropped = PeriodKey{.key = oldest->second.key, .epoch_first = oldest->first};
    if (latest_ == &oldest->second) latest_ = nullptr;
    if (added == &oldest->second) added = nullptr;
    kept.erase(oldest);
    --size_;
  }
  if (added == nullptr) {
    // Older than every kept one (a restore out of order past the bound): not kept.
    static const PeriodSnapshot kNone;
    return kNone;
  }
  if (latest_ == nullptr || added->closed_at_ms >= latest_->closed_at_ms) latest_ = added;
  return *added;
}

std::vector<const PeriodSnapshot*> PeriodBook::covering(uint64_t epoch) const {
  std::vector<const PeriodSnapshot*> out;
  for (const auto& [key, kept] : by_account_) {
    // The last snapshot starting at or before `epoch` is the only one that can cover it.
    auto it = kept.upper_bound(epoch);
    if (it == kept.begin()) continue;
    const PeriodSnapshot& candidate = std::prev(it)->second;
    if (candidate.epoch_last >= epoch) out.push_back(&candidate);
  }
  return out;
}

const PeriodSnapshot* PeriodBook::find(const PeriodKey& key) const {
  auto account = by_account_.find(key.key);
  if (account == by_account_.end()) return nullptr;
  auto it = account->second.find(key.epoch_first);
  return it == account->second.end() ? nullptr : &it->second;
}

std::vector<PeriodSpan> PeriodBook::spans() const {
  std::map<std::tuple<uint64_t, uint64_t, EpochPeriod>, PeriodSpan> by_span;
  for (const auto& [key, kept] : by_account_) {
    for (const auto& [epoch_first, snapshot] : kept) {
      PeriodSpan& span =
          by_span[{snapshot.epoch_first, snapshot.epoch_last, snapshot.epoch_period}];
      span.epoch_period = snapshot.epoch_period;
      span.epoch_first = snapshot.epoch_first;
      span.epoch_last = snapshot.epoch_last;
      ++span.accounts;
      span.conserved = span.conserved && snapshot.conserved;
    }
  }
  std::vector<PeriodSpan> out;
  out.reserve(by_span.size());
  for (auto& [ignored, span] : by_span) out.push_back(span);
  return out;
}

}  // namespace tally
