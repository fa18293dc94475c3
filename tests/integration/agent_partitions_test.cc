// A partitioned tally-agent with real processes (docs/scale-out.md "Partitioned subjects"): two
// real tally-ledgers, each the primary of one partition of the subjects, and one real tally-agent
// started with `--partitions 'A;B'`. Each partition's ledger is killed (-9) in turn: only that
// partition's subjects are served from its emergency shards (and a settle of one of its central
// reservations waits in that partition's outbox) while the other partition's subjects are still
// served by their ledger; when the ledger is back (restarted: a new port behind the same proxy
// address), the shard is reconciled to it and the queued settle delivered to it, and never to the
// other partition.

#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/partition_map.h"
#include "shard/identity.h"
#include "tests/integration/agent_harness.h"
#include "tests/integration/shard_fleet.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/temp_dir.h"

// A namespace of its own: the suite is a unity build, and partition_test.cc has the same
// helpers in its anonymous namespace.
namespace tally::testing::agent_partitions {
namespace {

constexpr uint32_t kPartitions = 2;
constexpr const char* kRoute = "chat";
constexpr Units kShardUnits = 100;

std::string subjectIn(uint32_t partition) {
  for (int n = 0;; ++n) {
    std::string subject = "tenant-" + std::to_string(n);
    if (partitionOf(subject, kPartitions) == partition) return subject;
  }
}

class PartitionedAgentTest : public ::testing::Test {
 protected:
  PartitionedAgentTest()
      : agent_("agent", dir_.file("agent"), dir_.file("agent.sock"), dir_.file("agent.toml"),
               dir_.file("agent.log")) {
    for (uint32_t i = 0; i < kPartitions; ++i) {
      const std::string name = "p" + std::to_string(i);
      ledgers_.push_back(
          std::make_unique<LedgerInstance>(dir_.file(name), dir_.file(name + ".log")));
    }
  }

  void TearDown() override {
    if (agent_.running()) agent_.kill9();
    if (HasFailure()) {
      std::cout << "---- agent ----\n" << agent_.log() << std::endl;
      for (size_t i = 0; i < ledgers_.size(); ++i) {
        std::cout << "---- partition " << i << " ledger ----\n" << ledgers_[i]->log() << std::endl;
      }
    }
  }

  // Each partition: its ledger's key, the ledger, a proxy in front of it (a stable address for
  // the agent's map across restarts), its subject's budget with emergency mode on, and the
  // agent's gateway enrolled there.
  void startFleet() {
    for (uint32_t i = 0; i < kPartitions; ++i) {
      TALLY_ASSIGN_OR_FAIL(
          const std::string out,
          runForOutput(binaryPath("tally-ledger"),
                       {"--data-dir", ledgers_[i]->dataDir(), "identity", "--json"},
                       dir_.file("ledger-identity-" + std::to_string(i) + ".log")));
      ledger_keys_.push_back(jsonString(out, "publicKey"));
      ASSERT_EQ(ledger_keys_.back().size(), 44u) << out;
      ASSERT_TRUE(ledgers_[i]->start().isOk()) << ledgers_[i]->log();
      proxies_.push_back(std::make_unique<FaultProxy>(ledgers_[i]->port()));
      Budget budget = makeBudget({.subject = subjectIn(i), .route = kRoute, .burst = 1'000});
      budget.emergency = {.enabled = true, .shard_units = kShardUnits, .shard_ttl_ms = 600'000};
      TALLY_ASSIGN_OR_FAIL(auto client, ledgers_[i]->connect());
      TALLY_ASSIGN_OR_FAIL(PolicyReply published, publishPolicy(*client, {budget}));
      ASSERT_EQ(published.code, ReplyCode::kOk) << i;
    }
    TALLY_ASSIGN_OR_FAIL(const std::string out,
                         runForOutput(binaryPath("tally-agent"),
                                      {"--data-dir", dir_.file("agent"), "--gateway-name", "gw-0",
                                       "identity", "--json"},
                                      dir_.file("agent-identity.log")));
    TALLY_ASSIGN_OR_FAIL(PublicKey key, identity::decodePublicKey(jsonString(out, "publicKey")));
    for (uint32_t i = 0; i < kPartitions; ++i) {
      TALLY_ASSIGN_OR_FAIL(auto client, ledgers_[i]->connect());
      TALLY_ASSIGN_OR_FAIL(
          wire::Response response,
          client->call(wire::EnrollGatewayRequest{.gateway_name = "gw-0", .public_key = key},
                       kCallTimeoutMs));
      const auto* reply = std::get_if<GatewayReply>(&response.body);
      ASSERT_NE(reply, nullptr) << wire::describe(response.body);
      ASSERT_EQ(reply->code, ReplyCode::kOk) << reply->message;
    }
  }

  void startAgent() {
    AgentSettings settings;
    settings.failures_to_partition = 2;
    settings.partition_after_ms = 1'000;
    settings.partitions = proxies_[0]->address() + ";" + proxies_[1]->address();
    for (const std::string& key : ledger_keys_) {
      settings.extra_args.insert(settings.extra_args.end(), {"--ledger-public-key", key});
    }
    settings.extra_toml = "[emergency]\naccounts = [\"" + subjectIn(0) + " " + kRoute + "\", \"" +
                          subjectIn(1) + " " + kRoute +
                          "\"]\nshards_on_hand = 1\nhold_ttl_ms = 600000\n";
    const Status started = agent_.start("", settings);
    ASSERT_TRUE(started.isOk()) << started.toString() << "\n" << agent_.log();
    TALLY_ASSIGN_OR_FAIL(gateway_, agent_.connect());
  }

  bool waitFor(const std::function<bool()>& done, uint64_t timeout_ms = kDeliveryTimeoutMs) {
    return pollUntil(done, timeout_ms);
  }

  double metric(const std::string& name, const std::map<std::string, std::string>& labels) {
    Result<std::string> body = httpGet(agent_.metricsPort(), "/metrics", 5'000);
    return body.isOk() ? metricSum(body.value(), name, labels) : -1;
  }
  double partitionMetric(uint32_t partition, const std::string& name,
                         std::map<std::string, std::string> labels = {}) {
    labels["partition"] = std::to_string(partition);
    return metric(name, labels);
  }

  AgentAnswer callOrFail(const wire::RequestBody& body) {
    Result<AgentAnswer> answer = callAgent(*gateway_, body);
    EXPECT_TRUE(answer.isOk()) << answer.status().toString();
    return answer.isOk() ? answer.value() : AgentAnswer{.is_error = true};
  }

  // reserve → start → settle through the agent; the reserve's origin ("" central, else a shard).
  std::string cycle(const std::string& id, const std::string& subject, Units units) {
    const AgentAnswer reserved =
        callOrFail(makeReserve({.id = id, .subject = subject, .units = units}));
    EXPECT_FALSE(reserved.is_error) << id << ": " << describe(reserved);
    EXPECT_EQ(reserved.reply.code, ReplyCode::kOk) << id << ": " << describe(reserved);
    const AgentAnswer started = callOrFail(StartRequest{id, "op-" + id});
    EXPECT_EQ(started.reply.code, ReplyCode::kOk) << id << ": " << describe(started);
    EXPECT_EQ(started.reply.receipt.state, ReservationState::kStarted) << id;
    const AgentAnswer settled = callOrFail(SettleRequest{id, "op-" + id, units});
    EXPECT_EQ(settled.reply.code, ReplyCode::kOk) << id << ": " << describe(settled);
    EXPECT_EQ(settled.reply.receipt.state, ReservationState::kSettled) << id;
    return reserved.reply.receipt.origin;
  }

  // The reservation as partition `partition`'s ledger holds it.
  ReservationReply onLedger(uint32_t partition, const std::string& id) {
    Result<std::unique_ptr<client::BlockingClient>> client = ledgers_[partition]->connect();
    if (!client.isOk()) return ReservationReply{.code = ReplyCode::kResourceExhausted};
    Result<ReservationReply> reply =
        callReservation(*client.value(), QueryRequest{.reservation_id = id});
    return reply.isOk() ? reply.value() : ReservationReply{.code = ReplyCode::kResourceExhausted};
  }

  std::optional<ShardLedgerView> ledgerShard(uint32_t partition, const std::string& shard_id) {
    Result<std::unique_ptr<client::BlockingClient>> client = ledgers_[partition]->connect();
    if (!client.isOk()) return std::nullopt;
    return findShard(listLedgerShards(*client.value(), "gw-0"), shard_id);
  }
  // The subjects of every shard partition `partition`'s ledger issued to the agent.
  std::vector<std::string> shardSubjects(uint32_t partition) {
    std::vector<std::string> subjects;
    Result<std::unique_ptr<client::BlockingClient>> client = ledgers_[partition]->connect();
    if (!client.isOk()) return subjects;
    for (const ShardLedgerView& view : listLedgerShards(*client.value(), "gw-0")) {
      subjects.push_back(view.grant.subject);
    }
    return subjects;
  }

  // The agent's merged fleet audit (every partition's ledger through the agent).
  std::optional<AuditReport> agentAudit() {
    Result<wire::Response> response = gateway_->call(wire::AuditRequest{}, kCallTimeoutMs);
    if (!response.isOk()) return std::nullopt;
    const auto* report = std::get_if<AuditReport>(&response.value().body);
    if (report == nullptr) {
      ADD_FAILURE() << wire::describe(response.value().body);
      return std::nullopt;
    }
    return *report;
  }

  std::string agentHealth() {
    Result<wire::Response> response = gateway_->call(wire::HealthRequest{}, kCallTimeoutMs);
    if (!response.isOk()) return "error";
    const auto* reply = std::get_if<wire::HealthReply>(&response.value().body);
    return reply == nullptr ? "?" : reply->status;
  }

  TempDir dir_;
  std::vector<std::unique_ptr<LedgerInstance>> ledgers_;
  std::vector<std::unique_ptr<FaultProxy>> proxies_;
  std::vector<std::string> ledger_keys_;
  AgentInstance agent_;
  std::unique_ptr<client::BlockingClient> gateway_;
};

TEST_F(PartitionedAgentTest, OnlyTheDownPartitionsSubjectsFallBackToItsShardsAndReconcileToIt) {
  ASSERT_NO_FATAL_FAILURE(startFleet());
  ASSERT_NO_FATAL_FAILURE(startAgent());
  const std::string subjects[kPartitions] = {subjectIn(0), subjectIn(1)};

  // Healthy: each partition keeps a shard of its own subject only, issued by its own ledger.
  for (uint32_t p = 0; p < kPartitions; ++p) {
    ASSERT_TRUE(waitFor([&] {
      return partitionMetric(p, "tally_agent_shards", {{"condition", "usable"}}) >= 1;
    })) << "partition "
        << p << " holds no usable shard\n"
        << agent_.log();
    EXPECT_EQ(shardSubjects(p), std::vector<std::string>{subjects[p]}) << p;
  }
  EXPECT_EQ(agentHealth(), "HEALTHY");

  // Both partitions' subjects served centrally, each by its own ledger only.
  for (uint32_t p = 0; p < kPartitions; ++p) {
    const std::string id = "healthy-" + std::to_string(p);
    EXPECT_EQ(cycle(id, subjects[p], 10), "") << id;
    EXPECT_EQ(onLedger(p, id).receipt.state, ReservationState::kSettled) << id;
    EXPECT_EQ(onLedger(1 - p, id).code, ReplyCode::kNotFound) << id;
  }
  std::optional<AuditReport> audit = agentAudit();
  ASSERT_TRUE(audit.has_value());
  EXPECT_TRUE(audit->conserved);
  EXPECT_EQ(audit->accounts.size(), 2u);

  for (uint32_t down = 0; down < kPartitions; ++down) {
    SCOPED_TRACE("partition " + std::to_string(down) + " down");
    const uint32_t up = 1 - down;
    const std::string tag = std::to_string(down);
    // A central reservation of the down partition's subject, reserved while its ledger is up.
    const std::string pending = "pending-" + tag;
    const AgentAnswer reserved =
        callOrFail(makeReserve({.id = pending, .subject = subjects[down], .units = 5}));
    ASSERT_EQ(reserved.reply.code, ReplyCode::kOk) << describe(reserved);
    ASSERT_EQ(callOrFail(StartRequest{pending, "op-" + pending}).reply.code, ReplyCode::kOk);

    // The gauge reads 2 as soon as the link is down, but the agent turns to the partition's
    // shards only once its link is PARTITIONED, after a second failure; until then a reserve
    // waits for the link and may go to the dying ledger's socket (outcome unknown). So the wait
    // is for that transition, a new "to=PARTITIONED" in the agent's log (the other partition's
    // link is healthy).
    const auto partitioned_transitions = [&] { return countOf(agent_.log(), "to=PARTITIONED"); };
    const size_t partitioned_before = partitioned_transitions();
    ledgers_[down]->kill9();
    ASSERT_TRUE(waitFor([&] {
      return partitionMetric(down, "tally_agent_ledger_health") == 2 &&  // PARTITIONED / gone
             partitioned_transitions() > partitioned_before;
    })) << agent_.log();
    EXPECT_EQ(partitionMetric(up, "tally_agent_ledger_health"), 0);  // HEALTHY
    EXPECT_NE(agentHealth(), "HEALTHY");

    // The down partition's subject: admitted from that partition's shard.
    const std::string shard_id = cycle("shard-" + tag, subjects[down], 30);
    EXPECT_TRUE(isShardOrigin(shard_id)) << "origin '" << shard_id << "'";
    // The up partition's subject: still its ledger's.
    const std::string central = "central-" + tag;
    EXPECT_EQ(cycle(central, subjects[up], 7), "") << central;
    EXPECT_EQ(onLedger(up, central).receipt.state, ReservationState::kSettled);
    // The settle of the down partition's central reservation waits in its partition's outbox.
    const AgentAnswer queued = callOrFail(SettleRequest{pending, "op-" + pending, 4});
    EXPECT_EQ(queued.reply.code, ReplyCode::kQueued) << describe(queued);
    EXPECT_EQ(partitionMetric(down, "tally_agent_outbox_depth"), 1);
    EXPECT_EQ(partitionMetric(up, "tally_agent_outbox_depth"), 0);

    // The ledger is back (a new port behind the same address): the queued settle is delivered
    // to it, and the shard reported and reconciled there.
    ASSERT_TRUE(ledgers_[down]->start().isOk()) << ledgers_[down]->log();
    proxies_[down]->setUpstreamPort(ledgers_[down]->port());
    ASSERT_TRUE(waitFor([&] {
      return onLedger(down, pending).receipt.state == ReservationState::kSettled;
    })) << agent_.log();
    EXPECT_EQ(onLedger(up, pending).code, ReplyCode::kNotFound);
    std::optional<ShardLedgerView> view;
    ASSERT_TRUE(waitFor([&] {
      view = ledgerShard(down, shard_id);
      return view.has_value() && view->state == ShardState::kReconciled;
    })) << (view ? shardStateName(view->state) : "no view")
        << "\n"
        << agent_.log();
    EXPECT_EQ(view->grant.subject, subjects[down]);
    EXPECT_EQ(view->spent_units, 30u);
    EXPECT_TRUE(view->conserved);
    // Shard ids are each ledger's own: the up partition's ledger only ever issued shards of its
    // own subject.
    for (const std::string& subject : shardSubjects(up)) EXPECT_EQ(subject, subjects[up]);
    EXPECT_TRUE(waitFor([&] { return partitionMetric(down, "tally_agent_outbox_depth") == 0; }));
    ASSERT_TRUE(waitFor([&] { return agentHealth() == "HEALTHY"; })) << agentHealth();

    // Served centrally again; the fleet's audit through the agent conserves, every account on
    // its own partition.
    EXPECT_EQ(cycle("again-" + tag, subjects[down], 3), "");
    audit = agentAudit();
    ASSERT_TRUE(audit.has_value());
    EXPECT_TRUE(audit->conserved);
    for (const std::string& violation : audit->violations) ADD_FAILURE() << violation;
  }
}

// The record of each reserve's partition is durable: after the agent is killed (-9) and started
// again, follow-ups still reach the partition of their reserve. Once a reservation is final its
// record is gone; a retried settle then is asked of every partition and still gets its own
// ledger's (duplicate) answer.
TEST_F(PartitionedAgentTest, FollowUpsFindTheirPartitionAfterAnAgentKill9AndAfterTheRecordIsGone) {
  ASSERT_NO_FATAL_FAILURE(startFleet());
  ASSERT_NO_FATAL_FAILURE(startAgent());
  for (uint32_t p = 0; p < kPartitions; ++p) {
    const std::string id = "before-kill-" + std::to_string(p);
    const AgentAnswer reserved =
        callOrFail(makeReserve({.id = id, .subject = subjectIn(p), .units = 4}));
    ASSERT_EQ(reserved.reply.code, ReplyCode::kOk) << describe(reserved);
  }
  // Each partition its own ordinary agent store.
  for (uint32_t p = 0; p < kPartitions; ++p) {
    EXPECT_EQ(
        ::access(dir_.file("agent/partition-" + std::to_string(p) + "/agent.db").c_str(), R_OK), 0)
        << p;
  }
  agent_.kill9();
  gateway_.reset();
  ASSERT_NO_FATAL_FAILURE(startAgent());
  for (uint32_t p = 0; p < kPartitions; ++p) {
    const std::string id = "before-kill-" + std::to_string(p);
    const AgentAnswer started = callOrFail(StartRequest{id, "op-" + id});
    ASSERT_EQ(started.reply.code, ReplyCode::kOk) << id << ": " << describe(started);
    const AgentAnswer settled = callOrFail(SettleRequest{id, "op-" + id, 2});
    ASSERT_EQ(settled.reply.code, ReplyCode::kOk) << id << ": " << describe(settled);
    EXPECT_EQ(settled.reply.refunded_units, 2u) << id;
    EXPECT_EQ(onLedger(p, id).receipt.state, ReservationState::kSettled) << id;
    EXPECT_EQ(onLedger(1 - p, id).code, ReplyCode::kNotFound) << id;
    // SETTLED: the record is gone; the retry is found on its partition by query.
    const AgentAnswer retried = callOrFail(SettleRequest{id, "op-" + id, 2});
    ASSERT_FALSE(retried.is_error) << id << ": " << describe(retried);
    EXPECT_TRUE(retried.reply.duplicate) << id << ": " << describe(retried);
    EXPECT_EQ(retried.reply.receipt.state, ReservationState::kSettled) << id;
  }
  // Never reserved anywhere: every partition's NOT_FOUND.
  const AgentAnswer unknown = callOrFail(SettleRequest{"never-reserved", "op", 1});
  ASSERT_FALSE(unknown.is_error) << describe(unknown);
  EXPECT_EQ(unknown.reply.code, ReplyCode::kNotFound) << describe(unknown);
  // SIGTERM: every partition drains and closes, the loop runs dry, exit 0.
  gateway_.reset();
  EXPECT_EQ(agent_.terminate(), 0) << agent_.log();
}

}  // namespace
}  // namespace tally::testing::agent_partitions
