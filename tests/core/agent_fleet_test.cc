#include "core/agent_fleet.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "core/partition_map.h"

namespace tally {
namespace {

// A subject of `partition` among `count` (the first "tenant-N" that maps there).
std::string subjectOf(uint32_t partition, uint32_t count) {
  for (int i = 0;; ++i) {
    std::string subject = "tenant-" + std::to_string(i);
    if (partitionOf(subject, count) == partition) return subject;
  }
}

AccountView accountOf(const std::string& subject) {
  AccountView view;
  view.key.subject = subject;
  view.key.route = "chat";
  return view;
}

ReservationReply holding(ReservationState state, ReplyCode code = ReplyCode::kOk) {
  ReservationReply reply{.code = code};
  reply.receipt.state = state;
  return reply;
}

TEST(AgentFleetAnswersTest, OnlyCurrentAuditsWholePoliciesAndHealthAreMerged) {
  EXPECT_EQ(fleetRequestOf(HealthRequest{}), FleetRequest::kMerged);
  EXPECT_EQ(fleetRequestOf(AuditRequest{}), FleetRequest::kMerged);
  EXPECT_EQ(fleetRequestOf(ShowPolicyRequest{}), FleetRequest::kMerged);
  EXPECT_EQ(fleetRequestOf(AuditRequest{.period = 3}), FleetRequest::kNotMergeable);
  EXPECT_EQ(fleetRequestOf(AuditRequest{.list_periods = true}), FleetRequest::kNotMergeable);
  EXPECT_EQ(fleetRequestOf(AuditRequest{.routes_max = 10}), FleetRequest::kNotMergeable);
  EXPECT_EQ(fleetRequestOf(ShowPolicyRequest{.unless_generation = 2}), FleetRequest::kNotMergeable);
  // Answered by the agent itself, alike for every partition.
  EXPECT_EQ(fleetRequestOf(PublishPolicyRequest{}), FleetRequest::kFirstOnly);
  EXPECT_EQ(fleetRequestOf(ListGatewaysRequest{}), FleetRequest::kFirstOnly);
  const LedgerReply refused = fleetRefusal(AuditRequest{.period = 3});
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(refused));
  EXPECT_EQ(std::get<ErrorReply>(refused).code, ErrorCode::kInvalidArgument);
}

TEST(AgentFleetAnswersTest, HealthIsTheWorstPartitions) {
  const std::vector<LedgerReply> answers = {
      HealthReply{.status = "HEALTHY", .version = "v", .now_ms = 5},
      HealthReply{.status = "PARTITIONED", .version = "v", .now_ms = 9},
      HealthReply{.status = "DEGRADED", .version = "v", .now_ms = 7}};
  const LedgerReply merged = mergeFleetAnswers(HealthRequest{}, answers);
  ASSERT_TRUE(std::holds_alternative<HealthReply>(merged));
  EXPECT_EQ(std::get<HealthReply>(merged).status, "PARTITIONED");
  EXPECT_EQ(std::get<HealthReply>(merged).now_ms, 9u);
  EXPECT_EQ(std::get<HealthReply>(merged).version, "v");
  const std::vector<LedgerReply> healthy = {HealthReply{.status = "HEALTHY"},
                                            HealthReply{.status = "HEALTHY"}};
  EXPECT_EQ(std::get<HealthReply>(mergeFleetAnswers(HealthRequest{}, healthy)).status, "HEALTHY");
  const std::vector<LedgerReply> one_failed = {HealthReply{.status = "DISCONNECTED"},
                                               ErrorReply{.code = ErrorCode::kUnavailable}};
  EXPECT_EQ(std::get<HealthReply>(mergeFleetAnswers(HealthRequest{}, one_failed)).status,
            "UNAVAILABLE");
}

TEST(AgentFleetAnswersTest, AuditsMergeAsTallyctlsAndAPartitionThatFailsIsNamed) {
  AuditReport zero{.as_of_ms = 1, .accounts = {accountOf(subjectOf(0, 2))}};
  AuditReport one{.as_of_ms = 2, .accounts = {accountOf(subjectOf(1, 2))}};
  const std::vector<LedgerReply> answers = {zero, one};
  const LedgerReply merged = mergeFleetAnswers(AuditRequest{}, answers);
  ASSERT_TRUE(std::holds_alternative<AuditReport>(merged));
  const std::vector<AuditReport> reports = {zero, one};
  EXPECT_EQ(std::get<AuditReport>(merged).accounts, mergePartitionAudits(reports).accounts);
  EXPECT_EQ(std::get<AuditReport>(merged).accounts.size(), 2u);
  EXPECT_TRUE(std::get<AuditReport>(merged).conserved);

  const std::vector<LedgerReply> one_down = {
      zero, ErrorReply{.code = ErrorCode::kUnavailable, .message = "link down"}};
  const LedgerReply failed = mergeFleetAnswers(AuditRequest{}, one_down);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(failed));
  EXPECT_EQ(std::get<ErrorReply>(failed).code, ErrorCode::kUnavailable);
  EXPECT_EQ(std::get<ErrorReply>(failed).message,
            "partition 1 did not answer with its audit: link down");
}

TEST(AgentFleetAnswersTest, PoliciesMergeWithoutRepeatsAtTheLowestGeneration) {
  const Budget pattern{.subject_pattern = "*", .route = "chat"};
  const Budget own0{.subject_pattern = subjectOf(0, 2), .route = "chat"};
  const Budget own1{.subject_pattern = subjectOf(1, 2), .route = "chat"};
  const std::vector<LedgerReply> answers = {
      PolicyAnswer{.reply = {.generation = 4},
                   .policy = Policy{.generation = 4, .budgets = {pattern, own0}}},
      PolicyAnswer{.reply = {.generation = 3},
                   .policy = Policy{.generation = 3, .budgets = {pattern, own1}}}};
  const LedgerReply merged = mergeFleetAnswers(ShowPolicyRequest{}, answers);
  ASSERT_TRUE(std::holds_alternative<PolicyAnswer>(merged));
  const PolicyAnswer& policy = std::get<PolicyAnswer>(merged);
  ASSERT_TRUE(policy.policy.has_value());
  EXPECT_EQ(policy.policy->budgets, (std::vector<Budget>{pattern, own0, own1}));
  EXPECT_EQ(policy.policy->generation, 3u);
  EXPECT_EQ(policy.reply.message,
            "the partitions' policies differ: partition 0 at generation 4, partition 1 at "
            "generation 3");

  const std::vector<LedgerReply> one_down = {answers[0], ErrorReply{.message = "x"}};
  const LedgerReply failed = mergeFleetAnswers(ShowPolicyRequest{}, one_down);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(failed));
  EXPECT_EQ(std::get<ErrorReply>(failed).message, "partition 1 did not answer with its policy: x");
}

TEST(AgentFleetAnswersTest, AnUnrecordedFollowUpGoesToThePartitionHoldingItsReservation) {
  using Kind = UnrecordedDecision::Kind;
  const ReservationReply not_found{.code = ReplyCode::kNotFound};
  const std::vector<LedgerReply> held_by_1 = {not_found, holding(ReservationState::kStarted)};
  UnrecordedDecision decision = decideUnrecorded("r", held_by_1);
  EXPECT_EQ(decision.kind, Kind::kForward);
  EXPECT_EQ(decision.partition, 1u);

  // Held nowhere: the ledger's own NOT_FOUND.
  const std::vector<LedgerReply> nowhere = {not_found, not_found};
  decision = decideUnrecorded("r", nowhere);
  EXPECT_EQ(decision.kind, Kind::kAnswer);
  ASSERT_TRUE(std::holds_alternative<ReservationReply>(decision.reply));
  EXPECT_EQ(std::get<ReservationReply>(decision.reply).code, ReplyCode::kNotFound);

  // Not found where asked, but a partition did not answer: it may be there.
  const std::vector<LedgerReply> one_down = {not_found,
                                             ErrorReply{.code = ErrorCode::kUnavailable}};
  decision = decideUnrecorded("r", one_down);
  EXPECT_EQ(decision.kind, Kind::kAnswer);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(decision.reply));
  EXPECT_EQ(std::get<ErrorReply>(decision.reply).code, ErrorCode::kUnavailable);
  EXPECT_NE(std::get<ErrorReply>(decision.reply).message.find("partition(s) 1 did not answer"),
            std::string::npos);

  const std::vector<LedgerReply> twice = {holding(ReservationState::kReserved),
                                          holding(ReservationState::kReserved)};
  decision = decideUnrecorded("r", twice);
  ASSERT_TRUE(std::holds_alternative<ErrorReply>(decision.reply));
  EXPECT_EQ(std::get<ErrorReply>(decision.reply).code, ErrorCode::kInternal);
}

TEST(AgentFleetAnswersTest, ARecordIsDoneOnlyOnceAnAnswerShowsTheReservationFinal) {
  for (ReservationState state :
       {ReservationState::kSettled, ReservationState::kSettledWithDebt, ReservationState::kReleased,
        ReservationState::kExpired, ReservationState::kRejected}) {
    EXPECT_TRUE(partitionRecordDone(holding(state))) << reservationStateName(state);
  }
  EXPECT_TRUE(partitionRecordDone(holding(ReservationState::kRejected, ReplyCode::kRejected)));
  for (ReservationState state :
       {ReservationState::kReserved, ReservationState::kStarted, ReservationState::kUsageUnknown}) {
    EXPECT_FALSE(partitionRecordDone(holding(state))) << reservationStateName(state);
  }
  // QUEUED: the outcome is the ledger's, later; errors: the gateway retries with the same id.
  EXPECT_FALSE(partitionRecordDone(holding(ReservationState::kSettled, ReplyCode::kQueued)));
  EXPECT_FALSE(partitionRecordDone(ErrorReply{.code = ErrorCode::kUnavailable}));
  EXPECT_FALSE(partitionRecordDone(ReservationReply{.code = ReplyCode::kNotFound}));
}

}  // namespace
}  // namespace tally
