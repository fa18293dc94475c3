// tallyctl audit --period EPOCH / --periods: arguments, the request sent, JSON and text.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ctl/args.h"
#include "ctl/commands.h"
#include "tests/ctl/ctl_test_support.h"

namespace tally::ctl {
namespace {

using test_support::FakePeer;
using test_support::run;
using test_support::usageError;

PeriodSnapshot sampleSnapshot(bool conserved) {
  return PeriodSnapshot{
      .key = {.subject = "tenant-7", .route = "chat.generate", .generation = 3},
      .epoch_period = EpochPeriod::kHour,
      .epoch_first = 495686,
      .epoch_last = 495687,
      .opened_at_ms = 1784469600000,
      .closed_at_ms = 1784476800250,
      .opening = {.opening = 1000, .available = 400, .reserved = 0, .spent = 600},
      .closing = {.opening = 1000,
                  .minted = 700,
                  .overdraft_issued = 50,
                  .available = 200,
                  .reserved = 100,
                  .spent = 1420,
                  .overdraft_repaid = 30},
      .conserved = conserved,
  };
}

wire::Response periodAnswer(bool conserved) {
  AuditReport report{.as_of_ms = 1784476800250, .conserved = conserved};
  report.period_epoch = 495687;
  report.period_snapshots = {sampleSnapshot(conserved)};
  if (!conserved) report.violations.push_back("tenant-7/chat.generate@3 epochs 495686..495687");
  return wire::Response{.request_id = 1, .body = report};
}

TEST(PeriodCommandsTest, ParsesPeriodAndPeriodsOnAuditOnly) {
  Result<Invocation> inv = parseArgs(std::vector<std::string_view>{"audit", "--period", "495687"});
  ASSERT_TRUE(inv.isOk()) << inv.status().toString();
  EXPECT_EQ(inv.value().period, 495687u);
  EXPECT_FALSE(inv.value().list_periods);
  // --periods takes no value: what follows it is not swallowed.
  inv = parseArgs(std::vector<std::string_view>{"audit", "--periods", "--json"});
  ASSERT_TRUE(inv.isOk()) << inv.status().toString();
  EXPECT_TRUE(inv.value().list_periods);
  EXPECT_TRUE(inv.value().json);
  EXPECT_FALSE(inv.value().period);
  inv = parseArgs(std::vector<std::string_view>{"audit"});
  ASSERT_TRUE(inv.isOk());
  EXPECT_FALSE(inv.value().period);
  EXPECT_FALSE(inv.value().list_periods);

  EXPECT_CONTAINS(usageError({"audit", "--period", "-1"}), "--period must not be negative");
  EXPECT_CONTAINS(usageError({"audit", "--period", "last"}), "--period must be a non-negative");
  EXPECT_CONTAINS(usageError({"audit", "--period"}), "--period needs a value");
  EXPECT_CONTAINS(usageError({"audit", "--periods=1"}), "--periods takes no value");
  EXPECT_CONTAINS(usageError({"health", "--period", "1"}), "'health' takes no --period");
  EXPECT_CONTAINS(usageError({"health", "--periods"}), "'health' takes no --periods");
}

TEST(PeriodCommandsTest, SendsThePeriodInTheAuditRequest) {
  FakePeer peer;
  peer.answer = periodAnswer(true);
  (void)run(peer, {"audit", "--period", "495687", "--subject", "tenant-7", "--periods"});
  ASSERT_TRUE(peer.request);
  const auto* request = std::get_if<wire::AuditRequest>(&*peer.request);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->period, 495687u);
  EXPECT_TRUE(request->list_periods);
  EXPECT_EQ(request->subject, "tenant-7");
  (void)run(peer, {"audit"});
  request = std::get_if<wire::AuditRequest>(&*peer.request);
  ASSERT_NE(request, nullptr);
  EXPECT_FALSE(request->period);
  EXPECT_FALSE(request->list_periods);
}

TEST(PeriodCommandsTest, PeriodJsonIsOneObjectWithTheContractFields) {
  FakePeer peer;
  peer.answer = periodAnswer(true);
  CommandOutput out = run(peer, {"--json", "audit", "--period", "495687"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(out.out.front(), '{');
  EXPECT_EQ(out.out.find('\n'), out.out.size() - 1);  // one line: one object
  for (const char* field :
       {R"("conservation":true)",
        R"("asOfMs":1784476800250)",
        R"("period":495687)",
        R"("periodSnapshots":[{)",
        R"("subject":"tenant-7")",
        R"("route":"chat.generate")",
        R"("policyGeneration":3)",
        R"("accountingEpoch":"hour")",
        R"("epochFirst":495686)",
        R"("epochLast":495687)",
        R"("openedAt":"2026-07-19T14:00:00Z")",
        R"("openedAtMs":1784469600000)",
        R"("closedAt":"2026-07-19T16:00:00.250Z")",
        R"("conserved":true)",
        R"("opening":{"opening":1000,"minted":0)",
        R"("closing":{"opening":1000,"minted":700,"overdraftIssued":50,"available":200,)",
        R"("activity":{"opened":0,"minted":700,"spent":820,"debtIssued":50,"debtRepaid":30,)",
        R"("debtOpening":0)",
        R"("debtClosing":20)",
        R"("violations":[])"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  out = run(peer, {"audit", "--period", "495687"});
  EXPECT_CONTAINS(out.out, "period 495687: conserved (1 account)");
  EXPECT_CONTAINS(out.out, "hour epochs 495686..495687");
  EXPECT_CONTAINS(out.out, "minted 700  spent 820  debt issued 50  repaid 30");

  peer.answer = periodAnswer(false);
  out = run(peer, {"--json", "audit", "--period", "495687"});
  EXPECT_EQ(out.exit_code, kExitAuditFailed);
  EXPECT_CONTAINS(out.out, R"("conservation":false)");
  out = run(peer, {"audit", "--period", "495687"});
  EXPECT_EQ(out.exit_code, kExitAuditFailed);
  EXPECT_CONTAINS(out.out, "NOT CONSERVED");
}

TEST(PeriodCommandsTest, PeriodsListsTheClosedPeriods) {
  FakePeer peer;
  AuditReport report{.as_of_ms = 1784476800250};
  report.closed_periods = {{.epoch_period = EpochPeriod::kHour,
                            .epoch_first = 495686,
                            .epoch_last = 495687,
                            .accounts = 2},
                           {.epoch_period = EpochPeriod::kDay,
                            .epoch_first = 20653,
                            .epoch_last = 20653,
                            .accounts = 1}};
  peer.answer = wire::Response{.request_id = 1, .body = report};
  CommandOutput out = run(peer, {"--json", "audit", "--periods"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, R"("closedPeriods":[{"accountingEpoch":"hour","epochFirst":495686,)"
                           R"("epochLast":495687,"accounts":2,"conserved":true},)");
  EXPECT_EQ(out.out.find("periodSnapshots"), std::string::npos);
  out = run(peer, {"audit", "--periods"});
  EXPECT_CONTAINS(out.out, "2 closed periods kept:");
  EXPECT_CONTAINS(out.out, "day epoch 20653  1 account  conserved");
}

TEST(PeriodCommandsTest, AnUnknownPeriodIsNotFoundAsOneJsonObject) {
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = wire::ErrorReply{.code = wire::ErrorCode::kNotFound,
                               .message = "no closed accounting period covers epoch 7"}};
  CommandOutput out = run(peer, {"--json", "audit", "--period", "7"});
  EXPECT_EQ(out.exit_code, kExitNotFound);
  EXPECT_CONTAINS(out.out, R"("error":true)");
  EXPECT_CONTAINS(out.out, R"("code":"NOT_FOUND")");
  EXPECT_CONTAINS(out.out, "no closed accounting period covers epoch 7");
}

}  // namespace
}  // namespace tally::ctl
