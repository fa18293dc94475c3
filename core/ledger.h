#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "core/account_book.h"
#include "core/audit_log.h"
#include "core/checked_math.h"
#include "core/ledger_types.h"
#include "core/limits.h"
#include "core/operator_registry.h"
#include "core/period_close.h"
#include "core/receipt_archive.h"
#include "core/reservation.h"
#include "core/reservation_table.h"
#include "core/shard_record.h"
#include "core/shard_registry.h"

// The central ledger state machine (SPEC §4, §5): the only place that spends capacity.
//
// Pure and deterministic: no I/O, no clock reads, no threads. Every call takes `now_ms`, the
// ledger clock (Unix milliseconds, never decreasing: an earlier value is treated as the latest
// seen). Expiry, hard-limit closing and compaction happen only in tick(now_ms).
//
// Owned by one thread (the ledger's loop, a test, or the simulator). The shell persists what
// takeChanges() names after each batch, before it replies.
//
// Invariants (checked by audit() and asserted on every transition):
//  * every account conserves and no balance is negative;
//  * each account's `reserved` equals the units held by its RESERVED, EXPIRING, STARTED and
//    USAGE_UNKNOWN reservations;
//  * the same reservation id never debits twice; settle, release and expiry return units at
//    most once; USAGE_UNKNOWN never returns units.

namespace tally {

struct LedgerOptions {
  // The idempotency window: a terminal reservation's receipt is kept (and every repeat answered
  // from it) this long after it closed, then compacted (docs/LEDGER.md "Retention").
  uint64_t retention_ms = limits::kRetentionMsDefault;
  // Live (non-terminal) reservations at once.
  uint64_t reservations_max = limits::kReservationsMax;
  // Memory the packed receipts of the window may take (core/receipt_archive.h); past it new
  // reservations are refused with RESOURCE_EXHAUSTED until compaction frees room.
  uint64_t receipt_bytes_max = limits::kReceiptBytesMaxDefault;
  // How long after its expiry a RECONCILED shard with nothing retired is kept, then compacted
  // (docs/SHARDS.md "Compaction"): longer than the receipts' window, so that an agent that did
  // not hear its report accepted is answered again, not told the shard is unknown.
  uint64_t shard_retention_ms = limits::kShardRetentionMsDefault;
};

struct TickOutcome {
  uint64_t expired = 0;
  uint64_t closed_by_hard_limit = 0;
  uint64_t compacted = 0;
  uint64_t shards_reminted = 0;   // deferred shard remints performed
  uint64_t shards_compacted = 0;  // reconciled shards dropped after retention
  uint64_t periods_closed = 0;    // accounting periods closed (one snapshot each)

  // Whether the tick changed durable state (the shell then commits it without waiting for a
  // request). Every counter above belongs here.
  bool changed() const {
    return expired > 0 || closed_by_hard_limit > 0 || compacted > 0 || shards_reminted > 0 ||
           shards_compacted > 0 || periods_closed > 0;
  }
};

// `tallyctl audit --period EPOCH` / `--periods`: the closed accounting periods kept.
struct PeriodQuery {
  std::optional<uint64_t> epoch;  // the snapshots of every account whose closed period covers it
  bool list = false;              // the list of closed periods kept
  std::string subject;            // filters, empty: all
  std::string route;
};
struct PeriodAudit {
  bool found = true;  // false: no kept period covers `epoch` (message says what is kept)
  std::string message;
  AuditReport report;  // period_epoch, period_snapshots and/or closed_periods; conserved
};

struct LedgerChanges {
  std::vector<std::string> reservations_upserted;
  std::vector<std::string> reservations_deleted;
  std::vector<AccountKey> accounts;
  bool policies = false;
  std::vector<std::string> gateways;        // by name, sorted
  std::vector<std::string> shards;          // by id, sorted
  std::vector<std::string> shards_deleted;  // compacted, sorted
  std::vector<SubjectRoute> fences;         // sorted
  bool shard_sequence = false;
  std::vector<PeriodKey> period_snapshots;          // closed periods written, sorted
  std::vector<PeriodKey> period_snapshots_deleted;  // beyond retention
  std::vector<std::string> operators;               // enrolled operators, by name
  std::vector<uint64_t> audit_log;                  // audit log entries appended, by sequence
  uint64_t audit_log_kept_from = 0;                 // entries below it dropped (0: none)

  bool empty() const {
    return reservations_upserted.empty() && reservations_deleted.empty() && accounts.empty() &&
           !policies && gateways.empty() && shards.empty() && shards_deleted.empty() &&
           fences.empty() && !shard_sequence && period_snapshots.empty() &&
           period_snapshots_deleted.empty() && operators.empty() && audit_log.empty() &&
           audit_log_kept_from == 0;
  }
};

// The rows a LedgerChanges names, for a shell that copies them into its store batch at once:
// pointers into the Ledger, valid until its next mutating call. Same order as LedgerChanges.
struct LedgerChangedRows {
  std::vector<const Reservation*> reservations_upserted;  // sorted by id
  std::vector<std::string> reservations_deleted;
  std::vector<const AccountEntry*> accounts;  // sorted by key
  bool policies = false;
  ShardChangedRows shards;  // gateways, shards, fences and the shard sequence
  // Period-close snapshots, in the same batch as the accounts whose period they closed (so a
  // crash never loses or doubles a period). Sorted by key.
  std::vector<const PeriodSnapshot*> period_snapshots;
  std::vector<PeriodKey> period_snapshots_deleted;  // beyond limits::kPeriodSnapshotsKept
  std::vector<const OperatorRecord*> operators;     // enrolled operators changed, by name
  AuditLog::Changes audit_log;                      // entries appended, and dropped below

  bool empty() const {
    return reservations_upserted.empty() && reservations_deleted.empty() && accounts.empty() &&
           !policies && shards.empty() && period_snapshots.empty() &&
           period_snapshots_deleted.empty() && operators.empty() && audit_log.empty();
  }
};

#ifdef TALLY_TEST_FAULTS
// Test-only faults, off by default, compiled only into tally_core_testing (never into a shipped
// binary). They exist so the property suite can prove it fails when the ledger is wrong.
struct LedgerFaults {
  bool refund_usage_unknown = false;     // treat USAGE_UNKNOWN as unconsumed on mark-unknown
  bool double_refund_release = false;    // a duplicate release refunds again
  bool remint_holding_receipts = false;  // a shard report remints STARTED/UNKNOWN units
  bool admit_in_debt = false;            // admits while another generation of the route owes debt
  bool expire_started = false;  // the hold TTL expires a STARTED reservation (forged past the
                                // transition table) and refunds it
  bool reconcile_superseded_reports = false;  // a superseded (late, replayed) shard report is
                                              // reconciled as the latest
};
#endif

class Ledger {
 public:
  explicit Ledger(LedgerOptions options = {});
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Rebuilding from the durable record, before serving: policies and accounts through
  // accounts(), then every stored reservation, the shard registry through shards(), then
  // finishRestore(). Restored state is not
  // reported by takeChanges() (it is already durable). Takes the record by value: a restore
  // moves each stored reservation into the table instead of copying it.
  Status restoreReservation(Reservation reservation);
  // A stored period-close snapshot, after the accounts.
  Status restorePeriodSnapshot(const PeriodSnapshot& snapshot);
  // Rebuilds the deadline queues, checks the audit, and sets the clock to at least `now_ms`.
  Status finishRestore(uint64_t now_ms);

  PolicyReply publishPolicy(Policy policy, uint64_t now_ms);
  PolicyReply rollbackPolicy(uint64_t now_ms);

  // `gateway_name`: the enrolled gateway whose connection asks ("" = none), recorded in a new
  // reservation (Reservation::gateway_name). Who may act on a reservation is checked before,
  // by core/link_authority.h reservationRefusal (LedgerRequests::apply).
  ReservationReply reserve(const ReserveRequest& request, uint64_t now_ms,
                           const std::string& gateway_name = {});
  ReservationReply start(const StartRequest& request, uint64_t now_ms);
  ReservationReply settle(const SettleRequest& request, uint64_t now_ms);
  ReservationReply release(const ReleaseRequest& request, uint64_t now_ms);
  ReservationReply markUnknown(const MarkUnknownRequest& request, uint64_t now_ms);
  ReservationReply reportOperation(const ReportOperationRequest& request, uint64_t now_ms);
  ReservationReply query(const QueryRequest& request) const;
  // Streaming top-up (core/reservation_lifecycle.h extend): the difference is admitted like a
  // reserve against the reservation's own account (its generation must still be the active
  // one; debt, the route's freeze, available and max single reservation, applied to the new
  // total, refuse it with the same limiting dimensions and retry-after).
  ReservationReply extend(const ExtendRequest& request, uint64_t now_ms);

  // Expires RESERVED reservations past expiresAt, closes USAGE_UNKNOWN ones past the hard
  // execution limit as fully consumed, and compacts terminal ones past retention; at most
  // `items_max` of each per call so a tick never stalls the loop. Also closes accounting
  // periods (core/period_close.h): once `now_ms` passes an hour boundary, a sweep visits every
  // account (at most `items_max` per tick) and closes each whose period's epoch has ended: its
  // route is rebalanced up to `now_ms` (the refill it has earned, exactly as audit projects it)
  // and the snapshot of its balances is recorded. No balance changes beyond that refill.
  TickOutcome tick(uint64_t now_ms, uint64_t items_max = 10'000);

  // The two halves of expiry, exposed so the simulator can interleave a start between them.
  // beginExpiry is the CAS RESERVED → EXPIRING (only once expiresAt has passed);
  // completeExpiry is EXPIRING → EXPIRED, returning the units. Each returns whether it acted.
  bool beginExpiry(const std::string& reservation_id, uint64_t now_ms);
  bool completeExpiry(const std::string& reservation_id, uint64_t now_ms);

  // Emergency shards (SPEC §6, docs/SHARDS.md), through the ShardRegistry. `crypto` signs
  // grants and verifies gateways' signatures; it must outlive the Ledger (or be reset).
  void setShardCrypto(const ShardCrypto* crypto) { shards_.setCrypto(crypto); }
  GatewayReply enrollGateway(const std::string& gateway_name, const PublicKey& public_key,
                             uint64_t now_ms);
  GatewayReply listGateways() const { return shards_.listGateways(); }
  GatewayReply setGatewayEnabled(const std::string& gateway_name, bool enabled, uint64_t now_ms);
  GatewayReply rotateGatewayKey(const std::string& gateway_name, const PublicKey& new_key,
                                uint64_t overlap_ms, uint64_t now_ms);
  ShardReply issueShard(const ShardIssueRequest& request, uint64_t now_ms);
  ShardReply reportShard(const ShardReport& report, uint64_t now_ms);
  ShardReply shardStatus(const std::string& gateway_name,
                         const std::vector<std::string>& shard_ids) const {
    return shards_.status(gateway_name, shard_ids);
  }
  ShardReply listShards(const std::string& gateway_name, std::optional<ShardState> state) const {
    return shards_.list(gateway_name, state);
  }
  // Exactly one of shard_id and gateway_name is set.
  ShardReply revokeShards(const std::string& shard_id, const std::string& gateway_name,
                          uint64_t now_ms);
  ShardReply writeOffShard(const std::string& shard_id, uint64_t now_ms);

  // Operators (docs/security.md "Operators"). An operator's key may not be a gateway's, nor
  // a gateway's an operator's: a key is one identity.
  OperatorReply enrollOperator(const std::string& name, const PublicKey& public_key,
                               OperatorRole role, uint64_t now_ms);
  OperatorReply setOperatorEnabled(const std::string& name, bool enabled, uint64_t now_ms);
  OperatorReply listOperators() const { return operators_.list(); }
  OperatorRegistry& operators() { return operators_; }
  const OperatorRegistry& operators() const { return operators_; }
  // The audit log of privileged actions (core/audit_log.h): the shell appends an entry for
  // each, in the batch of the action, so the two are durable together.
  uint64_t appendAuditLog(AuditLogEntry entry, uint64_t now_ms);
  AuditLogReply auditLog(uint64_t after_sequence, uint64_t entries_max) const {
    return audit_log_.page(after_sequence, entries_max);
  }
  AuditLog& auditLogEntries() { return audit_log_; }

  AuditReport audit(uint64_t now_ms) const;
  // The same verdict over every account, listing only the accounts `filter` selects: the cost
  // of the accounts left out is their projection, not a copy and a sort of each.
  AuditReport audit(uint64_t now_ms, const AccountFilter& filter) const;
  PeriodAudit auditPeriods(const PeriodQuery& query, uint64_t now_ms) const;
  const PeriodBook& periods() const { return periods_; }
  AccountBook& accounts() { return accounts_; }
  const AccountBook& accounts() const { return accounts_; }
  ShardRegistry& shards() { return shards_; }
  const ShardRegistry& shards() const { return shards_; }
  // The reservation with this id, live or a receipt of the window. The pointer is valid until
  // the next call on this Ledger (a receipt is decoded into a scratch copy).
  const Reservation* findReservation(const std::string& reservation_id) const;
  // Reservations kept: live ones and the window's receipts.
  size_t reservationCount() const { return reservations_.size() + receipts_.size(); }
  // Reservations in the live table (non-terminal ones, and terminal ones until the tick after
  // their final image was taken); receipts in the archive and the bytes they hold.
  size_t liveReservationCount() const { return reservations_.size(); }
  size_t receiptCount() const { return receipts_.size(); }
  uint64_t receiptBytes() const { return receipts_.bytes(); }
  // Entries in the two deadline queues (expiry, hard limit), stale ones included: at most twice
  // the live table plus kDeadlinesKeptMin each after a tick (compactDeadlines()).
  size_t deadlinesQueued() const { return expiry_queue_.size() + hard_limit_queue_.size(); }
  static constexpr size_t kDeadlinesKeptMin = 4096;
  // Reservations kept, by state (O(live reservations)).
  std::array<uint64_t, kReservationStateCount> reservationCountsByState() const;
  // Calls fn(const Reservation&) for every reservation kept, terminal ones included until
  // compaction (O(reservations), receipts decoded: tests and checks).
  template <typename F>
  void forEachReservation(F&& fn) const {
    reservations_.forEach([&fn](const auto& record) { fn(record.reservation); });
    receipts_.forEach(fn);
  }

  // The live table alone (non-terminal reservations, and terminal ones until the tick after
  // their final image was taken), then the receipts alone: together what forEachReservation
  // visits, in the same order.
  template <typename F>
  void forEachLiveReservation(F&& fn) const {
    reservations_.forEach([&fn](const auto& record) { fn(record.reservation); });
  }
  template <typename F>
  void forEachReceipt(F&& fn) const {
    receipts_.forEach(fn);
  }
  // The receipts packed (ReceiptArchive::forEachPacked, findPacked; decode with
  // ReceiptArchive::decode): for checks that cache what each receipt contributes by its bytes.
  template <typename F>
  void forEachPackedReceipt(F&& fn) const {
    receipts_.forEachPacked(fn);
  }
  std::optional<std::string_view> findPackedReceipt(const std::string& reservation_id) const {
    return receipts_.findPacked(reservation_id, ReservationTable::hashOf(reservation_id));
  }
  // Changes whenever a receipt enters or leaves the archive (ReceiptArchive::version): while it
  // stays the same, forEachReceipt visits the same receipts, unchanged (read-only bookkeeping
  // for checks that cache what the receipts contribute).
  uint64_t receiptsVersion() const { return receipts_.version(); }

  // What changed since the last take (either form): every reservation upserted or deleted and
  // every account whose durable state changed.
  LedgerChanges takeChanges();
  LedgerChangedRows takeChangedRows();
#ifdef TALLY_TEST_FAULTS
  // Out of line, so that a binary linking the testing core shows it (no_test_faults_shipped).
  void setFaultsForTesting(LedgerFaults faults);
#endif

 private:
  // A queue entry names its reservation by handle (no index lookup when it falls due) and by id
  // (for an entry that outlived its reservation: a lookup by id decides, as it always has).
  struct Deadline {
    uint64_t at_ms;
    ReservationTable::Handle handle;
    std::string reservation_id;
    bool operator>(const Deadline& other) const { return at_ms > other.at_ms; }
  };
  // Earliest first. An entry stays until it falls due, whatever became of its reservation since
  // (started, closed, compacted), so keepOnly() drops the stale ones in one pass
  // (compactDeadlines()).
  class DeadlineQueue
      : public std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> {
   public:
    template <typename Keep>
    void keepOnly(const Keep& keep) {
      std::erase_if(c, [&keep](const Deadline& deadline) { return !keep(deadline); });
      std::make_heap(c.begin(), c.end(), comp);
    }
  };

  using Record = ReservationTable::Record;
  // The CapacityHolder of one central reservation: its Account (through accounts_), its
  // deadline queues and its change mark. Defined in ledger.cc.
  class AccountHolder;

  uint64_t advance(uint64_t now_ms);
  Record* lookup(const std::string& reservation_id);
  AccountEntry* accountOf(const Reservation& reservation);
  void touched(Record* record);
  ReservationReply reject(const ReserveRequest& request, const std::string& gateway_name,
                          uint64_t id_hash, Generation generation, LimitingDimension dimension,
                          int64_t retry_after_ms, uint64_t now_ms);
  // Every request on an existing reservation: the clock advanced, the record looked up, its
  // account as the holder, then `rule(reservation or nullptr, holder, now_ms)`: a lifecycle::
  // function. Defined (and only instantiated) in ledger.cc.
  template <typename Rule>
  ReservationReply applyToReservation(const std::string& reservation_id, uint64_t now_ms,
                                      Rule rule);
  // settle and reportOperation share this: an operation receipt with actual units.
  ReservationReply applyReceipt(const std::string& reservation_id, const std::string& operation_id,
                                Units actual_units, uint64_t now_ms);
  bool closeByHardLimit(Record* record, uint64_t now_ms);
  void pushHardLimit(const Record& record);
  // `entry`: a USAGE_UNKNOWN reservation's account (the restore's audit found it).
  void enqueueDeadlines(const Record& record, const AccountEntry* entry);
  void pushDeadline(DeadlineQueue* queue, uint64_t at_ms, const Record& record);
  // Pops the top entry; returns the reservation it names now, or null.
  Record* popDue(DeadlineQueue* queue);
  // Drops the entries whose reservation no longer waits for that deadline from a queue that
  // holds more than twice the live table (and kDeadlinesKeptMin): a stale entry would otherwise
  // stay until it falls due, hold_ttl_ms (up to 7 days) after its reserve, so the queues would
  // grow with rate × hold TTL instead of with the live reservations.
  void compactDeadlines();
  // The queue a reservation in `state` waits in (the tick acts on it only from there), or null.
  DeadlineQueue* queueWaitedIn(ReservationState state);
  // Moves closed reservations whose final image has been taken into the receipt archive (or
  // compacts them, past retention); returns the reservations compacted.
  uint64_t archiveClosed(uint64_t now_ms, uint64_t items_max);
  uint64_t keepUntil(const Reservation& reservation) const {
    return saturatingAdd(reservation.closed_at_ms, options_.retention_ms);
  }
  // The period-close sweep of tick(); returns the periods closed.
  uint64_t closePeriods(uint64_t now_ms, uint64_t items_max);
  void addPeriod(PeriodSnapshot snapshot);

  LedgerOptions options_;
#ifdef TALLY_TEST_FAULTS
  LedgerFaults faults_;
#endif
  uint64_t now_ms_ = 0;
  AccountBook accounts_;
  ShardRegistry shards_{&accounts_, options_.shard_retention_ms};
  OperatorRegistry operators_;
  AuditLog audit_log_;
  ReservationTable reservations_;
  DeadlineQueue expiry_queue_;      // RESERVED reservations by expiresAt
  DeadlineQueue hard_limit_queue_;  // USAGE_UNKNOWN by startedAt + hard execution limit
  // Receipts of the idempotency window, packed (the live table keeps a terminal reservation only
  // until the tick after its final image was taken: closed_ names those).
  ReceiptArchive receipts_{std::max<uint64_t>(options_.retention_ms / 16, 1)};
  std::vector<ReservationTable::Handle> closed_;
  mutable Reservation found_scratch_;  // findReservation's copy of a receipt
  std::vector<Record*> upserted_;      // each with change_pending set, in first-touch order
  std::vector<std::string> deleted_;
  PeriodBook periods_;
  uint64_t period_sweep_due_ms_ = 0;  // the next hour boundary (0: sweep at the first tick)
  bool period_sweeping_ = false;
  size_t period_cursor_ = 0;  // AccountBook::entryAt index of the sweep
  std::vector<PeriodKey> periods_upserted_;
  std::vector<PeriodKey> periods_deleted_;
};

}  // namespace tally
