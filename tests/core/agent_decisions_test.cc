#include "core/agent_decisions.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

// Where a reserve goes (the agent's routing rule), alone: no sockets, files or clocks.

namespace tally {
namespace {

ReserveFacts partition() {
  return {.mode = RolloutMode::kEnforce, .link_usable = false, .shards_enabled = true};
}

TEST(ReserveRouteTest, KnownIdsComeFirstInOrderShardLocalUnknown) {
  ReserveFacts facts{.shard_owned = true, .local = true, .unknown = true, .link_usable = true};
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kShards);
  facts.shard_owned = false;
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kLocalDuplicate);
  facts.local = false;
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kResolveUnknown) << "never a new id";
  facts.link_usable = false;
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kResolveUnknown);
}

TEST(ReserveRouteTest, RolloutDecidesWhileTheLinkIsUsable) {
  EXPECT_EQ(reserveRoute({.mode = RolloutMode::kOff, .link_usable = true}),
            ReserveRoute::kLocalOff);
  EXPECT_EQ(reserveRoute({.mode = RolloutMode::kShadow, .link_usable = true}),
            ReserveRoute::kForward);
  EXPECT_EQ(reserveRoute({.mode = RolloutMode::kEnforce, .link_usable = true}),
            ReserveRoute::kForward);
  EXPECT_EQ(reserveRoute({.mode = RolloutMode::kOff, .link_usable = false}),
            ReserveRoute::kLocalOff);
  EXPECT_EQ(reserveRoute({.mode = RolloutMode::kShadow, .link_usable = false}),
            ReserveRoute::kShadowUnreachable);
}

// An id that was sent to the ledger is never admitted from a shard: the ledger may hold it.
TEST(ReserveRouteTest, APartitionNeverAdmitsFromAShardAnIdSentToTheLedger) {
  ReserveFacts facts = partition();
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kTryShard);
  facts.sent_to_ledger = true;
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kSentToLedgerBefore);
  facts.shards_enabled = false;
  EXPECT_EQ(reserveRoute(facts), ReserveRoute::kRejectUnavailable);
}

ReservationReply replyOf(ReplyCode code, ReservationState state,
                         LimitingDimension dimension = LimitingDimension::kNone) {
  ReservationReply reply;
  reply.code = code;
  reply.receipt.state = state;
  reply.receipt.limiting_dimension = dimension;
  return reply;
}

// Shadow never refuses on the ledger's word: what the ledger did not reserve is admitted
// locally, and the decision is counted; an admission is passed on.
TEST(ReserveAnswerTest, ShadowAdmitsLocallyWhatTheLedgerDidNotReserve) {
  const ReservationReply rejected =
      replyOf(ReplyCode::kRejected, ReservationState::kRejected, LimitingDimension::kCapacity);
  ReserveAnswerPlan plan =
      planReserveAnswer(RolloutMode::kShadow, LinkOutcome::kAnswered, &rejected, true);
  EXPECT_EQ(plan.action, ReserveAnswer::kAdmitShadow);
  ASSERT_TRUE(plan.shadow.has_value());
  EXPECT_STREQ(plan.shadow->outcome, "rejected");
  EXPECT_EQ(plan.shadow->dimension, LimitingDimension::kCapacity);
  EXPECT_FALSE(plan.learn_shard_account) << "shadow never teaches the shard keeper";

  for (const LinkOutcome lost : {LinkOutcome::kLost, LinkOutcome::kNotSent}) {
    plan = planReserveAnswer(RolloutMode::kShadow, lost, nullptr, false);
    EXPECT_EQ(plan.action, ReserveAnswer::kAdmitShadow);
    EXPECT_STREQ(plan.shadow->outcome, "unavailable");
    EXPECT_EQ(plan.shadow->dimension, LimitingDimension::kLedgerUnavailable);
  }

  const ReservationReply admitted = replyOf(ReplyCode::kOk, ReservationState::kReserved);
  plan = planReserveAnswer(RolloutMode::kShadow, LinkOutcome::kAnswered, &admitted, true);
  EXPECT_EQ(plan.action, ReserveAnswer::kPassOn);
  EXPECT_STREQ(plan.shadow->outcome, "admitted");

  plan = planReserveAnswer(RolloutMode::kShadow, LinkOutcome::kAnswered, nullptr, false);
  EXPECT_EQ(plan.action, ReserveAnswer::kPassOn) << "an error body is passed on as is";
  EXPECT_STREQ(plan.shadow->outcome, "error");
}

// Enforce: a lost answer is RESERVATION_UNKNOWN (never a new id), a refusal before sending is
// not, and an admission on an emergency route teaches the shard keeper the account.
TEST(ReserveAnswerTest, EnforcePassesOnAndALostAnswerIsUnknown) {
  const ReservationReply admitted = replyOf(ReplyCode::kOk, ReservationState::kReserved);
  ReserveAnswerPlan plan =
      planReserveAnswer(RolloutMode::kEnforce, LinkOutcome::kAnswered, &admitted, true);
  EXPECT_EQ(plan.action, ReserveAnswer::kPassOn);
  EXPECT_FALSE(plan.shadow.has_value());
  EXPECT_TRUE(plan.learn_shard_account);
  EXPECT_FALSE(planReserveAnswer(RolloutMode::kEnforce, LinkOutcome::kAnswered, &admitted, false)
                   .learn_shard_account);
  const ReservationReply rejected = replyOf(ReplyCode::kRejected, ReservationState::kRejected);
  EXPECT_FALSE(planReserveAnswer(RolloutMode::kEnforce, LinkOutcome::kAnswered, &rejected, true)
                   .learn_shard_account);
  EXPECT_EQ(planReserveAnswer(RolloutMode::kEnforce, LinkOutcome::kLost, nullptr, true).action,
            ReserveAnswer::kUnknown);
  EXPECT_EQ(planReserveAnswer(RolloutMode::kEnforce, LinkOutcome::kNotSent, nullptr, true).action,
            ReserveAnswer::kNotSent);
}

TEST(UsageUnknownTest, MarkUnknownEntersASettleOrReportTakesOutAReleaseNeverChanges) {
  AgedIds ids(10);
  const ReservationReply unknown = replyOf(ReplyCode::kOk, ReservationState::kUsageUnknown);
  trackUsageUnknown(&ids, OutboxKind::kMarkUnknown, "r1", &unknown, 100);
  EXPECT_TRUE(ids.contains("r1"));
  EXPECT_EQ(ids.oldestAgeMs(150), 50u);
  const ReservationReply settled = replyOf(ReplyCode::kOk, ReservationState::kSettled);
  trackUsageUnknown(&ids, OutboxKind::kMarkUnknown, "r2", &settled, 100);
  EXPECT_FALSE(ids.contains("r2")) << "a markUnknown that did not leave it USAGE_UNKNOWN";
  trackUsageUnknown(&ids, OutboxKind::kRelease, "r1", &settled, 200);
  EXPECT_TRUE(ids.contains("r1"));
  const ReservationReply refused = replyOf(ReplyCode::kInvalidState, ReservationState::kSettled);
  trackUsageUnknown(&ids, OutboxKind::kSettle, "r1", &refused, 200);
  EXPECT_TRUE(ids.contains("r1")) << "only an OK answer closes it";
  trackUsageUnknown(&ids, OutboxKind::kSettle, "r1", nullptr, 200);
  EXPECT_TRUE(ids.contains("r1"));
  trackUsageUnknown(&ids, OutboxKind::kReportOperation, "r1", &settled, 200);
  EXPECT_FALSE(ids.contains("r1"));
}

// The ids recently sent to the ledger: bounded, the oldest makes room.
TEST(AgedIdsTest, AddEvictingOldestKeepsTheNewestWhenFull) {
  AgedIds ids(2);
  ids.addEvictingOldest("a", 1);
  ids.addEvictingOldest("b", 2);
  ids.addEvictingOldest("c", 3);
  EXPECT_FALSE(ids.contains("a"));
  EXPECT_TRUE(ids.contains("b"));
  EXPECT_TRUE(ids.contains("c"));
  ids.addEvictingOldest("b", 4);
  EXPECT_EQ(ids.size(), 2u) << "an id already there stays, nothing evicted";
  EXPECT_TRUE(ids.contains("c"));
}

// The same answers as a plain model (a map of id to time; oldest by time, then id) after every
// step of random adds, evicting adds and removes, with times that repeat, advance and go back,
// through copies and moves.
TEST(AgedIdsTest, AnswersLikeAPlainModelOverRandomOperations) {
  struct Model {
    size_t entries_max;
    std::map<std::string, uint64_t> since;
    std::vector<std::pair<uint64_t, std::string>> byAge() const {
      std::vector<std::pair<uint64_t, std::string>> entries;
      for (const auto& [id, at] : since) entries.emplace_back(at, id);
      std::sort(entries.begin(), entries.end());
      return entries;
    }
    bool add(const std::string& id, uint64_t now_ms) {
      if (since.contains(id)) return true;
      if (since.size() >= entries_max) return false;
      since[id] = now_ms;
      return true;
    }
    void addEvictingOldest(const std::string& id, uint64_t now_ms) {
      if (add(id, now_ms)) return;
      if (!since.empty()) since.erase(byAge().front().second);
      (void)add(id, now_ms);
    }
    std::vector<std::string> oldest(size_t max) const {
      std::vector<std::string> ids;
      for (const auto& [at, id] : byAge()) {
        if (ids.size() == max) break;
        ids.push_back(id);
      }
      return ids;
    }
    uint64_t oldestAgeMs(uint64_t now_ms) const {
      if (since.empty()) return 0;
      const uint64_t at = byAge().front().first;
      return now_ms > at ? now_ms - at : 0;
    }
  };
  std::mt19937_64 random(20261207);
  for (size_t entries_max : {size_t{0}, size_t{1}, size_t{3}, size_t{16}}) {
    SCOPED_TRACE("entries_max " + std::to_string(entries_max));
    AgedIds ids(entries_max);
    Model model{.entries_max = entries_max};
    uint64_t now_ms = 1'000;
    for (int step = 0; step < 4'000; ++step) {
      const std::string id = "reservation-id-" + std::to_string(random() % 24);  // on the heap
      switch (random() % 8) {
        case 0:
        case 1: EXPECT_EQ(ids.add(id, now_ms), model.add(id, now_ms)); break;
        case 2:
        case 3:
          ids.addEvictingOldest(id, now_ms);
          model.addEvictingOldest(id, now_ms);
          break;
        case 4: EXPECT_EQ(ids.remove(id), model.since.erase(id) == 1); break;
        case 5: now_ms = now_ms + random() % 3 - (random() % 4 == 0 ? 2 : 0); break;
        case 6: {
          const AgedIds copy = ids;
          ids = AgedIds(0);
          ids = copy;
          break;
        }
        default: {
          AgedIds moved = std::move(ids);
          ids = std::move(moved);
          break;
        }
      }
      ASSERT_EQ(ids.size(), model.since.size()) << "step " << step;
      ASSERT_EQ(ids.contains(id), model.since.contains(id)) << "step " << step;
      ASSERT_EQ(ids.oldest(5), model.oldest(5)) << "step " << step;
      ASSERT_EQ(ids.oldestAgeMs(now_ms + 7), model.oldestAgeMs(now_ms + 7)) << "step " << step;
    }
  }
}

TEST(AgentDeadlinesTest, TheShutdownDeadlineAnswersOnce) {
  AgentDeadlines deadlines;
  EXPECT_FALSE(deadlines.answerPendingNow(1'000)) << "no shutdown begun";
  EXPECT_FALSE(deadlines.beginShutdown(1'000, 500));
  EXPECT_FALSE(deadlines.answerPendingNow(1'499));
  EXPECT_TRUE(deadlines.answerPendingNow(1'500));
  EXPECT_TRUE(deadlines.answerAll());
  EXPECT_FALSE(deadlines.answerPendingNow(1'600)) << "answered already";
  EXPECT_FALSE(deadlines.answerAll());

  AgentDeadlines at_once;
  EXPECT_TRUE(at_once.beginShutdown(1'000, 0)) << "timeout 0: at once";
}

TEST(AgentDeadlinesTest, TheDrainEndsWhenEmptyDisconnectedOrAtItsTimeout) {
  AgentDeadlines deadlines;
  EXPECT_FALSE(deadlines.drainEnds(0, true, true)) << "not draining";
  deadlines.beginDrain(1'000, 100);
  EXPECT_TRUE(deadlines.draining());
  EXPECT_FALSE(deadlines.drainEnds(1'050, false, true));
  EXPECT_TRUE(deadlines.drainEnds(1'050, true, true));
  EXPECT_FALSE(deadlines.drainEnds(1'050, true, true)) << "ends once";
  deadlines.beginDrain(2'000, 100);
  EXPECT_TRUE(deadlines.drainEnds(2'001, false, false));
  deadlines.beginDrain(3'000, 100);
  EXPECT_TRUE(deadlines.drainEnds(3'100, false, true));
}

}  // namespace
}  // namespace tally
