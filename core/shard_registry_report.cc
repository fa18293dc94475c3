// ShardRegistry: reports, reconciliation, conflicts, deferred remints and the shard audit
// (docs/SHARDS.md "Report"). The rest of the registry is in shard_registry.cc.

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"
#include "core/shard_registry.h"
#include "core/shard_report_check.h"

namespace tally {
namespace {

// A report identical to the last accepted one (its signature and reported_at_ms aside, which
// a rebuilt report may change): same boot epoch, balances and receipts. After a conflict the
// record keeps the union of receipts, so a repeat adds nothing to it.
bool identicalToLast(const ShardRecord& record, const ShardReport& report) {
  if (!record.reported || record.report_boot_epoch != report.gateway_boot_epoch ||
      record.last_reported != report.balances) {
    return false;
  }
  if (record.state == ShardState::kConflict) {
    return unionReceipts(record.receipts, report.receipts) == record.receipts;
  }
  return sortedReceipts(report.receipts) == record.receipts;
}

#ifdef TALLY_TEST_FAULTS
Units holdingUnits(const std::vector<Reservation>& receipts) {
  Units total = 0;
  for (const Reservation& receipt : receipts) {
    if (holdsUnits(receipt.state)) total = saturatingAdd(total, receipt.reserved_units);
  }
  return total;
}
#endif

}  // namespace

AccountEntry* ShardRegistry::sourceOf(const ShardRecord& record) {
  AccountEntry* entry =
      accounts_->find(record.grant.subject, record.grant.route, record.grant.policy_generation);
  TALLY_ASSERT(entry != nullptr);  // a shard's source account is never removed
  return entry;
}

ShardReply ShardRegistry::unknownShard(const ShardReport& report) const {
  // Only the gateway the grant names, enrolled with the key that signed the report and enabled,
  // and only for a grant this ledger's key signed, learns that the shard is unknown here; anyone
  // else is refused as before.
  const ShardGrant& grant = report.shard;
  const GatewayRecord* gateway = findGateway(grant.gateway_name);
  if (!crypto_->verifyGrant(grant) || gateway == nullptr ||
      gateway->public_key != grant.gateway_id || !gateway->enabled) {
    return permissionDenied("no shard '" + grant.shard_id + "'");
  }
  return {.code = ReplyCode::kNotFound,
          .message = "no record of shard '" + grant.shard_id +
                     "': reconciled and compacted after shard_retention_ms, or never in this "
                     "ledger's state; it will never be reconciled here"};
}

ShardReply ShardRegistry::report(const ShardReport& report, uint64_t now_ms) {
  if (crypto_ == nullptr) return {.code = ReplyCode::kInvalidState, .message = "no ledger key"};
  // Rule 1: signed by the shard's gateway, about the shard exactly as issued, by a gateway
  // still enrolled with that key and enabled.
  if (!crypto_->verifyReport(report)) {
    return permissionDenied("report signature does not verify");
  }
  auto it = shards_.find(report.shard.shard_id);
  if (it == shards_.end()) return unknownShard(report);
  ShardRecord& record = it->second;
  if (!(report.shard == record.grant)) {
    return permissionDenied("the report's shard differs from the grant");
  }
  const GatewayRecord* gateway = findGateway(record.grant.gateway_name);
  if (gateway == nullptr || gateway->public_key != record.grant.gateway_id) {
    return permissionDenied("gateway '" + record.grant.gateway_name + "' is not enrolled");
  }
  if (!gateway->enabled) {
    return permissionDenied("gateway '" + record.grant.gateway_name + "' is disabled");
  }
  // Rule 2.
  if (record.state == ShardState::kWrittenOff) {
    return answer(ReplyCode::kInvalidState, &record, "the shard was written off");
  }
  if (identicalToLast(record, report)) {
    ShardReply reply = answer(ReplyCode::kOk, &record);
    reply.duplicate = true;
    return reply;
  }
  // Rule 3.
  if (std::string why = checkReportConsistency(report, limits::kShardReceiptsPerReportMax);
      !why.empty()) {
    return answer(ReplyCode::kInvalidArgument, &record, "inconsistent report: " + why);
  }
  // An earlier report delivered late, or replayed: answered, nothing learnt from it.
  if (supersededByRecord(record, report)) {
#ifdef TALLY_TEST_FAULTS
    if (faults_.reconcile_superseded_reports) return reconcile(&record, report, now_ms);
#endif
    ShardReply reply =
        answer(ReplyCode::kOk, &record, "superseded by the report accepted after it");
    reply.duplicate = true;
    return reply;
  }
  // Rule 4.
  if (std::string why = findReportConflict(record, report); !why.empty()) {
    return recordConflict(&record, report, why);
  }
  return reconcile(&record, report, now_ms);
}

ShardReply ShardRegistry::reconcile(ShardRecord* record, const ShardReport& report,
                                    uint64_t now_ms) {
  const ShardBalances& b = report.balances;
  const Units spent = std::max(record->spent_units, b.local_spent);
  const Units spent_delta = spent - record->spent_units;
  if (spent_delta > record->retired_units) {
    return recordConflict(record, report, "usage exceeds what the shard still holds");
  }
  if (!recordSpent(record, spent_delta)) {
    return answer(ReplyCode::kArithmeticOverflow, record, "spent units overflow");
  }
  // Point of no return: the report is accepted.
  Units proven_unused = b.local_available + b.local_retired;  // ≤ allocated: checked (rule 3)
#ifdef TALLY_TEST_FAULTS
  if (faults_.remint_holding_receipts) {
    proven_unused = saturatingAdd(proven_unused, holdingUnits(report.receipts));
  }
#endif
  record->reported = true;
  record->report_boot_epoch = report.gateway_boot_epoch;
  record->last_reported = b;
  record->receipts = sortedReceipts(report.receipts);
  record->state = b.local_reserved > 0 ? ShardState::kReconciling : ShardState::kReconciled;
  if (record->remint_due_at_ms != 0) {
    deferred_.erase({record->remint_due_at_ms, record->grant.shard_id});
    record->remint_due_at_ms = 0;
    record->remint_target_units = 0;
  }
  Units reminted = 0;
  const bool other_boot = report.gateway_boot_epoch != record->grant.gateway_boot_epoch;
  if (other_boot && now_ms < record->grant.expires_at_ms) {
    // Before expiry a copy of the old process could still admit from the shard.
    record->remint_due_at_ms = record->grant.expires_at_ms;
    record->remint_target_units = proven_unused;
    deferred_.insert({record->remint_due_at_ms, record->grant.shard_id});
  } else {
    reminted = remintUpTo(record, proven_unused, now_ms);
  }
  assertConserved(*record);
  touched(*record);
  maybeQueueCompaction(*record);
  ShardReply reply = answer(ReplyCode::kOk, record);
  reply.spent_units = spent_delta;
  reply.reminted_units = reminted;
  return reply;
}

ShardReply ShardRegistry::recordConflict(ShardRecord* record, const ShardReport& report,
                                         const std::string& why) {
  std::vector<Reservation> receipts = unionReceipts(record->receipts, report.receipts);
  const Units usage = settledUsage(receipts);
  const Units recorded = saturatingAdd(record->spent_units, record->debt_units);
  const Units delta = usage > recorded ? usage - recorded : 0;
  const Units from_retired = std::min(delta, record->retired_units);
  const Units debt = delta - from_retired;
  AccountEntry* entry = sourceOf(*record);
  Account next = entry->account;
  if (next.recordShardSpent(from_retired) != AccountCode::kOk ||
      next.recordShardDebt(debt) != AccountCode::kOk) {
    return answer(ReplyCode::kArithmeticOverflow, record, "spent units overflow");
  }
  // Point of no return: the usage is recorded and nothing more of the shard is reminted.
  entry->account = next;
  accounts_->markChanged(entry);
  record->spent_units += from_retired;
  record->retired_units -= from_retired;
  record->debt_units += debt;
  if (record->remint_due_at_ms != 0) {
    deferred_.erase({record->remint_due_at_ms, record->grant.shard_id});
    record->remint_due_at_ms = 0;
    record->remint_target_units = 0;
  }
  record->reported = true;
  record->report_boot_epoch = report.gateway_boot_epoch;
  record->last_reported = report.balances;
  record->receipts = std::move(receipts);
  record->state = ShardState::kConflict;
  assertConserved(*record);
  touched(*record);
  ShardReply reply = answer(ReplyCode::kOk, record, "conflict: " + why);
  reply.spent_units = from_retired;
  reply.debt_units = debt;
  return reply;
}

bool ShardRegistry::recordSpent(ShardRecord* record, Units units) {
  if (units == 0) return true;
  TALLY_ASSERT(units <= record->retired_units);
  AccountEntry* entry = sourceOf(*record);
  const AccountCode code = entry->account.recordShardSpent(units);
  if (code == AccountCode::kOverflow) return false;
  TALLY_ASSERT(code == AccountCode::kOk);  // the account's retired covers every shard's
  accounts_->markChanged(entry);
  record->spent_units += units;
  record->retired_units -= units;
  return true;
}

Units ShardRegistry::remintUpTo(ShardRecord* record, Units target, uint64_t now_ms) {
  if (target <= record->reminted_units) return 0;
  const Units owed = std::min(target - record->reminted_units, record->retired_units);
  if (owed == 0) return 0;
  const AccountKey source{record->grant.subject, record->grant.route,
                          record->grant.policy_generation};
  Units reminted = 0;
  const AccountCode code = accounts_->remint(source, owed, now_ms, &reminted);
  // Overflow of `minted` would take centuries of policy-bounded refills: nothing moves then.
  TALLY_ASSERT(code == AccountCode::kOk || code == AccountCode::kOverflow);
  TALLY_ASSERT(reminted <= owed);
  record->reminted_units += reminted;
  record->retired_units -= reminted;
  assertConserved(*record);
  touched(*record);
  return reminted;
}

ShardRegistry::TickOutcome ShardRegistry::tick(uint64_t now_ms, uint64_t items_max) {
  TickOutcome outcome;
  while (!deferred_.empty() && deferred_.begin()->first <= now_ms && outcome.reminted < items_max) {
    const std::string shard_id = deferred_.begin()->second;
    deferred_.erase(deferred_.begin());
    ShardRecord& record = shards_.at(shard_id);
    TALLY_ASSERT(record.state == ShardState::kReconciling ||
                 record.state == ShardState::kReconciled);
    (void)remintUpTo(&record, record.remint_target_units, now_ms);
    record.remint_due_at_ms = 0;
    record.remint_target_units = 0;
    touched(record);
    maybeQueueCompaction(record);
    ++outcome.reminted;
  }
  // Entries may be stale (queued twice, or the shard changed since): each is checked again.
  while (!compaction_.empty() && compaction_.begin()->first <= now_ms &&
         outcome.compacted < items_max) {
    const std::string shard_id = compaction_.begin()->second;
    compaction_.erase(compaction_.begin());
    auto it = shards_.find(shard_id);
    if (it == shards_.end()) continue;
    const ShardRecord& record = it->second;
    if (record.state != ShardState::kReconciled || record.retired_units != 0 ||
        record.remint_due_at_ms != 0 ||
        now_ms < saturatingAdd(record.grant.expires_at_ms, shard_retention_ms_)) {
      continue;
    }
    by_request_id_.erase(record.issue_request.request_id);
    changed_shards_.erase(shard_id);
    deleted_shards_.insert(shard_id);
    shards_.erase(it);
    ++outcome.compacted;
  }
  return outcome;
}

void ShardRegistry::audit(AuditReport* report) const {
  // By views into the records: the audit runs after every simulated step.
  using Key = std::tuple<std::string_view, std::string_view, Generation>;
  std::map<Key, Units> retired;
  for (const auto& [id, record] : shards_) {
    report->shards.push_back(viewOf(record));
    if (!isShardConserved(record)) {
      report->violations.push_back("shard " + id + ": allocated " +
                                   std::to_string(record.grant.allocated_units) + " != spent " +
                                   std::to_string(record.spent_units) + " + reminted " +
                                   std::to_string(record.reminted_units) + " + retired " +
                                   std::to_string(record.retired_units));
    }
    Units& sum =
        retired[Key{record.grant.subject, record.grant.route, record.grant.policy_generation}];
    sum = saturatingAdd(sum, record.retired_units);
  }
  for (const AccountView& view : report->accounts) {
    auto it = retired.find(Key{view.key.subject, view.key.route, view.key.generation});
    const Units shards = it == retired.end() ? 0 : it->second;
    if (shards != view.balances.retired_for_emergency) {
      report->violations.push_back(view.key.subject + "/" + view.key.route + "@" +
                                   std::to_string(view.key.generation) + ": retiredForEmergency " +
                                   std::to_string(view.balances.retired_for_emergency) +
                                   " but its shards hold " + std::to_string(shards) + " retired");
    }
    if (it != retired.end()) retired.erase(it);
  }
  for (const auto& [key, units] : retired) {
    if (units == 0) continue;
    const auto& [subject, route, generation] = key;
    report->violations.push_back(std::string(subject) + "/" + std::string(route) + "@" +
                                 std::to_string(generation) + ": shards hold " +
                                 std::to_string(units) + " retired units but there is no account");
  }
}

}  // namespace tally
