// Fair scheduling end to end (SPEC §7, docs/AGENT.md "Fair scheduling"): a real ledger and a
// real tally-agent with `[scheduling] started_max = { "chat" = 1 }`. Starts of RESERVED work
// beyond the one execution slot wait in the agent; each settle frees the slot and the next start
// the agent sends is chosen by tenant weight (3 : 1). Readiness is explicit: the agent's
// "policy_loaded" log line, the tally_agent_fair_waiting gauge, and each start's own answer.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/agent_harness.h"

namespace tally::testing {
namespace {

// Polls `done` until it holds or `timeout_ms` passes.
bool waitUntil(const std::function<bool()>& done, uint64_t timeout_ms = 20'000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    pauseMs(10);
  }
  return done();
}

double scrape(const AgentInstance& agent, const std::string& name) {
  Result<std::string> metrics = httpGet(agent.metricsPort(), "/metrics", 5'000);
  return metrics.isOk() ? metricSum(metrics.value(), name, {{"route", "chat"}}) : -1;
}

class AgentFairTest : public AgentFleetTest {};

TEST_F(AgentFairTest, WaitingStartsAreAdmittedInWeightedOrderAsSlotsFree) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Budget heavy = makeBudget({.subject = "heavy", .burst = 1'000'000});
  heavy.weight = 3;
  Budget light = makeBudget({.subject = "light", .burst = 1'000'000});
  light.weight = 1;
  ASSERT_NO_FATAL_FAILURE(publish({heavy, light}));
  ASSERT_NO_FATAL_FAILURE(
      startAgent(0, ledgerAddress(),
                 AgentSettings{.extra_toml = "[scheduling]\nstarted_max = { \"chat\" = 1 }\n"
                                             "fairness_window = 9\n"}));
  AgentInstance& agent = *agents_[0];
  ASSERT_TRUE(waitUntil([&] { return agent.log().find("policy_loaded") != std::string::npos; }))
      << "the agent never loaded the policy (weights)";

  std::unique_ptr<client::BlockingClient> control = gateway(0);
  std::unique_ptr<client::BlockingClient> starts = gateway(0);
  ASSERT_NE(control, nullptr);
  ASSERT_NE(starts, nullptr);
  std::vector<std::string> ids = {"h0"};
  for (int i = 1; i <= 4; ++i) {  // arrival order: l1 h1 h2 l2 h3 h4 …
    ids.push_back("l" + std::to_string(i));
    ids.push_back("h" + std::to_string(2 * i - 1));
    ids.push_back("h" + std::to_string(2 * i));
  }
  for (const std::string& id : ids) {
    TALLY_ASSIGN_OR_FAIL(
        AgentAnswer reserved,
        callAgent(*control, makeReserve({.id = id, .subject = id[0] == 'h' ? "heavy" : "light"})));
    ASSERT_FALSE(reserved.is_error) << describe(reserved);
    ASSERT_EQ(reserved.reply.receipt.state, ReservationState::kReserved) << describe(reserved);
  }
  // h0 takes the one slot.
  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer first,
      callAgent(*control, StartRequest{.reservation_id = "h0", .operation_id = "op-h0"}));
  ASSERT_FALSE(first.is_error) << describe(first);
  ASSERT_EQ(first.reply.receipt.state, ReservationState::kStarted);
  // The other twelve starts wait in the agent (never sent to the ledger yet).
  for (size_t i = 1; i < ids.size(); ++i) {
    Result<uint64_t> sent =
        starts->send(StartRequest{.reservation_id = ids[i], .operation_id = "op-" + ids[i]},
                     kAgentCallTimeoutMs);
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
  }
  ASSERT_TRUE(waitUntil([&] { return scrape(agent, "tally_agent_fair_waiting") == 12; }))
      << "waiting: " << scrape(agent, "tally_agent_fair_waiting");
  EXPECT_EQ(scrape(agent, "tally_agent_fair_started"), 1);

  // Each settle frees the slot; the start the agent admits next answers on `starts`.
  std::string running = "h0";
  std::string order;
  for (int k = 0; k < 8; ++k) {
    TALLY_ASSIGN_OR_FAIL(AgentAnswer settled,
                         callAgent(*control, SettleRequest{.reservation_id = running,
                                                           .operation_id = "op-" + running,
                                                           .actual_units = 1}));
    ASSERT_FALSE(settled.is_error) << describe(settled);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer started, agentAnswerOf(starts->receive(kAgentCallTimeoutMs)));
    ASSERT_FALSE(started.is_error) << describe(started);
    ASSERT_EQ(started.reply.receipt.state, ReservationState::kStarted) << describe(started);
    running = started.reply.receipt.reservation_id;
    order += running[0];
  }
  // Weight 3 : 1, smoothly interleaved; within a tenant, arrival order (checked by ids below).
  EXPECT_EQ(order, "lhhhlhhh");
  EXPECT_EQ(running, "h6");
  // Nine admissions: one fairness window, in which each tenant got its weighted share.
  EXPECT_EQ(scrape(agent, "tally_agent_fairness_windows_total"), 1);
  EXPECT_LT(scrape(agent, "tally_agent_fairness_error"), 0.001);
  EXPECT_EQ(scrape(agent, "tally_agent_fair_waiting"), 4);
}

}  // namespace
}  // namespace tally::testing
