#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "agent/gateway_server.h"
#include "agent/metrics.h"
#include "central-client/ledger_link.h"
#include "common/log.h"
#include "core/shard_book.h"
#include "shard/store.h"
#include "wire/codec.h"

// The agent's emergency shards at run time (docs/SHARDS.md "Agent: when shards are used"): the
// shell around core's ShardBook. It
//
//  * answers every operation on a reservation the book owns (origin = a shard id), in any
//    health state, and admits reserves from usable shards when the agent asks it to (the
//    ledger is partitioned);
//  * persists what each call changed (ShardStore::commit, fsync'd) before it answers: a reply
//    never depends on state a crash could lose. Group commit: the answers of one loop iteration
//    wait for one transaction (a uv_check handle). If the store fails, they get kUnavailable and
//    the changes are retried with the next commit;
//  * every maintain_interval_ms: ticks the book (local expiry, shard expiry, forgetting after
//    retention) and, while the link is usable, closes what a reconnected agent closes, sends
//    signed reports for closed shards and records the answers, polls shardStatus for open ones
//    (revoked → close, higher fence → close) and keeps `shards_on_hand` usable shards for each
//    configured or recently reserved account (signed issue requests, one in flight per account,
//    request ids unique per process start).
//
// Owns its timer and the ShardBook; borrows loop, link, store, crypto, metrics and logger,
// which must outlive it. Single-threaded (the loop thread).

namespace tally::agent {

struct EmergencyOptions {
  std::vector<SubjectRoute> accounts;          // [emergency] accounts = ["subject route", …]
  uint64_t shards_on_hand = 1;                 // usable shards kept per account while healthy
  uint64_t refresh_before_expiry_ms = 30'000;  // close (and replace) a shard this close to expiry
  uint64_t hold_ttl_ms = 30'000;               // local RESERVED expiry
  uint64_t accounts_max = 1'000;               // auto-learned accounts kept (oldest dropped)
  uint64_t account_idle_ms = 600'000;  // a learned account not reserved this long is dropped
  uint64_t maintain_interval_ms = 250;
  uint64_t status_poll_ms = 2'000;
  uint64_t issue_retry_ms = 5'000;           // after a refused or failed issue, or report
  uint64_t emergency_off_retry_ms = 60'000;  // after "emergency mode is off"
  uint64_t retention_ms = 24ull * 3600 * 1000;
};

// Our gateway identity and the two signing operations (shard/crypto.h, libsodium).
struct GatewaySigner {
  std::string gateway_name;
  PublicKey public_key{};
  std::function<void(ShardIssueRequest*)> sign_issue;
  std::function<void(ShardReport*)> sign_report;
};

struct ShardGauges {
  uint64_t usable = 0;
  uint64_t closed = 0;
  uint64_t quarantined = 0;
  uint64_t available_units = 0;  // localAvailable of usable shards
  uint64_t oldest_unreconciled_age_ms = 0;
};

class ShardKeeper {
 public:
  ShardKeeper(uv_loop_t* loop, central::LedgerLink* link, ShardStore* store,
              const ShardCrypto* crypto, GatewaySigner signer, AgentMetrics* metrics,
              Logger* logger, EmergencyOptions options, uint64_t boot_epoch, uint64_t seed);
  ~ShardKeeper();
  ShardKeeper(const ShardKeeper&) = delete;
  ShardKeeper& operator=(const ShardKeeper&) = delete;

  // Restores the book from the store (closing shards of earlier boot epochs, quarantining bad
  // grants, durably) and starts the timer.
  [[nodiscard]] Status start(uint64_t now_ms);
  void stop();

  bool owns(const std::string& reservation_id) const {
    return book_.ownsReservation(reservation_id);
  }
  // Partition admission (enforce mode). False when no usable shard can admit it (nothing
  // changed; `respond` is not called: the caller rejects as before). Otherwise `respond` gets the
  // answer (admitted, duplicate, conflict) once it is durable.
  bool admit(const ReserveRequest& request, uint64_t now_ms, Respond respond);
  // Any operation on a reservation the book owns (owns() is true); `respond` gets the answer
  // once what it changed is durable.
  void apply(const wire::RequestBody& body, uint64_t now_ms, Respond respond);
  // A central reservation succeeded on a route with emergency mode on: keep shards for it.
  void learnAccount(const SubjectRoute& account, uint64_t now_ms);

  ShardGauges gauges(uint64_t now_ms) const;
  const ShardBook& book() const { return book_; }

 private:
  struct PendingReply {
    wire::ResponseBody body;
    Respond respond;
  };
  struct AccountState {
    bool configured = false;
    uint64_t learned_at_ms = 0;
    bool issuing = false;
    uint64_t next_issue_ms = 0;
    // The issue request whose answer was lost (the ledger may have carved it): retried as is,
    // so the ledger answers that shard again instead of carving another.
    std::optional<ShardIssueRequest> unanswered;
  };

  bool linkUsable() const;
  // Persists the book's changes (and any a failed commit left); false while the store fails.
  bool persist();
  void answerWhenDurable(wire::ResponseBody body, Respond respond);
  void commitPending();
  static void onCheck(uv_check_t* check);
  void maintain();
  void closeForReconnect(uint64_t now_ms);
  void sendReports(uint64_t now_ms);
  void onReportAnswer(const std::string& shard_id, central::LinkResult result);
  void pollStatus(uint64_t now_ms);
  void keepOnHand(uint64_t now_ms);
  void issue(const SubjectRoute& account);
  void onIssueAnswer(const SubjectRoute& account, central::LinkResult result);
  void logClosed(const std::vector<std::string>& ids, const char* why);

  static void onTimer(uv_timer_t* timer);

  uv_loop_t* loop_;
  central::LedgerLink* link_;
  ShardStore* store_;
  GatewaySigner signer_;
  AgentMetrics* metrics_;
  Logger* logger_;
  EmergencyOptions options_;
  uint64_t boot_epoch_;
  ShardBook book_;
  std::mt19937_64 rng_;
  uint64_t request_nonce_ = 0;  // random per process start: issue request ids never repeat
  uint64_t issue_seq_ = 0;

  uv_timer_t timer_{};
  uv_check_t check_{};
  int open_handles_ = 0;  // initialized, not yet closed
  std::vector<PendingReply> pending_;
  bool store_failing_ = false;
  ShardBookChanges unsaved_;  // changes a failed commit left, retried first
  std::map<SubjectRoute, AccountState> accounts_;
  std::set<std::string> reports_in_flight_;
  std::map<std::string, uint64_t> report_retry_at_ms_;  // after a failed or refused report
  bool status_in_flight_ = false;
  uint64_t next_status_poll_ms_ = 0;
};

}  // namespace tally::agent
