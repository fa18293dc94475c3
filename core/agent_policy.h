#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/ledger_types.h"
#include "core/policy.h"

// The policy tally-agent routes by (rollout modes, emergency shards), kept fresh from the
// ledger, as a pure machine: when to ask (ShowPolicy), what an answer changes. Time is an
// argument; the shell sends the ShowPolicy and feeds the answer back.
//
//  * A fetch is due on connect (onConnected()) and after a publish or rollback through this
//    agent (refreshNow()), and policy_refresh_ms after the previous one began; one at a time,
//    and only while connected.
//  * A fetch asks for the document unless the generation held was answered on this connection
//    (unlessGeneration()): generations are immutable in one ledger's store, but a ledger reached
//    again may be another store, whose generation 3 is another policy.
//  * An OK answer with a policy replaces it (generation 0 in the document means the reply's
//    generation); an OK answer without one, naming the generation held, keeps it; NOT_FOUND
//    forgets it (every route enforces); anything else changes nothing.
//  * No policy known, or no budget matching: enforce (the ledger decides).

namespace tally {

struct AgentPolicyOptions {
  uint64_t refresh_ms = 5'000;
};

// What one ShowPolicy answer did.
struct PolicyFetchOutcome {
  bool applied = false;       // the answer was the ledger's word on the policy (OK or NOT_FOUND)
  bool changed = false;       // the generation differs from the one before (log policy_loaded)
  Generation generation = 0;  // now (0: none)
  uint64_t budgets = 0;       // now
};

class AgentPolicy {
 public:
  AgentPolicy(AgentPolicyOptions options, uint64_t now_ms);

  // The next fetch is due at once (after a publish or rollback).
  void refreshNow() { next_fetch_ms_ = 0; }
  // A new connection: the next fetch is due at once and asks for the document.
  void onConnected() {
    refreshNow();
    answered_on_connection_ = false;
  }
  // The ShowPolicy's unless_generation: the generation held once this connection answered it.
  Generation unlessGeneration() const {
    return answered_on_connection_ && policy_.has_value() ? policy_->generation : 0;
  }
  // True: send one ShowPolicy now (connected, none in flight, due); it is then in flight.
  bool beginFetch(bool connected, uint64_t now_ms);
  bool fetching() const { return in_flight_; }
  // The fetch failed in transport, or its answer was no PolicyAnswer: nothing changes.
  void onFetchFailed();
  // The ledger's ShowPolicy answer.
  PolicyFetchOutcome onFetchAnswer(const PolicyReply& reply, std::optional<Policy> policy);

  RolloutMode mode(const std::string& subject, const std::string& route) const;
  // The matched budget has emergency mode on with a non-zero shard size: an admission on it
  // teaches the shard keeper the account (ShardKeeping::learnAccount).
  bool wantsShards(const std::string& subject, const std::string& route) const;
  const std::optional<Policy>& policy() const { return policy_; }

 private:
  AgentPolicyOptions options_;
  std::optional<Policy> policy_;
  bool in_flight_ = false;
  bool answered_on_connection_ = false;
  uint64_t next_fetch_ms_;
};

}  // namespace tally
