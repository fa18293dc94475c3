#include "ledger/restore.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace tally::ledger {
namespace {

uint64_t msSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

}  // namespace

Result<RestoreSummary> restoreLedger(Store* store, Ledger* ledger, uint64_t wall_now_ms,
                                     std::vector<BadRecord>* bad_records) {
  const auto started = std::chrono::steady_clock::now();
  Result<StoreContents> loaded = store->load();
  if (!loaded.isOk()) return loaded.status();
  const uint64_t load_ms = msSince(started);
  Result<RestoreSummary> restored =
      restoreLedger(std::move(loaded).value(), ledger, wall_now_ms, bad_records);
  if (restored.isOk()) restored.value().load_ms = load_ms;
  return restored;
}

Result<RestoreSummary> restoreLedger(StoreContents contents, Ledger* ledger, uint64_t wall_now_ms,
                                     std::vector<BadRecord>* bad_records) {
  const auto started = std::chrono::steady_clock::now();
  // Checked before anything is applied: a record no bounded request can produce would reach
  // an invariant of the core (an assertion) later, on every restart.
  std::vector<BadRecord> bad = findBadRecords(contents);
  if (!bad.empty()) {
    const std::string first = describe(bad.front());
    const size_t count = bad.size();
    if (bad_records != nullptr) *bad_records = std::move(bad);
    return Status::corruption(std::to_string(count) +
                              (count == 1 ? " stored record" : " stored records") +
                              " cannot be applied; first: " + first);
  }
  RestoreSummary summary;
  for (PolicyRecord& record : contents.policies) {
    if (Status s =
            ledger->accounts().restorePolicy(std::move(record.policy), record.republished_from);
        !s.isOk()) {
      return s;
    }
    ++summary.policies;
  }
  for (const AccountRecord& record : contents.accounts) {
    if (Status s =
            ledger->accounts().restoreAccount(record.key, record.balances, record.refill_clock_ms,
                                              record.refill_carry, record.breaches, record.period);
        !s.isOk()) {
      return s;
    }
    ++summary.accounts;
  }
  for (const PeriodSnapshot& snapshot : contents.period_snapshots) {
    if (Status s = ledger->restorePeriodSnapshot(snapshot); !s.isOk()) return s;
  }
  for (Reservation& reservation : contents.reservations) {
    if (Status s = ledger->restoreReservation(std::move(reservation)); !s.isOk()) return s;
    ++summary.reservations;
  }
  contents.reservations = {};  // moved into the ledger: free the husks before the audit
  ShardRegistry& shards = ledger->shards();
  for (const GatewayRecord& gateway : contents.gateways) {
    if (Status s = shards.restoreGateway(gateway); !s.isOk()) return s;
    ++summary.gateways;
  }
  for (const ShardRecord& shard : contents.shards) {
    if (Status s = shards.restoreShard(shard); !s.isOk()) return s;
    ++summary.shards;
  }
  for (const FenceRecord& fence : contents.fences) {
    if (Status s = shards.restoreFence(fence); !s.isOk()) return s;
  }
  shards.restoreShardSequence(contents.shard_sequence);
  for (const OperatorRecord& record : contents.operators) {
    if (Status s = ledger->operators().restore(record); !s.isOk()) return s;
  }
  for (AuditLogEntry& entry : contents.audit_log) {
    if (Status s = ledger->auditLogEntries().restore(std::move(entry)); !s.isOk()) return s;
  }
  summary.ledger_clock_ms = std::max(contents.ledger_clock_ms, wall_now_ms);
  summary.apply_ms = msSince(started);
  const auto finishing = std::chrono::steady_clock::now();
  if (Status s = ledger->finishRestore(summary.ledger_clock_ms); !s.isOk()) return s;
  summary.finish_ms = msSince(finishing);
  return summary;
}

}  // namespace tally::ledger
