#include "agent/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "agent/metrics_server.h"

namespace tally::agent {
namespace {

TEST(AgentMetrics, RendersCountersHistogramsAndGauges) {
  AgentMetrics metrics;
  metrics.countRequest(Op::kReserve, "ok", 300);
  metrics.countRequest(Op::kReserve, "rejected", 20'000);
  metrics.countRejection(LimitingDimension::kLedgerUnavailable);
  metrics.countShadowDecision("rejected", LimitingDimension::kCapacity);
  EXPECT_EQ(metrics.requests(Op::kReserve, "ok"), 1u);
  EXPECT_EQ(metrics.shadowDecisions("rejected", LimitingDimension::kCapacity), 1u);
  const std::string text = metrics.render(GaugeSnapshot{.health = LinkHealth::kDegraded,
                                                        .connected = true,
                                                        .outbox_depth = 4,
                                                        .outbox_oldest_age_ms = 1500,
                                                        .reservation_unknown = 2,
                                                        .boot_epoch = 9});
  EXPECT_NE(text.find("tally_agent_requests_total{op=\"reserve\",outcome=\"ok\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("tally_agent_rejections_total{dimension=\"ledger-unavailable\"} 1\n"),
            std::string::npos);
  EXPECT_NE(
      text.find("tally_agent_request_duration_seconds_bucket{op=\"reserve\",le=\"0.0005\"} 1\n"),
      std::string::npos);
  EXPECT_NE(
      text.find("tally_agent_request_duration_seconds_bucket{op=\"reserve\",le=\"+Inf\"} 2\n"),
      std::string::npos);
  EXPECT_NE(text.find("tally_agent_ledger_health{state=\"DEGRADED\",connected=\"true\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("tally_agent_outbox_depth 4\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_outbox_oldest_age_seconds 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_reservation_unknown 2\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_shadow_decisions_total{outcome=\"rejected\",dimension="
                      "\"capacity\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("tally_agent_boot_epoch 9\n"), std::string::npos);
}

// A partitioned agent: each partition's link, outbox, shards and boot epoch under a partition
// label; the counters once, unlabelled.
TEST(AgentMetrics, LabelsEachPartitionsGauges) {
  AgentMetrics metrics;
  metrics.countRequest(Op::kReserve, "ok", 300);
  const std::vector<GaugeSnapshot> gauges = {GaugeSnapshot{.health = LinkHealth::kHealthy,
                                                           .connected = true,
                                                           .outbox_depth = 0,
                                                           .boot_epoch = 3,
                                                           .shards_usable = 1,
                                                           .ledger_address = "127.0.0.1:7411"},
                                             GaugeSnapshot{.connected = false,
                                                           .outbox_depth = 5,
                                                           .boot_epoch = 4,
                                                           .shard_available_units = 70,
                                                           .ledger_address = "127.0.0.1:7511"}};
  const std::string text = metrics.render(gauges);
  for (const char* line :
       {"tally_agent_requests_total{op=\"reserve\",outcome=\"ok\"} 1\n",
        "tally_agent_ledger_health{partition=\"0\",state=\"HEALTHY\",connected=\"true\"} 0\n",
        "tally_agent_ledger_health{partition=\"1\",state=\"PARTITIONED\",connected=\"false\"} "
        "2\n",
        "tally_agent_ledger_address{partition=\"1\",address=\"127.0.0.1:7511\"} 1\n",
        "tally_agent_outbox_depth{partition=\"0\"} 0\n",
        "tally_agent_outbox_depth{partition=\"1\"} 5\n",
        "tally_agent_boot_epoch{partition=\"1\"} 4\n",
        "tally_agent_shards{partition=\"0\",condition=\"usable\"} 1\n",
        "tally_agent_shard_available_units{partition=\"1\"} 70\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
  EXPECT_EQ(text.find("tally_agent_outbox_depth 0\n"), std::string::npos) << text;
  // One partition: the unpartitioned text, no label.
  const std::vector<GaugeSnapshot> one = {gauges[1]};
  EXPECT_EQ(metrics.render(one), metrics.render(gauges[1]));
  EXPECT_EQ(metrics.render(one).find("partition="), std::string::npos);
}

TEST(AgentMetrics, ShowsTheCurrentLedgerAddress) {
  AgentMetrics metrics;
  EXPECT_EQ(metrics.render(GaugeSnapshot{}).find("tally_agent_ledger_address"), std::string::npos);
  const std::string text = metrics.render(
      GaugeSnapshot{.ledger_address = "10.0.0.6:7411", .ledger_not_primary_answers = 3});
  EXPECT_NE(text.find("tally_agent_ledger_address{address=\"10.0.0.6:7411\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tally_agent_ledger_not_primary_total 3\n"), std::string::npos) << text;
}

TEST(AgentMetrics, NotConnectedShowsPartitioned) {
  AgentMetrics metrics;
  const std::string text = metrics.render(GaugeSnapshot{.connected = false});
  EXPECT_NE(text.find("tally_agent_ledger_health{state=\"PARTITIONED\",connected=\"false\"} 2\n"),
            std::string::npos);
}

TEST(AgentMetrics, OutcomeLabels) {
  EXPECT_EQ(outcomeLabel(ReservationReply{.code = ReplyCode::kQueued}), "queued");
  EXPECT_EQ(outcomeLabel(wire::ErrorReply{.code = wire::ErrorCode::kUnavailable}),
            "error_unavailable");
  EXPECT_EQ(opFor(wire::RequestBody{SettleRequest{}}), Op::kSettle);
  // An OK whose receipt is REJECTED (an admission refused) counts as rejected.
  ReservationReply refused{.code = ReplyCode::kOk};
  refused.receipt.state = ReservationState::kRejected;
  EXPECT_EQ(outcomeName(refused), "rejected");
  EXPECT_EQ(outcomeName(ReservationReply{.code = ReplyCode::kNotFound}), "not_found");
  EXPECT_EQ(outcomeName(wire::ErrorReply{.code = wire::ErrorCode::kMalformedFrame}),
            "error_malformedFrame");
  EXPECT_EQ(outcomeName(wire::HealthReply{}), "ok");
  // Codes outside the enums (a newer peer's) get their names' fallbacks, not a read past a table.
  EXPECT_EQ(outcomeName(ReservationReply{.code = static_cast<ReplyCode>(200)}), "unknown");
  EXPECT_EQ(outcomeName(wire::ErrorReply{.code = static_cast<wire::ErrorCode>(255)}),
            "error_invalid");
}

// The requests counter's samples come by op name, then outcome, whatever the order of the
// answers: the text a scrape sees does not depend on traffic.
TEST(AgentMetrics, RequestSamplesAreOrderedByOpThenOutcome) {
  AgentMetrics metrics;
  metrics.countRequest(Op::kStart, "ok", 10);
  metrics.countRequest(Op::kReserve, "rejected", 10);
  metrics.countRequest(Op::kSettle, "ok", 10);
  metrics.countRequest(Op::kReserve, "ok", 10);
  metrics.countRequest(Op::kReserve, "ok", 10);
  metrics.countRequest(Op::kHealth, "ok", 10);
  EXPECT_EQ(metrics.requests(Op::kReserve, "ok"), 2u);
  EXPECT_EQ(metrics.requests(Op::kReserve, "queued"), 0u);
  EXPECT_EQ(metrics.requests(Op::kSettle, "rejected"), 0u);
  const std::string text = metrics.render(GaugeSnapshot{});
  std::vector<size_t> at;
  for (const char* line : {"tally_agent_requests_total{op=\"health\",outcome=\"ok\"} 1\n",
                           "tally_agent_requests_total{op=\"reserve\",outcome=\"ok\"} 2\n",
                           "tally_agent_requests_total{op=\"reserve\",outcome=\"rejected\"} 1\n",
                           "tally_agent_requests_total{op=\"settle\",outcome=\"ok\"} 1\n",
                           "tally_agent_requests_total{op=\"start\",outcome=\"ok\"} 1\n"}) {
    at.push_back(text.find(line));
    ASSERT_NE(at.back(), std::string::npos) << line << text;
  }
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end())) << text;
}

TEST(HttpResponse, MetricsAndNotFound) {
  const std::string ok = httpResponseFor("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "body\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_NE(ok.find("Content-Length: 5\r\n"), std::string::npos);
  EXPECT_EQ(ok.substr(ok.size() - 5), "body\n");
  EXPECT_EQ(httpResponseFor("GET / HTTP/1.1\r\n\r\n", "x").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(httpResponseFor("POST /metrics HTTP/1.1\r\n\r\n", "x").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(httpResponseFor("garbage\r\n\r\n", "x").rfind("HTTP/1.1 400", 0), 0u);
}

TEST(AgentMetrics, RendersFairSchedulingPerRouteWithEscapedLabels) {
  AgentMetrics metrics;
  EXPECT_EQ(metrics.render(GaugeSnapshot{}).find("tally_agent_fairness_error"), std::string::npos)
      << "no scheduled route, no fairness series";
  GaugeSnapshot gauges;
  gauges.fair_routes.push_back(FairRouteGauges{.route = "chat",
                                               .started_max = 8,
                                               .started = 8,
                                               .waiting = 3,
                                               .fairness_error = 0.0125,
                                               .windows = 4});
  gauges.fair_routes.push_back(FairRouteGauges{.route = "odd\"route\\"});
  const std::string text = metrics.render(gauges);
  EXPECT_NE(text.find("tally_agent_fair_started_max{route=\"chat\"} 8\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_fair_started{route=\"chat\"} 8\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_fair_waiting{route=\"chat\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_fairness_error{route=\"chat\"} 0.012500\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("tally_agent_fairness_windows_total{route=\"chat\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("tally_agent_fair_waiting{route=\"odd\\\"route\\\\\"} 0\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace tally::agent
