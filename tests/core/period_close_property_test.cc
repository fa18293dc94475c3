// Property: whatever the ledger does between ticks (reserves, settles over and under, releases,
// mark-unknown, generation switches) and however the ticks fall (gaps of several epochs, a
// sweep bounded to a few accounts per tick), every closed period conserves, each account's
// periods chain (closing(n) = opening(n+1), epochs contiguous, none closed twice), their
// activity sums to the account's whole history, and the account's open period starts where
// its last snapshot closed.
//
// Sequences per property: RC_PARAMS (ctest sets max_success=10000; 1000 under the sanitizers).

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/limits.h"

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kHourMs = 3'600'000;

Budget propertyBudget() {
  return Budget{.subject_pattern = "tenant-*",
                .route = "/r",
                .unit = "u",
                .refill_per_second = 1,
                .burst = 1000,
                .max_single_reservation = 1000,
                .hold_ttl_ms = 600'000,
                .hard_execution_limit_ms = 1'200'000,
                .max_overdraft = 1'000'000};
}

RC_GTEST_PROP(PeriodCloseProperty, PeriodsConserveChainAndSumToTheHistory, ()) {
  Ledger ledger;
  RC_ASSERT(ledger.publishPolicy(Policy{.budgets = {propertyBudget()}}, kT0).code ==
            ReplyCode::kOk);
  uint64_t now = kT0;
  const int steps = *rc::gen::inRange(1, 60);
  for (int step = 0; step < steps; ++step) {
    const std::string id = "r" + std::to_string(*rc::gen::inRange(0, 12));
    const std::string subject = "tenant-" + std::to_string(*rc::gen::inRange(0, 3));
    switch (*rc::gen::inRange(0, 8)) {
      case 0: {
        ReserveRequest request{.reservation_id = id,
                               .subject = subject,
                               .route = "/r",
                               .units = *rc::gen::inRange<Units>(1, 400)};
        request.request_digest.fill(static_cast<uint8_t>(id.size() + subject.back()));
        (void)ledger.reserve(request, now);
        break;
      }
      case 1: (void)ledger.start({.reservation_id = id, .operation_id = "op"}, now); break;
      case 2:
        (void)ledger.settle({.reservation_id = id,
                             .operation_id = "op",
                             .actual_units = *rc::gen::inRange<Units>(0, 700)},
                            now);
        break;
      case 3: (void)ledger.release({.reservation_id = id}, now); break;
      case 4: (void)ledger.markUnknown({.reservation_id = id, .operation_id = "op"}, now); break;
      case 5:
        if (ledger.accounts().activeGeneration() < 3) {
          (void)ledger.publishPolicy(Policy{.budgets = {propertyBudget()}}, now);
        }
        break;
      default: {
        // Minutes, or several epochs at once (a ledger that was down).
        const bool gap = *rc::gen::inRange(0, 4) == 0;
        now += gap ? *rc::gen::inRange<uint64_t>(kHourMs, 5 * kHourMs)
                   : *rc::gen::inRange<uint64_t>(0, 40 * 60'000);
        (void)ledger.tick(now, *rc::gen::inRange<uint64_t>(1, 6));
        break;
      }
    }
    (void)ledger.takeChangedRows();
  }
  // Close everything still open: past the next boundary, one tick to finish a sweep under way
  // (it started before this boundary) and one for the sweep of this boundary.
  now += 2 * kHourMs;
  (void)ledger.tick(now, 1'000);
  (void)ledger.tick(now + 1, 1'000);
  RC_ASSERT(ledger.audit(now).conserved);

  std::map<AccountKey, std::vector<PeriodSnapshot>> by_account;
  for (const PeriodSpan& span : ledger.auditPeriods({.list = true}, now).report.closed_periods) {
    RC_ASSERT(span.conserved);
    for (const PeriodSnapshot& snapshot :
         ledger.auditPeriods({.epoch = span.epoch_first}, now).report.period_snapshots) {
      if (snapshot.epoch_first == span.epoch_first && snapshot.epoch_last == span.epoch_last) {
        by_account[snapshot.key].push_back(snapshot);
      }
    }
  }
  size_t accounts = 0;
  for (const AccountView& view : ledger.audit(now).accounts) {
    ++accounts;
    const AccountEntry* entry = ledger.accounts().find(view.key);
    RC_ASSERT(entry != nullptr);
    const std::vector<PeriodSnapshot>& periods = by_account[view.key];
    RC_ASSERT(!periods.empty());  // the final tick closed every account
    RC_ASSERT(periods.size() <= limits::kPeriodSnapshotsKept);
    PeriodActivity total;
    for (size_t i = 0; i < periods.size(); ++i) {
      const PeriodSnapshot& p = periods[i];
      RC_ASSERT(p.conserved);
      RC_ASSERT(checkPeriod(p.opening, p.closing));
      if (i > 0) {
        RC_ASSERT(p.opening == periods[i - 1].closing);
        RC_ASSERT(p.opened_at_ms == periods[i - 1].closed_at_ms);
        RC_ASSERT(p.epoch_first == periods[i - 1].epoch_last + 1);
      }
      const PeriodActivity a = *periodActivity(p.opening, p.closing);
      total.opened += a.opened;
      total.minted += a.minted;
      total.spent += a.spent;
      total.debt_issued += a.debt_issued;
      total.debt_repaid += a.debt_repaid;
      total.transferred_out += a.transferred_out;
    }
    RC_ASSERT(entry->period.opening == periods.back().closing);
    RC_ASSERT(entry->period.epoch_first == periods.back().epoch_last + 1);
    if (periods.size() < limits::kPeriodSnapshotsKept) {
      RC_ASSERT(periods.front().opening == Balances{});  // nothing pruned: the whole history
      RC_ASSERT(total == *periodActivity(Balances{}, periods.back().closing));
    }
  }
  RC_ASSERT(accounts == by_account.size());
}

}  // namespace
}  // namespace tally
