#include "ledger/store_batch.h"

#include <utility>

namespace tally::ledger {

StoreBatch storeBatchOf(const Ledger& ledger, LedgerChangedRows* rows, uint64_t now_ms) {
  StoreBatch batch;
  batch.ledger_clock_ms = now_ms;
  if (rows->policies) {
    for (Generation generation : ledger.accounts().generations()) {
      batch.policies.push_back(
          PolicyRecord{.policy = *ledger.accounts().policy(generation),
                       .republished_from = ledger.accounts().republishedFrom(generation)});
    }
  }
  // The rows are read in place (no lookups); each image is copied once, into the batch.
  batch.accounts.reserve(rows->accounts.size());
  for (const AccountEntry* entry : rows->accounts) {
    batch.accounts.push_back(AccountRecord{.key = entry->key,
                                           .balances = entry->account.balances(),
                                           .refill_clock_ms = entry->account.refillClockMs(),
                                           .refill_carry = entry->account.refillCarry(),
                                           .breaches = entry->account.breaches(),
                                           .period = entry->period});
  }
  batch.reservations.reserve(rows->reservations_upserted.size());
  for (const Reservation* reservation : rows->reservations_upserted) {
    batch.reservations.push_back(*reservation);
  }
  batch.deleted_reservations = std::move(rows->reservations_deleted);
  const ShardChangedRows& shards = rows->shards;
  for (const GatewayRecord* gateway : shards.gateways) batch.gateways.push_back(*gateway);
  for (const ShardRecord* shard : shards.shards) batch.shards.push_back(*shard);
  batch.fences = shards.fences;
  batch.shard_sequence = shards.shard_sequence;
  batch.deleted_shards = shards.deleted_shards;
  batch.period_snapshots.reserve(rows->period_snapshots.size());
  for (const PeriodSnapshot* snapshot : rows->period_snapshots) {
    batch.period_snapshots.push_back(*snapshot);
  }
  batch.deleted_period_snapshots = std::move(rows->period_snapshots_deleted);
  for (const OperatorRecord* record : rows->operators) batch.operators.push_back(*record);
  batch.audit_log.reserve(rows->audit_log.appended.size());
  for (const AuditLogEntry* entry : rows->audit_log.appended) batch.audit_log.push_back(*entry);
  batch.audit_log_kept_from = rows->audit_log.kept_from;
  return batch;
}

}  // namespace tally::ledger
