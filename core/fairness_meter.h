#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

// The fairness error of SPEC §7, defined once: the agent's FairScheduler feeds it, the agent's
// metric reads it, and the simulator and the fairness benchmark compute it with this same class.
//
// A window is `window_admissions` consecutive admissions. Each admission hands one unit of
// "admitted share" to the tenant admitted, and one unit of "fair share", split by weight, among
// the tenants backlogged at that moment in the admitted item's priority class (the admitted
// tenant included): tenant i gets w_i / sum of the weights of those tenants. Tenants waiting in
// a lower class get no fair share of it (strict priority). Over the window, for each tenant:
//
//   admitted share = admissions of i / N          fair share = (sum of i's fair shares) / N
//   error_i        = |admitted share - fair share|
//
// and the window's fairness error is the max of error_i over the tenants backlogged in it. When
// every tenant is backlogged throughout, the fair share is the classic w_i / sum w. Both shares
// sum to 1 over the tenants of a window. Computed incrementally (per class: the running sum of
// 1 / backlogged weight; per tenant: where that sum stood when it became backlogged), O(log n)
// per event, whatever the number of tenants.
//
// Pure and deterministic; no clock. Memory: one entry per (tenant, class) with waiting items or
// counted in the current window, bounded by what feeds it. Single-threaded.

namespace tally {

struct FairnessShare {
  std::string tenant;
  double admitted_share = 0;
  double fair_share = 0;
  double error = 0;  // |admitted_share - fair_share|
};

struct FairnessWindow {
  uint64_t admissions = 0;             // in this window (0: no window yet)
  double error = 0;                    // max error over its tenants
  std::vector<FairnessShare> tenants;  // every tenant backlogged or admitted in it, by name
};

class FairnessMeter {
 public:
  // `window_admissions` >= 1.
  explicit FairnessMeter(uint64_t window_admissions);

  // One more item of `tenant` waits in class `priority`. The first makes the tenant backlogged
  // in that class, with `weight` (>= 1) until its last item there leaves.
  void waiting(const std::string& tenant, uint32_t priority, uint32_t weight);
  // One waiting item of `tenant` in class `priority` leaves: admitted (counted) or not (expired,
  // cancelled). An item admitted at once is waiting() then leaves(…, true).
  void leaves(const std::string& tenant, uint32_t priority, bool admitted);

  // The last complete window (admissions == 0 before the first completes).
  const FairnessWindow& last() const { return last_; }
  // The window in progress, so far.
  FairnessWindow current() const;
  uint64_t windowAdmissions() const { return window_admissions_; }
  uint64_t windowsCompleted() const { return windows_; }
  size_t entries() const { return entries_.size(); }

 private:
  struct ClassState {
    uint64_t weight_backlogged = 0;
    double share_sum = 0;  // sum over the class's admissions of 1 / weight_backlogged
  };
  struct Entry {
    uint64_t waiting = 0;
    uint32_t weight = 1;
    double share_sum_at = 0;  // the class's share_sum when this entry was last brought up to date
    double fair = 0;          // fair share earned in this window (in admissions)
    uint64_t admitted = 0;    // admissions in this window
  };
  using Key = std::pair<uint32_t, std::string>;  // (class, tenant)

  FairnessWindow summary() const;
  void closeWindow();

  uint64_t window_admissions_;
  uint64_t admissions_ = 0;  // in the current window
  uint64_t windows_ = 0;
  std::map<uint32_t, ClassState> classes_;
  std::map<Key, Entry> entries_;
  FairnessWindow last_;
};

}  // namespace tally
