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
#include "core/limits.h"
#include "core/shard_book.h"
#include "core/shard_keeping.h"
#include "shard/store.h"
#include "wire/codec.h"

// The agent's emergency shards at run time (docs/SHARDS.md "Agent: when shards are used"): the
// I/O shell around core's ShardKeeping (core/shard_keeping.h), which decides everything: which
// operations the book answers, partition admission, what to persist before a reply, when to
// issue, report, poll and retry. This class only carries its effects out: it signs and sends
// issue requests, reports and shardStatus polls over the LedgerLink and feeds the answers back,
// answers gateways (after the group commit of each loop iteration: a uv_check handle), commits
// the book's changes to the ShardStore (fsync'd) through the ShardBookStore seam, and turns the
// machine's notes into log lines and metrics. The wall clock is read once per event (a timer
// tick, a link answer) and passed down. Gateway requests reach the machine through AgentCore,
// which calls ShardKeeping directly; the AgentService then hands the requester to expect().
//
// Owns its timer and the ShardKeeping; borrows loop, link, store, crypto, metrics and logger,
// which must outlive it. Single-threaded (the loop thread).

namespace tally::agent {

// Writes a core machine's note as a log line (its counter, if any, is the caller's).
void logNote(Logger* logger, const ShardNote& note);

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
  uint64_t retention_ms = limits::kShardRetentionMsDefault;  // final shards kept this long
};

// Our gateway identity and the two signing operations (shard/crypto.h, libsodium).
struct GatewaySigner {
  std::string gateway_name;
  PublicKey public_key{};
  std::function<void(ShardIssueRequest*)> sign_issue;
  std::function<void(ShardReport*)> sign_report;
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

  bool owns(const std::string& reservation_id) const { return keeping_.owns(reservation_id); }
  // The machine AgentCore hands shard-owned reservations and partition admissions to.
  ShardKeeping& keeping() { return keeping_; }
  // The answer for requester `token` comes from the machine (a ShardGatewayAnswer once it is
  // durable): `respond` gets it. Tokens are the AgentCore's.
  void expect(uint64_t token, Respond respond);
  // Carries out what the machine decided since the last call (sends, answers, notes).
  void perform();

  ShardGauges gauges(uint64_t now_ms) const { return keeping_.gauges(now_ms); }
  const ShardBook& book() const { return keeping_.book(); }

 private:
  // The production ShardBookStore: agent.db through shard/store.
  class Store final : public ShardBookStore {
   public:
    explicit Store(ShardStore* store) : store_(store) {}
    Status commit(const ShardBook& book, const ShardBookChanges& changes) override {
      return store_->commit(book, changes);
    }

   private:
    ShardStore* store_;
  };

  bool linkUsable() const;
  void send(ShardSendIssue issue);
  void send(ShardSendReport report);
  void send(ShardSendStatus status);
  void answer(ShardGatewayAnswer answer);
  void note(const ShardNote& note);
  static ShardCallResult callResult(central::LinkResult result);
  static void onCheck(uv_check_t* check);
  static void onTimer(uv_timer_t* timer);

  uv_loop_t* loop_;
  central::LedgerLink* link_;
  ShardStore* shard_store_;
  Store store_;
  GatewaySigner signer_;
  AgentMetrics* metrics_;
  Logger* logger_;
  EmergencyOptions options_;
  ShardKeeping keeping_;

  uv_timer_t timer_{};
  uv_check_t check_{};
  int open_handles_ = 0;                    // initialized, not yet closed
  std::map<uint64_t, Respond> responders_;  // by token: gateways waiting for the commit
};

}  // namespace tally::agent
