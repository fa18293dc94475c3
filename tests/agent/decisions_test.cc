#include "core/agent_decisions.h"
#include "core/outbox_request.h"

#include <gtest/gtest.h>

#include "agent/agent_service.h"
#include "agent/config.h"
#include "agent/gateway_server.h"

namespace tally::agent {
namespace {

Policy policyWith(RolloutMode mode, uint32_t percent = 100) {
  Budget budget{.subject_pattern = "tenant-*", .route = "chat", .burst = 10};
  budget.rollout = Rollout{.mode = mode, .percent = percent};
  return Policy{.generation = 3, .budgets = {budget}};
}

TEST(RolloutModeFor, UnknownPolicyOrNoBudgetEnforces) {
  EXPECT_EQ(rolloutModeFor(std::nullopt, "tenant-1", "chat"), RolloutMode::kEnforce);
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kOff), "other", "chat"), RolloutMode::kEnforce);
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kOff), "tenant-1", "embed"),
            RolloutMode::kEnforce);
}

TEST(RolloutModeFor, MatchedBudgetDecides) {
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kOff), "tenant-1", "chat"), RolloutMode::kOff);
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kShadow), "tenant-1", "chat"),
            RolloutMode::kShadow);
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kEnforce), "tenant-1", "chat"),
            RolloutMode::kEnforce);
  // percent 0 under enforce: no route enforces; it runs as shadow.
  EXPECT_EQ(rolloutModeFor(policyWith(RolloutMode::kEnforce, 0), "tenant-1", "chat"),
            RolloutMode::kShadow);
}

TEST(Routing, PartitionAndOutboxOrdering) {
  EXPECT_TRUE(linkUsable(true, LinkHealth::kHealthy));
  EXPECT_TRUE(linkUsable(true, LinkHealth::kDegraded));
  EXPECT_FALSE(linkUsable(true, LinkHealth::kPartitioned));
  EXPECT_FALSE(linkUsable(false, LinkHealth::kHealthy));

  EXPECT_EQ(followUpRoute(true, true, false), FollowUp::kLocal);
  EXPECT_EQ(followUpRoute(false, false, true), FollowUp::kForward);
  EXPECT_EQ(followUpRoute(false, false, false), FollowUp::kOutbox);
  // Never overtake what is queued, even with a healthy link.
  EXPECT_EQ(followUpRoute(false, true, true), FollowUp::kOutbox);

  EXPECT_EQ(startRoute(true, false), StartRoute::kLocal);
  EXPECT_EQ(startRoute(false, true), StartRoute::kForward);
  EXPECT_EQ(startRoute(false, false), StartRoute::kUnavailable);
}

TEST(Routing, LedgerUnavailableRejectionCarriesDimensionAndRetryAfter) {
  const ReserveRequest request{.reservation_id = "r", .subject = "s", .route = "x", .units = 5};
  const ReservationReply reply = ledgerUnavailableRejection(request, 1500, 42);
  EXPECT_EQ(reply.code, ReplyCode::kRejected);
  EXPECT_EQ(reply.receipt.state, ReservationState::kRejected);
  EXPECT_EQ(reply.receipt.limiting_dimension, LimitingDimension::kLedgerUnavailable);
  EXPECT_EQ(reply.receipt.retry_after_ms, 1500);
  EXPECT_EQ(reply.receipt.reservation_id, "r");
  EXPECT_STREQ(limitingDimensionName(LimitingDimension::kLedgerUnavailable), "ledger-unavailable");
  EXPECT_STREQ(replyCodeName(ReplyCode::kQueued), "QUEUED");
}

TEST(Outbox, OnlyAnAnswerThatChangedSomethingDelivers) {
  EXPECT_FALSE(outboxAnswerDelivers(nullptr));  // an ErrorReply or another kind of answer
  ReservationReply reply;
  for (ReplyCode code : {ReplyCode::kResourceExhausted, ReplyCode::kArithmeticOverflow}) {
    reply.code = code;
    EXPECT_FALSE(outboxAnswerDelivers(&reply)) << replyCodeName(code);
  }
  for (ReplyCode code : {ReplyCode::kOk, ReplyCode::kNotFound, ReplyCode::kInvalidState,
                         ReplyCode::kOperationConflict, ReplyCode::kExpired}) {
    reply.code = code;
    EXPECT_TRUE(outboxAnswerDelivers(&reply)) << replyCodeName(code);
  }
}

TEST(Shadow, ClassifiesLedgerAnswers) {
  ReservationReply rejected{.code = ReplyCode::kRejected};
  rejected.receipt.state = ReservationState::kRejected;
  rejected.receipt.limiting_dimension = LimitingDimension::kCapacity;
  ShadowDecision decision = classifyShadow(&rejected, false);
  EXPECT_STREQ(decision.outcome, "rejected");
  EXPECT_EQ(decision.dimension, LimitingDimension::kCapacity);
  EXPECT_TRUE(decision.admit_locally);

  ReservationReply reserved{.code = ReplyCode::kOk};
  reserved.receipt.state = ReservationState::kReserved;
  decision = classifyShadow(&reserved, false);
  EXPECT_STREQ(decision.outcome, "admitted");
  EXPECT_FALSE(decision.admit_locally);

  decision = classifyShadow(nullptr, true);
  EXPECT_STREQ(decision.outcome, "unavailable");
  EXPECT_TRUE(decision.admit_locally);

  ReservationReply conflict{.code = ReplyCode::kIdempotencyConflict};
  EXPECT_FALSE(classifyShadow(&conflict, false).admit_locally);
}

TEST(AgedIds, CountsAndOldestAge) {
  AgedIds ids(2);
  EXPECT_EQ(ids.oldestAgeMs(100), 0u);
  EXPECT_TRUE(ids.add("a", 10));
  EXPECT_TRUE(ids.add("b", 20));
  EXPECT_TRUE(ids.add("a", 30));  // already present: keeps its first time
  EXPECT_FALSE(ids.add("c", 30));
  EXPECT_EQ(ids.oldestAgeMs(100), 90u);
  EXPECT_EQ(ids.oldest(5), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(ids.remove("a"));
  EXPECT_FALSE(ids.remove("a"));
  EXPECT_EQ(ids.oldestAgeMs(100), 80u);
  EXPECT_EQ(ids.size(), 1u);
}

TEST(OutboxRequest, MapsEveryKind) {
  OutboxEntry entry{
      .kind = OutboxKind::kSettle, .reservation_id = "r", .operation_id = "op", .actual_units = 9};
  const auto settle = std::get<SettleRequest>(outboxRequest(entry));
  EXPECT_EQ(settle.actual_units, 9u);
  entry.kind = OutboxKind::kRelease;
  EXPECT_EQ(std::get<ReleaseRequest>(outboxRequest(entry)).reservation_id, "r");
  entry.kind = OutboxKind::kMarkUnknown;
  EXPECT_EQ(std::get<MarkUnknownRequest>(outboxRequest(entry)).operation_id, "op");
  entry.kind = OutboxKind::kReportOperation;
  EXPECT_EQ(std::get<ReportOperationRequest>(outboxRequest(entry)).actual_units, 9u);
}

TEST(PeerAllowed, UidOrGid) {
  EXPECT_TRUE(peerAllowed(1000, 5, {1000}, {}));
  EXPECT_TRUE(peerAllowed(7, 50, {1000}, {50}));
  EXPECT_FALSE(peerAllowed(7, 8, {1000, 0}, {50, 0}));
}

TEST(Config, DefaultPeersAndHostPort) {
  AgentConfig config;
  applyDefaultPeers(&config, 1000, 1001);
  EXPECT_EQ(config.allowed_uids, (std::vector<uint32_t>{1000, 0}));
  EXPECT_EQ(config.allowed_gids, (std::vector<uint32_t>{1001, 0}));
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(parseHostPort("127.0.0.1:7411", &host, &port).isOk());
  EXPECT_EQ(port, 7411);
  EXPECT_FALSE(parseHostPort("nope", &host, &port).isOk());
  ASSERT_TRUE(applyMetricsListen("", &config).isOk());
  EXPECT_FALSE(config.metrics_enabled);
}

}  // namespace
}  // namespace tally::agent
