#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/account.h"
#include "core/operator_types.h"
#include "core/period_close.h"
#include "core/policy.h"
#include "core/reservation.h"
#include "core/shard_record.h"
#include "core/shard_types.h"
#include "core/status.h"
#include "core/types.h"

// The ledger's durable record. The working state lives in memory (core::Ledger); the store
// holds full images of every changed row, so that a restart rebuilds exactly the state whose
// replies were sent.
//
// Contract:
//  * commit(batch) returns only once the batch is durable (fsync'd); batches are applied in
//    commit order and a later image of a row replaces an earlier one. Within one batch,
//    deleted_reservations apply before the upserts (an id compacted and then reused in the same
//    batch is present afterwards). Images are idempotent: committing a batch twice is harmless.
//  * When commit() fails, the batch may or may not be durable; the caller replies to none of
//    its operations and either retries the same batch or stops serving.
//  * load() returns the latest image of every row that was ever committed and not deleted.
//  * A Store is used by one thread at a time (the ledger's commit thread); it is not
//    thread-safe.

namespace tally::ledger {

struct PolicyRecord {
  Policy policy;  // policy.generation is set
  Generation republished_from = 0;

  bool operator==(const PolicyRecord&) const = default;
};

struct AccountRecord {
  AccountKey key;
  Balances balances;
  uint64_t refill_clock_ms = 0;
  uint64_t refill_carry = 0;
  OverdraftBreaches breaches;
  PeriodState period;  // the accounting period open now (all zero: stored before periods)

  bool operator==(const AccountRecord&) const = default;
};

struct StoreBatch {
  std::vector<PolicyRecord> policies;
  std::vector<AccountRecord> accounts;
  std::vector<Reservation> reservations;
  std::vector<std::string> deleted_reservations;
  uint64_t ledger_clock_ms = 0;  // the ledger clock's high-water mark at this batch
  std::vector<GatewayRecord> gateways;
  std::vector<ShardRecord> shards;
  std::vector<FenceRecord> fences;
  uint64_t shard_sequence = 0;  // the last shard sequence number used; load() keeps the highest
  std::vector<std::string> deleted_shards;  // compacted; ids are never reused
  // Closed accounting periods, in the batch that moved their accounts to the next period.
  // Deletions apply before the upserts; the two never name the same key in one batch.
  std::vector<PeriodSnapshot> period_snapshots;
  std::vector<PeriodKey> deleted_period_snapshots;  // beyond limits::kPeriodSnapshotsKept
  // Enrolled operators (full images) and the audit log: entries are appended, never changed;
  // those below audit_log_kept_from (0: none) are dropped, before the appends apply.
  std::vector<OperatorRecord> operators;
  std::vector<AuditLogEntry> audit_log;
  uint64_t audit_log_kept_from = 0;

  bool operator==(const StoreBatch&) const = default;

  // Every list above, for the members below that treat them alike. A field added to the batch
  // goes here if it is a list, or is counted in kScalarBytes: the static_assert after the struct
  // fails to compile until it is.
  template <typename Batch>
  static auto listsOf(Batch& batch) {
    return std::tie(batch.policies, batch.accounts, batch.reservations, batch.deleted_reservations,
                    batch.gateways, batch.shards, batch.fences, batch.deleted_shards,
                    batch.period_snapshots, batch.deleted_period_snapshots, batch.operators,
                    batch.audit_log);
  }
  static constexpr size_t kScalarBytes =
      sizeof(ledger_clock_ms) + sizeof(shard_sequence) + sizeof(audit_log_kept_from);

  // Empties every list and zeroes the rest, keeping the lists' capacity: a batch reused across
  // folds allocates its megabytes of rows once (ledger/sqlite_store.h, fold_net_).
  void clear() {
    std::apply([](auto&... list) { (list.clear(), ...); }, listsOf(*this));
    ledger_clock_ms = 0;
    shard_sequence = 0;
    audit_log_kept_from = 0;
  }
  // No rows and no audit-log trim (ledger_clock_ms and shard_sequence alone do not count).
  bool empty() const {
    return std::apply([](const auto&... list) { return (list.empty() && ...); }, listsOf(*this)) &&
           audit_log_kept_from == 0;
  }
};

namespace store_batch_detail {
template <typename... List>
constexpr size_t bytesOf(const std::tuple<List&...>*) {
  return (sizeof(List) + ... + 0);
}
}  // namespace store_batch_detail
static_assert(
    sizeof(StoreBatch) ==
        store_batch_detail::bytesOf(
            static_cast<decltype(StoreBatch::listsOf(std::declval<StoreBatch&>()))*>(nullptr)) +
            StoreBatch::kScalarBytes,
    "a field of StoreBatch is in neither StoreBatch::listsOf nor kScalarBytes");

struct StoreContents {
  std::vector<PolicyRecord> policies;  // ascending generation
  std::vector<AccountRecord> accounts;
  std::vector<Reservation> reservations;
  uint64_t ledger_clock_ms = 0;
  std::vector<GatewayRecord> gateways;  // ascending name
  std::vector<ShardRecord> shards;      // ascending id
  std::vector<FenceRecord> fences;      // ascending subject/route
  uint64_t shard_sequence = 0;
  std::vector<PeriodSnapshot> period_snapshots;  // ascending (key, epoch_first)
  std::vector<OperatorRecord> operators;         // ascending name
  std::vector<AuditLogEntry> audit_log;          // ascending sequence, contiguous
};

class Store {
 public:
  virtual ~Store() = default;
  [[nodiscard]] virtual Status commit(const StoreBatch& batch) = 0;
  [[nodiscard]] virtual Result<StoreContents> load() = 0;
};

}  // namespace tally::ledger
