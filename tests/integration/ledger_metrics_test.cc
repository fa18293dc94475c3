// tally-ledger's Prometheus endpoint end to end: a real ledger on a free metrics port, real
// requests over the ledger protocol, then GET /metrics over a real socket; the counters and
// gauges must have moved by exactly what the requests did (docs/LEDGER.md, Metrics).

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/integration/agent_harness.h"
#include "tests/integration/ledger_fixture.h"

namespace tally::testing {
namespace {

// The value of the sample `series` (name with its labels, exactly as rendered), or -1.
double sampleOf(const std::string& metrics, const std::string& series) {
  const std::string needle = "\n" + series + " ";
  const size_t at = ("\n" + metrics).find(needle);
  if (at == std::string::npos) return -1;
  return std::strtod(metrics.c_str() + at + needle.size() - 1, nullptr);
}

TEST_F(LedgerServiceTest, MetricsEndpointCountsRequestsCommitsDebtAndTheAudit) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_GT(ledger_.metricsPort(), 0);
  {
    // Before any request: the endpoint serves, nothing counted yet.
    TALLY_ASSIGN_OR_FAIL(std::string before, httpGet(ledger_.metricsPort(), "/metrics", 5'000));
    EXPECT_EQ(sampleOf(before, "tally_ledger_commit_batch_requests_count"), 0) << before;
    EXPECT_EQ(sampleOf(before, "tally_ledger_accounts"), 0) << before;
  }
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1000, .max_overdraft = 10})}));

  // A reserve settled under its units, then one settled 60 over with nothing left: debt 60,
  // above the maximum overdraft of 10 (a breach), and the next reserve is refused for debt.
  auto call = [this](const wire::RequestBody& body) {
    Result<ReservationReply> reply = callReservation(*client_, body);
    EXPECT_TRUE(reply.isOk()) << reply.status().toString();
    return reply.isOk() ? reply.value() : ReservationReply{};
  };
  EXPECT_EQ(call(makeReserve({.id = "small", .units = 100})).code, ReplyCode::kOk);
  EXPECT_EQ(call(StartRequest{.reservation_id = "small", .operation_id = "op-small"}).code,
            ReplyCode::kOk);
  EXPECT_EQ(
      call(SettleRequest{.reservation_id = "small", .operation_id = "op-small", .actual_units = 60})
          .receipt.state,
      ReservationState::kSettled);
  EXPECT_EQ(call(makeReserve({.id = "rest", .units = 940})).code, ReplyCode::kOk);
  EXPECT_EQ(call(StartRequest{.reservation_id = "rest", .operation_id = "op-rest"}).code,
            ReplyCode::kOk);
  EXPECT_EQ(
      call(SettleRequest{.reservation_id = "rest", .operation_id = "op-rest", .actual_units = 1000})
          .receipt.state,
      ReservationState::kSettledWithDebt);
  const ReservationReply refused = call(makeReserve({.id = "refused", .units = 1}));
  EXPECT_EQ(refused.receipt.state, ReservationState::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kDebt);
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));

  TALLY_ASSIGN_OR_FAIL(std::string m, httpGet(ledger_.metricsPort(), "/metrics", 5'000));
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"publish_policy\",outcome=\"ok\"}"), 1)
      << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"reserve\",outcome=\"ok\"}"), 2) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"reserve\",outcome=\"rejected\"}"), 1)
      << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"start\",outcome=\"ok\"}"), 2) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"settle\",outcome=\"ok\"}"), 2) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_requests_total{op=\"audit\",outcome=\"ok\"}"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_rejections_total{dimension=\"debt\"}"), 1) << m;
  // One client calling one request at a time: every mutation is a commit of one request (the
  // audit changes nothing and commits nothing).
  EXPECT_EQ(sampleOf(m, "tally_ledger_commit_batch_requests_count"), 8) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_commit_batch_requests_sum"), 8) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_commit_batch_requests_bucket{le=\"1\"}"), 8) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_commit_duration_seconds_count"), 8) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_store_commit_seconds_count"), 8) << m;
  EXPECT_GT(sampleOf(m, "tally_ledger_store_commit_seconds_sum"), 0) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_accounts"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_accounts_in_debt"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_debt_units"), 60) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_overdraft_breaches"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_reservations{state=\"SETTLED\"}"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_reservations{state=\"SETTLED_WITH_DEBT\"}"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_reservations{state=\"REJECTED\"}"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_reservations{state=\"RESERVED\"}"), 0) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_shards{state=\"ISSUED\"}"), 0) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_audits_total"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_audit_conserved"), 1) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_audit_violations"), 0) << m;
  EXPECT_EQ(sampleOf(m, "tally_ledger_connections"), 1) << m;
  EXPECT_GT(sampleOf(m, "tally_ledger_store_bytes"), 0) << m;
}

}  // namespace
}  // namespace tally::testing
