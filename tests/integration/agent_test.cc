// tally-agent end to end (SPEC §5, §7, §8): one real ledger, real agents on Unix sockets in a
// temp dir, gateways speaking the wire protocol to the agents, and a fault-injecting proxy
// between agents and ledger where a test needs lost answers, a blackhole or a stable address
// across a ledger restart. Each test states what it proves; randomized ones print their seed.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/integration/agent_harness.h"
#include "tests/support/raw_socket.h"
#include "wire/frame.h"

namespace tally::testing {
namespace {

constexpr uint64_t kReadTimeoutMs = 5'000;

bool isQueued(const AgentAnswer& answer) {
  return !answer.is_error && answer.reply.code == ReplyCode::kQueued;
}
bool isOk(const AgentAnswer& answer) {
  return !answer.is_error && answer.reply.code == ReplyCode::kOk;
}
// The reserve answer while the ledger is unreachable: REJECTED "ledger-unavailable" with a
// Retry-After, or (the answer to that very reserve was lost) a retryable kUnavailable.
bool isPartitionRejection(const AgentAnswer& answer) {
  if (isUnavailable(answer)) return true;
  return !answer.is_error && answer.reply.code == ReplyCode::kRejected &&
         answer.reply.receipt.limiting_dimension == LimitingDimension::kLedgerUnavailable;
}
bool settledState(ReservationState state) {
  return state == ReservationState::kSettled || state == ReservationState::kSettledWithDebt;
}

// Calls through the agent until the answer is definitive (not a retryable kUnavailable and not
// a partition rejection), always with the same request (same reservation id), pausing between
// attempts; returns the last answer.
AgentAnswer callUntilDefinitive(client::BlockingClient& gateway, const wire::RequestBody& body,
                                uint64_t timeout_ms = kDeliveryTimeoutMs) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  AgentAnswer last;
  last.is_error = true;
  last.error.message = "no answer within the deadline";
  while (std::chrono::steady_clock::now() < deadline) {
    Result<AgentAnswer> answer = callAgent(gateway, body);
    if (answer.isOk()) {
      last = answer.value();
      if (!isPartitionRejection(last)) return last;
    }
    pauseMs(100);
  }
  return last;
}

std::vector<uint8_t> frameHeader(uint32_t length) {
  return {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
          static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
}

std::vector<uint8_t> requestFrame(uint64_t request_id, const wire::RequestBody& body) {
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = body});
  EXPECT_TRUE(frame.isOk());
  return frame.isOk() ? frame.value() : std::vector<uint8_t>{};
}

// A reply frame (payload) that is the ledger's answer about `id`: used to lose exactly that
// answer in the proxy, whatever else (health checks, policy refreshes) shares the link.
FaultProxy::ReplyMatcher aboutReservation(std::string id) {
  return [id = std::move(id)](std::span<const uint8_t> payload) {
    Result<wire::Response> response = wire::decodeResponse(payload);
    if (!response.isOk()) return false;
    const auto* reply = std::get_if<ReservationReply>(&response.value().body);
    return reply != nullptr && reply->receipt.reservation_id == id;
  };
}

// --- The article's opening scenario -------------------------------------------------------

// Three gateways on three hosts, each with its agent, reserve 600 at once from one bucket of
// 1,000: exactly one is admitted fleet-wide; settling 200 refunds 400; a client that timed out
// retries with the same id and gets the same receipt, through its own agent or another.
TEST_F(AgentFleetTest, OpeningScenarioThroughThreeAgentsAdmitsExactlyOne) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1000})}, &generation));
  for (size_t i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(startAgent(i, ledgerAddress()));

  std::vector<std::unique_ptr<client::BlockingClient>> gateways;
  std::vector<ReserveRequest> requests;
  for (size_t i = 0; i < 3; ++i) {
    gateways.push_back(gateway(i));
    ASSERT_NE(gateways.back(), nullptr);
    requests.push_back(makeReserve({.id = "gateway-" + std::to_string(i), .units = 600}));
  }
  for (size_t i = 0; i < 3; ++i) {
    Result<uint64_t> sent = gateways[i]->send(requests[i], kCallTimeoutMs);
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
  }
  std::vector<AgentAnswer> answers(3);
  int winner = -1;
  for (size_t i = 0; i < 3; ++i) {
    TALLY_ASSIGN_OR_FAIL(answers[i], agentAnswerOf(gateways[i]->receive(kAgentCallTimeoutMs)));
    ASSERT_FALSE(answers[i].is_error) << describe(answers[i]);
    const ReservationReply& reply = answers[i].reply;
    if (reply.code == ReplyCode::kOk) {
      EXPECT_EQ(winner, -1) << "a second reservation was admitted: " << describe(reply);
      winner = static_cast<int>(i);
      EXPECT_EQ(reply.receipt.state, ReservationState::kReserved);
      EXPECT_EQ(reply.receipt.reserved_units, 600u);
      EXPECT_EQ(reply.receipt.policy_generation, generation);
    } else {
      EXPECT_EQ(reply.code, ReplyCode::kRejected) << describe(reply);
      EXPECT_EQ(reply.receipt.limiting_dimension, LimitingDimension::kCapacity) << describe(reply);
    }
  }
  ASSERT_NE(winner, -1) << "none of the three was admitted";
  const ReserveRequest& won = requests[winner];
  client::BlockingClient& gateway_w = *gateways[winner];

  // The ledger agrees: one RESERVED, two REJECTED.
  for (size_t i = 0; i < 3; ++i) {
    TALLY_ASSIGN_OR_FAIL(ReservationReply on_ledger,
                         callReservation(*client_, QueryRequest{requests[i].reservation_id}));
    EXPECT_EQ(on_ledger.receipt.state, static_cast<int>(i) == winner ? ReservationState::kReserved
                                                                     : ReservationState::kRejected)
        << describe(on_ledger);
  }

  TALLY_ASSIGN_OR_FAIL(AgentAnswer started,
                       callAgent(gateway_w, StartRequest{.reservation_id = won.reservation_id,
                                                         .operation_id = "op-1"}));
  ASSERT_TRUE(isOk(started)) << describe(started);
  EXPECT_EQ(started.reply.receipt.state, ReservationState::kStarted);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer settled,
                       callAgent(gateway_w, SettleRequest{.reservation_id = won.reservation_id,
                                                          .operation_id = "op-1",
                                                          .actual_units = 200}));
  ASSERT_TRUE(isOk(settled)) << describe(settled);
  EXPECT_EQ(settled.reply.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(settled.reply.refunded_units, 400u);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer settled_again,
                       callAgent(gateway_w, SettleRequest{.reservation_id = won.reservation_id,
                                                          .operation_id = "op-1",
                                                          .actual_units = 200}));
  EXPECT_TRUE(isOk(settled_again)) << describe(settled_again);
  EXPECT_EQ(settled_again.reply.refunded_units, 0u) << "a duplicate settle refunds nothing";

  // A client timeout: the gateway sends a reserve and gives up before the answer (its
  // connection is gone); it retries with the same id on a new connection, then via another
  // agent. Every answer is the receipt the ledger holds, and it was debited once.
  const ReserveRequest late = makeReserve({.id = "timed-out-client", .units = 300});
  const size_t late_agent = (winner + 1) % 3;
  {
    std::unique_ptr<client::BlockingClient> impatient = gateway(late_agent);
    ASSERT_NE(impatient, nullptr);
    Result<uint64_t> sent = impatient->send(late, kCallTimeoutMs);
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
  }  // closed without reading: the client timed out
  std::unique_ptr<client::BlockingClient> retrying = gateway(late_agent);
  ASSERT_NE(retrying, nullptr);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer retry, callAgent(*retrying, late));
  ASSERT_TRUE(isOk(retry)) << describe(retry);
  EXPECT_EQ(retry.reply.receipt.state, ReservationState::kReserved);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer retry_elsewhere, callAgent(*gateways[(winner + 2) % 3], late));
  ASSERT_TRUE(isOk(retry_elsewhere)) << describe(retry_elsewhere);
  EXPECT_TRUE(retry_elsewhere.reply.duplicate);
  TALLY_ASSIGN_OR_FAIL(ReservationReply on_ledger,
                       callReservation(*client_, QueryRequest{late.reservation_id}));
  EXPECT_EQ(retry.reply.receipt, on_ledger.receipt);
  EXPECT_EQ(retry_elsewhere.reply.receipt, on_ledger.receipt);

  // A query through any agent tells the same story.
  TALLY_ASSIGN_OR_FAIL(AgentAnswer queried,
                       callAgent(*gateways[(winner + 1) % 3], QueryRequest{won.reservation_id}));
  ASSERT_TRUE(isOk(queried)) << describe(queried);
  EXPECT_EQ(queried.reply.receipt, settled.reply.receipt);

  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const AccountView* account = findAccount(audit, {"tenant-1", "chat", generation});
  ASSERT_NE(account, nullptr) << describe(audit);
  EXPECT_EQ(account->balances,
            (Balances{.opening = 1000, .available = 500, .reserved = 300, .spent = 200}))
      << describe(audit);
}

// A gateway that asks the agent for the policy gets the ledger's whole answer: every budget,
// not just the generation (the agent also reads the answer for its own rollout modes).
TEST_F(AgentFleetTest, ShowPolicyThroughTheAgentIsTheLedgersWholePolicy) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 1000}),
                                   makeBudget({.subject = "tenant-2", .burst = 2000})},
                                  &generation));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  std::unique_ptr<client::BlockingClient> gateway_0 = gateway(0);
  ASSERT_NE(gateway_0, nullptr);
  TALLY_ASSIGN_OR_FAIL(wire::Response direct,
                       client_->call(wire::ShowPolicyRequest{}, kCallTimeoutMs));
  const auto* on_ledger = std::get_if<wire::PolicyAnswer>(&direct.body);
  ASSERT_NE(on_ledger, nullptr);
  ASSERT_TRUE(on_ledger->policy.has_value());
  ASSERT_EQ(on_ledger->policy->budgets.size(), 2u);
  // Twice: the first answer may be one the agent also used for its own policy refresh.
  for (int i = 0; i < 2; ++i) {
    TALLY_ASSIGN_OR_FAIL(wire::Response relayed,
                         gateway_0->call(wire::ShowPolicyRequest{}, kAgentCallTimeoutMs));
    const auto* through_agent = std::get_if<wire::PolicyAnswer>(&relayed.body);
    ASSERT_NE(through_agent, nullptr) << wire::describe(relayed.body);
    EXPECT_EQ(through_agent->reply.generation, generation);
    ASSERT_TRUE(through_agent->policy.has_value());
    EXPECT_EQ(through_agent->policy->generation, generation);
    EXPECT_EQ(through_agent->policy->budgets, on_ledger->policy->budgets);
  }
}

// --- Regions (docs/LEDGER.md "Regions") ---------------------------------------------------

// The agent decodes and re-encodes every request: the region must reach the ledger intact, or a
// request from another region would be charged to a budget fenced to eu-west-1.
TEST_F(AgentFleetTest, TheRegionSurvivesTheAgentAndTheLedgerFencesOnIt) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Budget budget = makeBudget({.burst = 1000});
  budget.region = "eu-west-1";
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(publish({budget}, &generation));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);

  const ReserveRequest eu = makeReserve({.id = "eu", .units = 100, .region = "eu-west-1"});
  TALLY_ASSIGN_OR_FAIL(AgentAnswer admitted, callAgent(*gw, eu));
  ASSERT_TRUE(isOk(admitted)) << describe(admitted);
  EXPECT_EQ(admitted.reply.receipt.region, "eu-west-1");
  TALLY_ASSIGN_OR_FAIL(ReservationReply on_ledger,
                       callReservation(*client_, QueryRequest{eu.reservation_id}));
  EXPECT_EQ(on_ledger.receipt.region, "eu-west-1") << describe(on_ledger);

  TALLY_ASSIGN_OR_FAIL(AgentAnswer none, callAgent(*gw, makeReserve({.id = "none", .units = 100})));
  ASSERT_TRUE(isOk(none)) << describe(none);

  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer us,
      callAgent(*gw, makeReserve({.id = "us", .units = 100, .region = "us-east-1"})));
  ASSERT_FALSE(us.is_error) << describe(us);
  EXPECT_EQ(us.reply.code, ReplyCode::kRejected) << describe(us);
  EXPECT_EQ(us.reply.receipt.limiting_dimension, LimitingDimension::kNoBudget) << describe(us);
  EXPECT_EQ(us.reply.receipt.region, "us-east-1");
  EXPECT_NE(us.reply.message.find("region 'us-east-1'"), std::string::npos) << describe(us);
  EXPECT_NE(us.reply.message.find("region 'eu-west-1'"), std::string::npos) << describe(us);

  // The same id and digest from another region is another request (the ledger compares the
  // region itself, not only the digest the gateway sent).
  ReserveRequest moved = eu;
  moved.region = "us-east-1";
  TALLY_ASSIGN_OR_FAIL(AgentAnswer conflict, callAgent(*gw, moved));
  ASSERT_FALSE(conflict.is_error) << describe(conflict);
  EXPECT_EQ(conflict.reply.code, ReplyCode::kIdempotencyConflict) << describe(conflict);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer again, callAgent(*gw, eu));
  EXPECT_TRUE(isOk(again) && again.reply.duplicate) << describe(again);

  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const AccountView* account = findAccount(audit, {"tenant-1", "chat", generation});
  ASSERT_NE(account, nullptr) << describe(audit);
  EXPECT_EQ(account->balances, (Balances{.opening = 1000, .available = 800, .reserved = 200}))
      << describe(audit);
}

// --- Lost answers ---------------------------------------------------------------------------

// Each agent reaches the ledger through its own proxy, which loses the ledger's answer about a
// chosen reservation at a chosen step (reserve, start or settle). The agent must resolve by
// querying with the same id; the gateway may retry, always with the same id. In the end every
// reservation is settled exactly once with its actual, and the audit's reserved and spent
// match the settled work to the unit.
TEST_F(AgentFleetTest, LostAnswersResolveByQueryAndNothingIsDebitedTwice) {
  std::mt19937_64 rng(testSeed("LostAnswers"));
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}, &generation));
  AgentSettings settings;
  settings.failures_to_partition = 1000;  // lost answers alone must not partition the link
  settings.partition_after_ms = 600'000;
  for (size_t i = 0; i < 3; ++i) {
    FaultProxy& proxy = addProxy();
    ASSERT_NO_FATAL_FAILURE(startAgent(i, proxy.address(), settings));
  }
  std::vector<std::unique_ptr<client::BlockingClient>> gateways;
  for (size_t i = 0; i < 3; ++i) {
    gateways.push_back(gateway(i));
    ASSERT_NE(gateways.back(), nullptr);
  }

  struct Cycle {
    std::string id;
    size_t agent = 0;
    Units units = 0;
    Units actual = 0;
  };
  constexpr int kCycles = 24;
  std::vector<Cycle> cycles;
  uint64_t drops_planned = 0;
  for (int n = 0; n < kCycles; ++n) {
    Cycle& cycle = cycles.emplace_back();
    cycle.id = "lost-" + std::to_string(n);
    cycle.agent = static_cast<size_t>(n % 3);
    cycle.units = 1 + rng() % 100;
    cycle.actual = rng() % (cycle.units + 1);
    // Which steps lose their first answer: a bit per step, never none for a third of cycles.
    const uint64_t lose = (n % 3 == 0) ? (1 + rng() % 7) : (rng() % 8);
    FaultProxy& proxy = *proxies_[cycle.agent];
    client::BlockingClient& gw = *gateways[cycle.agent];
    SCOPED_TRACE(cycle.id + " lose mask " + std::to_string(lose));

    const std::vector<wire::RequestBody> steps = {
        makeReserve({.id = cycle.id, .units = cycle.units}),
        StartRequest{.reservation_id = cycle.id, .operation_id = "op-" + cycle.id},
        SettleRequest{.reservation_id = cycle.id,
                      .operation_id = "op-" + cycle.id,
                      .actual_units = cycle.actual}};
    for (size_t step = 0; step < steps.size(); ++step) {
      const uint64_t dropped_before = proxy.counters().replies_dropped;
      if ((lose >> step) & 1) {
        proxy.dropNextReplies(1, aboutReservation(cycle.id));
        ++drops_planned;
      }
      const AgentAnswer answer = callUntilDefinitive(gw, steps[step]);
      proxy.clearFaults();
      if ((lose >> step) & 1) {
        EXPECT_EQ(proxy.counters().replies_dropped, dropped_before + 1)
            << "step " << step << ": the planned answer was not lost";
      }
      if (step < 2) {
        ASSERT_TRUE(isOk(answer)) << "step " << step << ": " << describe(answer);
        EXPECT_EQ(answer.reply.receipt.reservation_id, cycle.id);
        EXPECT_EQ(answer.reply.receipt.reserved_units, cycle.units) << describe(answer);
        EXPECT_EQ(answer.reply.receipt.state,
                  step == 0 ? ReservationState::kReserved : ReservationState::kStarted)
            << describe(answer);
      } else {
        // A settle whose answer was lost may be queued in the outbox instead.
        ASSERT_TRUE(isOk(answer) || isQueued(answer)) << describe(answer);
      }
    }
  }

  Units spent = 0;
  for (const Cycle& cycle : cycles) {
    const ReservationReply final_state = waitForLedger(
        cycle.id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
    EXPECT_TRUE(settledState(final_state.receipt.state)) << describe(final_state);
    EXPECT_EQ(final_state.receipt.reserved_units, cycle.units) << describe(final_state);
    EXPECT_EQ(final_state.receipt.actual_units, cycle.actual) << describe(final_state);
    EXPECT_EQ(final_state.receipt.refunded_units, cycle.units - cycle.actual)
        << describe(final_state);
    spent += cycle.actual;
    // A late duplicate refunds nothing.
    TALLY_ASSIGN_OR_FAIL(ReservationReply again,
                         callReservation(*client_, SettleRequest{.reservation_id = cycle.id,
                                                                 .operation_id = "op-" + cycle.id,
                                                                 .actual_units = cycle.actual}));
    EXPECT_TRUE(again.duplicate) << describe(again);
    EXPECT_EQ(again.refunded_units, 0u);
  }
  uint64_t dropped = 0;
  for (const auto& proxy : proxies_) dropped += proxy->counters().replies_dropped;
  EXPECT_EQ(dropped, drops_planned);
  std::cout << "[ lost     ] " << drops_planned << " answers lost over " << kCycles << " cycles"
            << std::endl;

  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, 0u) << describe(audit);
  EXPECT_EQ(sum.spent, spent) << "debited twice or lost: " << describe(audit);
  EXPECT_EQ(sum.available, 1'000'000u - spent) << describe(audit);

  // Nothing is left unresolved at the agents.
  for (const auto& agent : agents_) {
    TALLY_ASSIGN_OR_FAIL(std::string metrics, httpGet(agent->metricsPort(), "/metrics", 5'000));
    EXPECT_EQ(metricSum(metrics, "tally_agent_reservation_unknown"), 0) << agent->name();
  }
}

// --- Partition ------------------------------------------------------------------------------

// What one gateway thread of the load did with one reservation.
struct LoadCycle {
  std::string id;
  Units units = 0;
  Units actual = 0;
  bool reserve_acked = false;      // RESERVED
  bool reserve_uncertain = false;  // sent, answered with a partition rejection or nothing
  bool started = false;
  bool settle_sent = false;
  bool settle_acked = false;  // OK or QUEUED: the agent promised it
};

// Reserve → start → settle through one agent until stop or the first answer that is not a
// success: the ledger stopped answering mid-cycle.
void runLoad(AgentInstance& agent, const std::string& prefix, std::atomic<bool>& stop,
             std::atomic<uint64_t>& completed, std::vector<LoadCycle>* out) {
  Result<std::unique_ptr<client::BlockingClient>> connected = agent.connect();
  if (!connected.isOk()) return;
  client::BlockingClient& gw = *connected.value();
  std::mt19937_64 rng(std::hash<std::string>{}(prefix));
  for (int n = 0; !stop.load(); ++n) {
    LoadCycle& cycle = out->emplace_back();
    cycle.id = prefix + "-" + std::to_string(n);
    cycle.units = 1 + rng() % 100;
    cycle.actual = rng() % (cycle.units + 1);
    Result<AgentAnswer> reserved =
        callAgent(gw, makeReserve({.id = cycle.id, .units = cycle.units}));
    if (!reserved.isOk() || !isOk(reserved.value())) {
      cycle.reserve_uncertain = true;
      return;
    }
    cycle.reserve_acked = true;
    Result<AgentAnswer> started =
        callAgent(gw, StartRequest{.reservation_id = cycle.id, .operation_id = "op-" + cycle.id});
    if (!started.isOk() || !isOk(started.value())) return;
    cycle.started = true;
    cycle.settle_sent = true;
    Result<AgentAnswer> settled = callAgent(gw, SettleRequest{.reservation_id = cycle.id,
                                                              .operation_id = "op-" + cycle.id,
                                                              .actual_units = cycle.actual});
    if (!settled.isOk() || !(isOk(settled.value()) || isQueued(settled.value()))) return;
    cycle.settle_acked = true;
    ++completed;
    if (!isOk(settled.value())) return;  // queued: the ledger is gone
  }
}

// The ledger freezes (SIGSTOP) under load from three agents, then dies (kill -9) and comes back
// on the same data dir at a new port, behind the proxy's stable address. Meanwhile: start fails
// retryably, reserve is rejected "ledger-unavailable", settles are QUEUED. Afterwards every
// acknowledged settle has landed exactly once, and every uncertain reserve resolves with its id.
TEST_F(AgentFleetTest, PartitionQueuesSettlesThatLandExactlyOnceAfterTheLedgerReturns) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  FaultProxy& proxy = addProxy();
  AgentSettings settings;
  settings.failures_to_partition = 2;
  settings.partition_after_ms = 1'000;
  for (size_t i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(startAgent(i, proxy.address(), settings));

  // Before the partition: per agent, 8 reservations started (to be settled during it) and 2
  // only reserved (to be started during it).
  struct Held {
    std::string id;
    size_t agent = 0;
    Units units = 0;
    Units actual = 0;
    bool started = false;
  };
  std::vector<Held> held;
  std::vector<std::unique_ptr<client::BlockingClient>> gateways;
  for (size_t a = 0; a < 3; ++a) {
    gateways.push_back(gateway(a));
    ASSERT_NE(gateways.back(), nullptr);
    for (int n = 0; n < 10; ++n) {
      Held& h = held.emplace_back();
      h.id = "held-" + std::to_string(a) + "-" + std::to_string(n);
      h.agent = a;
      h.units = 50 + n;
      h.actual = 10 + n;
      h.started = n < 8;
      TALLY_ASSIGN_OR_FAIL(AgentAnswer r,
                           callAgent(*gateways[a], makeReserve({.id = h.id, .units = h.units})));
      ASSERT_TRUE(isOk(r)) << describe(r);
      if (h.started) {
        TALLY_ASSIGN_OR_FAIL(AgentAnswer s,
                             callAgent(*gateways[a], StartRequest{h.id, "op-" + h.id}));
        ASSERT_TRUE(isOk(s)) << describe(s);
      }
    }
  }

  // Load, then the ledger freezes mid-load.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> completed{0};
  std::vector<std::vector<LoadCycle>> loads(3);
  std::vector<std::thread> threads;
  for (size_t a = 0; a < 3; ++a) {
    threads.emplace_back(runLoad, std::ref(*agents_[a]), "load-" + std::to_string(a),
                         std::ref(stop), std::ref(completed), &loads[a]);
  }
  const auto load_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (completed.load() < 30 && std::chrono::steady_clock::now() < load_deadline) pauseMs(5);
  ASSERT_GE(completed.load(), 30u) << "the load did not get going";
  ASSERT_TRUE(ledger_.running());
  ASSERT_TRUE(ledger_.signal(SIGSTOP));

  // During the partition. Settles are queued durably (or, if the agent had not noticed yet,
  // forwarded and queued once their answer did not come).
  for (const Held& h : held) {
    if (!h.started) continue;
    TALLY_ASSIGN_OR_FAIL(AgentAnswer settled,
                         callAgent(*gateways[h.agent], SettleRequest{.reservation_id = h.id,
                                                                     .operation_id = "op-" + h.id,
                                                                     .actual_units = h.actual}));
    EXPECT_TRUE(isQueued(settled)) << h.id << ": " << describe(settled);
  }
  // Only the ledger can grant a start: retryable unavailable.
  for (const Held& h : held) {
    if (h.started) continue;
    TALLY_ASSIGN_OR_FAIL(AgentAnswer start,
                         callAgent(*gateways[h.agent], StartRequest{h.id, "op-" + h.id}));
    EXPECT_TRUE(isUnavailable(start)) << h.id << ": " << describe(start);
  }
  // New admissions: rejected with a Retry-After, limiting dimension "ledger-unavailable".
  for (size_t a = 0; a < 3; ++a) {
    TALLY_ASSIGN_OR_FAIL(
        AgentAnswer reserve,
        callAgent(*gateways[a], makeReserve({.id = "during-" + std::to_string(a), .units = 5})));
    ASSERT_FALSE(reserve.is_error) << describe(reserve);
    EXPECT_EQ(reserve.reply.code, ReplyCode::kRejected) << describe(reserve);
    EXPECT_EQ(reserve.reply.receipt.limiting_dimension, LimitingDimension::kLedgerUnavailable)
        << describe(reserve);
    EXPECT_GT(reserve.reply.receipt.retry_after_ms, 0) << describe(reserve);
  }
  stop = true;
  for (std::thread& thread : threads) thread.join();
  for (const auto& agent : agents_) {
    TALLY_ASSIGN_OR_FAIL(std::string metrics, httpGet(agent->metricsPort(), "/metrics", 5'000));
    EXPECT_GE(metricSum(metrics, "tally_agent_outbox_depth"), 1) << agent->name();
    EXPECT_EQ(metricSum(metrics, "tally_agent_ledger_health", {{"state", "PARTITIONED"}}), 2)
        << agent->name() << "\n"
        << metrics;
  }

  // The ledger dies while frozen and restarts on its data dir, at a new port behind the proxy.
  ledger_.kill9();
  proxy.severAll();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  proxy.setUpstreamPort(ledger_.port());

  Units spent = 0;
  for (const Held& h : held) {
    if (!h.started) continue;
    const ReservationReply landed = waitForLedger(
        h.id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
    EXPECT_TRUE(settledState(landed.receipt.state)) << describe(landed);
    EXPECT_EQ(landed.receipt.actual_units, h.actual) << describe(landed);
    spent += h.actual;
  }
  size_t queued_in_load = 0;
  for (size_t a = 0; a < 3; ++a) {
    for (LoadCycle& cycle : loads[a]) {
      SCOPED_TRACE(cycle.id);
      if (cycle.settle_acked) {
        const ReservationReply landed = waitForLedger(
            cycle.id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
        EXPECT_TRUE(settledState(landed.receipt.state)) << describe(landed);
        EXPECT_EQ(landed.receipt.actual_units, cycle.actual) << describe(landed);
        spent += cycle.actual;
        ++queued_in_load;
        continue;
      }
      // Unfinished cycles resolve with their own id: the reserve is retried (same id, same
      // digest) and then released, or settled if it had started.
      AgentAnswer reserve =
          callUntilDefinitive(*gateways[a], makeReserve({.id = cycle.id, .units = cycle.units}));
      ASSERT_TRUE(isOk(reserve)) << describe(reserve);
      if (reserve.reply.receipt.state == ReservationState::kStarted || cycle.started) {
        AgentAnswer settle =
            callUntilDefinitive(*gateways[a], SettleRequest{.reservation_id = cycle.id,
                                                            .operation_id = "op-" + cycle.id,
                                                            .actual_units = cycle.actual});
        ASSERT_TRUE(isOk(settle) || isQueued(settle)) << describe(settle);
        const ReservationReply landed = waitForLedger(
            cycle.id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
        EXPECT_EQ(landed.receipt.actual_units, cycle.actual) << describe(landed);
        spent += cycle.actual;
      } else if (reserve.reply.receipt.state == ReservationState::kReserved) {
        AgentAnswer release =
            callUntilDefinitive(*gateways[a], ReleaseRequest{.reservation_id = cycle.id});
        ASSERT_TRUE(isOk(release) || isQueued(release)) << describe(release);
        waitForLedger(cycle.id, [](const ReservationReply& r) {
          return r.receipt.state == ReservationState::kReleased;
        });
      }
    }
  }
  // The held-but-unstarted ones can start now, then be released by settling 0.
  for (const Held& h : held) {
    if (h.started) continue;
    AgentAnswer start = callUntilDefinitive(*gateways[h.agent], StartRequest{h.id, "op-" + h.id});
    ASSERT_TRUE(isOk(start)) << describe(start);
    AgentAnswer settle =
        callUntilDefinitive(*gateways[h.agent], SettleRequest{.reservation_id = h.id,
                                                              .operation_id = "op-" + h.id,
                                                              .actual_units = h.actual});
    ASSERT_TRUE(isOk(settle) || isQueued(settle)) << describe(settle);
    waitForLedger(h.id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
    spent += h.actual;
  }
  std::cout << "[ partition] load cycles settled: " << queued_in_load << std::endl;

  // Duplicate deliveries refund nothing; the books balance to the unit.
  for (const Held& h : held) {
    TALLY_ASSIGN_OR_FAIL(ReservationReply again,
                         callReservation(*client_, SettleRequest{.reservation_id = h.id,
                                                                 .operation_id = "op-" + h.id,
                                                                 .actual_units = h.actual}));
    EXPECT_TRUE(again.duplicate) << describe(again);
    EXPECT_EQ(again.refunded_units, 0u) << describe(again);
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.spent, spent) << describe(audit);
  EXPECT_EQ(sum.reserved, 0u) << describe(audit);
  for (const auto& agent : agents_) {
    TALLY_ASSIGN_OR_FAIL(std::string metrics, httpGet(agent->metricsPort(), "/metrics", 5'000));
    EXPECT_EQ(metricSum(metrics, "tally_agent_outbox_depth"), 0) << agent->name();
  }
}

// --- Agent crash ----------------------------------------------------------------------------

// Settles acknowledged as QUEUED while the ledger is blackholed are in the agent's durable
// outbox: kill -9 of the agent loses none of them. Restarted on the same data dir, with the
// ledger reachable again, it delivers every one, exactly once.
TEST_F(AgentFleetTest, AgentKilledWithANonEmptyOutboxDeliversEverythingAcknowledged) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  FaultProxy& proxy = addProxy();
  AgentSettings settings;
  settings.failures_to_partition = 2;
  settings.partition_after_ms = 1'000;
  ASSERT_NO_FATAL_FAILURE(startAgent(0, proxy.address(), settings));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);

  constexpr int kCount = 40;
  std::vector<wire::RequestBody> reserves, starts, settles;
  Units spent = 0;
  for (int n = 0; n < kCount; ++n) {
    const std::string id = "crash-" + std::to_string(n);
    reserves.push_back(makeReserve({.id = id, .units = 100}));
    starts.push_back(StartRequest{.reservation_id = id, .operation_id = "op-" + id});
    settles.push_back(SettleRequest{
        .reservation_id = id, .operation_id = "op-" + id, .actual_units = static_cast<Units>(n)});
    spent += static_cast<Units>(n);
  }
  for (const auto* bodies : {&reserves, &starts}) {
    for (const Result<AgentAnswer>& answer : callAgentPipelined(*gw, *bodies)) {
      ASSERT_TRUE(answer.isOk()) << answer.status().toString();
      ASSERT_TRUE(isOk(answer.value())) << describe(answer.value());
    }
  }

  proxy.blackhole(true);
  for (const Result<AgentAnswer>& answer : callAgentPipelined(*gw, settles)) {
    ASSERT_TRUE(answer.isOk()) << answer.status().toString();
    ASSERT_TRUE(isQueued(answer.value())) << describe(answer.value());
  }
  // Nothing reached the ledger.
  for (int n = 0; n < kCount; ++n) {
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply on_ledger,
        callReservation(*client_, QueryRequest{.reservation_id = "crash-" + std::to_string(n)}));
    EXPECT_EQ(on_ledger.receipt.state, ReservationState::kStarted) << describe(on_ledger);
  }

  agents_[0]->kill9();
  gw.reset();
  ASSERT_NO_FATAL_FAILURE(startAgent(0, proxy.address(), settings));
  proxy.blackhole(false);
  proxy.severAll();  // the restarted agent's blackholed connection: make it reconnect now

  for (int n = 0; n < kCount; ++n) {
    const std::string id = "crash-" + std::to_string(n);
    const ReservationReply landed =
        waitForLedger(id, [](const ReservationReply& r) { return settledState(r.receipt.state); });
    EXPECT_TRUE(settledState(landed.receipt.state)) << describe(landed);
    EXPECT_EQ(landed.receipt.actual_units, static_cast<Units>(n)) << describe(landed);
    EXPECT_EQ(landed.receipt.refunded_units, 100u - static_cast<Units>(n)) << describe(landed);
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.spent, spent) << describe(audit);
  EXPECT_EQ(sum.reserved, 0u) << describe(audit);
  // The restarted agent's outbox drains to empty and it answers queries from the ledger.
  gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer queried,
                       callAgent(*gw, QueryRequest{.reservation_id = "crash-7"}));
  ASSERT_TRUE(isOk(queried)) << describe(queried);
  EXPECT_EQ(queried.reply.receipt.actual_units, 7u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  double depth = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<std::string> metrics = httpGet(agents_[0]->metricsPort(), "/metrics", 5'000);
    if (metrics.isOk() && (depth = metricSum(metrics.value(), "tally_agent_outbox_depth")) == 0) {
      break;
    }
    pauseMs(50);
  }
  EXPECT_EQ(depth, 0);
}

// --- Bad input on the agent socket -----------------------------------------------------------

class AgentBadInputTest : public AgentFleetTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(startLedger());
    ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
    ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
    ASSERT_NO_FATAL_FAILURE(startAgent(1, ledgerAddress()));
    AgentSettings strict;
    // Neither root nor this test's uid/gid: every local peer is refused.
    strict.extra_toml = "allowed_uids = [12345]\nallowed_gids = [12345]\n";
    ASSERT_NO_FATAL_FAILURE(startAgent(2, ledgerAddress(), strict));
    healthy_ = gateway(0);
    ASSERT_NE(healthy_, nullptr);
    other_ = gateway(1);
    ASSERT_NE(other_, nullptr);
  }

  std::unique_ptr<RawSocket> rawConnect(size_t agent) {
    std::string error;
    std::unique_ptr<RawSocket> socket =
        RawSocket::connectUnix(agents_.at(agent)->socketPath(), kCallTimeoutMs, &error);
    EXPECT_NE(socket, nullptr) << error;
    return socket;
  }

  // Both other gateways are still served, by agent 0 (the one attacked) and agent 1.
  void expectHealthy(const std::string& after) {
    SCOPED_TRACE("healthy gateways after " + after);
    ASSERT_TRUE(agents_[0]->running()) << "agent0 exited";
    for (client::BlockingClient* gw : {healthy_.get(), other_.get()}) {
      const std::string id = "healthy-" + std::to_string(checks_++);
      TALLY_ASSIGN_OR_FAIL(AgentAnswer reserved,
                           callAgent(*gw, makeReserve({.id = id, .units = 1})));
      EXPECT_TRUE(isOk(reserved)) << describe(reserved);
    }
  }

  void readResponse(RawSocket& socket, wire::Response* response) {
    std::vector<uint8_t> payload;
    const RawSocket::Read read = socket.readFrame(&payload, kReadTimeoutMs);
    ASSERT_EQ(read, RawSocket::Read::kFrame) << RawSocket::readName(read);
    TALLY_ASSIGN_OR_FAIL(*response, wire::decodeResponse(payload));
  }

  void expectError(const wire::Response& response, wire::ErrorCode code) {
    const auto* error = std::get_if<wire::ErrorReply>(&response.body);
    ASSERT_NE(error, nullptr) << wire::describe(response.body);
    EXPECT_EQ(error->code, code) << error->message;
    EXPECT_FALSE(error->message.empty()) << "errors say what was wrong";
  }

  void expectClosed(RawSocket& socket) {
    std::vector<uint8_t> payload;
    const RawSocket::Read read = socket.readFrame(&payload, kReadTimeoutMs);
    EXPECT_TRUE(read == RawSocket::Read::kClosed || read == RawSocket::Read::kReset)
        << RawSocket::readName(read);
  }

  std::unique_ptr<client::BlockingClient> healthy_;
  std::unique_ptr<client::BlockingClient> other_;
  int checks_ = 0;
};

TEST_F(AgentBadInputTest, SocketIsCreatedWithMode0660) {
  struct stat info {};
  ASSERT_EQ(::stat(agents_[0]->socketPath().c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0660u);
}

TEST_F(AgentBadInputTest, OversizedFrameGetsFrameTooLargeThenClose) {
  std::unique_ptr<RawSocket> bad = rawConnect(0);
  ASSERT_NE(bad, nullptr);
  ASSERT_TRUE(bad->sendAll(frameHeader(2u << 20), kCallTimeoutMs));
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kFrameTooLarge));
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("an oversized frame"));
}

TEST_F(AgentBadInputTest, GarbageInsideAWellFormedLengthGetsMalformedFrame) {
  std::unique_ptr<RawSocket> bad = rawConnect(0);
  ASSERT_NE(bad, nullptr);
  const std::vector<std::vector<uint8_t>> garbage = {
      std::vector<uint8_t>(24, 0xff),
      std::vector<uint8_t>(5, 0x00),
      {0, 0, 0, 0, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
  };
  for (const std::vector<uint8_t>& payload : garbage) {
    SCOPED_TRACE("garbage of " + std::to_string(payload.size()) + " bytes");
    std::vector<uint8_t> frame = frameHeader(static_cast<uint32_t>(payload.size()));
    frame.insert(frame.end(), payload.begin(), payload.end());
    std::unique_ptr<RawSocket> socket = rawConnect(0);
    ASSERT_NE(socket, nullptr);
    ASSERT_TRUE(socket->sendAll(frame, kCallTimeoutMs));
    wire::Response response;
    ASSERT_NO_FATAL_FAILURE(readResponse(*socket, &response));
    ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kMalformedFrame));
    ASSERT_NO_FATAL_FAILURE(expectHealthy("a garbage frame"));
  }
  // Pure noise without framing either: an error or a close, never a crash.
  std::vector<uint8_t> noise(4096);
  std::mt19937 rng(7);
  for (uint8_t& byte : noise) byte = static_cast<uint8_t>(rng());
  noise[0] = 0x40;  // a length within bounds (16,448 bytes), more than is sent
  noise[1] = 0x40;
  noise[2] = 0;
  noise[3] = 0;
  (void)bad->sendAll(noise, kCallTimeoutMs);
  bad->shutdownWrite();
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("noise"));
}

TEST_F(AgentBadInputTest, TruncatedFrameThenCloseAffectsNoOne) {
  std::unique_ptr<RawSocket> bad = rawConnect(0);
  ASSERT_NE(bad, nullptr);
  std::vector<uint8_t> frame = requestFrame(7, makeReserve({.id = "truncated", .units = 5}));
  frame.resize(frame.size() / 2);
  ASSERT_TRUE(bad->sendAll(frame, kCallTimeoutMs));
  bad->shutdownWrite();
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a truncated frame"));
  TALLY_ASSIGN_OR_FAIL(ReservationReply query,
                       callReservation(*client_, QueryRequest{.reservation_id = "truncated"}));
  EXPECT_EQ(query.code, ReplyCode::kNotFound) << describe(query);
}

TEST_F(AgentBadInputTest, ValidRequestsOnARawConnectionAreAnsweredUnderTheirIds) {
  std::unique_ptr<RawSocket> raw = rawConnect(0);
  ASSERT_NE(raw, nullptr);
  // Pipelined in one write: three requests, answered under their own ids.
  std::vector<uint8_t> bytes;
  for (uint64_t id : {11u, 12u, 13u}) {
    const std::vector<uint8_t> frame =
        requestFrame(id, makeReserve({.id = "raw-" + std::to_string(id), .units = 2}));
    bytes.insert(bytes.end(), frame.begin(), frame.end());
  }
  ASSERT_TRUE(raw->sendAll(bytes, kCallTimeoutMs));
  std::set<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    wire::Response response;
    ASSERT_NO_FATAL_FAILURE(readResponse(*raw, &response));
    ids.insert(response.request_id);
    const auto* reply = std::get_if<ReservationReply>(&response.body);
    ASSERT_NE(reply, nullptr) << wire::describe(response.body);
    EXPECT_EQ(reply->code, ReplyCode::kOk) << describe(*reply);
  }
  EXPECT_EQ(ids, (std::set<uint64_t>{11, 12, 13}));
}

TEST_F(AgentBadInputTest, DisallowedUidIsRefusedWithAClearErrorAndOthersAreServed) {
  std::unique_ptr<RawSocket> refused = rawConnect(2);
  ASSERT_NE(refused, nullptr);
  // The agent may answer before reading anything; a request makes the refusal observable
  // either way (or is answered with the same error).
  (void)refused->sendAll(requestFrame(1, wire::HealthRequest{}), kCallTimeoutMs);
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*refused, &response));
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kPermissionDenied));
  ASSERT_NO_FATAL_FAILURE(expectClosed(*refused));
  // Nothing it sent reached the ledger; the log names the refused peer.
  Result<std::unique_ptr<client::BlockingClient>> blocked = agents_[2]->connect();
  if (blocked.isOk()) {
    Result<AgentAnswer> answer =
        callAgent(*blocked.value(), makeReserve({.id = "refused", .units = 1}), 5'000);
    EXPECT_TRUE(!answer.isOk() || (answer.value().is_error &&
                                   answer.value().error.code == wire::ErrorCode::kPermissionDenied))
        << (answer.isOk() ? describe(answer.value()) : answer.status().toString());
  }
  TALLY_ASSIGN_OR_FAIL(ReservationReply query,
                       callReservation(*client_, QueryRequest{.reservation_id = "refused"}));
  EXPECT_EQ(query.code, ReplyCode::kNotFound) << describe(query);
  const std::string log = agents_[2]->log();
  EXPECT_NE(log.find("uid"), std::string::npos) << log;
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a refused peer"));
}

// --- Rollout modes ---------------------------------------------------------------------------

// Per route: `shadow` asks the ledger and records its decision but always admits; `off` admits
// without asking. The ledger is called, or not, exactly as stated; /metrics counts the
// rejections shadow mode did not enforce; `enforce` next to them still rejects.
TEST_F(AgentFleetTest, ShadowAndOffModesAlwaysAdmitAndCountWouldBeRejections) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Budget shadowed = makeBudget({.route = "shadowed", .burst = 100});
  shadowed.rollout.mode = RolloutMode::kShadow;
  Budget dark = makeBudget({.route = "dark", .burst = 100});
  dark.rollout.mode = RolloutMode::kOff;
  Budget enforced = makeBudget({.route = "enforced", .burst = 100});
  ASSERT_NO_FATAL_FAILURE(publish({shadowed, dark, enforced}));
  for (size_t i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(startAgent(i, ledgerAddress()));
  std::vector<std::unique_ptr<client::BlockingClient>> gateways;
  for (size_t i = 0; i < 3; ++i) {
    gateways.push_back(gateway(i));
    ASSERT_NE(gateways.back(), nullptr);
  }

  // The agents learn the policy from the ledger: wait (bounded) until agent i treats "dark" as
  // off, probing with ids that the ledger must then not know.
  for (size_t i = 0; i < 3; ++i) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool off_seen = false;
    for (int probe = 0; !off_seen && std::chrono::steady_clock::now() < deadline; ++probe) {
      const std::string id = "probe-" + std::to_string(i) + "-" + std::to_string(probe);
      TALLY_ASSIGN_OR_FAIL(AgentAnswer answer,
                           callAgent(*gateways[i], makeReserve({.id = id, .route = "dark"})));
      TALLY_ASSIGN_OR_FAIL(ReservationReply on_ledger,
                           callReservation(*client_, QueryRequest{.reservation_id = id}));
      off_seen = on_ledger.code == ReplyCode::kNotFound;
      if (!off_seen) {
        // The agent had not loaded the policy yet and enforced (its documented default): give
        // the probe's unit back so the books below stay exact.
        TALLY_ASSIGN_OR_FAIL(ReservationReply released,
                             callReservation(*client_, ReleaseRequest{.reservation_id = id}));
        ASSERT_EQ(released.code, ReplyCode::kOk) << describe(released);
        pauseMs(50);
      }
    }
    ASSERT_TRUE(off_seen) << "agent" << i << " never applied the policy's rollout modes";
  }

  // shadow: 3 × 60 of 100 — the ledger reserves one and rejects two; the agents admit all.
  for (size_t i = 0; i < 3; ++i) {
    const std::string id = "shadow-" + std::to_string(i);
    TALLY_ASSIGN_OR_FAIL(
        AgentAnswer answer,
        callAgent(*gateways[i], makeReserve({.id = id, .route = "shadowed", .units = 60})));
    EXPECT_TRUE(isOk(answer)) << id << ": " << describe(answer);
    EXPECT_EQ(answer.reply.receipt.state, ReservationState::kReserved) << describe(answer);
  }
  int ledger_reserved = 0;
  int ledger_rejected = 0;
  for (size_t i = 0; i < 3; ++i) {
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply on_ledger,
        callReservation(*client_, QueryRequest{.reservation_id = "shadow-" + std::to_string(i)}));
    ASSERT_NE(on_ledger.code, ReplyCode::kNotFound) << "shadow mode must call the ledger";
    if (on_ledger.receipt.state == ReservationState::kReserved) ++ledger_reserved;
    if (on_ledger.receipt.state == ReservationState::kRejected) ++ledger_rejected;
  }
  EXPECT_EQ(ledger_reserved, 1);
  EXPECT_EQ(ledger_rejected, 2);

  // off: 3 × 60 admitted, the ledger never hears of them.
  for (size_t i = 0; i < 3; ++i) {
    const std::string id = "dark-" + std::to_string(i);
    TALLY_ASSIGN_OR_FAIL(
        AgentAnswer answer,
        callAgent(*gateways[i], makeReserve({.id = id, .route = "dark", .units = 60})));
    EXPECT_TRUE(isOk(answer)) << id << ": " << describe(answer);
    TALLY_ASSIGN_OR_FAIL(ReservationReply on_ledger,
                         callReservation(*client_, QueryRequest{.reservation_id = id}));
    EXPECT_EQ(on_ledger.code, ReplyCode::kNotFound) << "off mode must not call the ledger";
    // Its follow-ups stay local and succeed.
    TALLY_ASSIGN_OR_FAIL(AgentAnswer start, callAgent(*gateways[i], StartRequest{id, "op-" + id}));
    EXPECT_TRUE(isOk(start)) << describe(start);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer settle,
                         callAgent(*gateways[i], SettleRequest{id, "op-" + id, 10}));
    EXPECT_TRUE(isOk(settle)) << describe(settle);
  }

  // enforce, for contrast: the second 60 of 100 is rejected.
  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer first,
      callAgent(*gateways[0], makeReserve({.id = "enforced-0", .route = "enforced", .units = 60})));
  EXPECT_TRUE(isOk(first)) << describe(first);
  TALLY_ASSIGN_OR_FAIL(
      AgentAnswer second,
      callAgent(*gateways[1], makeReserve({.id = "enforced-1", .route = "enforced", .units = 60})));
  EXPECT_EQ(second.reply.code, ReplyCode::kRejected) << describe(second);

  // The would-be rejections are counted, fleet-wide: two, both on capacity.
  double would_reject = 0;
  double shadow_admitted = 0;
  for (const auto& agent : agents_) {
    TALLY_ASSIGN_OR_FAIL(std::string metrics, httpGet(agent->metricsPort(), "/metrics", 5'000));
    would_reject += metricSum(metrics, "tally_agent_shadow_decisions_total",
                              {{"outcome", "rejected"}, {"dimension", "capacity"}});
    shadow_admitted +=
        metricSum(metrics, "tally_agent_shadow_decisions_total", {{"outcome", "admitted"}});
  }
  EXPECT_EQ(would_reject, 2);
  EXPECT_EQ(shadow_admitted, 1);

  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  EXPECT_EQ(sumBalances(audit, {"tenant-1", "dark"}).reserved, 0u) << describe(audit);
}

// SIGTERM drains: in-flight work is answered, the agent exits 0.
TEST_F(AgentFleetTest, SigtermDrainsAndExitsZero) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);
  std::vector<wire::RequestBody> reserves;
  for (int n = 0; n < 200; ++n) {
    reserves.push_back(makeReserve({.id = "drain-" + std::to_string(n), .units = 1}));
  }
  for (const wire::RequestBody& body : reserves) {
    ASSERT_TRUE(gw->send(body, kCallTimeoutMs).isOk());
  }
  ASSERT_TRUE(agents_[0]->signal(SIGTERM));
  // Every request that was sent gets an answer (or the connection closes after the agent
  // answered what it had read); whatever was answered OK is on the ledger.
  int answered = 0;
  for (size_t i = 0; i < reserves.size(); ++i) {
    Result<AgentAnswer> answer = agentAnswerOf(gw->receive(kAgentCallTimeoutMs));
    if (!answer.isOk()) break;
    ++answered;
    if (isOk(answer.value())) {
      TALLY_ASSIGN_OR_FAIL(
          ReservationReply on_ledger,
          callReservation(*client_, QueryRequest{.reservation_id =
                                                     answer.value().reply.receipt.reservation_id}));
      EXPECT_EQ(on_ledger.receipt.state, ReservationState::kReserved) << describe(on_ledger);
    }
  }
  EXPECT_EQ(agents_[0]->waitExit(kExitTimeoutMs), 0) << "exit code after SIGTERM";
  std::cout << "[ drain    ] " << answered << " of " << reserves.size() << " answered before close"
            << std::endl;
}

// Issue 9: SIGTERM with drain_timeout_ms = 1000 while the ledger is frozen and 64 requests are in
// flight. At the deadline every one of them is answered under its own request id: the settles
// (forwarded, answer not back) are queued durably and only then answered QUEUED; the reserves get
// kUnavailable "retry with the same id". Every QUEUED settle is in the outbox at the next boot and
// lands on the ledger once it is back; nothing is queued after the outbox's last write.
TEST_F(AgentFleetTest, SigtermWithAFrozenLedgerAnswersEveryRequestAndQueuesOnlyDurably) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  AgentSettings settings;
  settings.request_timeout_ms = 20'000;  // nothing times out before the drain deadline
  settings.drain_timeout_ms = 1'000;
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), settings));
  std::unique_ptr<client::BlockingClient> gw = gateway(0);
  ASSERT_NE(gw, nullptr);

  constexpr int kEach = 32;
  for (int n = 0; n < kEach; ++n) {
    const std::string id = "term-held-" + std::to_string(n);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer reserved,
                         callAgent(*gw, makeReserve({.id = id, .units = 10})));
    ASSERT_TRUE(isOk(reserved)) << describe(reserved);
    TALLY_ASSIGN_OR_FAIL(AgentAnswer started, callAgent(*gw, StartRequest{id, "op-" + id}));
    ASSERT_TRUE(isOk(started)) << describe(started);
  }
  ASSERT_TRUE(ledger_.signal(SIGSTOP));

  std::map<uint64_t, std::string> settles, reserves;  // request id -> reservation id
  for (int n = 0; n < kEach; ++n) {
    const std::string held = "term-held-" + std::to_string(n);
    TALLY_ASSIGN_OR_FAIL(uint64_t settle_id, gw->send(SettleRequest{.reservation_id = held,
                                                                    .operation_id = "op-" + held,
                                                                    .actual_units = 3},
                                                      kCallTimeoutMs));
    settles[settle_id] = held;
    const std::string fresh = "term-new-" + std::to_string(n);
    TALLY_ASSIGN_OR_FAIL(uint64_t reserve_id,
                         gw->send(makeReserve({.id = fresh, .units = 1}), kCallTimeoutMs));
    reserves[reserve_id] = fresh;
  }
  // The agent answers a health check itself, in order after the 64 on this connection: once it
  // is back, all 64 are in the agent's hands (forwarded to the frozen ledger).
  TALLY_ASSIGN_OR_FAIL(uint64_t health_id, gw->send(wire::HealthRequest{}, kCallTimeoutMs));
  std::map<uint64_t, AgentAnswer> answers;
  for (bool health_seen = false; !health_seen;) {
    TALLY_ASSIGN_OR_FAIL(wire::Response response, gw->receive(kReadTimeoutMs));
    if (response.request_id == health_id) {
      health_seen = true;
    } else {
      TALLY_ASSIGN_OR_FAIL(AgentAnswer early, agentAnswerOf(std::move(response)));
      answers[response.request_id] = early;
    }
  }
  ASSERT_TRUE(agents_[0]->signal(SIGTERM));
  while (answers.size() < settles.size() + reserves.size()) {
    Result<wire::Response> response = gw->receive(kAgentCallTimeoutMs);
    if (!response.isOk()) break;
    const uint64_t request_id = response.value().request_id;
    TALLY_ASSIGN_OR_FAIL(AgentAnswer answer, agentAnswerOf(std::move(response)));
    answers[request_id] = answer;
  }
  EXPECT_EQ(agents_[0]->waitExit(kExitTimeoutMs), 0) << "exit code after SIGTERM";

  std::vector<std::string> queued;
  for (const auto& [request_id, held] : settles) {
    auto it = answers.find(request_id);
    ASSERT_NE(it, answers.end()) << "no answer to the settle of " << held;
    if (isQueued(it->second)) {
      queued.push_back(held);
    } else {
      EXPECT_TRUE(isUnavailable(it->second)) << held << ": " << describe(it->second);
      EXPECT_NE(it->second.error.message.find("same id"), std::string::npos)
          << describe(it->second);
    }
  }
  for (const auto& [request_id, fresh] : reserves) {
    auto it = answers.find(request_id);
    ASSERT_NE(it, answers.end()) << "no answer to the reserve of " << fresh;
    EXPECT_TRUE(isUnavailable(it->second)) << fresh << ": " << describe(it->second);
    EXPECT_NE(it->second.error.message.find("same id"), std::string::npos) << describe(it->second);
  }
  EXPECT_EQ(queued.size(), settles.size()) << "the store works: every sent settle is queued";
  const std::string first_run = agents_[0]->log();
  EXPECT_EQ(first_run.find("queued_after_link_failure"), std::string::npos) << first_run;

  // The next boot restores exactly the queued settles and delivers them.
  ASSERT_TRUE(ledger_.signal(SIGCONT));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), settings));
  const std::string restored = "event=outbox_restored";
  const std::string second_run = agents_[0]->log().substr(first_run.size());
  const size_t at = second_run.find(restored);
  ASSERT_NE(at, std::string::npos) << second_run;
  EXPECT_NE(second_run.find("entries=" + std::to_string(queued.size()), at), std::string::npos)
      << second_run.substr(at, 200);
  for (const std::string& held : queued) {
    const ReservationReply on_ledger = waitForLedger(
        held, [](const ReservationReply& r) { return settledState(r.receipt.state); });
    EXPECT_TRUE(settledState(on_ledger.receipt.state)) << describe(on_ledger);
  }
}

// Issue 9: a burst from gateway connections that then close, against a frozen ledger. The agent
// sends at most its window (1,024 requests) and drops the rest before sending once their
// requester is gone; the sent ones are resolved (RESERVATION_UNKNOWN, query with the same id).
// Once the ledger answers again, a new gateway's reserve is forwarded and admitted.
TEST_F(AgentFleetTest, RequestsOfGoneGatewaysAreDroppedBeforeTheyAreSent) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  constexpr int kConnections = 8;
  constexpr int kEach = 500;
  constexpr size_t kWindow = 1'024;  // AgentServiceOptions::ledger_window_max
  ASSERT_TRUE(ledger_.signal(SIGSTOP));
  {
    std::vector<std::unique_ptr<client::BlockingClient>> gone;
    for (int c = 0; c < kConnections; ++c) {
      gone.push_back(gateway(0));
      ASSERT_NE(gone.back(), nullptr);
      for (int n = 0; n < kEach; ++n) {
        const std::string id = "gone-" + std::to_string(c) + "-" + std::to_string(n);
        ASSERT_TRUE(gone.back()->send(makeReserve({.id = id, .units = 1}), kCallTimeoutMs).isOk());
      }
    }
  }  // every connection closes with its requests unanswered
  // Frozen for longer than the agent's request timeout (500 ms): the sent ones time out (the
  // window opens again) while their requesters are long gone.
  pauseMs(1'500);
  ASSERT_TRUE(ledger_.signal(SIGCONT));

  std::unique_ptr<client::BlockingClient> fresh = gateway(0);
  ASSERT_NE(fresh, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  AgentAnswer admitted;
  int attempts = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<AgentAnswer> answer =
        callAgent(*fresh, makeReserve({.id = "fresh-" + std::to_string(attempts++), .units = 1}));
    ASSERT_TRUE(answer.isOk()) << answer.status().toString();
    admitted = answer.value();
    if (isOk(admitted)) break;
    pauseMs(50);
  }
  EXPECT_TRUE(isOk(admitted)) << describe(admitted);

  size_t on_ledger = 0;
  for (int c = 0; c < kConnections; ++c) {
    for (int n = 0; n < kEach; ++n) {
      const std::string id = "gone-" + std::to_string(c) + "-" + std::to_string(n);
      TALLY_ASSIGN_OR_FAIL(ReservationReply reply,
                           callReservation(*client_, QueryRequest{.reservation_id = id}));
      if (reply.code == ReplyCode::kOk) ++on_ledger;
    }
  }
  std::cout << "[ gone     ] " << on_ledger << " of " << kConnections * kEach
            << " reached the ledger; a fresh reserve admitted after " << attempts << " attempts"
            << std::endl;
  EXPECT_LE(on_ledger, kWindow) << "requests of gone gateways were sent to the ledger";
}

// Streaming top-up end to end: a started reservation grows through the agent, a refusal
// changes nothing, settle refunds against the grown total once, and the grown reservation
// survives a kill -9 of the ledger (restored from its store, the audit still conserving).
TEST_F(AgentFleetTest, ExtendGrowsAStartedReservationAndSettleCoversTheWhole) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  std::unique_ptr<client::BlockingClient> gateway_0 = gateway(0);
  ASSERT_NE(gateway_0, nullptr);
  auto through = [&](const wire::RequestBody& body) -> ReservationReply {
    Result<AgentAnswer> answer = callAgent(*gateway_0, body);
    EXPECT_TRUE(answer.isOk()) << answer.status().toString();
    if (!answer.isOk()) return {};
    EXPECT_FALSE(answer.value().is_error) << describe(answer.value());
    return answer.value().reply;
  };
  const ExtendRequest to_800{
      .reservation_id = "stream-1", .operation_id = "op-1", .reserved_units_total = 800};
  ASSERT_EQ(through(makeReserve({.id = "stream-1", .units = 300})).code, ReplyCode::kOk);
  // Before start: refused, nothing held beyond the 300.
  EXPECT_EQ(through(to_800).code, ReplyCode::kInvalidState);
  ASSERT_EQ(through(StartRequest{.reservation_id = "stream-1", .operation_id = "op-1"}).code,
            ReplyCode::kOk);
  const ReservationReply grown = through(to_800);
  ASSERT_EQ(grown.code, ReplyCode::kOk) << describe(grown);
  EXPECT_EQ(grown.receipt.reserved_units, 800u);
  const ReservationReply again = through(to_800);  // a retry after a lost answer
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  const ReservationReply refused = through(ExtendRequest{
      .reservation_id = "stream-1", .operation_id = "op-1", .reserved_units_total = 1'100});
  EXPECT_EQ(refused.code, ReplyCode::kRejected) << describe(refused);
  EXPECT_EQ(refused.receipt.reserved_units, 800u);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kMaxSingleReservation);

  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
  ASSERT_EQ(report.accounts.size(), 1u);
  EXPECT_EQ(report.accounts[0].balances.reserved, 800u);
  EXPECT_EQ(report.accounts[0].balances.available, 200u);

  // The grown reservation is durable: a kill -9 and restart restores 800 held.
  ledger_.kill9();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  TALLY_ASSIGN_OR_FAIL(ReservationReply restored,
                       callReservation(*client_, QueryRequest{.reservation_id = "stream-1"}));
  EXPECT_EQ(restored.receipt.state, ReservationState::kStarted);
  EXPECT_EQ(restored.receipt.reserved_units, 800u);
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
  EXPECT_EQ(report.accounts[0].balances.reserved, 800u);

  // Settle covers the whole, straight at the ledger (the agent reconnects in the background).
  TALLY_ASSIGN_OR_FAIL(ReservationReply settled,
                       callReservation(*client_, SettleRequest{.reservation_id = "stream-1",
                                                               .operation_id = "op-1",
                                                               .actual_units = 700}));
  EXPECT_EQ(settled.code, ReplyCode::kOk) << describe(settled);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(settled.refunded_units, 100u);
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
  EXPECT_EQ(report.accounts[0].balances.reserved, 0u);
  EXPECT_EQ(report.accounts[0].balances.spent, 700u);
  EXPECT_EQ(report.accounts[0].balances.available, 300u);
}

}  // namespace
}  // namespace tally::testing
