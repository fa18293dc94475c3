#include "core/agent_machine.h"

#include <gtest/gtest.h>

#include <string>

// The agent machine alone: no sockets, files or clocks. Time is a number, the store's outcome
// is an argument.

namespace tally {
namespace {

constexpr uint64_t kT0 = 10'000;

OutboxEntry settle(const std::string& id) {
  return {.kind = OutboxKind::kSettle,
          .reservation_id = id,
          .operation_id = "op-" + id,
          .actual_units = 1};
}

template <typename T>
std::vector<T> only(const AgentEffects& effects) {
  std::vector<T> out;
  for (const AgentEffect& effect : effects) {
    if (const auto* typed = std::get_if<T>(&effect)) out.push_back(*typed);
  }
  return out;
}

// Sends or drops every waiting request the window lets through; `alive(token)` answers.
AgentEffects pump(AgentMachine& machine, const std::function<bool(uint64_t)>& alive) {
  AgentEffects effects;
  while (std::optional<uint64_t> next = machine.nextToSend()) {
    AgentEffects step = machine.admitNext(alive(*next));
    effects.insert(effects.end(), step.begin(), step.end());
  }
  return effects;
}

TEST(AgentMachineTest, TheWindowBoundsWhatIsSentAndTheRestWaitsInOrder) {
  AgentMachine machine({.window_max = 2, .waiting_max = 10});
  for (uint64_t token = 1; token <= 5; ++token) EXPECT_TRUE(machine.submit(token, {}).empty());
  AgentEffects first = pump(machine, [](uint64_t) { return true; });
  EXPECT_EQ(first, (AgentEffects{AgentSend{1}, AgentSend{2}}));
  EXPECT_EQ(machine.waiting(), 3u);
  ASSERT_TRUE(machine.onResult(1));
  EXPECT_EQ(pump(machine, [](uint64_t) { return true; }), (AgentEffects{AgentSend{3}}));
}

// Issue 9: requests whose requester left are dropped before they are sent, never after.
TEST(AgentMachineTest, ARequesterGoneBeforeSendIsDroppedAndASentOneIsStillResolved) {
  AgentMachine machine({.window_max = 1, .waiting_max = 10});
  ASSERT_TRUE(machine.submit(1, {}).empty());
  ASSERT_TRUE(machine.submit(2, {}).empty());
  ASSERT_TRUE(machine.submit(3, {}).empty());
  EXPECT_EQ(pump(machine, [](uint64_t) { return true; }), (AgentEffects{AgentSend{1}}));
  // All three requesters leave now. 1 was sent: its result still comes back and is taken.
  auto gone = [](uint64_t) { return false; };
  EXPECT_TRUE(pump(machine, gone).empty());  // the window is full: nothing decided yet
  ASSERT_TRUE(machine.onResult(1));
  EXPECT_EQ(pump(machine, gone), (AgentEffects{AgentDrop{2}, AgentDrop{3}}));
  EXPECT_EQ(machine.sent(), 0u);
  EXPECT_EQ(machine.waiting(), 0u);
}

TEST(AgentMachineTest, AFullWaitingQueueAnswersUnavailableAtOnce) {
  AgentMachine machine({.window_max = 1, .waiting_max = 1});
  ASSERT_TRUE(machine.submit(1, {}).empty());
  const auto refused = only<AgentReplyUnavailable>(machine.submit(2, {}));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].token, 2u);
}

// QUEUED only after the durable write; a failed write is taken back and answered kUnavailable.
TEST(AgentMachineTest, QueuedOnlyAfterPersistedAndNeverDeliveredBefore) {
  AgentMachine machine({});
  EXPECT_TRUE(machine.queue(7, settle("r1"), kT0).empty());  // no reply yet
  EXPECT_FALSE(machine.nextDelivery(kT0).has_value());       // not durable: not delivered
  AgentEffects flushed = machine.flush();
  ASSERT_EQ(flushed.size(), 1u);
  const auto& persist = std::get<AgentPersist>(flushed[0]);
  ASSERT_EQ(persist.entries.size(), 1u);
  EXPECT_FALSE(machine.nextDelivery(kT0).has_value());  // still waiting for the outcome
  const auto queued = only<AgentReplyQueued>(machine.persisted(true, ""));
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].token, 7u);
  EXPECT_EQ(machine.durableSeq(), queued[0].entry.seq);
  std::optional<OutboxEntry> head = machine.nextDelivery(kT0);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->reservation_id, "r1");
}

// Issue 9 (agent_service.cc:556): a failed write must not make the entries durable. They are
// never delivered, never acknowledged, and later entries are delivered normally.
TEST(AgentMachineTest, AFailedWriteIsNeverDurableNorDeliveredAndDoesNotBlockTheOutbox) {
  AgentMachine machine({});
  ASSERT_TRUE(machine.queue(1, settle("lost-a"), kT0).empty());
  ASSERT_TRUE(machine.queue(2, settle("lost-b"), kT0).empty());
  ASSERT_EQ(machine.flush().size(), 1u);
  AgentEffects failed = machine.persisted(false, "disk full");
  EXPECT_TRUE(only<AgentReplyQueued>(failed).empty());
  const auto unavailable = only<AgentReplyUnavailable>(failed);
  ASSERT_EQ(unavailable.size(), 2u);
  EXPECT_NE(unavailable[0].message.find("retry with the same ids"), std::string::npos);
  EXPECT_EQ(machine.durableSeq(), 0u);
  EXPECT_TRUE(machine.outbox().empty());
  EXPECT_FALSE(machine.nextDelivery(kT0).has_value());

  ASSERT_TRUE(machine.queue(3, settle("kept"), kT0).empty());
  ASSERT_EQ(machine.flush().size(), 1u);
  ASSERT_EQ(only<AgentReplyQueued>(machine.persisted(true, "")).size(), 1u);
  std::optional<OutboxEntry> head = machine.nextDelivery(kT0);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->reservation_id, "kept");
}

// The outbox is never overtaken: one in flight, in order, a failure retries the same head.
TEST(AgentMachineTest, DeliveryIsInOrderAndAFailureRetriesTheHead) {
  AgentMachine machine({.outbox = {.backoff_initial_ms = 50, .backoff_max_ms = 1'000}});
  for (uint64_t token = 1; token <= 3; ++token) {
    ASSERT_TRUE(machine.queue(token, settle("r" + std::to_string(token)), kT0).empty());
  }
  ASSERT_EQ(machine.flush().size(), 1u);
  ASSERT_EQ(only<AgentReplyQueued>(machine.persisted(true, "")).size(), 3u);
  std::optional<OutboxEntry> head = machine.nextDelivery(kT0);
  ASSERT_TRUE(head.has_value());
  EXPECT_FALSE(machine.nextDelivery(kT0).has_value());  // one in flight
  machine.onDelivery(head->seq, /*delivered=*/false, kT0, /*jitter_permille=*/0);
  EXPECT_FALSE(machine.nextDelivery(kT0 + 49).has_value());
  std::optional<OutboxEntry> again = machine.nextDelivery(kT0 + 50);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->seq, head->seq);
  machine.onDelivery(again->seq, /*delivered=*/true, kT0 + 50, 0);
  std::optional<OutboxEntry> second = machine.nextDelivery(kT0 + 50);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->reservation_id, "r2");
}

// Issue 9 (SIGTERM drain): at the deadline every requester is answered: a sent follow-up is
// queued and answered QUEUED only once persisted; a sent reserve hears "outcome unknown"; one
// that never left hears "retry"; results arriving later are ignored; nothing is queued after
// the last write.
TEST(AgentMachineTest, ShutdownAnswersEveryPendingRequesterAndClosesTheOutbox) {
  AgentMachine machine({.window_max = 2, .waiting_max = 10});
  ASSERT_TRUE(machine.submit(1, settle("s1")).empty());  // sent settle
  ASSERT_TRUE(machine.submit(2, {}).empty());            // sent reserve
  ASSERT_TRUE(machine.submit(3, settle("s3")).empty());  // waiting settle (never sent)
  ASSERT_EQ(pump(machine, [](uint64_t) { return true; }).size(), 2u);

  AgentEffects effects = machine.shutdown(kT0);
  const auto unavailable = only<AgentReplyUnavailable>(effects);
  ASSERT_EQ(unavailable.size(), 2u);
  EXPECT_EQ(unavailable[0].token, 2u);
  EXPECT_EQ(unavailable[0].message, kAgentOutcomeUnknown);
  EXPECT_EQ(unavailable[1].token, 3u);
  EXPECT_TRUE(only<AgentReplyQueued>(effects).empty()) << "QUEUED before the write";
  const auto persists = only<AgentPersist>(effects);
  ASSERT_EQ(persists.size(), 1u);
  ASSERT_EQ(persists[0].entries.size(), 1u);
  EXPECT_EQ(persists[0].entries[0].reservation_id, "s1");
  EXPECT_FALSE(machine.closed());

  const auto queued = only<AgentReplyQueued>(machine.persisted(true, ""));
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].token, 1u);
  EXPECT_TRUE(machine.closed());

  EXPECT_FALSE(machine.onResult(1)) << "a late result of an answered request is ignored";
  EXPECT_FALSE(machine.onResult(2));
  const auto after = only<AgentReplyUnavailable>(machine.queue(9, settle("late"), kT0));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_TRUE(machine.flush().empty()) << "nothing is written after the last write";
  EXPECT_EQ(only<AgentReplyUnavailable>(machine.submit(10, {})).size(), 1u);
  EXPECT_TRUE(machine.shutdown(kT0).empty());
}

TEST(AgentMachineTest, RestoredEntriesAreDurableAndDeliveredInSeqOrder) {
  AgentMachine machine({});
  OutboxEntry b = settle("b");
  b.seq = 9;
  OutboxEntry a = settle("a");
  a.seq = 4;
  machine.restore({b, a});
  EXPECT_EQ(machine.durableSeq(), 9u);
  std::optional<OutboxEntry> head = machine.nextDelivery(kT0);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->reservation_id, "a");
  ASSERT_TRUE(machine.queue(1, settle("c"), kT0).empty());
  ASSERT_EQ(machine.flush().size(), 1u);
  const auto queued = only<AgentReplyQueued>(machine.persisted(true, ""));
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_GT(queued[0].entry.seq, 9u);
}

}  // namespace
}  // namespace tally
