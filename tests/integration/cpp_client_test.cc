// clients/cpp (tally/client.h) against a real tally-agent and ledger: the flow, a rejection,
// a duplicate, and its retry rules across an agent restart (a reserve sent while the agent is
// down lands exactly once when it is back).

#include <gtest/gtest.h>

#include <future>
#include <string>

#include "tally/client.h"
#include "tests/integration/agent_harness.h"

namespace tally::testing {
namespace {

class CppClientTest : public AgentFleetTest {
 protected:
  ClientOptions options() const {
    return ClientOptions{.socket_path = agents_[0]->socketPath(),
                         .attempt_timeout_ms = 5'000,
                         .deadline_ms = 20'000,
                         .backoff_first_ms = 10,
                         .backoff_max_ms = 200};
  }
};

TEST_F(CppClientTest, ReserveStartSettleRejectAndDuplicate) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 1000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  Client client(options());

  const ReserveArgs args{
      .reservation_id = "cpp-1", .subject = "tenant-1", .route = "chat", .units = 600};
  Answer reserved = client.reserve(args);
  ASSERT_EQ(reserved.outcome, Outcome::kOk) << reserved.code << " " << reserved.message;
  EXPECT_EQ(reserved.receipt.state, "RESERVED");
  EXPECT_EQ(reserved.receipt.reserved_units, 600u);
  EXPECT_FALSE(reserved.duplicate);
  const Answer again = client.reserve(args);
  EXPECT_EQ(again.outcome, Outcome::kOk);
  EXPECT_TRUE(again.duplicate);

  const Answer rejected = client.reserve(
      {.reservation_id = "cpp-2", .subject = "tenant-1", .route = "chat", .units = 600});
  EXPECT_EQ(rejected.outcome, Outcome::kRejected) << rejected.code;
  EXPECT_EQ(rejected.receipt.limiting_dimension, "capacity");

  EXPECT_EQ(client.start("cpp-1", "op-1").receipt.state, "STARTED");
  const Answer settled = client.settle("cpp-1", "op-1", 250);
  EXPECT_EQ(settled.outcome, Outcome::kOk);
  EXPECT_EQ(settled.receipt.state, "SETTLED");
  EXPECT_EQ(settled.receipt.refunded_units, 350u);
  EXPECT_EQ(client.query("cpp-never").outcome, Outcome::kNotFound);
  EXPECT_EQ(client.start("cpp-1", "op-other").outcome, Outcome::kConflict);
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
}

TEST_F(CppClientTest, ExtendGrowsAStartedReservation) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 1000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  Client client(options());
  ASSERT_EQ(
      client
          .reserve(
              {.reservation_id = "cpp-x", .subject = "tenant-1", .route = "chat", .units = 300})
          .outcome,
      Outcome::kOk);
  ASSERT_EQ(client.start("cpp-x", "op-x").outcome, Outcome::kOk);
  const Answer grown = client.extend("cpp-x", "op-x", 900);
  EXPECT_EQ(grown.outcome, Outcome::kOk) << grown.code << " " << grown.message;
  EXPECT_EQ(grown.receipt.reserved_units, 900u);
  const Answer refused = client.extend("cpp-x", "op-x", 1'001);  // above max single (burst)
  EXPECT_EQ(refused.outcome, Outcome::kRejected) << refused.code;
  EXPECT_EQ(refused.receipt.limiting_dimension, "max-single-reservation");
  EXPECT_EQ(refused.receipt.reserved_units, 900u);
  EXPECT_EQ(client.settle("cpp-x", "op-x", 850).receipt.refunded_units, 50u);
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
}

TEST_F(CppClientTest, AReserveSentWhileTheAgentIsDownLandsOnceItIsBack) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 1000})}));
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  ASSERT_EQ(agents_[0]->terminate(), 0);

  Client client(options());
  std::future<Answer> pending = std::async(std::launch::async, [&client] {
    return client.reserve(
        {.reservation_id = "cpp-late", .subject = "tenant-1", .route = "chat", .units = 400});
  });
  // The client cannot reach the socket and keeps trying (same id) until the agent is back.
  ASSERT_EQ(pending.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress()));
  const Answer answer = pending.get();
  ASSERT_EQ(answer.outcome, Outcome::kOk) << answer.code << " " << answer.message;
  EXPECT_GT(answer.attempts, 1);
  EXPECT_EQ(answer.receipt.state, "RESERVED");
  // Held once: 600 of the 1000 are left.
  const Answer second = client.reserve(
      {.reservation_id = "cpp-more", .subject = "tenant-1", .route = "chat", .units = 600});
  EXPECT_EQ(second.outcome, Outcome::kOk) << second.code;
  const Answer third = client.reserve(
      {.reservation_id = "cpp-over", .subject = "tenant-1", .route = "chat", .units = 1});
  EXPECT_EQ(third.outcome, Outcome::kRejected) << third.code;
}

TEST_F(CppClientTest, NoAgentAtAllIsUnavailableAtTheDeadline) {
  ClientOptions options{.socket_path = "/nonexistent/tally.sock",
                        .deadline_ms = 100,
                        .backoff_first_ms = 10,
                        .backoff_max_ms = 20};
  Client client(options);
  const Answer answer = client.release("cpp-x");
  EXPECT_EQ(answer.outcome, Outcome::kUnavailable);
  EXPECT_GT(answer.attempts, 1);
}

}  // namespace
}  // namespace tally::testing
