// Emergency shards under SPEC §8's faults, end to end: one real tally-ledger (its signing key,
// a policy with emergency mode on), real tally-agents with enrolled gateway identities, the
// fault proxy between them where a test needs a partition the test itself is not subject to,
// lost answers, or a stable address across a ledger restart. Each test states the fault and what
// it proves, and ends with checkShardInvariants(): the audit conserves (central and every
// shard's equation), nothing is reminted beyond what a report proved unused (duplicate
// recovery = 0), USAGE_UNKNOWN/STARTED units stay retired, every account's retiredForEmergency is
// its shards' retired sum.

#include <signal.h>
#include <sqlite3.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "tests/integration/shard_fleet.h"

namespace tally::testing {
namespace {

bool isOk(const AgentAnswer& answer) {
  return !answer.is_error && answer.reply.code == ReplyCode::kOk;
}
// An operation the agent acknowledged: done (OK, possibly a duplicate) or durably QUEUED.
bool isAcknowledged(const AgentAnswer& answer) {
  return !answer.is_error &&
         (answer.reply.code == ReplyCode::kOk || answer.reply.code == ReplyCode::kQueued);
}

// Calls through the agent with the same request until it is acknowledged (a lost answer is a
// retryable error: the gateway retries with the same id), or the deadline; the last answer.
AgentAnswer callUntilAcknowledged(client::BlockingClient& gw, const wire::RequestBody& body) {
  const uint64_t deadline = wallNowMs() + kDeliveryTimeoutMs;
  AgentAnswer last;
  last.is_error = true;
  last.error.message = "no answer within the deadline";
  while (wallNowMs() < deadline) {
    Result<AgentAnswer> answer = callAgent(gw, body);
    if (answer.isOk()) {
      last = answer.value();
      if (isAcknowledged(last)) return last;
    }
    pauseMs(50);
  }
  return last;
}

const AccountView* accountOf(const AuditReport& report, Generation generation) {
  return findAccount(report, AccountKey{kShardSubject, kShardRoute, generation});
}

Units shardsAllocated(const std::vector<ShardLedgerView>& shards) {
  Units sum = 0;
  for (const ShardLedgerView& view : shards) sum += view.grant.allocated_units;
  return sum;
}

std::set<std::string> shardIds(const std::vector<ShardLedgerView>& shards) {
  std::set<std::string> ids;
  for (const ShardLedgerView& view : shards) ids.insert(view.grant.shard_id);
  return ids;
}

// Changes one byte of the signature inside a stored grant blob (packed Cap'n Proto: each word's
// non-zero bytes stay contiguous), keeping it non-zero so that the blob still decodes and only
// the signature check can reject it. False if no word of the signature is found.
bool flipSignatureByte(const Signature& signature, std::vector<uint8_t>* blob) {
  for (size_t word = 0; word + 8 <= signature.size(); word += 8) {
    const auto begin = signature.begin() + static_cast<std::ptrdiff_t>(word);
    if (std::find(begin, begin + 8, 0) != begin + 8) continue;  // zero bytes are packed away
    auto at = std::search(blob->begin(), blob->end(), begin, begin + 8);
    if (at == blob->end()) continue;
    at[3] ^= at[3] == 0x01 ? 0x02 : 0x01;
    return true;
  }
  return false;
}

class ShardFaultTest : public ShardFleetTest {
 protected:
  // Starts and settles (actual `actual`) every admitted reservation through agent `index`.
  void settleAll(size_t index, const std::vector<std::string>& ids, Units actual) {
    std::unique_ptr<client::BlockingClient> gw = gateway(index);
    ASSERT_NE(gw, nullptr);
    for (const std::string& id : ids) {
      TALLY_ASSIGN_OR_FAIL(AgentAnswer started, callAgent(*gw, StartRequest{id, "op-" + id}));
      ASSERT_TRUE(isOk(started)) << id << ": " << describe(started);
      TALLY_ASSIGN_OR_FAIL(AgentAnswer settled,
                           callAgent(*gw, SettleRequest{id, "op-" + id, actual}));
      ASSERT_TRUE(isOk(settled)) << id << ": " << describe(settled);
    }
  }

  // Cuts agent `index` (behind `proxy`) off the ledger and waits until it knows (PARTITIONED).
  void partition(FaultProxy& proxy, size_t index) {
    proxy.blackhole(true);
    ASSERT_TRUE(waitCutOff(index)) << agentHealth(index);
  }
  void reconnect(FaultProxy& proxy) {
    proxy.blackhole(false);
    proxy.severAll();  // drop the blackholed connections: the agent reconnects now
  }

  // Starts agent 0 behind `proxy` and waits until it holds a usable shard (in *shard).
  void startAgentHoldingAShard(FaultProxy& proxy, ShardLedgerView* shard) {
    ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
    std::optional<ShardLedgerView> usable = waitUsableShard(0);
    ASSERT_TRUE(usable.has_value());
    *shard = std::move(usable).value();
  }

  // Cuts agent 0 off (partition()), then admits `count` reservations of `units` each, all from
  // shard `shard_id`, and settles each at `actual`.
  void spendShardWhileCutOff(FaultProxy& proxy, const std::string& shard_id,
                             const std::string& prefix, size_t count, Units units, Units actual) {
    ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));
    const Admissions admitted = reserveMany(0, prefix, count, units);
    ASSERT_EQ(admitted.units_by_origin.at(shard_id), count * units);
    ASSERT_NO_FATAL_FAILURE(settleAll(0, admitted.admitted_ids, actual));
  }

  // The shard invariants hold, and generation `generation`'s account minted exactly what all
  // shards reminted.
  void expectMintedIsReminted(Generation generation) {
    AuditReport report;
    ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&report));
    Units reminted = 0;
    for (const ShardLedgerView& v : report.shards) reminted += v.reminted_units;
    const AccountView* account = accountOf(report, generation);
    ASSERT_NE(account, nullptr);
    EXPECT_EQ(account->balances.minted, reminted) << describe(report);
  }
};

// --- 1. Ledger partition ----------------------------------------------------------------------

// SIGSTOP freezes the ledger under two agents, each holding its own shard. Each admits from its
// shards only, never past their allocation (Σ units of admitted reserves ≤ Σ allocated of that
// gateway's shards), and rejects the rest; after SIGCONT both reconcile: spent = Σ actual,
// reminted = proven unused, the USAGE_UNKNOWN units still retired.
TEST_F(ShardFaultTest, FrozenLedgerAgentsAdmitWithinTheirShardsThenReconcile) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  std::vector<std::vector<ShardLedgerView>> held(2);
  for (size_t a = 0; a < 2; ++a) {
    ASSERT_NO_FATAL_FAILURE(startShardAgent(a, ledgerAddress()));
  }
  for (size_t a = 0; a < 2; ++a) {
    ASSERT_TRUE(waitUsableShard(a).has_value()) << "agent " << a << " obtained no shard";
    held[a] = ledgerShards(gatewayName(a));
  }

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  std::vector<Admissions> admitted(2);
  for (size_t a = 0; a < 2; ++a) {
    ASSERT_TRUE(waitCutOff(a)) << agentHealth(a);
    admitted[a] = reserveMany(a, "p" + std::to_string(a), 15, 10);
    const std::set<std::string> own = shardIds(held[a]);
    for (const auto& [origin, units] : admitted[a].units_by_origin) {
      EXPECT_TRUE(own.contains(origin)) << "agent " << a << " admitted from " << origin;
    }
    EXPECT_GT(admitted[a].shardUnits(), 0u);
    EXPECT_LE(admitted[a].shardUnits(), shardsAllocated(held[a])) << "agent " << a;
    EXPECT_EQ(admitted[a].admitted_ids.size() + admitted[a].rejected, 15u);
    EXPECT_GT(admitted[a].rejected, 0u) << "15 × 10 units cannot fit in one shard of 100";
  }
  // Agent 0 settles everything at 4; agent 1 settles all but one, which goes USAGE_UNKNOWN.
  ASSERT_NO_FATAL_FAILURE(settleAll(0, admitted[0].admitted_ids, 4));
  std::vector<std::string> settled1 = admitted[1].admitted_ids;
  const std::string unknown_id = settled1.back();
  settled1.pop_back();
  ASSERT_NO_FATAL_FAILURE(settleAll(1, settled1, 4));
  {
    std::unique_ptr<client::BlockingClient> gw = gateway(1);
    ASSERT_NE(gw, nullptr);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer s, callAgent(*gw, StartRequest{unknown_id, "op-x"}));
    ASSERT_TRUE(isOk(s)) << describe(s);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer u, callAgent(*gw, MarkUnknownRequest{unknown_id, "op-x"}));
    ASSERT_EQ(u.reply.receipt.state, ReservationState::kUsageUnknown) << describe(u);
  }

  ASSERT_TRUE(ledger_.signal(SIGCONT));
  for (size_t a = 0; a < 2; ++a) {
    for (const auto& [shard_id, units] : admitted[a].units_by_origin) {
      const Units count = units / 10;
      const Units holding = a == 1 ? 10 : 0;
      const Units spent = (count - (a == 1 ? 1 : 0)) * 4;
      std::optional<ShardLedgerView> view = waitShard(
          shard_id, [&](const ShardLedgerView& v) { return v.reported && v.spent_units == spent; });
      ASSERT_TRUE(view.has_value() && view->reported) << shard_id;
      EXPECT_EQ(view->state, a == 1 ? ShardState::kReconciling : ShardState::kReconciled)
          << describe(*view);
      EXPECT_EQ(view->reminted_units, view->grant.allocated_units - spent - holding)
          << describe(*view);
      EXPECT_EQ(view->retired_units, holding) << describe(*view);
    }
  }
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// The ledger is killed (-9) while agents admit from their shards and restarts on its data dir
// (behind the proxy's stable address): the shards it issued before the crash are still known,
// the reports are accepted, the equations hold.
TEST_F(ShardFaultTest, LedgerKilledAndRestartedReconcilesShardsIssuedBeforeTheCrash) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::vector<ShardLedgerView> held = ledgerShards(gatewayName(0));

  ledger_.kill9();
  proxy.severAll();
  ASSERT_TRUE(waitCutOff(0)) << agentHealth(0);
  const Admissions admitted = reserveMany(0, "k", 15, 10);
  EXPECT_LE(admitted.shardUnits(), shardsAllocated(held));
  EXPECT_EQ(admitted.shardUnits(), shard.grant.allocated_units);
  ASSERT_NO_FATAL_FAILURE(settleAll(0, admitted.admitted_ids, 7));

  ASSERT_NO_FATAL_FAILURE(startLedger());
  proxy.setUpstreamPort(ledger_.port());
  proxy.severAll();
  const Units spent = admitted.admitted_ids.size() * 7;
  std::optional<ShardLedgerView> view =
      waitShard(shard.grant.shard_id,
                [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  ASSERT_TRUE(view.has_value()) << "the restarted ledger forgot " << shard.grant.shard_id;
  EXPECT_EQ(view->state, ShardState::kReconciled) << describe(*view);
  EXPECT_EQ(view->spent_units, spent) << describe(*view);
  EXPECT_EQ(view->reminted_units, view->grant.allocated_units - spent) << describe(*view);
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// Many reserves at once through one agent during a partition: two gateway connections each
// pipeline 20 reserves of 10 (the agent answers a loop iteration's worth after one commit), and
// every id is sent twice. The shard admits exactly its allocation, each id at most once (the
// second copy is the same receipt), and the reconciled shard accounts for exactly those.
TEST_F(ShardFaultTest, PipelinedReservesDuringAPartitionNeverOverAdmit) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;
  ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));

  std::vector<std::vector<Result<AgentAnswer>>> answers(2);
  std::vector<std::vector<std::string>> ids(2);
  {
    std::vector<std::unique_ptr<client::BlockingClient>> gws;
    for (int c = 0; c < 2; ++c) {
      gws.push_back(gateway(0));
      ASSERT_NE(gws.back(), nullptr);
    }
    std::vector<std::thread> threads;
    for (size_t c = 0; c < 2; ++c) {
      std::vector<wire::RequestBody> bodies;
      for (int i = 0; i < 20; ++i) {
        const std::string id = "pl-" + std::to_string(c) + "-" + std::to_string(i);
        ids[c].push_back(id);
        bodies.push_back(makeReserve({.id = id, .units = 10}));
        bodies.push_back(makeReserve({.id = id, .units = 10}));
      }
      threads.emplace_back(
          [&, c, bodies = std::move(bodies)] { answers[c] = callAgentPipelined(*gws[c], bodies); });
    }
    for (std::thread& thread : threads) thread.join();
  }
  Units admitted_units = 0;
  std::vector<std::string> admitted_ids;
  for (size_t c = 0; c < 2; ++c) {
    ASSERT_EQ(answers[c].size(), 40u);
    for (size_t i = 0; i < 20; ++i) {
      const Result<AgentAnswer>& first = answers[c][2 * i];
      const Result<AgentAnswer>& second = answers[c][2 * i + 1];
      ASSERT_TRUE(first.isOk() && second.isOk()) << ids[c][i];
      const bool first_ok = isOk(first.value());
      const bool second_ok = isOk(second.value());
      if (first_ok) {
        EXPECT_EQ(first.value().reply.receipt.origin, shard_id) << describe(first.value());
        admitted_units += 10;
        admitted_ids.push_back(ids[c][i]);
      }
      if (second_ok) {
        EXPECT_TRUE(first_ok) << ids[c][i] << ": admitted only on its retry";
        EXPECT_TRUE(second.value().reply.duplicate) << describe(second.value());
      }
    }
  }
  EXPECT_EQ(admitted_units, shard.grant.allocated_units);
  EXPECT_EQ(metric(0, "tally_agent_shard_available_units"), 0.0);
  ASSERT_NO_FATAL_FAILURE(settleAll(0, admitted_ids, 1));

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spent_units, admitted_ids.size()) << describe(*view);
  EXPECT_EQ(view->reminted_units, view->grant.allocated_units - admitted_ids.size())
      << describe(*view);
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// --- 2. Two agents given copies of one shard ----------------------------------------------------

// Agent A's data dir (with its shard and gateway key) is copied to B while A holds the shard and
// the ledger is frozen. B boots with a newer boot epoch: it never admits from the copy. A does.
// When the ledger is back both report the shard: the ledger marks it CONFLICT, remints nothing
// beyond what A's report alone proved (and nothing at all later), and records A's usage as spent.
TEST_F(ShardFaultTest, CopiedDataDirNeverAdmitsAndTwoReportsMakeAConflict) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger({.shard_ttl_ms = 15'000}));
  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, ledgerAddress(), {.refresh_before_expiry_ms = 500}));
  std::optional<ShardLedgerView> shard = waitUsableShard(0);
  ASSERT_TRUE(shard.has_value());
  const std::string shard_id = shard->grant.shard_id;

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  ASSERT_TRUE(agents_[0]->signal(SIGSTOP));  // a crash-consistent copy of agent.db and its WAL
  std::filesystem::copy(dir_.file("agent0"), dir_.file("agent1"),
                        std::filesystem::copy_options::recursive);
  ASSERT_TRUE(agents_[0]->signal(SIGCONT));
  gateway_names_[1] = gatewayName(0);  // the same identity: no enrollment of its own
  ASSERT_NO_FATAL_FAILURE(startShardAgent(1, ledgerAddress(), {.refresh_before_expiry_ms = 500}));
  EXPECT_GT(metric(1, "tally_agent_boot_epoch"), metric(0, "tally_agent_boot_epoch"));
  EXPECT_EQ(metric(1, "tally_agent_shards", {{"condition", "usable"}}), 0.0);

  ASSERT_TRUE(waitCutOff(0)) << agentHealth(0);
  ASSERT_TRUE(waitCutOff(1)) << agentHealth(1);
  const Admissions copy = reserveMany(1, "b", 5, 10);
  EXPECT_TRUE(copy.admitted_ids.empty()) << "the copy admitted " << copy.admitted_ids.size();
  EXPECT_EQ(copy.units_by_origin.count(shard_id), 0u);
  const Admissions original = reserveMany(0, "a", 3, 10);
  ASSERT_EQ(original.units_by_origin.at(shard_id), 30u);
  ASSERT_NO_FATAL_FAILURE(settleAll(0, original.admitted_ids, 10));

  ASSERT_TRUE(ledger_.signal(SIGCONT));
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kConflict; });
  ASSERT_TRUE(view.has_value() && view->state == ShardState::kConflict)
      << (view ? describe(*view) : "no view");
  EXPECT_EQ(view->spent_units, 30u) << describe(*view);
  EXPECT_EQ(view->debt_units, 0u) << describe(*view);
  // At most A's proven unused (if A's report came first); nothing more, even after expiry when
  // a deferred remint would otherwise happen.
  EXPECT_LE(view->reminted_units, view->grant.allocated_units - 30) << describe(*view);
  const Units reminted_at_conflict = view->reminted_units;
  EXPECT_NE(ledger_.log().find("shard_conflict"), std::string::npos) << "no conflict alert";
  EXPECT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shard_events_total", {{"event", "conflict"}}) +
               metric(1, "tally_agent_shard_events_total", {{"event", "conflict"}}) >=
           1;
  })) << "no agent was told of the conflict";
  waitUntilWallMs(view->grant.expires_at_ms + 600);
  view = ledgerShard(shard_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, ShardState::kConflict) << describe(*view);
  EXPECT_EQ(view->reminted_units, reminted_at_conflict) << describe(*view);
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&report));
  const AccountView* account = accountOf(report, view->grant.policy_generation);
  ASSERT_NE(account, nullptr);
  EXPECT_EQ(account->debt, 0u);
}

// A shard reservation settles above what the shard can cover (actual 180 on a shard of 100)
// while the ledger is unreachable. On reconcile the overspend is recorded as debt on the source
// account (the shard is a CONFLICT, nothing reminted), and the subject/route admits nothing more
// centrally while the debt is outstanding (SPEC §8: admission = 0 while debt is outstanding).
TEST_F(ShardFaultTest, OverspentShardBecomesDebtAndStopsAdmission) {
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(startShardLedger({}, &generation));
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;

  ASSERT_NO_FATAL_FAILURE(spendShardWhileCutOff(proxy, shard_id, "o", 1, 50, 180));

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kConflict; });
  ASSERT_TRUE(view.has_value() && view->state == ShardState::kConflict)
      << (view ? describe(*view) : "no view");
  EXPECT_EQ(view->last_reported.overspent, 80u) << describe(*view);
  EXPECT_EQ(view->spent_units, 100u) << describe(*view);
  EXPECT_EQ(view->debt_units, 80u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 0u) << describe(*view);
  EXPECT_NE(ledger_.log().find("shard_conflict"), std::string::npos) << "no conflict alert";
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&report));
  const AccountView* account = accountOf(report, generation);
  ASSERT_NE(account, nullptr);
  EXPECT_EQ(account->debt, 80u) << describe(report);
  EXPECT_EQ(account->balances.spent, 180u) << describe(report);

  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer after,
                       callAgent(*gw, makeReserve({.id = "o-after", .units = 1})));
  ASSERT_FALSE(after.is_error) << describe(after);
  EXPECT_EQ(after.reply.code, ReplyCode::kRejected) << describe(after);
  EXPECT_TRUE(after.reply.receipt.limiting_dimension == LimitingDimension::kDebt ||
              after.reply.receipt.limiting_dimension == LimitingDimension::kFrozenRoute)
      << describe(after);
}

// --- 3. Replay of an old shard after kill -9 and restart ---------------------------------------

// The agent admits from its shard while the ledger is frozen, is killed (-9) and restarted while
// still cut off: it does not admit from the earlier boot's shard (its remainder is retired), but
// still answers the reservations it made from it. When the ledger thaws, the reports (from
// another boot epoch: first the one queued at restart, STARTED receipts holding, then the settled
// one) record spent at once, keep the STARTED units retired, and defer the remint to the shard's
// expiry.
TEST_F(ShardFaultTest, RestartedAgentNeverReusesItsOldShardAndRemintWaitsForExpiry) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger({.shard_ttl_ms = 10'000}));
  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, ledgerAddress(), {.refresh_before_expiry_ms = 500}));
  std::optional<ShardLedgerView> shard = waitUsableShard(0);
  ASSERT_TRUE(shard.has_value());
  const std::string shard_id = shard->grant.shard_id;

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  ASSERT_TRUE(waitCutOff(0)) << agentHealth(0);
  const Admissions before = reserveMany(0, "r", 2, 10);
  ASSERT_EQ(before.units_by_origin.at(shard_id), 20u);
  {
    std::unique_ptr<client::BlockingClient> gw = gateway(0);
    ASSERT_NE(gw, nullptr);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer s, callAgent(*gw, StartRequest{"r-0", "op-r-0"}));
    ASSERT_TRUE(isOk(s)) << describe(s);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer t, callAgent(*gw, StartRequest{"r-1", "op-r-1"}));
    ASSERT_TRUE(isOk(t)) << describe(t);
  }

  agents_[0]->kill9();
  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, ledgerAddress(), {.refresh_before_expiry_ms = 500}));
  ASSERT_TRUE(waitCutOff(0)) << agentHealth(0);
  EXPECT_EQ(metric(0, "tally_agent_shards", {{"condition", "usable"}}), 0.0);
  EXPECT_GE(metric(0, "tally_agent_shards", {{"condition", "closed"}}), 1.0);
  const Admissions after = reserveMany(0, "late", 3, 10);
  EXPECT_TRUE(after.admitted_ids.empty())
      << "admitted from " << after.units_by_origin.begin()->first;
  {
    // The earlier boot's reservations are still answered: settle them.
    std::unique_ptr<client::BlockingClient> gw = gateway(0);
    ASSERT_NE(gw, nullptr);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer s0, callAgent(*gw, SettleRequest{"r-0", "op-r-0", 6}));
    EXPECT_TRUE(isOk(s0)) << describe(s0);
    EXPECT_EQ(s0.reply.receipt.origin, shard_id);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer s1, callAgent(*gw, SettleRequest{"r-1", "op-r-1", 9}));
    EXPECT_TRUE(isOk(s1)) << describe(s1);
  }

  ASSERT_TRUE(ledger_.signal(SIGCONT));
  std::optional<ShardLedgerView> view =
      waitShard(shard_id, [](const ShardLedgerView& v) { return v.reported; });
  ASSERT_TRUE(view.has_value() && view->reported) << "never reported";
  const uint64_t seen_at_ms = wallNowMs();
  EXPECT_TRUE(view->spent_units == 0 || view->spent_units == 15) << describe(*view);
  if (seen_at_ms + 200 < view->grant.expires_at_ms) {
    EXPECT_EQ(view->reminted_units, 0u) << "reminted before expiry: " << describe(*view);
  } else {
    std::cout << "note: the report landed after the shard's expiry (a slow run); the deferred "
                 "remint was not observable this time"
              << std::endl;
  }
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
  view = waitShard(shard_id, [](const ShardLedgerView& v) { return v.reminted_units == 85; });
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spent_units, 15u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 85u) << describe(*view);
  EXPECT_EQ(view->state, ShardState::kReconciled) << describe(*view);
  EXPECT_GE(wallNowMs() + 250, view->grant.expires_at_ms) << "reminted before expiry";
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// --- 4. Duplicate recovery ----------------------------------------------------------------------

// The ledger's answer to a shard report is lost (the proxy drops that reply): the agent sends
// the report again, the ledger answers it as a duplicate, and the unused units are reminted
// exactly once (the account's minted is exactly Σ reminted).
TEST_F(ShardFaultTest, LostReportAnswerIsRetriedAndRemintsExactlyOnce) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;

  ASSERT_NO_FATAL_FAILURE(spendShardWhileCutOff(proxy, shard_id, "d", 3, 10, 5));

  proxy.dropNextReplies(1, [shard_id](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    if (!response.isOk()) return false;
    const auto* reply = std::get_if<ShardReply>(&response.value().body);
    if (reply == nullptr || reply->duplicate || reply->reminted_units == 0) return false;
    return std::any_of(reply->shards.begin(), reply->shards.end(),
                       [&](const ShardLedgerView& v) { return v.grant.shard_id == shard_id; });
  });
  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  ASSERT_TRUE(waitFor([&] { return proxy.dropsPending() == 0; })) << "no report answer dropped";
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shard_reports_total", {{"result", "duplicate"}}) >= 1;
  })) << "the agent did not retry its report\n"
      << metricsText(0);
  std::optional<ShardLedgerView> view = ledgerShard(shard_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, ShardState::kReconciled) << describe(*view);
  EXPECT_EQ(view->spent_units, 15u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 85u) << describe(*view);
  ASSERT_NO_FATAL_FAILURE(expectMintedIsReminted(shard.grant.policy_generation));
}

// The agent is killed (-9) after its report reached the ledger but before the answer reached
// the agent (the proxy drops it). The restarted agent (a new boot epoch) reports the same shard
// again: same receipts, so no conflict (an honest restart), and nothing is reminted twice.
TEST_F(ShardFaultTest, AgentKilledBetweenReportAndAnswerReportsAgainWithoutConflict) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;

  ASSERT_NO_FATAL_FAILURE(spendShardWhileCutOff(proxy, shard_id, "x", 4, 10, 3));

  proxy.dropRepliesAfter(0, UINT64_MAX, [](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    return response.isOk() && std::holds_alternative<ShardReply>(response.value().body);
  });
  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> view =
      waitShard(shard_id, [](const ShardLedgerView& v) { return v.reported; });
  ASSERT_TRUE(view.has_value() && view->reported) << "never reported";
  EXPECT_EQ(view->state, ShardState::kReconciled) << describe(*view);
  EXPECT_EQ(view->reminted_units, 88u) << describe(*view);
  EXPECT_EQ(metric(0, "tally_agent_shard_reports_total", {{"result", "RECONCILED"}}), 0.0)
      << "the answer reached the agent";
  agents_[0]->kill9();
  proxy.clearFaults();

  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shard_reports_total", {{"result", "RECONCILED"}}) +
               metric(0, "tally_agent_shard_reports_total", {{"result", "duplicate"}}) >=
           1;
  })) << "the restarted agent did not report again\n"
      << metricsText(0);
  view = ledgerShard(shard_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, ShardState::kReconciled) << describe(*view);
  EXPECT_EQ(view->spent_units, 12u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 88u) << describe(*view);
  EXPECT_EQ(metric(0, "tally_agent_shard_events_total", {{"event", "conflict"}}), 0.0);
  ASSERT_NO_FATAL_FAILURE(expectMintedIsReminted(shard.grant.policy_generation));
}

// The ledger reconciles a shard, the agent never hears it (the proxy drops every report
// answer) and is killed; the ledger compacts the shard after its shard_retention_ms (1 s here,
// the receipts' window left alone). The restarted agent's report of it gets the typed
// "no record" answer (notFound): the agent stops retrying and keeps the shard as
// unreconcilable, visible in its metrics and its log, not pending any more.
TEST_F(ShardFaultTest, ReportOfAShardTheLedgerCompactedMakesItUnreconcilable) {
  std::ofstream(ledger_.dataDir() + ".toml") << "shard_retention_ms = 1000\n";
  ASSERT_NO_FATAL_FAILURE(startShardLedger({.shard_ttl_ms = 2'000}));
  FaultProxy& proxy = addProxy();
  proxy.dropRepliesAfter(0, UINT64_MAX, [](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    if (!response.isOk()) return false;
    const auto* reply = std::get_if<ShardReply>(&response.value().body);
    return reply != nullptr &&
           std::any_of(reply->shards.begin(), reply->shards.end(),
                       [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  });
  // The first shard is closed 1 s before its expiry (refresh_before_expiry_ms) and reported.
  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
  std::string shard_id;
  ASSERT_TRUE(waitFor([&] {
    for (const ShardLedgerView& v : ledgerShards(gatewayName(0))) {
      if (v.state == ShardState::kReconciled && v.reported) shard_id = v.grant.shard_id;
    }
    return !shard_id.empty();
  })) << "no shard reconciled";
  EXPECT_EQ(metric(0, "tally_agent_shard_reports_total", {{"result", "RECONCILED"}}), 0.0)
      << "the answer reached the agent";
  agents_[0]->kill9();
  // Every shard reconciled unheard by now (usually just the first) is compacted.
  std::set<std::string> unheard;
  for (const ShardLedgerView& v : ledgerShards(gatewayName(0))) {
    if (v.state == ShardState::kReconciled) unheard.insert(v.grant.shard_id);
  }
  ASSERT_TRUE(unheard.contains(shard_id));
  ASSERT_TRUE(waitFor([&] {
    return std::none_of(unheard.begin(), unheard.end(),
                        [&](const std::string& id) { return ledgerShard(id).has_value(); });
  })) << "not compacted after shard_retention_ms";
  proxy.clearFaults();

  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
  // (A report still in flight at the kill may have reconciled one more shard since.)
  const double expected = static_cast<double>(unheard.size());
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "unreconcilable"}}) >= expected;
  })) << metricsText(0);
  EXPECT_EQ(metric(0, "tally_agent_shard_events_total", {{"event", "unreconcilable"}}),
            metric(0, "tally_agent_shards", {{"condition", "unreconcilable"}}));
  EXPECT_EQ(metric(0, "tally_agent_shard_reports_total", {{"result", "refused"}}), 0.0);
  const std::string log = agents_[0]->log();
  for (const std::string& id : unheard) {
    EXPECT_NE(log.find("event=shard_unreconcilable shard_id=" + id), std::string::npos) << log;
    EXPECT_NE(ledger_.log().find("event=shard_report_refused shard=" + id), std::string::npos);
  }
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// The ledger's answer to the agent's first shard issue request is lost: the shard was carved, the
// agent never saw it; then the ledger is killed (-9) and restarted on its data dir before the
// agent retries. The agent must retry with the same request id, and the ledger (the id is durable
// with the carve) answers the same shard as a duplicate. Asking anew would carve a second shard
// and leave the first retired until an operator writes it off: the tenant's bucket would never
// get those units back.
TEST_F(ShardFaultTest, LostIssueAnswerIsRetriedWithTheSameRequestAndCarvesOnce) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  proxy.dropNextReplies(1, [](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    return response.isOk() && std::holds_alternative<ShardReply>(response.value().body);
  });
  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
  ASSERT_TRUE(waitFor([&] { return proxy.dropsPending() == 0; })) << "no issue answer dropped";
  ledger_.kill9();
  proxy.severAll();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  proxy.setUpstreamPort(ledger_.port());
  proxy.severAll();
  std::optional<ShardLedgerView> shard = waitUsableShard(0);
  ASSERT_TRUE(shard.has_value());
  const std::vector<ShardLedgerView> carved = ledgerShards(gatewayName(0));
  EXPECT_EQ(carved.size(), 1u) << "carved twice for one need:\n"
                               << (carved.empty() ? "" : describe(carved.front())) << "\n"
                               << (carved.size() < 2 ? "" : describe(carved.back()));
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&report));
  const AccountView* account = accountOf(report, shard->grant.policy_generation);
  ASSERT_NE(account, nullptr);
  EXPECT_EQ(account->balances.retired_for_emergency, shard->grant.allocated_units)
      << describe(report);
}

// --- 5. Lost refund ACKs ------------------------------------------------------------------------

// Settles of central reservations whose answers are lost (one dropped by the proxy, two queued
// while the agent is cut off), and settles of shard reservations during the partition (one sent
// twice): every acknowledged settle lands exactly once, centrally and in the shard.
TEST_F(ShardFaultTest, LostSettleAnswersAndLocalSettlesLandExactlyOnce) {
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(startShardLedger({}, &generation));
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);

  const std::vector<std::pair<std::string, Units>> central = {{"c-0", 8}, {"c-1", 9}, {"c-2", 11}};
  for (const auto& [id, actual] : central) {
    TALLY_ASSIGN_OR_FAIL(AgentAnswer r, callAgent(*gw, makeReserve({.id = id, .units = 20})));
    ASSERT_TRUE(isOk(r)) << describe(r);
    EXPECT_FALSE(isShardOrigin(r.reply.receipt.origin)) << describe(r);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer s, callAgent(*gw, StartRequest{id, "op-" + id}));
    ASSERT_TRUE(isOk(s)) << describe(s);
  }
  proxy.dropNextReplies(1, [](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    if (!response.isOk()) return false;
    const auto* reply = std::get_if<ReservationReply>(&response.value().body);
    return reply != nullptr && reply->receipt.reservation_id == "c-0";
  });
  const AgentAnswer first = callUntilAcknowledged(*gw, SettleRequest{"c-0", "op-c-0", 8});
  EXPECT_TRUE(isAcknowledged(first)) << describe(first);
  EXPECT_EQ(proxy.dropsPending(), 0u) << "the settle's answer was not dropped";

  ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));
  for (size_t i = 1; i < central.size(); ++i) {
    const auto& [id, actual] = central[i];
    const AgentAnswer a = callUntilAcknowledged(*gw, SettleRequest{id, "op-" + id, actual});
    EXPECT_TRUE(isAcknowledged(a)) << id << ": " << describe(a);
  }
  const Admissions local = reserveMany(0, "s", 3, 10);
  ASSERT_EQ(local.units_by_origin.at(shard_id), 30u);
  ASSERT_NO_FATAL_FAILURE(settleAll(0, local.admitted_ids, 6));
  TALLY_ASSIGN_OR_FAIL(AgentAnswer again, callAgent(*gw, SettleRequest{"s-0", "op-s-0", 6}));
  EXPECT_TRUE(again.reply.duplicate) << describe(again);
  EXPECT_EQ(again.reply.refunded_units, 0u) << describe(again);

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  for (const auto& [id, actual] : central) {
    const ReservationReply landed = waitForLedger(id, [](const ReservationReply& r) {
      return r.receipt.state == ReservationState::kSettled;
    });
    EXPECT_EQ(landed.receipt.state, ReservationState::kSettled) << describe(landed);
    EXPECT_EQ(landed.receipt.actual_units, actual) << describe(landed);
  }
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spent_units, 18u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 82u) << describe(*view);
  EXPECT_TRUE(waitFor([&] { return metric(0, "tally_agent_outbox_depth") == 0; }));
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&report));
  const AccountView* account = accountOf(report, generation);
  ASSERT_NE(account, nullptr);
  EXPECT_EQ(account->balances.spent, 8u + 9u + 11u + 18u) << describe(report);
  EXPECT_EQ(account->balances.reserved, 0u) << describe(report);
}

// --- 6. Generation switch while shards are out ---------------------------------------------------

// A new policy generation is published while the agent is cut off holding a shard of the old
// one. On reconcile the shard's unused units are reminted into the new generation's account (a
// paired transfer out of the old one), never into the draining one.
TEST_F(ShardFaultTest, GenerationSwitchDuringAPartitionRemintsIntoTheNewGeneration) {
  Generation old_generation = 0;
  ASSERT_NO_FATAL_FAILURE(startShardLedger({}, &old_generation));
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;
  ASSERT_EQ(shard.grant.policy_generation, old_generation);

  ASSERT_NO_FATAL_FAILURE(spendShardWhileCutOff(proxy, shard_id, "g", 4, 10, 10));
  Generation new_generation = 0;
  ASSERT_NO_FATAL_FAILURE(publish({shardBudget({})}, &new_generation));
  ASSERT_GT(new_generation, old_generation);
  AuditReport before;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&before));
  const AccountView* old_before = accountOf(before, old_generation);
  const AccountView* new_before = accountOf(before, new_generation);
  ASSERT_NE(old_before, nullptr);
  const Units new_minted_before = new_before == nullptr ? 0 : new_before->balances.minted;

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spent_units, 40u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 60u) << describe(*view);
  AuditReport after;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&after));
  const AccountView* old_after = accountOf(after, old_generation);
  const AccountView* new_after = accountOf(after, new_generation);
  ASSERT_NE(old_after, nullptr);
  ASSERT_NE(new_after, nullptr);
  EXPECT_NE(old_after->generation_state, GenerationState::kActive) << describe(after);
  // Nothing was reminted into the old generation; whatever it handed over (its available, at the
  // switch or lazily when the new account opened, plus the remint) is one paired transfer.
  EXPECT_EQ(old_after->balances.minted, old_before->balances.minted) << describe(after);
  EXPECT_EQ(old_after->balances.retired_for_emergency, 0u) << describe(after);
  const Units handed_over =
      old_after->balances.transferred_out - old_before->balances.transferred_out;
  EXPECT_EQ(handed_over, old_before->balances.available + 60) << describe(after);
  EXPECT_EQ(new_after->balances.minted + new_after->balances.opening -
                (new_before == nullptr ? 0 : new_before->balances.opening) - new_minted_before,
            handed_over)
      << describe(after);
  EXPECT_EQ(old_after->balances.spent, 40u) << describe(after);
}

// Rollback while the agent is cut off holding a shard of generation 1: generation 2 is
// published, then rolled back (generation 3 republishes generation 1's policy). The shard's
// unused units go to generation 3, the active one; every cross-generation move is paired, so the
// subject/route as a whole still holds exactly its one opening.
TEST_F(ShardFaultTest, RollbackDuringAPartitionRemintsIntoTheActiveGeneration) {
  Generation first = 0;
  ASSERT_NO_FATAL_FAILURE(startShardLedger({}, &first));
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;

  ASSERT_NO_FATAL_FAILURE(spendShardWhileCutOff(proxy, shard_id, "rb", 2, 10, 10));
  Generation second = 0;
  ASSERT_NO_FATAL_FAILURE(publish({shardBudget({.burst = 800})}, &second));
  TALLY_ASSIGN_OR_FAIL(PolicyReply rolled_back, rollbackPolicy(*client_));
  ASSERT_EQ(rolled_back.code, ReplyCode::kOk) << rolled_back.message;
  const Generation third = rolled_back.generation;
  ASSERT_GT(third, second);
  AuditReport before;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&before));
  const AccountView* first_before = accountOf(before, first);
  ASSERT_NE(first_before, nullptr);

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> view = waitShard(
      shard_id, [](const ShardLedgerView& v) { return v.state == ShardState::kReconciled; });
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->spent_units, 20u) << describe(*view);
  EXPECT_EQ(view->reminted_units, 80u) << describe(*view);
  AuditReport after;
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants(&after));
  const AccountView* first_after = accountOf(after, first);
  const AccountView* third_after = accountOf(after, third);
  ASSERT_NE(first_after, nullptr);
  ASSERT_NE(third_after, nullptr) << describe(after);
  EXPECT_EQ(third_after->generation_state, GenerationState::kActive) << describe(after);
  EXPECT_NE(first_after->generation_state, GenerationState::kActive) << describe(after);
  EXPECT_EQ(first_after->balances.minted, first_before->balances.minted) << describe(after);
  EXPECT_EQ(first_after->balances.transferred_out - first_before->balances.transferred_out,
            first_before->balances.available + 80)
      << describe(after);
  EXPECT_GE(third_after->balances.minted, 80u) << describe(after);
  Units inflow = 0;
  Units outflow = 0;
  for (const AccountView& account : after.accounts) {
    if (account.key.subject != kShardSubject || account.key.route != kShardRoute) continue;
    inflow += account.balances.opening + account.balances.minted;
    outflow += account.balances.transferred_out;
  }
  EXPECT_EQ(inflow - outflow, 1'000u) << "a generation switch minted or lost capacity\n"
                                      << describe(after);
}

// --- 7. Revoke during a partition -------------------------------------------------------------

// `tallyctl shard revoke` while the agent is cut off: the fence is bumped. After reconnect the
// agent closes the shard (its fence is below the current one), reports it, and never admits from
// it again: in the next partition it admits only from a newer shard.
TEST_F(ShardFaultTest, RevokeDuringAPartitionClosesTheShardAtReconnect) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;

  ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));
  TALLY_ASSIGN_OR_FAIL(const std::string revoked, tallyctl({"shard", "revoke", "--id", shard_id}));
  EXPECT_NE(revoked.find("\"code\":\"OK\""), std::string::npos) << revoked;
  EXPECT_NE(revoked.find("\"state\":\"REVOKED\""), std::string::npos) << revoked;
  std::optional<ShardLedgerView> view = ledgerShard(shard_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, ShardState::kRevoked) << describe(*view);
  EXPECT_GT(view->current_fence, view->grant.fence) << describe(*view);

  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  view = waitShard(shard_id, [](const ShardLedgerView& v) { return v.reported; });
  ASSERT_TRUE(view.has_value() && view->reported) << "the revoked shard was never reported";
  EXPECT_EQ(view->spent_units, 0u) << describe(*view);
  EXPECT_EQ(view->reminted_units, view->grant.allocated_units) << describe(*view);
  std::optional<ShardLedgerView> fresh = waitUsableShard(0);
  ASSERT_TRUE(fresh.has_value());
  ASSERT_NE(fresh->grant.shard_id, shard_id);
  EXPECT_GE(fresh->grant.fence, view->current_fence) << describe(*fresh);

  ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));
  const Admissions admitted = reserveMany(0, "v", 12, 10);
  EXPECT_EQ(admitted.units_by_origin.count(shard_id), 0u) << "admitted from the revoked shard";
  EXPECT_LE(admitted.shardUnits(),
            shardsAllocated(ledgerShards(gatewayName(0))) - view->grant.allocated_units);
  EXPECT_GT(admitted.units_by_origin.count(fresh->grant.shard_id), 0u);
  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

// --- 8. A tampered shard ----------------------------------------------------------------------

// One byte of the stored grant's signature is changed in agent.db while the agent is stopped:
// on restart the shard is quarantined (metric and log), never used during a partition (only the
// fresh shard is) and never reported; it stays retired at the ledger.
TEST_F(ShardFaultTest, TamperedGrantIsQuarantinedNeverUsedNeverReported) {
  ASSERT_NO_FATAL_FAILURE(startShardLedger());
  FaultProxy& proxy = addProxy();
  ShardLedgerView shard;
  ASSERT_NO_FATAL_FAILURE(startAgentHoldingAShard(proxy, &shard));
  const std::string shard_id = shard.grant.shard_id;
  ASSERT_EQ(agents_[0]->terminate(), 0);

  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(dir_.file("agent0/agent.db").c_str(), &db), SQLITE_OK);
    sqlite3_stmt* select = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT grant_blob FROM shards WHERE shard_id = ?1", -1,
                                 &select, nullptr),
              SQLITE_OK);
    sqlite3_bind_text(select, 1, shard_id.c_str(), -1, SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(select), SQLITE_ROW);
    const auto* bytes = static_cast<const uint8_t*>(sqlite3_column_blob(select, 0));
    std::vector<uint8_t> blob(bytes, bytes + sqlite3_column_bytes(select, 0));
    sqlite3_finalize(select);
    ASSERT_TRUE(flipSignatureByte(shard.grant.signature, &blob))
        << "the stored grant does not hold the ledger's signature";
    sqlite3_stmt* update = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE shards SET grant_blob = ?1 WHERE shard_id = ?2", -1,
                                 &update, nullptr),
              SQLITE_OK);
    sqlite3_bind_blob(update, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(update, 2, shard_id.c_str(), -1, SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(update), SQLITE_DONE);
    sqlite3_finalize(update);
    ASSERT_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
  }

  ASSERT_NO_FATAL_FAILURE(startShardAgent(0, proxy.address()));
  EXPECT_EQ(metric(0, "tally_agent_shards", {{"condition", "quarantined"}}), 1.0);
  EXPECT_GE(metric(0, "tally_agent_shard_events_total", {{"event", "quarantined"}}), 1.0);
  EXPECT_NE(agents_[0]->log().find("quarantin"), std::string::npos) << "no log line about it";

  // In contact, the agent gets a fresh shard: a full maintenance pass, which sends every pending
  // report (an untampered shard of the earlier boot would be one) before it asks for shards.
  std::optional<ShardLedgerView> fresh = waitUsableShard(0, shard_id);
  ASSERT_TRUE(fresh.has_value());
  const std::string fresh_id = fresh->grant.shard_id;
  EXPECT_EQ(metric(0, "tally_agent_shard_reports_total"), 0.0) << metricsText(0);

  // Cut off, it admits from the fresh shard only.
  ASSERT_NO_FATAL_FAILURE(partition(proxy, 0));
  Admissions admitted = reserveMany(0, "t", 12, 10);
  EXPECT_EQ(admitted.units_by_origin.count(shard_id), 0u) << "admitted from a tampered shard";
  EXPECT_EQ(admitted.shardUnits(), admitted.units_by_origin[fresh_id]);
  EXPECT_EQ(admitted.shardUnits(), fresh->grant.allocated_units);
  ASSERT_NO_FATAL_FAILURE(reconnect(proxy));
  std::optional<ShardLedgerView> fresh_view =
      waitShard(fresh_id, [](const ShardLedgerView& v) { return v.reported; });
  ASSERT_TRUE(fresh_view.has_value() && fresh_view->reported) << "the fresh shard was not reported";
  std::optional<ShardLedgerView> view = ledgerShard(shard_id);
  ASSERT_TRUE(view.has_value());
  EXPECT_FALSE(view->reported) << describe(*view);
  EXPECT_EQ(view->state, ShardState::kIssued) << describe(*view);
  EXPECT_EQ(view->retired_units, view->grant.allocated_units) << describe(*view);
  ASSERT_NO_FATAL_FAILURE(checkShardInvariants());
}

}  // namespace
}  // namespace tally::testing
