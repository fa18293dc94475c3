// AgentCore with fair scheduling on (core/fair_scheduler.h wired into the start path): starts of
// RESERVED work beyond a route's limit wait and are sent in weighted order as slots free; a
// follow-up frees a slot; a refused start gives its slot back; a start waiting when its
// reservation is released is never sent. No sockets, files or clocks.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/agent_core.h"

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'800'000'000'000;
const AgentLinkState kUp{.connected = true, .health = LinkHealth::kHealthy};

template <typename T>
std::vector<T> only(const AgentCoreEffects& effects) {
  std::vector<T> found;
  for (const auto& effect : effects) {
    if (const T* value = std::get_if<T>(&effect)) found.push_back(*value);
  }
  return found;
}

AgentLedgerAnswer answered(ReplyCode code, ReservationState state, uint64_t expires_at_ms = 0) {
  ReservationReply reply;
  reply.code = code;
  reply.receipt.state = state;
  reply.receipt.expires_at_ms = expires_at_ms;
  return {.outcome = LinkOutcome::kAnswered, .reservation = reply, .label = "ok"};
}

Budget budget(const std::string& subject, uint32_t weight) {
  Budget b;
  b.subject_pattern = subject;
  b.route = "chat";
  b.weight = weight;
  b.hard_execution_limit_ms = 60'000;
  return b;
}

class AgentCoreFairTest : public ::testing::Test {
 protected:
  AgentCoreFairTest()
      : core_(AgentCoreOptions{.fair = {.started_max = {{"chat", 1}}}}, nullptr, nullptr) {
    core_.start({}, kT0);
    core_.onConnected(kUp, kT0);
    const std::vector<AgentCall> calls = only<AgentCall>(core_.takeEffects());
    EXPECT_EQ(calls.size(), 1u);  // the policy fetch
    core_.onAnswer(
        calls.at(0).call,
        {.outcome = LinkOutcome::kAnswered,
         .policy_reply = PolicyReply{.generation = 1},
         .policy = Policy{.generation = 1, .budgets = {budget("heavy", 3), budget("light", 1)}}},
        kUp, kT0, 0);
    (void)core_.takeEffects();
  }

  // Reserves `id` for `subject` (the ledger answers RESERVED), then asks to start it. Returns
  // the start's token.
  uint64_t reserveAndStart(const std::string& id, const std::string& subject) {
    const uint64_t reserve = core_.newToken();
    core_.onRequest(
        reserve,
        ReserveRequest{.reservation_id = id, .subject = subject, .route = "chat", .units = 1}, kUp,
        kT0);
    (void)core_.takeEffects();
    core_.onAnswer(reserve, answered(ReplyCode::kOk, ReservationState::kReserved, kT0 + 30'000),
                   kUp, kT0, 0);
    (void)core_.takeEffects();
    const uint64_t start = core_.newToken();
    core_.onRequest(start, StartRequest{.reservation_id = id, .operation_id = "op-" + id}, kUp,
                    kT0);
    ids_[start] = id;
    return start;
  }

  // The starts the effects send, by reservation id.
  std::vector<std::string> sentStarts(const AgentCoreEffects& effects) {
    std::vector<std::string> sent;
    for (const AgentSend& send : only<AgentSend>(effects)) {
      if (ids_.contains(send.token)) sent.push_back(ids_[send.token]);
    }
    return sent;
  }

  std::map<uint64_t, std::string> ids_;  // start token -> reservation id
  AgentCore core_;
};

TEST_F(AgentCoreFairTest, WaitingStartsAreSentInWeightedOrderAsSlotsFree) {
  const uint64_t first = reserveAndStart("h0", "heavy");
  ASSERT_EQ(sentStarts(core_.takeEffects()), std::vector<std::string>{"h0"});
  for (int i = 1; i <= 4; ++i) {
    (void)reserveAndStart("l" + std::to_string(i), "light");
    (void)reserveAndStart("h" + std::to_string(i * 2 - 1), "heavy");
    (void)reserveAndStart("h" + std::to_string(i * 2), "heavy");
  }
  EXPECT_TRUE(sentStarts(core_.takeEffects()).empty()) << "the one slot is taken";
  EXPECT_EQ(core_.fair().waiting(), 12u);

  core_.onAnswer(first, answered(ReplyCode::kOk, ReservationState::kStarted), kUp, kT0, 0);
  (void)core_.takeEffects();
  std::string running = "h0";
  std::map<char, int> count;
  for (int i = 0; i < 8; ++i) {  // each settle frees the slot: the next start is sent
    const uint64_t settle = core_.newToken();
    core_.onRequest(
        settle,
        SettleRequest{
            .reservation_id = running, .operation_id = "op-" + running, .actual_units = 1},
        kUp, kT0);
    const std::vector<std::string> sent = sentStarts(core_.takeEffects());
    ASSERT_EQ(sent.size(), 1u);
    running = sent[0];
    ++count[running[0]];
  }
  EXPECT_EQ(count['h'], 6);  // weight 3 : 1
  EXPECT_EQ(count['l'], 2);
  const FairnessWindow window = core_.fair().meter("chat")->current();
  EXPECT_EQ(window.admissions, 9u);
  EXPECT_LT(window.error, 0.1);
}

TEST_F(AgentCoreFairTest, ARefusedStartGivesItsSlotToTheNext) {
  const uint64_t first = reserveAndStart("h0", "heavy");
  (void)core_.takeEffects();
  (void)reserveAndStart("l1", "light");
  EXPECT_TRUE(sentStarts(core_.takeEffects()).empty());
  core_.onAnswer(first, answered(ReplyCode::kExpired, ReservationState::kExpired), kUp, kT0, 0);
  const AgentCoreEffects effects = core_.takeEffects();
  EXPECT_EQ(sentStarts(effects), std::vector<std::string>{"l1"});
  ASSERT_EQ(only<AgentReplyLedgerAnswer>(effects).size(), 1u);  // h0 hears the ledger
}

TEST_F(AgentCoreFairTest, AStartWaitingWhenItsReservationIsReleasedIsNeverSent) {
  (void)reserveAndStart("h0", "heavy");
  (void)core_.takeEffects();
  const uint64_t waiting = reserveAndStart("l1", "light");
  (void)core_.takeEffects();
  const uint64_t release = core_.newToken();
  core_.onRequest(release, ReleaseRequest{.reservation_id = "l1"}, kUp, kT0);
  const AgentCoreEffects effects = core_.takeEffects();
  const std::vector<AgentReplyUnavailable> answers = only<AgentReplyUnavailable>(effects);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].token, waiting);
  EXPECT_NE(answers[0].message.find("not started"), std::string::npos);
  EXPECT_TRUE(sentStarts(effects).empty());
  EXPECT_EQ(core_.fair().waiting(), 0u);
}

TEST_F(AgentCoreFairTest, AStartStillWaitingAtItsExpiryGoesToTheLedgerToBeAnsweredExpired) {
  (void)reserveAndStart("h0", "heavy");
  (void)core_.takeEffects();
  (void)reserveAndStart("l1", "light");
  (void)core_.takeEffects();
  core_.onTick(kUp, kT0 + 29'999);
  EXPECT_TRUE(sentStarts(core_.takeEffects()).empty());
  core_.onTick(kUp, kT0 + 30'000);
  EXPECT_EQ(sentStarts(core_.takeEffects()), std::vector<std::string>{"l1"});
}

TEST_F(AgentCoreFairTest, ShutdownAnswersTheWaitingStarts) {
  (void)reserveAndStart("h0", "heavy");
  (void)core_.takeEffects();
  const uint64_t waiting = reserveAndStart("l1", "light");
  (void)core_.takeEffects();
  core_.beginShutdown(0, kT0);
  bool answered_waiting = false;
  for (const AgentReplyUnavailable& reply : only<AgentReplyUnavailable>(core_.takeEffects())) {
    answered_waiting = answered_waiting || reply.token == waiting;
  }
  EXPECT_TRUE(answered_waiting);
}

}  // namespace
}  // namespace tally
