#include "core/agent_decisions.h"

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

}  // namespace
}  // namespace tally
