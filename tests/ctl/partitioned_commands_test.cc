// tallyctl --partitions (ctl/partitioned.h): the map on the command line, and `audit` summing
// the fleet, against fake partitions.

#include "ctl/partitioned.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/partition_map.h"
#include "tests/ctl/ctl_test_support.h"

namespace tally::ctl {
namespace {

using test_support::invocation;
using test_support::usageError;

std::string subjectIn(uint32_t partition, uint32_t count) {
  for (int n = 0;; ++n) {
    std::string subject = "tenant-" + std::to_string(n);
    if (partitionOf(subject, count) == partition) return subject;
  }
}

AuditReport reportOf(const std::string& subject) {
  return AuditReport{.accounts = {AccountView{.key = {.subject = subject, .route = "chat"}}}};
}

// Partition i answers reports[i] (or its failure); the calls are recorded.
struct FakeFleet {
  std::vector<Result<wire::Response>> answers;
  std::vector<uint32_t> called;
  PartitionCallFn fn() {
    return [this](uint32_t partition, const wire::RequestBody&) {
      called.push_back(partition);
      return answers.at(partition);
    };
  }
};

TEST(PartitionedCommandsTest, TheMapIsEveryPartitionsAddressList) {
  const Invocation inv = invocation(
      {"--partitions", "127.0.0.1:7411,127.0.0.1:7412;127.0.0.1:7511", "--insecure", "audit"});
  ASSERT_EQ(inv.partitions.size(), 2u);
  EXPECT_EQ(inv.partitions[0].size(), 2u);
  EXPECT_EQ(inv.partitions[1].size(), 1u);
  EXPECT_EQ(inv.partitions[1][0].port, 7511);
  EXPECT_EQ(inv.endpoint.port, 7411);
}

TEST(PartitionedCommandsTest, OnlyAuditOfBalancesTakesTheMap) {
  EXPECT_CONTAINS(usageError({"--partitions", "a:1;b:2", "--ledger", "a:1", "audit"}),
                  "--partitions excludes --ledger");
  EXPECT_CONTAINS(usageError({"--partitions", "a:1;;b:2", "audit"}), "--partitions: partition");
  EXPECT_CONTAINS(usageError({"--partitions", "a:1;b", "audit"}), "--partitions: partition 1");
  EXPECT_CONTAINS(usageError({"--partitions", "a:1;b:2", "query", "--id", "r"}),
                  "only 'audit' of current balances");
  EXPECT_CONTAINS(usageError({"--partitions", "a:1;b:2", "audit", "--periods"}),
                  "only 'audit' of current balances");
}

TEST(PartitionedCommandsTest, AuditSumsEveryPartitionAndConservesWhenEachDoes) {
  const std::string in0 = subjectIn(0, 2);
  const std::string in1 = subjectIn(1, 2);
  FakeFleet fleet{
      .answers = {wire::Response{.body = reportOf(in0)}, wire::Response{.body = reportOf(in1)}}};
  const CommandOutput out = runPartitionedCommand(
      invocation({"--partitions", "127.0.0.1:1;127.0.0.1:2", "--json", "audit"}), fleet.fn());
  EXPECT_EQ(out.exit_code, kExitOk) << out.out << out.err;
  EXPECT_EQ(fleet.called, (std::vector<uint32_t>{0, 1}));
  EXPECT_CONTAINS(out.out, "\"subject\":\"" + in0 + "\"");
  EXPECT_CONTAINS(out.out, "\"subject\":\"" + in1 + "\"");
  EXPECT_CONTAINS(out.out, "\"conserved\":true");
}

TEST(PartitionedCommandsTest, ASubjectOnTheWrongPartitionFailsTheAudit) {
  const std::string in0 = subjectIn(0, 2);
  FakeFleet fleet{
      .answers = {wire::Response{.body = AuditReport{}}, wire::Response{.body = reportOf(in0)}}};
  const CommandOutput out = runPartitionedCommand(
      invocation({"--partitions", "127.0.0.1:1;127.0.0.1:2", "--json", "audit"}), fleet.fn());
  EXPECT_EQ(out.exit_code, kExitAuditFailed) << out.out;
  EXPECT_CONTAINS(
      out.out, "partition 1: holds an account of subject '" + in0 + "', which maps to partition 0");
}

TEST(PartitionedCommandsTest, APartitionThatDoesNotAnswerFailsTheAuditNamingIt) {
  FakeFleet fleet{.answers = {wire::Response{.body = AuditReport{}},
                              Status::unavailable("connection refused")}};
  const CommandOutput out = runPartitionedCommand(
      invocation({"--partitions", "127.0.0.1:1;127.0.0.1:2,127.0.0.1:3", "audit"}), fleet.fn());
  EXPECT_EQ(out.exit_code, kExitUnavailable);
  EXPECT_CONTAINS(out.err, "partition 1 (127.0.0.1:2,127.0.0.1:3)");
  EXPECT_CONTAINS(out.err, "connection refused");
}

TEST(PartitionedCommandsTest, AuditOfOneSubjectAsksItsPartitionOnly) {
  const std::string in1 = subjectIn(1, 2);
  FakeFleet fleet{
      .answers = {Status::unavailable("must not be asked"), wire::Response{.body = reportOf(in1)}}};
  const CommandOutput out = runPartitionedCommand(
      invocation({"--partitions", "127.0.0.1:1;127.0.0.1:2", "--json", "audit", "--subject", in1}),
      fleet.fn());
  EXPECT_EQ(out.exit_code, kExitOk) << out.out << out.err;
  EXPECT_EQ(fleet.called, (std::vector<uint32_t>{1}));
}

}  // namespace
}  // namespace tally::ctl
