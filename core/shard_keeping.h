#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/ledger_types.h"
#include "core/shard_book.h"
#include "core/status.h"

// The agent's emergency-shard decisions (docs/SHARDS.md "Agent: when shards are used"), as a
// pure machine around ShardBook: events and `now_ms` in, plain-value effects out, the book's
// durable writes through the small ShardBookStore interface. No libuv, SQLite, clock or RNG (the
// issue-request nonce is an option). The shell (agent/shard_keeper.cc) signs and sends what
// the effects say, answers gateways, logs the notes, and feeds the ledger's answers back.
//
//  * Gateway operations: every operation on a reservation the book owns (origin = a shard id)
//    is answered by the book in any health state; admit() takes a partition-time reserve from a
//    usable shard. What a call changed is persisted before its answer: the answers of one loop
//    iteration wait for one commit() (one transaction). If the store fails they are answered
//    kUnavailable "retry with the same ids", and the changes are retried with the next commit.
//  * maintain(now, link_usable) (every maintain_interval_ms): ticks the book (local expiry, shard
//    expiry, forgetting after retention); then, only if that was persisted and the link is
//    usable: closes what a reconnected agent closes (expired, near expiry, fenced) and persists
//    that, sends a report for each closed shard needing one (one in flight per shard; after a
//    failed or refused one, not before issue_retry_ms), polls shardStatus for open shards (one
//    poll in flight, every status_poll_ms; revoked or a higher fence → closed), and keeps
//    `shards_on_hand` usable shards for each configured or recently reserved account (one issue
//    in flight per account; request ids unique per process start; an unanswered issue is
//    retried as is, so the ledger answers that shard again instead of carving another; after a
//    refusal issue_retry_ms, after "emergency mode is off" emergency_off_retry_ms).
//  * A report answered kNotFound (the ledger has no record of the shard: compacted after its
//    shard_retention_ms before we heard the answer) or refused because the shard was written off
//    marks the shard unreconcilable (ShardBook::markUnreconcilable): never sent again, not
//    pending, counted in gauges().unreconcilable and noted at error level with its balances.
//    Every other refusal and every transport failure is retried after issue_retry_ms.
//  * Learned accounts (learnAccount: a central admission on a route with emergency mode on) are
//    bounded by accounts_max (the one learned longest ago and not being issued for makes room)
//    and dropped after account_idle_ms without a reserve.
//
// Single-threaded. Effects accumulate until takeEffects(); the shell performs them in order.

namespace tally {

// The durable seam: writes everything `changes` names, in one transaction, durable when it
// returns OK (shard/store.h's ShardStore in production; a simulated store in the simulator).
class ShardBookStore {
 public:
  virtual ~ShardBookStore() = default;
  [[nodiscard]] virtual Status commit(const ShardBook& book, const ShardBookChanges& changes) = 0;
};

struct ShardKeepingOptions {
  std::vector<SubjectRoute> accounts;  // configured: always kept
  uint64_t shards_on_hand = 1;
  uint64_t refresh_before_expiry_ms = 30'000;
  uint64_t accounts_max = 1'000;
  uint64_t account_idle_ms = 600'000;
  uint64_t status_poll_ms = 2'000;
  uint64_t issue_retry_ms = 5'000;
  uint64_t emergency_off_retry_ms = 60'000;
  std::string gateway_name;
  PublicKey gateway_id{};
  uint64_t boot_epoch = 0;
  uint64_t request_nonce = 0;  // random per process start: issue request ids never repeat
};

// --- effects -------------------------------------------------------------------------------------
// Sign (gateway key) and send this issue request; feed the result to onIssueAnswer(account, …).
struct ShardSendIssue {
  SubjectRoute account;
  ShardIssueRequest request;  // unsigned; Ed25519 is deterministic, so a retry is identical
  bool operator==(const ShardSendIssue&) const = default;
};
// Sign and send this report; feed the result to onReportAnswer(shard_id, …).
struct ShardSendReport {
  std::string shard_id;
  ShardReport report;  // unsigned
  bool operator==(const ShardSendReport&) const = default;
};
// Send shardStatus (our gateway name) for these shards; feed the result to onStatusAnswer().
struct ShardSendStatus {
  std::vector<std::string> shard_ids;
  bool operator==(const ShardSendStatus&) const = default;
};
// The answer for gateway requester `token` (durable now): `reply`, or kUnavailable `message`.
struct ShardGatewayAnswer {
  uint64_t token = 0;
  std::optional<ReservationReply> reply;
  std::string unavailable;  // set when `reply` is not
};
// What happened, for the log and the metrics: a log line (`event` and its fields, values
// already formatted) and, when `counter` is set, one count of `label`.
enum class ShardNoteLevel : uint8_t { kDebug, kInfo, kWarn, kError };
enum class ShardCounter : uint8_t { kNone, kAdmission, kReport, kIssue, kEvent };
struct ShardNote {
  ShardNoteLevel level = ShardNoteLevel::kInfo;
  std::string event;  // empty: a count only
  std::vector<std::pair<std::string, std::string>> fields;
  ShardCounter counter = ShardCounter::kNone;
  std::string label;
  bool operator==(const ShardNote&) const = default;
};
using ShardKeepingEffect =
    std::variant<ShardSendIssue, ShardSendReport, ShardSendStatus, ShardGatewayAnswer, ShardNote>;
using ShardKeepingEffects = std::vector<ShardKeepingEffect>;

// A gateway operation on a reservation the book owns.
using ShardOperation = std::variant<ReserveRequest, StartRequest, SettleRequest, ReleaseRequest,
                                    MarkUnknownRequest, ReportOperationRequest, QueryRequest>;

// The ledger's answer to one of our calls, as the shell saw it.
struct ShardCallResult {
  bool answered = false;  // false: the call failed in transport (`error` says why)
  std::string error;
  std::optional<ShardReply> reply;  // answered with a ShardReply
  std::string label;                // the answer's outcome label, for the log
};

struct ShardGauges {
  uint64_t usable = 0;
  uint64_t closed = 0;
  uint64_t quarantined = 0;
  uint64_t unreconcilable = 0;   // the ledger will never take their report (not in `closed`)
  uint64_t available_units = 0;  // localAvailable of usable shards
  uint64_t oldest_unreconciled_age_ms = 0;
};

class ShardKeeping {
 public:
  // `store` must outlive the machine.
  ShardKeeping(ShardBookOptions book_options, ShardKeepingOptions options, ShardBookStore* store);
  ShardKeeping(const ShardKeeping&) = delete;
  ShardKeeping& operator=(const ShardKeeping&) = delete;

  // For the shell's restore from its store (ShardStore::restore), before anything else.
  ShardBook* bookForRestore() { return &book_; }
  // The restore's outcome: notes for quarantined shards and those closed at boot.
  void restored(const ShardRestoreReport& report);

  bool owns(const std::string& reservation_id) const {
    return book_.ownsReservation(reservation_id);
  }
  // Partition admission (enforce mode). False when no usable shard can admit it (nothing
  // changed, no answer will come: the caller rejects as before). Otherwise `token`'s answer
  // comes from the next commit().
  bool admit(uint64_t token, const ReserveRequest& request, uint64_t now_ms);
  // Any operation on a reservation the book owns (owns() is true); the answer comes from the
  // next commit() (even a read waits: it may show state changed in this iteration).
  void apply(uint64_t token, const ShardOperation& operation, uint64_t now_ms);
  // End of a loop iteration: persists what changed and answers every waiting token.
  void commit();
  bool waitingForCommit() const { return !pending_.empty(); }

  // A central reservation succeeded on a route with emergency mode on: keep shards for it.
  void learnAccount(const SubjectRoute& account, uint64_t now_ms);
  void maintain(uint64_t now_ms, bool link_usable);
  void onIssueAnswer(const SubjectRoute& account, const ShardCallResult& result, uint64_t now_ms);
  void onReportAnswer(const std::string& shard_id, const ShardCallResult& result, uint64_t now_ms);
  void onStatusAnswer(const ShardCallResult& result, uint64_t now_ms);

  ShardKeepingEffects takeEffects() { return std::exchange(effects_, {}); }

  ShardGauges gauges(uint64_t now_ms) const;
  const ShardBook& book() const { return book_; }
  bool storeFailing() const { return store_failing_; }

 private:
  struct AccountState {
    bool configured = false;
    uint64_t learned_at_ms = 0;
    bool issuing = false;
    uint64_t next_issue_ms = 0;
    // The issue request whose answer was lost (the ledger may have carved it): retried as is.
    std::optional<ShardIssueRequest> unanswered;
  };
  struct Pending {
    uint64_t token = 0;
    ReservationReply reply;
  };

  // Persists the book's changes (and any a failed commit left); false while the store fails.
  bool persist();
  void note(ShardNote note) { effects_.push_back(std::move(note)); }
  void noteClosed(const std::vector<std::string>& ids, const char* why);
  void markUnreconcilable(const std::string& shard_id, ShardUnreconcilable reason,
                          const std::string& answer, uint64_t now_ms);
  void closeForReconnect(uint64_t now_ms);
  void sendReports(uint64_t now_ms);
  void pollStatus(uint64_t now_ms);
  void keepOnHand(uint64_t now_ms);
  void issue(const SubjectRoute& account);

  ShardKeepingOptions options_;
  ShardBookStore* store_;
  ShardBook book_;
  uint64_t issue_seq_ = 0;
  ShardKeepingEffects effects_;
  std::vector<Pending> pending_;
  bool store_failing_ = false;
  ShardBookChanges unsaved_;  // changes a failed commit left, retried first
  std::map<SubjectRoute, AccountState> accounts_;
  std::set<std::string> reports_in_flight_;
  std::map<std::string, uint64_t> report_retry_at_ms_;  // after a failed or refused report
  bool status_in_flight_ = false;
  uint64_t next_status_poll_ms_ = 0;
};

}  // namespace tally
