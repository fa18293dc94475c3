#include "core/agent_unknown.h"

#include <gtest/gtest.h>

// RESERVATION_UNKNOWN alone: no sockets, files or clocks.

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'000;

ReserveRequest reserve(const std::string& id) {
  return ReserveRequest{.reservation_id = id, .subject = "tenant-1", .route = "chat", .units = 5};
}

ReservationReply reply(ReplyCode code, ReservationState state) {
  ReservationReply answer;
  answer.code = code;
  answer.receipt.state = state;
  return answer;
}

// A reserve whose answer was lost becomes RESERVATION_UNKNOWN; resolving it queries the same id
// (one step at a time); the ledger found it → RESERVED, the entry leaves.
TEST(UnknownReservationsTest, ALostAnswerIsResolvedByAQueryWithTheSameId) {
  UnknownReservations unknown(10);
  ASSERT_TRUE(unknown.onAnswerLost(reserve("r1"), kT0));
  EXPECT_TRUE(unknown.contains("r1"));
  EXPECT_EQ(unknown.oldestAgeMs(kT0 + 40), 40u);
  std::optional<QueryRequest> query = unknown.resolve("r1");
  ASSERT_TRUE(query.has_value());
  EXPECT_EQ(query->reservation_id, "r1");
  EXPECT_FALSE(unknown.resolve("r1").has_value()) << "one step in flight at a time";
  const ReservationReply found = reply(ReplyCode::kOk, ReservationState::kReserved);
  UnknownQueryOutcome outcome = unknown.onQueryAnswer("r1", &found);
  EXPECT_EQ(outcome.resolved, ReservationState::kReserved);
  EXPECT_FALSE(outcome.resend.has_value());
  EXPECT_FALSE(unknown.contains("r1"));
  EXPECT_EQ(unknown.size(), 0u);
}

// The ledger never saw it: the very same reserve is sent again (same id, same fields), never a
// new id; its answer resolves it, REJECTED included.
TEST(UnknownReservationsTest, NotFoundResendsTheSameReserveNeverANewId) {
  UnknownReservations unknown(10);
  const ReserveRequest original = reserve("r2");
  ASSERT_TRUE(unknown.onAnswerLost(original, kT0));
  ASSERT_TRUE(unknown.resolve("r2").has_value());
  const ReservationReply not_found = reply(ReplyCode::kNotFound, ReservationState::kRequested);
  UnknownQueryOutcome outcome = unknown.onQueryAnswer("r2", &not_found);
  ASSERT_TRUE(outcome.resend.has_value());
  EXPECT_EQ(outcome.resend->reservation_id, "r2");
  EXPECT_EQ(outcome.resend->units, original.units);
  EXPECT_EQ(outcome.resend->subject, original.subject);
  EXPECT_TRUE(unknown.contains("r2")) << "unknown until the resend is answered";
  const ReservationReply rejected = reply(ReplyCode::kRejected, ReservationState::kRejected);
  EXPECT_EQ(unknown.onResendAnswer("r2", &rejected), ReservationState::kRejected);
  EXPECT_FALSE(unknown.contains("r2"));
}

// A failed step or an unexpected answer leaves it unknown, and it can be tried again.
TEST(UnknownReservationsTest, AFailedStepStaysUnknownAndIsRetried) {
  UnknownReservations unknown(10);
  ASSERT_TRUE(unknown.onAnswerLost(reserve("r3"), kT0));
  ASSERT_TRUE(unknown.resolve("r3").has_value());
  unknown.onStepFailed("r3");
  ASSERT_TRUE(unknown.resolve("r3").has_value());
  UnknownQueryOutcome outcome = unknown.onQueryAnswer("r3", nullptr);
  EXPECT_FALSE(outcome.resolved.has_value());
  EXPECT_FALSE(outcome.resend.has_value());
  EXPECT_TRUE(unknown.contains("r3"));
  EXPECT_TRUE(unknown.resolve("r3").has_value());
}

TEST(UnknownReservationsTest, BoundedAndAQueryOfTheGatewayResolvesToo) {
  UnknownReservations unknown(1);
  ASSERT_TRUE(unknown.onAnswerLost(reserve("a"), kT0));
  EXPECT_TRUE(unknown.onAnswerLost(reserve("a"), kT0)) << "already there";
  EXPECT_FALSE(unknown.onAnswerLost(reserve("b"), kT0)) << "full";
  EXPECT_FALSE(unknown.contains("b"));
  EXPECT_FALSE(unknown.resolve("b").has_value()) << "not unknown: nothing to ask";
  unknown.onFoundElsewhere("a", reply(ReplyCode::kOk, ReservationState::kStarted));
  EXPECT_FALSE(unknown.contains("a"));
  EXPECT_TRUE(unknown.onAnswerLost(reserve("b"), kT0));
}

// A gateway's own query through the agent resolves an unknown id it names; its waiting retries
// hear the receipt as a duplicate refunding nothing.
TEST(UnknownReservationsTest, AGatewayQueryAnsweredOkResolvesItAsADuplicate) {
  UnknownReservations unknown(10);
  ASSERT_TRUE(unknown.onAnswerLost(reserve("r1"), kT0));
  const ReservationReply missing = reply(ReplyCode::kNotFound, ReservationState::kRequested);
  EXPECT_FALSE(unknown.onGatewayQueryAnswer("r1", &missing).has_value());
  EXPECT_FALSE(unknown.onGatewayQueryAnswer("r1", nullptr).has_value());
  EXPECT_TRUE(unknown.contains("r1"));
  ReservationReply found = reply(ReplyCode::kOk, ReservationState::kReserved);
  found.refunded_units = 3;
  std::optional<ReservationReply> answer = unknown.onGatewayQueryAnswer("r1", &found);
  ASSERT_TRUE(answer.has_value());
  EXPECT_TRUE(answer->duplicate);
  EXPECT_EQ(answer->refunded_units, 0u);
  EXPECT_FALSE(unknown.contains("r1"));
  EXPECT_FALSE(unknown.onGatewayQueryAnswer("r1", &found).has_value()) << "not unknown any more";
}

}  // namespace
}  // namespace tally
