#include "core/fairness_meter.h"

#include <algorithm>
#include <cmath>

#include "core/assert.h"

namespace tally {

FairnessMeter::FairnessMeter(uint64_t window_admissions) : window_admissions_(window_admissions) {
  TALLY_ASSERT(window_admissions_ >= 1);
}

void FairnessMeter::waiting(const std::string& tenant, uint32_t priority, uint32_t weight) {
  TALLY_ASSERT(weight >= 1);
  Entry& entry = entries_[{priority, tenant}];
  ClassState& cls = classes_[priority];
  if (entry.waiting == 0) {  // becomes backlogged: it earns fair share from now on
    entry.weight = weight;
    entry.share_sum_at = cls.share_sum;
    cls.weight_backlogged += weight;
  }
  ++entry.waiting;
}

void FairnessMeter::leaves(const std::string& tenant, uint32_t priority, bool admitted) {
  auto it = entries_.find({priority, tenant});
  TALLY_ASSERT(it != entries_.end() && it->second.waiting > 0);
  Entry& entry = it->second;
  ClassState& cls = classes_[priority];
  TALLY_ASSERT(cls.weight_backlogged >= entry.weight);
  if (admitted) {
    // This admission's fair share is split among the class's backlogged tenants, this one too.
    cls.share_sum += 1.0 / static_cast<double>(cls.weight_backlogged);
    ++entry.admitted;
    ++admissions_;
  }
  if (--entry.waiting == 0) {
    entry.fair += entry.weight * (cls.share_sum - entry.share_sum_at);
    entry.share_sum_at = cls.share_sum;
    cls.weight_backlogged -= entry.weight;
    if (cls.weight_backlogged == 0) classes_.erase(priority);
    if (entry.fair == 0 && entry.admitted == 0) entries_.erase(it);
  }
  if (admissions_ == window_admissions_) closeWindow();
}

FairnessWindow FairnessMeter::summary() const {
  FairnessWindow window{.admissions = admissions_};
  if (admissions_ == 0) return window;
  std::map<std::string, std::pair<double, uint64_t>> by_tenant;  // fair, admitted
  for (const auto& [key, entry] : entries_) {
    double fair = entry.fair;
    if (entry.waiting > 0) {
      fair += entry.weight * (classes_.at(key.first).share_sum - entry.share_sum_at);
    }
    auto& [tenant_fair, tenant_admitted] = by_tenant[key.second];
    tenant_fair += fair;
    tenant_admitted += entry.admitted;
  }
  const double n = static_cast<double>(admissions_);
  for (const auto& [tenant, totals] : by_tenant) {
    if (totals.first == 0 && totals.second == 0) continue;  // waiting, not yet in any share
    FairnessShare share{.tenant = tenant,
                        .admitted_share = static_cast<double>(totals.second) / n,
                        .fair_share = totals.first / n};
    share.error = std::fabs(share.admitted_share - share.fair_share);
    window.error = std::max(window.error, share.error);
    window.tenants.push_back(std::move(share));
  }
  return window;
}

FairnessWindow FairnessMeter::current() const { return summary(); }

void FairnessMeter::closeWindow() {
  last_ = summary();
  ++windows_;
  admissions_ = 0;
  // A new window: every share starts from zero; the running sums restart too (no drift).
  for (auto& [priority, cls] : classes_) cls.share_sum = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = it->second;
    if (entry.waiting == 0) {
      it = entries_.erase(it);
      continue;
    }
    entry.fair = 0;
    entry.admitted = 0;
    entry.share_sum_at = 0;
    ++it;
  }
}

}  // namespace tally
