// Emergency shards end to end (SPEC §6, docs/SHARDS.md): a real tally-ledger and a real
// tally-agent. The agent obtains a signed shard while the ledger is healthy, admits from it
// while the ledger is frozen (SIGSTOP) up to its allocation and not one unit more, and
// reconciles it when the ledger is back: spent recorded, proven-unused units reminted, USAGE_
// UNKNOWN units still retired until their receipt arrives, the audit conserved throughout.

#include <signal.h>

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "shard/identity.h"
#include "tests/integration/agent_harness.h"
#include "tests/integration/shard_fleet.h"

namespace tally::testing {
namespace {

constexpr Units kShardUnits = 100;
const char* const kSubject = "tenant-1";
const char* const kRoute = "chat";

class AgentShardTest : public AgentFleetTest {
 protected:
  // The ledger's public key (its identity, created on first use) and a started ledger with an
  // emergency-mode budget.
  void startLedgerWithShards(const std::string& region = "") {
    TALLY_ASSIGN_OR_FAIL(const std::string out,
                         runForOutput(binaryPath("tally-ledger"),
                                      {"--data-dir", ledger_.dataDir(), "identity", "--json"},
                                      dir_.file("ledger-identity.log")));
    ledger_key_ = jsonString(out, "publicKey");
    ASSERT_EQ(ledger_key_.size(), 44u) << out;
    ASSERT_NO_FATAL_FAILURE(startLedger());
    Budget budget = makeBudget({.subject = kSubject, .route = kRoute, .burst = 1'000});
    budget.emergency = {.enabled = true, .shard_units = kShardUnits, .shard_ttl_ms = 600'000};
    budget.region = region;
    ASSERT_NO_FATAL_FAILURE(publish({budget}));
  }

  // The agent's identity (created by `tally-agent identity --json`), enrolled at the ledger.
  void enrollAgent(size_t index) {
    const std::string data_dir = dir_.file("agent" + std::to_string(index));
    TALLY_ASSIGN_OR_FAIL(
        const std::string out,
        runForOutput(binaryPath("tally-agent"),
                     {"--data-dir", data_dir, "--gateway-name", "gw-" + std::to_string(index),
                      "identity", "--json"},
                     dir_.file("agent-identity-" + std::to_string(index) + ".log")));
    gateway_name_ = jsonString(out, "gatewayId");
    ASSERT_EQ(gateway_name_, "gw-" + std::to_string(index)) << out;
    TALLY_ASSIGN_OR_FAIL(PublicKey key, identity::decodePublicKey(jsonString(out, "publicKey")));
    TALLY_ASSIGN_OR_FAIL(
        wire::Response response,
        client_->call(wire::EnrollGatewayRequest{.gateway_name = gateway_name_, .public_key = key},
                      kCallTimeoutMs));
    const auto* reply = std::get_if<GatewayReply>(&response.body);
    ASSERT_NE(reply, nullptr) << wire::describe(response.body);
    ASSERT_EQ(reply->code, ReplyCode::kOk) << reply->message;
  }

  AgentSettings shardSettings() const {
    AgentSettings settings;
    settings.failures_to_partition = 2;
    settings.partition_after_ms = 1'000;
    settings.extra_args = {"--ledger-public-key", ledger_key_};
    settings.extra_toml = std::string("[emergency]\naccounts = [\"") + kSubject + " " + kRoute +
                          "\"]\nshards_on_hand = 1\nhold_ttl_ms = 600000\n";
    return settings;
  }

  double metric(size_t agent, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
    Result<std::string> body = httpGet(agents_.at(agent)->metricsPort(), "/metrics", 5'000);
    return body.isOk() ? metricSum(body.value(), name, labels) : -1;
  }

  // Bounded polling on an observable condition.
  bool waitFor(const std::function<bool()>& done, uint64_t timeout_ms = kDeliveryTimeoutMs) {
    return pollUntil(done, timeout_ms);
  }

  std::string agentHealth(client::BlockingClient& gateway) {
    Result<wire::Response> response = gateway.call(wire::HealthRequest{}, kCallTimeoutMs);
    if (!response.isOk()) return "error";
    const auto* reply = std::get_if<wire::HealthReply>(&response.value().body);
    return reply == nullptr ? "?" : reply->status;
  }

  // Every shard of a gateway (the last enrolled by default) as the ledger sees it.
  std::vector<ShardLedgerView> ledgerShards(std::string gateway_name = {}) {
    if (gateway_name.empty()) gateway_name = gateway_name_;
    return listLedgerShards(*client_, gateway_name);
  }

  // One shard, whichever gateway holds it.
  std::optional<ShardLedgerView> ledgerShard(const std::string& shard_id) {
    return findShard(listLedgerShards(*client_, ""), shard_id);
  }

  std::string ledger_key_;
  std::string gateway_name_;
};

TEST_F(AgentShardTest, AdmitsFromAShardDuringAPartitionAndReconcilesAfterwards) {
  ASSERT_NO_FATAL_FAILURE(startLedgerWithShards());
  ASSERT_NO_FATAL_FAILURE(enrollAgent(0));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), shardSettings()));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);

  // Healthy: the agent obtains a shard for the configured account.
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  })) << "no shard obtained";
  EXPECT_EQ(metric(0, "tally_agent_shard_available_units"), double(kShardUnits));
  std::vector<ShardLedgerView> issued = ledgerShards();
  ASSERT_EQ(issued.size(), 1u);
  const std::string shard_id = issued.front().grant.shard_id;
  EXPECT_EQ(issued.front().state, ShardState::kIssued);

  // A central reservation made while healthy.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer central,
                       callAgent(*gw, makeReserve({.id = "central-1", .units = 5})));
  ASSERT_FALSE(central.is_error) << describe(central);
  ASSERT_EQ(central.reply.code, ReplyCode::kOk) << describe(central);
  EXPECT_EQ(central.reply.receipt.origin, "");

  // Partition: the ledger freezes; the agent notices.
  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  ASSERT_TRUE(waitFor([&] { return agentHealth(*gw) == "PARTITIONED"; }))
      << "agent health " << agentHealth(*gw);

  // Admission from the shard up to its allocation, and not one unit more.
  struct Ask {
    std::string id;
    Units units;
    bool admitted;
  };
  const std::vector<Ask> asks = {{"p-1", 30, true},  {"p-2", 30, true}, {"p-3", 30, true},
                                 {"p-4", 30, false}, {"p-5", 10, true}, {"p-6", 1, false}};
  for (const Ask& ask : asks) {
    TALLY_ASSIGN_OR_FAIL(AgentAnswer answer,
                         callAgent(*gw, makeReserve({.id = ask.id, .units = ask.units})));
    ASSERT_FALSE(answer.is_error) << ask.id << ": " << describe(answer);
    if (ask.admitted) {
      EXPECT_EQ(answer.reply.code, ReplyCode::kOk) << ask.id << ": " << describe(answer);
      EXPECT_EQ(answer.reply.receipt.origin, shard_id) << ask.id;
      EXPECT_EQ(answer.reply.receipt.state, ReservationState::kReserved) << ask.id;
    } else {
      EXPECT_EQ(answer.reply.code, ReplyCode::kRejected) << ask.id << ": " << describe(answer);
      EXPECT_EQ(answer.reply.receipt.limiting_dimension, LimitingDimension::kLedgerUnavailable);
    }
  }
  EXPECT_EQ(metric(0, "tally_agent_shard_available_units"), 0.0);
  EXPECT_EQ(metric(0, "tally_agent_shard_admissions_total", {{"outcome", "admitted"}}), 4.0);
  EXPECT_EQ(metric(0, "tally_agent_shard_admissions_total", {{"outcome", "no-shard"}}), 2.0);
  // A retry of an admitted id is the same receipt, not a second admission.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer again, callAgent(*gw, makeReserve({.id = "p-1", .units = 30})));
  EXPECT_TRUE(again.reply.duplicate) << describe(again);
  // An id the ledger may already hold is never admitted from a shard.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer central_retry,
                       callAgent(*gw, makeReserve({.id = "central-1", .units = 5})));
  EXPECT_TRUE(isUnavailable(central_retry)) << describe(central_retry);

  // Start is granted locally; settle some, mark one unknown, release one.
  for (const char* id : {"p-1", "p-2", "p-3"}) {
    TALLY_ASSIGN_OR_FAIL(AgentAnswer started,
                         callAgent(*gw, StartRequest{id, std::string("op-") + id}));
    EXPECT_EQ(started.reply.code, ReplyCode::kOk) << id << ": " << describe(started);
    EXPECT_EQ(started.reply.receipt.state, ReservationState::kStarted);
  }
  TALLY_ASSIGN_OR_FAIL(AgentAnswer s1, callAgent(*gw, SettleRequest{"p-1", "op-p-1", 20}));
  EXPECT_EQ(s1.reply.code, ReplyCode::kOk) << describe(s1);
  EXPECT_EQ(s1.reply.refunded_units, 10u);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer s2, callAgent(*gw, SettleRequest{"p-2", "op-p-2", 30}));
  EXPECT_EQ(s2.reply.code, ReplyCode::kOk) << describe(s2);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer unknown, callAgent(*gw, MarkUnknownRequest{"p-3", "op-p-3"}));
  EXPECT_EQ(unknown.reply.receipt.state, ReservationState::kUsageUnknown) << describe(unknown);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer released, callAgent(*gw, ReleaseRequest{"p-5"}));
  EXPECT_EQ(released.reply.code, ReplyCode::kOk) << describe(released);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer twice, callAgent(*gw, ReleaseRequest{"p-5"}));
  EXPECT_EQ(twice.reply.refunded_units, 0u) << describe(twice);

  // The ledger returns: the agent closes the shard it used and reports it. Spent 50 (20 + 30),
  // proven unused 20 (p-1's refund 10, p-5's 10) reminted, p-3's 30 units still retired.
  ASSERT_TRUE(ledger_.signal(SIGCONT));
  std::optional<ShardLedgerView> view;
  ASSERT_TRUE(waitFor([&] {
    view = ledgerShard(shard_id);
    return view.has_value() && view->state == ShardState::kReconciling;
  })) << (view ? shardStateName(view->state) : "no view");
  EXPECT_EQ(view->spent_units, 50u);
  EXPECT_EQ(view->reminted_units, 20u);
  EXPECT_EQ(view->retired_units, 30u);
  EXPECT_TRUE(view->conserved);
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));

  // Never reserved centrally: the shard's reservations exist only at the agent.
  TALLY_ASSIGN_OR_FAIL(ReservationReply central_view,
                       callReservation(*client_, QueryRequest{.reservation_id = "p-1"}));
  EXPECT_EQ(central_view.code, ReplyCode::kNotFound);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer after, callAgent(*gw, makeReserve({.id = "p-2", .units = 30})));
  EXPECT_TRUE(after.reply.duplicate) << describe(after);
  EXPECT_EQ(after.reply.receipt.origin, shard_id);

  // The UNKNOWN one's receipt arrives: the agent reports again; the shard is reconciled.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer receipt,
                       callAgent(*gw, ReportOperationRequest{"p-3", "op-p-3", 25}));
  EXPECT_EQ(receipt.reply.code, ReplyCode::kOk) << describe(receipt);
  ASSERT_TRUE(waitFor([&] {
    view = ledgerShard(shard_id);
    return view.has_value() && view->state == ShardState::kReconciled;
  })) << (view ? shardStateName(view->state) : "no view");
  EXPECT_EQ(view->spent_units, 75u);
  EXPECT_EQ(view->reminted_units, 25u);
  EXPECT_EQ(view->retired_units, 0u);
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  EXPECT_GE(metric(0, "tally_agent_shard_reports_total", {{"result", "RECONCILED"}}), 1.0);
  EXPECT_EQ(metric(0, "tally_agent_shard_oldest_unreconciled_age_seconds"), 0.0);
  // Acknowledged reports are not sent again (no duplicate stream while RECONCILING).
  EXPECT_EQ(metric(0, "tally_agent_shard_reports_total", {{"result", "duplicate"}}), 0.0);
  // And the agent keeps a fresh shard on hand again.
  EXPECT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  }));
}

// The budget is fenced to eu-west-1 (docs/LEDGER.md "Regions"): during a partition the agent's
// shard of it admits requests from eu-west-1 and requests that name no region, and refuses one
// from another region as the ledger would (no-budget, both regions named), taking nothing from
// the shard.
TEST_F(AgentShardTest, AShardAdmitsOnlyWhatItsBudgetsRegionFenceAdmits) {
  ASSERT_NO_FATAL_FAILURE(startLedgerWithShards("eu-west-1"));
  ASSERT_NO_FATAL_FAILURE(enrollAgent(0));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), shardSettings()));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  })) << "no shard obtained";
  std::vector<ShardLedgerView> issued = ledgerShards();
  ASSERT_EQ(issued.size(), 1u);
  const std::string shard_id = issued.front().grant.shard_id;
  // The agent holds the policy before the partition (it admits centrally with it).
  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer central,
      callAgent(*gw, makeReserve({.id = "c-eu", .units = 1, .region = "eu-west-1"})));
  ASSERT_EQ(central.reply.code, ReplyCode::kOk) << describe(central);

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  ASSERT_TRUE(waitFor([&] { return agentHealth(*gw) == "PARTITIONED"; }));
  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer us,
      callAgent(*gw, makeReserve({.id = "p-us", .units = 10, .region = "us-east-1"})));
  ASSERT_FALSE(us.is_error) << describe(us);
  EXPECT_EQ(us.reply.code, ReplyCode::kRejected) << describe(us);
  EXPECT_EQ(us.reply.receipt.limiting_dimension, LimitingDimension::kNoBudget) << describe(us);
  EXPECT_EQ(us.reply.receipt.origin, "");
  EXPECT_NE(us.reply.message.find("region 'us-east-1'"), std::string::npos) << us.reply.message;
  EXPECT_NE(us.reply.message.find("region 'eu-west-1'"), std::string::npos) << us.reply.message;
  EXPECT_EQ(metric(0, "tally_agent_shard_available_units"), double(kShardUnits));
  for (const char* region : {"eu-west-1", ""}) {
    const std::string id = std::string("p-") + (*region != 0 ? region : "none");
    TALLY_ASSIGN_OR_FAIL(AgentAnswer admitted,
                         callAgent(*gw, makeReserve({.id = id, .units = 10, .region = region})));
    ASSERT_FALSE(admitted.is_error) << id << ": " << describe(admitted);
    EXPECT_EQ(admitted.reply.code, ReplyCode::kOk) << id << ": " << describe(admitted);
    EXPECT_EQ(admitted.reply.receipt.origin, shard_id) << id;
    EXPECT_EQ(admitted.reply.receipt.region, region) << id;
  }
  EXPECT_EQ(metric(0, "tally_agent_shard_available_units"), double(kShardUnits - 20));
  // The same id from another region is another request, at the shard book too.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer moved,
                       callAgent(*gw, makeReserve({.id = "p-eu-west-1", .units = 10})));
  EXPECT_EQ(moved.reply.code, ReplyCode::kIdempotencyConflict) << describe(moved);
  ASSERT_TRUE(ledger_.signal(SIGCONT));
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
}

// kill -9 during a partition: the restarted agent (a new boot epoch) never admits from the old
// shard again, still answers its reservations (they are durable), and reports it when the
// ledger is back; the ledger records the spend at once and defers the remint to expiry.
TEST_F(AgentShardTest, ARestartedAgentNeverReusesItsOldShard) {
  ASSERT_NO_FATAL_FAILURE(startLedgerWithShards());
  ASSERT_NO_FATAL_FAILURE(enrollAgent(0));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), shardSettings()));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  })) << "no shard obtained";
  std::vector<ShardLedgerView> issued = ledgerShards();
  ASSERT_EQ(issued.size(), 1u);
  const std::string shard_id = issued.front().grant.shard_id;

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  ASSERT_TRUE(waitFor([&] { return agentHealth(*gw) == "PARTITIONED"; }));
  TALLY_ASSIGN_OR_FAIL(AgentAnswer k1, callAgent(*gw, makeReserve({.id = "k-1", .units = 40})));
  ASSERT_EQ(k1.reply.receipt.origin, shard_id) << describe(k1);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer k2, callAgent(*gw, makeReserve({.id = "k-2", .units = 20})));
  ASSERT_EQ(k2.reply.receipt.origin, shard_id) << describe(k2);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer started, callAgent(*gw, StartRequest{"k-1", "op-k-1"}));
  ASSERT_EQ(started.reply.code, ReplyCode::kOk) << describe(started);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer settled, callAgent(*gw, SettleRequest{"k-1", "op-k-1", 40}));
  ASSERT_EQ(settled.reply.code, ReplyCode::kOk) << describe(settled);

  gw.reset();
  agents_[0]->kill9();
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), shardSettings()));
  gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  ASSERT_TRUE(waitFor([&] { return agentHealth(*gw) == "PARTITIONED"; }));
  EXPECT_EQ(metric(0, "tally_agent_shards", {{"condition", "usable"}}), 0.0);
  EXPECT_EQ(metric(0, "tally_agent_shards", {{"condition", "closed"}}), 1.0);
  // The old shard still has 40 units, but it belongs to the previous boot epoch.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer k3, callAgent(*gw, makeReserve({.id = "k-3", .units = 10})));
  ASSERT_FALSE(k3.is_error) << describe(k3);
  EXPECT_EQ(k3.reply.code, ReplyCode::kRejected) << describe(k3);
  EXPECT_EQ(k3.reply.receipt.limiting_dimension, LimitingDimension::kLedgerUnavailable);
  // What was admitted before the crash is still answered, exactly once.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer k1_again,
                       callAgent(*gw, makeReserve({.id = "k-1", .units = 40})));
  EXPECT_TRUE(k1_again.reply.duplicate) << describe(k1_again);
  EXPECT_EQ(k1_again.reply.receipt.state, ReservationState::kSettled);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer released, callAgent(*gw, ReleaseRequest{"k-2"}));
  EXPECT_EQ(released.reply.code, ReplyCode::kOk) << describe(released);

  ASSERT_TRUE(ledger_.signal(SIGCONT));
  std::optional<ShardLedgerView> view;
  ASSERT_TRUE(waitFor([&] {
    view = ledgerShard(shard_id);
    return view.has_value() && view->reported && view->spent_units == 40;
  })) << (view ? shardStateName(view->state) : "no view");
  EXPECT_NE(view->state, ShardState::kConflict);
  // Reported from another boot epoch before expiry: the remint waits for expiresAt.
  EXPECT_EQ(view->reminted_units, 0u);
  EXPECT_EQ(view->retired_units, kShardUnits - 40);
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
}

// An operator revokes the agent's shard: the agent hears it at its next status poll, closes and
// reports it (all of it unused: reminted), and obtains a new shard under the bumped fence.
TEST_F(AgentShardTest, ARevokedShardIsClosedReportedAndReplaced) {
  ASSERT_NO_FATAL_FAILURE(startLedgerWithShards());
  ASSERT_NO_FATAL_FAILURE(enrollAgent(0));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), shardSettings()));
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  }));
  std::vector<ShardLedgerView> issued = ledgerShards();
  ASSERT_EQ(issued.size(), 1u);
  const std::string shard_id = issued.front().grant.shard_id;
  const uint64_t fence = issued.front().grant.fence;

  TALLY_ASSIGN_OR_FAIL(
      wire::Response response,
      client_->call(wire::RevokeShardsRequest{.shard_id = shard_id}, kCallTimeoutMs));
  const auto* revoked = std::get_if<ShardReply>(&response.body);
  ASSERT_NE(revoked, nullptr) << wire::describe(response.body);
  ASSERT_EQ(revoked->code, ReplyCode::kOk) << revoked->message;

  std::optional<ShardLedgerView> view;
  ASSERT_TRUE(waitFor([&] {
    view = ledgerShard(shard_id);
    return view.has_value() && view->state == ShardState::kReconciled;
  })) << (view ? shardStateName(view->state) : "no view");
  EXPECT_EQ(view->spent_units, 0u);
  EXPECT_EQ(view->reminted_units, kShardUnits);
  EXPECT_GE(metric(0, "tally_agent_shard_events_total", {{"event", "closed-revoked"}}), 1.0);
  ASSERT_TRUE(waitFor([&] {
    for (const ShardLedgerView& shard : ledgerShards()) {
      if (shard.state == ShardState::kIssued && shard.grant.fence > fence) return true;
    }
    return false;
  })) << "no replacement under the new fence";
  ASSERT_TRUE(waitFor([&] {
    return metric(0, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
  }));
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
}

// Two gateways, each with its own shard, during one partition: each admits only from its own
// shard, the ledger reconciles both, and the subject/route's balances conserve throughout.
TEST_F(AgentShardTest, TwoGatewaysEachAdmitOnlyFromTheirOwnShard) {
  ASSERT_NO_FATAL_FAILURE(startLedgerWithShards());
  std::vector<std::unique_ptr<client::BlockingClient>> gws;
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(enrollAgent(i));
    ASSERT_NO_FATAL_FAILURE(startAgent(i, ledgerAddress(), shardSettings()));
    gws.push_back(gateway(i));
    ASSERT_NE(gws.back(), nullptr);
  }
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(waitFor([&] {
      return metric(i, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
    }));
  }
  std::string shard_of[2];
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<ShardLedgerView> mine = ledgerShards("gw-" + std::to_string(i));
    ASSERT_EQ(mine.size(), 1u);
    shard_of[i] = mine.front().grant.shard_id;
  }
  ASSERT_NE(shard_of[0], shard_of[1]);

  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  for (auto& gw : gws) ASSERT_TRUE(waitFor([&] { return agentHealth(*gw) == "PARTITIONED"; }));
  // Each gateway takes its whole shard in 25-unit steps, and not one unit more.
  for (size_t i = 0; i < 2; ++i) {
    for (int n = 0; n < 5; ++n) {
      const std::string id = "g" + std::to_string(i) + "-" + std::to_string(n);
      TALLY_ASSIGN_OR_FAIL(AgentAnswer answer,
                           callAgent(*gws[i], makeReserve({.id = id, .units = 25})));
      ASSERT_FALSE(answer.is_error) << describe(answer);
      if (n < 4) {
        EXPECT_EQ(answer.reply.code, ReplyCode::kOk) << id << ": " << describe(answer);
        EXPECT_EQ(answer.reply.receipt.origin, shard_of[i]) << id;
        TALLY_ASSIGN_OR_FAIL(AgentAnswer started, callAgent(*gws[i], StartRequest{id, "op-" + id}));
        ASSERT_EQ(started.reply.code, ReplyCode::kOk) << describe(started);
        TALLY_ASSIGN_OR_FAIL(AgentAnswer settled,
                             callAgent(*gws[i], SettleRequest{id, "op-" + id, 25}));
        ASSERT_EQ(settled.reply.code, ReplyCode::kOk) << describe(settled);
      } else {
        EXPECT_EQ(answer.reply.code, ReplyCode::kRejected) << id << ": " << describe(answer);
      }
    }
  }
  // Another gateway's reservation is not this agent's to answer.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer foreign, callAgent(*gws[1], QueryRequest{"g0-0"}));
  EXPECT_TRUE(isUnavailable(foreign)) << describe(foreign);

  ASSERT_TRUE(ledger_.signal(SIGCONT));
  for (size_t i = 0; i < 2; ++i) {
    std::optional<ShardLedgerView> view;
    ASSERT_TRUE(waitFor([&] {
      view = ledgerShard(shard_of[i]);
      return view.has_value() && view->state == ShardState::kReconciled;
    })) << shard_of[i]
        << " " << (view ? shardStateName(view->state) : "no view");
    EXPECT_EQ(view->spent_units, kShardUnits);
    EXPECT_EQ(view->reminted_units, 0u);
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {kSubject, kRoute});
  EXPECT_GE(sum.spent, 2 * kShardUnits);
}

}  // namespace
}  // namespace tally::testing
