#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/ledger_types.h"
#include "core/limits.h"
#include "core/reservation.h"
#include "core/shard_account.h"
#include "core/shard_types.h"
#include "core/status.h"

// The agent's emergency shards and the reservations it admitted from them (SPEC §6,
// docs/SHARDS.md "Agent: the shard book").
//
// Pure and deterministic: every call takes `now_ms` (the agent's wall clock); expiry, shard
// expiry and forgetting happen only in tick(). The agent shell persists what takeChanges() names
// (shard/store.h) before any reply that depends on it.
//
// Invariants, asserted after every mutation:
//  * every shard conserves: allocated = localAvailable + localReserved + localSpent +
//    localRetired (ShardAccount);
//  * each shard's localReserved equals the units held by its RESERVED, EXPIRING, STARTED and
//    USAGE_UNKNOWN reservations, so Σ admitted units never exceeds what was allocated;
//  * a closed shard admits nothing; a quarantined shard is closed, never admits and is never
//    reported.
//
// Borrows `crypto` (it must outlive the book). Owned by one thread (the agent's loop or a test).

namespace tally {

inline constexpr uint64_t kShardIdBytesMax = 128;  // as wire::kOriginBytesMax

struct ShardBookOptions {
  PublicKey gateway_id{};   // our gateway key
  uint64_t boot_epoch = 0;  // our current boot epoch (already durably incremented)
  const ShardCrypto* crypto = nullptr;
  // Keep final (reconciled, conflict, written-off, unreconcilable) shards and their
  // reservations this long after the final answer, so a retried reservation id is answered
  // locally. A day, as the ledger's shard_retention_ms (limits::kShardRetentionMsDefault).
  uint64_t retention_ms = limits::kShardRetentionMsDefault;
  uint64_t hold_ttl_ms = 30'000;  // local RESERVED expiry
  uint64_t shards_max = 10'000;
  uint64_t reservations_max = 1'000'000;
  // Keeps a shard's report well inside one wire frame (each receipt is a few hundred bytes).
  uint64_t reservations_per_shard_max = 2'000;
};

// Why a shard stopped admitting. Stored as its integer value: only append.
enum class ShardCloseReason : uint8_t {
  kNone = 0,
  kReconnect,    // admitted from during a partition; the ledger is back
  kBootEpoch,    // issued to an earlier boot epoch of this agent (SPEC §6 rule 3)
  kFence,        // its fence is below the highest seen for its subject/route
  kExpiry,       // expiresAt passed (or is within refresh_before_expiry_ms)
  kRevoked,      // the ledger says REVOKED
  kQuarantined,  // its stored grant does not verify
};
inline constexpr int kShardCloseReasonCount = 7;
const char* shardCloseReasonName(ShardCloseReason reason);

// Why the ledger will never take this shard's report (HeldShardRecord::unreconcilable). Stored as
// its integer value: only append.
enum class ShardUnreconcilable : uint8_t {
  kNo = 0,
  // The ledger answered kNotFound: it has no record of the shard (reconciled and compacted after
  // its shard_retention_ms before we heard the answer, or lost by a restore). Our report may be
  // a repeat of one it accepted, or new usage: the operator must look.
  kForgotten,
  // The ledger refused the report because an operator wrote the shard off: its usage is not
  // recorded centrally.
  kWrittenOff,
};
inline constexpr int kShardUnreconcilableCount = 3;
const char* shardUnreconcilableName(ShardUnreconcilable reason);

// Outcomes of addShard(). Only kOk and kDuplicate leave a usable shard in the book.
enum class ShardAddCode : uint8_t {
  kOk = 0,
  kDuplicate,          // this exact grant is already in the book
  kInvalid,            // empty id, subject or route, or zero units
  kIdConflict,         // a different grant under an id we already hold
  kBadSignature,       // verifyGrant failed
  kNotOurGateway,      // gateway_id is another gateway's key
  kWrongBootEpoch,     // issued to another boot epoch of this agent
  kFenceBelowSeen,     // fence < the highest fence seen for its subject/route
  kExpired,            // now ≥ expiresAt
  kResourceExhausted,  // shards_max reached
};
const char* shardAddCodeName(ShardAddCode code);

// The agent's durable record of one shard, beside its ShardAccount (balances, closed).
struct HeldShardRecord {
  ShardGrant grant;
  ShardCloseReason close_reason = ShardCloseReason::kNone;
  bool quarantined = false;     // recomputed at every restore; never persisted as trusted
  bool used = false;            // at least one reservation was admitted from it
  bool report_pending = false;  // closed, and the ledger has not acknowledged these balances
  bool ledger_known = false;    // the ledger answered about it at least once
  ShardState ledger_state = ShardState::kIssued;
  Units ledger_spent_units = 0;
  Units ledger_reminted_units = 0;
  Units ledger_debt_units = 0;
  uint64_t added_at_ms = 0;
  uint64_t closed_at_ms = 0;
  uint64_t final_at_ms = 0;  // when the ledger's state became final (RECONCILED and beyond)
  // Set when the ledger said it will never take the report: kept (durably, for retention_ms
  // from final_at_ms) with its balances and receipts for the operator, never reported again,
  // not counted as awaiting reconciliation.
  ShardUnreconcilable unreconcilable = ShardUnreconcilable::kNo;

  bool operator==(const HeldShardRecord&) const = default;
};

// How long before its expiry an unused shard is closed and replaced: `refresh_before_ms`, but
// at most half the grant's lifetime (a short-lived grant is not closed as soon as it arrives).
uint64_t refreshWindowMs(const ShardGrant& grant, uint64_t refresh_before_ms);

// A ledger state after which the shard is never reported again.
bool isFinalShardState(ShardState state);
// Never reported again: a final ledger state, or unreconcilable.
bool isFinalShard(const HeldShardRecord& record);

// One shard as the store wrote it, handed back at boot.
struct StoredShard {
  std::string shard_id;        // the row's key
  bool grant_decoded = false;  // false: the grant blob did not even decode (quarantined)
  HeldShardRecord record;
  ShardBalances balances;
  bool closed = false;
};

struct ShardBookChanges {
  std::vector<std::string> shards_upserted;  // sorted
  std::vector<std::string> shards_deleted;
  std::vector<std::string> reservations_upserted;  // sorted
  std::vector<std::string> reservations_deleted;
  std::vector<SubjectRoute> fences;  // whose highest fence changed

  bool empty() const {
    return shards_upserted.empty() && shards_deleted.empty() && reservations_upserted.empty() &&
           reservations_deleted.empty() && fences.empty();
  }
};

struct ShardRestoreReport {
  std::vector<std::string> quarantined;     // grant does not verify (or does not decode)
  std::vector<std::string> closed_at_boot;  // issued to an earlier boot epoch, closed now
};

struct ShardTickOutcome {
  uint64_t reservations_expired = 0;
  std::vector<std::string> shards_closed;  // expired
  std::vector<std::string> shards_forgotten;
};

// What a ledger answer did to a shard, for the shell's logs and metrics.
struct ShardAnswerOutcome {
  bool known = false;         // the shard is in the book
  bool closed_now = false;    // revoked or fenced: closed by this answer
  bool acknowledged = false;  // the ledger holds our current balances
  bool became_final = false;  // RECONCILED / CONFLICT / WRITTEN_OFF, first time
};

#ifdef TALLY_TEST_FAULTS
// Test-only faults, off by default, compiled only into tally_core_testing (never into a shipped
// binary): they let the property suite prove it fails when the book is wrong.
struct ShardBookFaults {
  bool admit_from_unusable = false;       // admit from an expired or fenced (still open) shard
  bool refund_duplicate_release = false;  // a duplicate release reports its units refunded again
  bool reuse_after_restart = false;       // shards of an earlier boot epoch stay open and usable
};
#endif

class ShardBook {
 public:
  struct Shard {
    HeldShardRecord record;
    ShardAccount account;
    std::set<std::string> reservation_ids;
    Units held_units = 0;  // Σ units of its holding reservations; must equal local_reserved
  };

  explicit ShardBook(ShardBookOptions options);
  ShardBook(const ShardBook&) = delete;
  ShardBook& operator=(const ShardBook&) = delete;

  // --- boot ---
  // Rebuilding from the store, before serving: every fence, every shard, then every
  // reservation, then finishRestore(). Corruption for rows that cannot be consistent.
  void restoreFence(const SubjectRoute& subject_route, uint64_t fence);
  Status restoreShard(StoredShard stored);
  Status restoreReservation(const Reservation& reservation);
  // Checks every shard's reserved units against its reservations, quarantines shards whose
  // grant does not verify and closes those of earlier boot epochs (both reported by
  // takeChanges(), so the shell persists them), and re-queues local expiries.
  Result<ShardRestoreReport> finishRestore(uint64_t now_ms);

  // --- shards ---
  ShardAddCode addShard(const ShardGrant& grant, uint64_t now_ms);
  // Closes every open shard of the subject/route with a lower fence; remembers the fence.
  // Returns the ids closed.
  std::vector<std::string> noteFence(const SubjectRoute& subject_route, uint64_t fence,
                                     uint64_t now_ms);
  // Stops admission (localAvailable → localRetired) and marks it for a report. Idempotent;
  // false if unknown.
  bool close(const std::string& shard_id, ShardCloseReason reason, uint64_t now_ms);
  // Closes every open shard that was admitted from, or expires within its refresh window
  // (refreshWindowMs), or
  // whose fence is below the highest seen: what a reconnected agent does. Returns the ids.
  std::vector<std::string> closeForReconnect(uint64_t now_ms, uint64_t refresh_before_ms);
  // The report of a closed, not quarantined shard (unsigned: the shell signs it); null
  // otherwise. Receipts sorted by reservation id.
  std::optional<ShardReport> buildReport(const std::string& shard_id, uint64_t now_ms) const;
  // Records the ledger's view of a shard (a report's or a status answer). A revoked shard is
  // closed; a current fence above the shard's closes it (noteFence).
  ShardAnswerOutcome onLedgerAnswer(const std::string& shard_id, const ShardLedgerView& view,
                                    uint64_t now_ms);
  // The ledger will never take this closed shard's report (`reason`): it stops needing a report
  // and is kept, with its balances and reservations, until retention_ms after now (longer while
  // a reservation still holds units). False (nothing changed) if unknown, quarantined, open or
  // already unreconcilable.
  bool markUnreconcilable(const std::string& shard_id, ShardUnreconcilable reason, uint64_t now_ms);

  // --- local reservations (origin = shard id) ---
  // Admits from a usable shard of (subject, route) with enough localAvailable, or answers a
  // known id (duplicate or conflict) — in any health state. nullopt: the id is not ours and no
  // shard can admit it (the shell rejects with Retry-After as before).
  std::optional<ReservationReply> reserve(const ReserveRequest& request, uint64_t now_ms);
  ReservationReply start(const StartRequest& request, uint64_t now_ms);
  ReservationReply settle(const SettleRequest& request, uint64_t now_ms);
  ReservationReply release(const ReleaseRequest& request, uint64_t now_ms);
  ReservationReply markUnknown(const MarkUnknownRequest& request, uint64_t now_ms);
  ReservationReply reportOperation(const ReportOperationRequest& request, uint64_t now_ms);
  ReservationReply query(const QueryRequest& request) const;

  // Expires local RESERVED past their hold, closes expired shards, forgets final shards (and
  // their reservations; unreconcilable ones too) after retention.
  ShardTickOutcome tick(uint64_t now_ms);

  // --- questions the shell asks ---
  bool ownsReservation(const std::string& reservation_id) const;
  // Open, not quarantined, not expired, fence current, boot epoch ours.
  bool isUsable(const Shard& shard, uint64_t now_ms) const;
  size_t usableShardCount(const SubjectRoute& subject_route, uint64_t now_ms) const;
  Units usableUnits(const SubjectRoute& subject_route, uint64_t now_ms) const;
  // Closed, not quarantined, and not yet acknowledged by the ledger (sorted).
  std::vector<std::string> shardsNeedingReport() const;
  // Open shards the ledger should be asked about (status poll), sorted.
  std::vector<std::string> openShards() const;
  uint64_t highestFence(const SubjectRoute& subject_route) const;
  const Shard* findShard(const std::string& shard_id) const;
  const Reservation* findReservation(const std::string& reservation_id) const;
  void forEachShard(const std::function<void(const std::string&, const Shard&)>& fn) const;
  size_t shardCount() const { return shards_.size(); }
  size_t reservationCount() const { return reservations_.size(); }
  uint64_t bootEpoch() const { return options_.boot_epoch; }

  // Every shard conserves and holds exactly its reservations' units; empty when sound.
  std::vector<std::string> audit() const;
  // Moves on every call that may have changed a shard, a reservation or the open index (every
  // mutable lookup, insert, erase and change mark): while it stays the same, audit() and
  // forEachShard() see the same book. Read-only bookkeeping for a checker (the simulator's)
  // that looks again only at a changed book.
  uint64_t version() const { return version_; }

  ShardBookChanges takeChanges();
#ifdef TALLY_TEST_FAULTS
  void setFaultsForTesting(ShardBookFaults faults);  // out of line: see Ledger's
#endif

 private:
  Shard* lookupShard(const std::string& shard_id);
  Reservation* lookup(const std::string& reservation_id);
  Shard& shardOf(const Reservation& reservation);
  // The CapacityHolder of one shard reservation: its shard's ShardAccount, the expiry index and
  // the change marks. Defined in shard_book_reservations.cc.
  class ShardHolder;

  Shard* pickShard(const ReserveRequest& request, uint64_t now_ms);
  // Expires every local RESERVED (or restored EXPIRING) reservation due by now_ms; the count.
  uint64_t expireDue(uint64_t now_ms);
  ReservationReply applyReceipt(const std::string& reservation_id, const std::string& operation_id,
                                Units actual_units, uint64_t now_ms);
  void closeShard(const std::string& shard_id, Shard* shard, ShardCloseReason reason,
                  uint64_t now_ms);
  void forget(const std::string& shard_id);
  void indexOpen(const std::string& shard_id, const ShardGrant& grant);
  void unindexOpen(const std::string& shard_id, const ShardGrant& grant);
  // The open shards of a subject/route (ids, sorted).
  std::vector<std::string> openShardsOf(const SubjectRoute& subject_route) const;
  void checkShard(const Shard& shard) const;
  void touchShard(const std::string& shard_id) {
    ++version_;
    shards_changed_.insert(shard_id);
  }
  void touchReservation(const std::string& id);

  ShardBookOptions options_;
#ifdef TALLY_TEST_FAULTS
  ShardBookFaults faults_;
#endif
  std::map<std::string, Shard> shards_;
  std::unordered_map<std::string, Reservation> reservations_;
  std::map<SubjectRoute, uint64_t> fences_;
  // Open shards by subject/route: admission, counts and fences look only at these.
  std::map<SubjectRoute, std::set<std::string>> open_by_account_;
  std::set<std::pair<uint64_t, std::string>> expiry_;  // RESERVED local ones by expiresAt

  std::set<std::string> shards_changed_;
  std::set<std::string> shards_deleted_;
  std::set<std::string> reservations_changed_;
  std::set<std::string> reservations_deleted_;
  std::set<SubjectRoute> fences_changed_;
  uint64_t version_ = 0;
};

}  // namespace tally
