#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/ledger.h"
#include "core/shard_book.h"
#include "tests/sim/ledger_node.h"
#include "tests/sim/storage.h"
#include "tests/sim/trace.h"

// The gate's checks (issue 10, "Checked after every step"), against the real Ledger and the
// replies it made durable and sent. Each check counts the runs it failed in; a run stops at the
// step of its first failure, so that --replay shows the step that broke it.

namespace tally::sim {

enum class Check : uint8_t {
  kConservation = 0,            // Ledger::audit(): per account, and reserved = live holds
  kOverspend,                   // a fresh admission while the subject/route owed debt, or an
                                // admission of a request beyond the limits
  kSecondReservation,           // one reservation id (or one gateway job) debited twice
  kDuplicateShardConsumption,   // an agent admitted from a shard issued to another gateway or
                                // boot epoch of it
  kUnrecordedDebt,              // per account: spent and overdraft issued equal what the
                                // reservations' receipts consumed and owed
  kDuplicateRefund,             // a reservation refunded twice, or a duplicate that refunded
  kUnknownTreatedAsUnconsumed,  // USAGE_UNKNOWN (or its hard-limit close) refunded units
  kLostAcknowledged,            // a reply the gateway saw contradicted later; or the live
                                // state differs from the state rebuilt from durable rows
  kUnknownUnresolved,           // USAGE_UNKNOWN left after healing and letting time pass
  kShardUnreconciled,           // a shard neither reconciled nor written off (nor in CONFLICT,
                                // its overspend recorded as debt) at the end
  kOutboxUndrained,             // an agent's outbox (memory or durable rows) not empty at the end
  kFairnessOverBudget,          // a window's fairness error of a tenant above its budget
  kFairScheduling,              // the fair scheduler broke a rule: a tenant's starts reordered
                                // within a class, a start held that the ledger never reserved,
                                // a start still waiting past its reservation's expiry
  kCount,
};
inline constexpr size_t kCheckCount = static_cast<size_t>(Check::kCount);
const char* checkName(Check check);

struct Finding {
  Check check = Check::kConservation;
  std::string detail;
  uint64_t now_ms = 0;
};

class Checker {
 public:
  explicit Checker(Trace* trace) : trace_(trace) {}

  // A reply the ledger made durable and sent (LedgerNode::commit), in commit order.
  void onCommitted(const CommittedReply& reply, uint64_t now_ms);
  // A gateway accepted `reply` as the answer to its current request about `reservation_id`.
  void onAcknowledged(const std::string& reservation_id, const ReservationReply& reply,
                      bool actual_known, uint64_t now_ms);
  // A gateway's query about a reservation whose acknowledged state was `known` when it asked.
  void onQueried(const std::string& reservation_id, const ReservationReply& reply,
                 ReservationState known, uint64_t now_ms);
  // Before every Ledger::tick (the only place that compacts): the final images of the terminal
  // reservations. A reservation settled and compacted within one batch was never durable in its
  // settled form, so its last durable image would undercount what it consumed.
  // Only reservations terminal for at least `retention_ms` by `now_ms` (the tick's time) can be
  // compacted by it.
  // Skipped (nothing to keep) when the last full look at the ledger proves that this tick can
  // compact nothing.
  void beforeTick(const Ledger& ledger, uint64_t now_ms, uint64_t retention_ms);
  // The ledger restarted from its durable rows: what the last look proved is void (a restore
  // brings back rows the live ledger had compacted before it crashed).
  // A new Ledger is checked from now on: what was kept about the last one's receipts too.
  void onLedgerRestarted() {
    horizon_ = {};
    archive_ = {};
    entries_ = {};
  }
  // Reservations compacted by a durable commit (their consumption stays in the sums).
  void onCompacted(const std::vector<Reservation>& deleted);
  void fail(Check check, const std::string& detail, uint64_t now_ms);
  bool compacted(const std::string& reservation_id) const {
    return compacted_ids_.contains(reservation_id);
  }

  // After every step that may have changed the ledger, while it is up.
  void afterStep(const Ledger& ledger, uint64_t now_ms);
  // After a step that left the ledger as it was: only what was acknowledged since the last
  // check, against the ledger's state (the rest was checked against that same state).
  void afterAcknowledgements(const Ledger& ledger, uint64_t now_ms);
  // The live ledger equals one rebuilt from the durable rows (call with nothing uncommitted).
  void checkDurable(const Ledger& live, SimStore* store, const LedgerOptions& options,
                    uint64_t now_ms);
  // After healing and letting time pass.
  void atEnd(const Ledger& ledger, uint64_t now_ms);

  // --- agents and shards ---
  // After every step that may have changed an agent (while it is up): its shard book audits
  // (every shard conserves and holds exactly its reservations' units), and every reservation
  // it admitted from a shard was admitted by the gateway and boot epoch the shard was issued to.
  void afterAgentStep(const std::string& gateway_name, uint64_t boot_epoch, const ShardBook& book,
                      uint64_t now_ms);
  // At the end, every agent up: its outbox drained, nothing of its book waiting for a report.
  void atEndAgent(const std::string& gateway_name, const ShardBook& book, size_t outbox_depth,
                  size_t outbox_rows, uint64_t now_ms);
  // Shards compacted by a durable commit (their spent and debt stay in the account sums).
  void onCompactedShards(const std::vector<ShardRecord>& deleted);
  uint64_t shardAdmissions() const { return shard_reservations_seen_.size(); }
  // The ledger compacted this shard (after reconciling it and its retention window).
  bool shardCompacted(const std::string& shard_id) const {
    return compacted_shards_.contains(shard_id);
  }
  // Closed accounting periods compared between the live and the rebuilt ledger so far.
  uint64_t periodsChecked() const { return periods_checked_; }

  bool failed() const { return !findings_.empty(); }
  const std::vector<Finding>& findings() const { return findings_; }
  // Simulated ms from a reservation's first sighting in USAGE_UNKNOWN to its close.
  const std::vector<uint64_t>& convergenceMs() const { return convergence_ms_; }
  // Reservations seen USAGE_UNKNOWN and not yet seen closed, with when they were first seen.
  const std::map<std::string, uint64_t>& unknownSince() const { return unknown_since_ms_; }
  std::array<bool, kCheckCount> failedChecks() const;

 private:
  struct Fact {
    ReservationState state = ReservationState::kRequested;
    Units reserved_units = 0;
    Units actual_units = 0;
    bool actual_known = false;
    uint64_t created_at_ms = 0;  // which incarnation of the id (ids are reusable after
                                 // compaction)
    uint64_t pass = 0;           // the last afterStep whose scan met its reservation
    // The archive (ArchiveCache::serial) in which its receipt was found to agree with it; 0
    // when it changed since. A receipt never changes while archived.
    uint64_t archived_ok = 0;
    // The packed receipt it was last found to agree with (empty: none since it changed).
    std::string archived_packed;
  };
  struct Sums {
    Units consumed = 0;
    Units debt = 0;
  };

  // What the last full look at the ledger (every reservation and shard) saw: the earliest
  // closedAt of a terminal reservation and the earliest shard expiry, and when it looked.
  struct Horizon {
    bool known = false;
    uint64_t seen_at_ms = 0;
    uint64_t closed_ms_min = ~uint64_t{0};
    uint64_t expires_ms_min = ~uint64_t{0};

    void saw(uint64_t now_ms);  // a full look begins
    bool nothingCompactable(uint64_t now_ms, uint64_t retention_ms) const;
  };

  // Hashing by string_view for maps keyed by std::string (lookups with views, no copy).
  struct ViewHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // What afterStep takes from the receipt archive, kept between calls: receipts never change
  // while archived, so this is rebuilt only when the archive changed (Ledger::receiptsVersion)
  // or the Ledger was replaced (onLedgerRestarted; `ledger` also tells two ledgers apart).
  struct ArchiveCache {
    const Ledger* ledger = nullptr;
    uint64_t version = 0;
    uint64_t serial = 0;  // numbers the rebuilds (never 0 once built)
    size_t receipts = 0;
    uint64_t closed_ms_min = ~uint64_t{0};
    // By account entry (entries never move within one Ledger).
    std::unordered_map<const AccountEntry*, Sums> sums;
    // Gateway job → the first non-REJECTED receipt that debited it (views into packed_).
    std::unordered_map<std::string_view, std::string_view> jobs;
    // Failures the receipts alone show (reported at every afterStep while they are kept).
    std::vector<std::pair<Check, std::string>> failures;
  };
  // Brings archive_ up to date with `ledger`'s receipts.
  void refreshArchive(const Ledger& ledger);
  // What one receipt contributes to archive_, by its packed bytes (a receipt never changes
  // while archived; the same bytes in one Ledger contribute the same).
  struct PackedReceipt {
    const AccountEntry* entry = nullptr;
    Sums sums;
    uint64_t closed_at_ms = 0;
    bool debits = false;  // not REJECTED: it debited its gateway job
    std::string id;
    size_t job_length = 0;                      // the job is id's first job_length bytes
    std::optional<std::string> unknown_refund;  // the failure it shows alone (unknownRefundOf)
    uint64_t serial = 0;                        // the last archive_.serial that held it
  };
  // Of archive_.ledger's receipts (cleared when the Ledger changes).
  std::unordered_map<std::string, PackedReceipt, ViewHash, std::equal_to<>> packed_;

  // The account entries of the last afterStep's audit, by position in audit.accounts (sorted
  // by key), of one Ledger (cleared when it changes: entries never move within one Ledger).
  struct AuditEntries {
    const Ledger* ledger = nullptr;
    std::vector<const AccountEntry*> by_position;
  };
  AuditEntries entries_;

  Trace* trace_;
  std::vector<Finding> findings_;
  Horizon horizon_;
  ArchiveCache archive_;
  uint64_t archive_serial_ = 0;
  void checkFact(const Ledger& ledger, const std::string& id, const Fact& fact, uint64_t now_ms);
  // Why `r` contradicts what was acknowledged about it, if it does.
  static std::optional<std::string> factFailure(const Reservation& r, const Fact& fact);
  uint64_t facts_pass_ = 0;
  void checkPeriods(const Ledger& live, const Ledger& rebuilt, uint64_t now_ms);
  uint64_t periods_checked_ = 0;

  // The last book afterAgentStep checked, by gateway: an unchanged one (same boot epoch, same
  // book, same ShardBook::version) passes again without a look.
  struct BookSeen {
    uint64_t boot_epoch = 0;
    const ShardBook* book = nullptr;
    uint64_t version = 0;
  };
  std::map<std::string, BookSeen, std::less<>> books_seen_;

  std::map<std::string, Fact> facts_;  // acknowledged, by reservation id
  // Shards the ledger answered CONFLICT about, with what they had reminted then.
  std::unordered_map<std::string, Units> conflicted_reminted_;
  std::vector<std::string> fresh_facts_;        // acknowledged since the last check
  std::map<std::string, uint64_t> admissions_;  // fresh admissions committed, by id
  std::map<std::string, uint64_t> refunds_;     // committed replies that refunded, by id
  struct Image {
    AccountKey key;
    Sums sums;
    uint64_t created_at_ms = 0;
  };
  std::map<AccountKey, Sums> compacted_;             // consumption of compacted reservations
  std::map<std::string, Image> before_tick_;         // terminal reservations before the last tick
  std::map<std::string, Image> before_tick_shards_;  // final shards before the last tick
  std::set<std::string> compacted_shards_;
  std::set<std::string> compacted_ids_;
  std::map<std::string, uint64_t> compacted_created_at_ms_;  // latest compacted incarnation
  std::map<std::string, uint64_t> unknown_since_ms_;
  std::set<std::string> shard_reservations_seen_;             // "<gateway>/<reservation id>"
  std::map<std::string, size_t> shard_reservations_counted_;  // "<gateway>/<shard id>"
  std::vector<uint64_t> convergence_ms_;
};

// Whether a reservation in `from` can later be observed in `to` (canTransition, closed).
bool reachable(ReservationState from, ReservationState to);
// What a settled reservation consumed (what its account's `spent` holds for it).
Units consumedBy(const Reservation& reservation);

}  // namespace tally::sim
