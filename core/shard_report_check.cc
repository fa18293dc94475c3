#include "core/shard_report_check.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

#include "core/checked_math.h"

namespace tally {
namespace {

bool isSettled(ReservationState state) {
  return state == ReservationState::kSettled || state == ReservationState::kSettledWithDebt;
}

bool lessById(const Reservation& a, const Reservation& b) {
  return a.reservation_id < b.reservation_id;
}

}  // namespace

Units settledUsage(const std::vector<Reservation>& receipts) {
  Units total = 0;
  for (const Reservation& receipt : receipts) {
    if (isSettled(receipt.state)) total = saturatingAdd(total, receipt.actual_units);
  }
  return total;
}

std::vector<Reservation> sortedReceipts(const std::vector<Reservation>& receipts) {
  std::vector<Reservation> sorted = receipts;
  std::sort(sorted.begin(), sorted.end(), lessById);
  return sorted;
}

std::string checkReportConsistency(const ShardReport& report, uint64_t receipts_max) {
  const ShardBalances& b = report.balances;
  const ShardGrant& shard = report.shard;
  if (!isConserved(b)) return "report balances do not conserve";
  if (b.allocated != shard.allocated_units) return "report allocated differs from the grant";
  if (report.receipts.size() > receipts_max) {
    return "report has more than " + std::to_string(receipts_max) + " receipts";
  }
  std::set<std::string> ids;
  Units holding = 0;
  Units settled = 0;
  for (const Reservation& receipt : report.receipts) {
    const std::string& id = receipt.reservation_id;
    if (!ids.insert(id).second) return "receipt '" + id + "' appears twice";
    if (receipt.origin != shard.shard_id) return "receipt '" + id + "' has another origin";
    if (receipt.subject != shard.subject || receipt.route != shard.route) {
      return "receipt '" + id + "' is for another subject/route";
    }
    if (holdsUnits(receipt.state)) {
      auto sum = checkedAdd(holding, receipt.reserved_units);
      if (!sum) return "receipt units overflow";
      holding = *sum;
    } else if (isTerminal(receipt.state)) {
      if (isSettled(receipt.state)) {
        auto sum = checkedAdd(settled, receipt.actual_units);
        if (!sum) return "receipt units overflow";
        settled = *sum;
      }
    } else {
      return "receipt '" + id + "' is in state " + reservationStateName(receipt.state);
    }
  }
  if (holding != b.local_reserved) return "holding receipts do not sum to localReserved";
  auto used = checkedAdd(b.local_spent, b.overspent);
  if (!used || settled != *used) return "settled receipts do not sum to localSpent + overspent";
  return {};
}

std::string findReportConflict(const ShardRecord& record, const ShardReport& report) {
  if (report.balances.overspent > 0) return "the shard was overspent";
  if (record.state == ShardState::kConflict) return "the shard is already in conflict";
  if (!record.reported) return {};
  // Every report is of a closed shard: from one accepted report to the next, receipts may
  // only resolve (holding → terminal), never appear, vanish or change once terminal.
  std::map<std::string, const Reservation*> earlier;
  for (const Reservation& receipt : record.receipts) earlier[receipt.reservation_id] = &receipt;
  for (const Reservation& receipt : report.receipts) {
    auto it = earlier.find(receipt.reservation_id);
    if (it == earlier.end()) {
      return "receipt '" + receipt.reservation_id + "' was admitted after the shard was closed" +
             " (reports from boot epochs " + std::to_string(record.report_boot_epoch) + " and " +
             std::to_string(report.gateway_boot_epoch) + ")";
    }
    const Reservation& before = *it->second;
    if (isTerminal(before.state) ? !(receipt == before)
                                 : receipt.reserved_units != before.reserved_units) {
      return "receipt '" + receipt.reservation_id + "' changed";
    }
    earlier.erase(it);
  }
  if (!earlier.empty()) return "receipt '" + earlier.begin()->first + "' is missing";
  const Units proven_unused =
      saturatingAdd(report.balances.local_available, report.balances.local_retired);
  if (proven_unused < record.reminted_units) return "units already reminted reappear as used";
  return {};
}

bool supersededByRecord(const ShardRecord& record, const ShardReport& report) {
  if (!record.reported || record.state == ShardState::kConflict ||
      report.gateway_boot_epoch > record.report_boot_epoch || report.balances.overspent > 0 ||
      report.receipts.size() != record.receipts.size()) {
    return false;
  }
  const ShardBalances& earlier = report.balances;
  const ShardBalances& last = record.last_reported;
  if (earlier.local_spent > last.local_spent || earlier.local_reserved < last.local_reserved ||
      saturatingAdd(earlier.local_available, earlier.local_retired) >
          saturatingAdd(last.local_available, last.local_retired)) {
    return false;
  }
  std::map<std::string_view, const Reservation*> kept;
  for (const Reservation& receipt : record.receipts) kept[receipt.reservation_id] = &receipt;
  for (const Reservation& receipt : report.receipts) {
    auto it = kept.find(receipt.reservation_id);
    if (it == kept.end()) return false;
    const Reservation& now = *it->second;
    const bool resolved_since = holdsUnits(receipt.state) && isTerminal(now.state) &&
                                receipt.reserved_units == now.reserved_units;
    if (!(receipt == now) && !resolved_since) return false;
    kept.erase(it);
  }
  return kept.empty();
}

std::vector<Reservation> unionReceipts(const std::vector<Reservation>& stored,
                                       const std::vector<Reservation>& reported) {
  std::map<std::string, Reservation> by_id;
  for (const Reservation& receipt : stored) by_id[receipt.reservation_id] = receipt;
  for (const Reservation& receipt : reported) {
    auto [it, inserted] = by_id.try_emplace(receipt.reservation_id, receipt);
    if (inserted) continue;
    Reservation& kept = it->second;
    const bool kept_terminal = isTerminal(kept.state);
    const bool new_terminal = isTerminal(receipt.state);
    if (new_terminal && (!kept_terminal || receipt.actual_units > kept.actual_units)) {
      kept = receipt;
    } else if (!kept_terminal && !new_terminal) {
      kept = receipt;
    }
  }
  std::vector<Reservation> all;
  all.reserve(by_id.size());
  for (auto& [id, receipt] : by_id) all.push_back(std::move(receipt));
  return all;
}

}  // namespace tally
