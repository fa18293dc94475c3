// Partitioned subjects with real processes (docs/scale-out.md "Partitioned subjects"): two
// ledgers, each the primary of one partition of the subjects (core/partition_map.h), and
// `tallyctl --partitions` summing the fleet's audit, checking that every subject is on its own
// partition, and naming the partition that is down while the other's subjects stay audited.

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "core/partition_map.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr uint32_t kPartitions = 2;
constexpr int kExitAuditFailed = 3;
constexpr int kExitUnavailable = 6;

std::string subjectIn(uint32_t partition) {
  for (int n = 0;; ++n) {
    std::string subject = "tenant-" + std::to_string(n);
    if (partitionOf(subject, kPartitions) == partition) return subject;
  }
}

class PartitionTest : public ::testing::Test {
 protected:
  PartitionTest() {
    for (uint32_t i = 0; i < kPartitions; ++i) {
      const std::string name = "p" + std::to_string(i);
      ledgers_.push_back(
          std::make_unique<LedgerInstance>(dir_.file(name), dir_.file(name + ".log")));
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      for (size_t i = 0; i < ledgers_.size(); ++i) {
        std::cout << "---- partition " << i << " ledger ----\n" << ledgers_[i]->log() << std::endl;
      }
    }
  }

  std::string partitionMap() const {
    return "127.0.0.1:" + std::to_string(ledgers_[0]->port()) +
           ";127.0.0.1:" + std::to_string(ledgers_[1]->port());
  }

  // tallyctl --insecure --partitions MAP --json `args`: its exit code; its output in *output.
  int tallyctl(const std::vector<std::string>& args, std::string* output) {
    std::vector<std::string> all{"--insecure", "--partitions", partitionMap(), "--json"};
    all.insert(all.end(), args.begin(), args.end());
    Process ctl(binaryPath("tallyctl"), all,
                dir_.file("tallyctl" + std::to_string(++calls_) + ".log"), /*ready_fd=*/false);
    const int code = ctl.waitExit(kExitTimeoutMs);
    *output = ctl.log();
    return code;
  }

  // Publishes on each partition's ledger the budgets of its subjects (splitBudgets).
  void publishSplit(const std::vector<Budget>& budgets) {
    const std::vector<std::vector<Budget>> split = splitBudgets(budgets, kPartitions);
    for (uint32_t i = 0; i < kPartitions; ++i) publishOn(i, split[i]);
  }
  void publishOn(uint32_t partition, const std::vector<Budget>& budgets) {
    TALLY_ASSIGN_OR_FAIL(auto client, ledgers_[partition]->connect());
    TALLY_ASSIGN_OR_FAIL(PolicyReply published, publishPolicy(*client, budgets));
    ASSERT_EQ(published.code, ReplyCode::kOk) << partition;
  }
  void reserveOn(uint32_t partition, const std::string& id, const std::string& subject,
                 Units units) {
    TALLY_ASSIGN_OR_FAIL(auto client, ledgers_[partition]->connect());
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply reply,
        callReservation(*client, makeReserve({.id = id, .subject = subject, .units = units})));
    ASSERT_EQ(reply.code, ReplyCode::kOk) << describe(reply);
  }

  TempDir dir_;
  std::vector<std::unique_ptr<LedgerInstance>> ledgers_;
  int calls_ = 0;
};

TEST_F(PartitionTest, TallyctlSumsTheFleetsAuditAndNamesThePartitionThatIsDown) {
  for (auto& ledger : ledgers_) ASSERT_TRUE(ledger->start().isOk()) << ledger->log();
  const std::string in0 = subjectIn(0);
  const std::string in1 = subjectIn(1);
  ASSERT_NO_FATAL_FAILURE(publishSplit(
      {makeBudget({.subject = in0, .burst = 100}), makeBudget({.subject = in1, .burst = 100})}));
  ASSERT_NO_FATAL_FAILURE(reserveOn(0, "r0", in0, 7));
  ASSERT_NO_FATAL_FAILURE(reserveOn(1, "r1", in1, 9));

  // The fleet's audit: both partitions' accounts, conserved.
  std::string output;
  EXPECT_EQ(tallyctl({"audit"}, &output), 0) << output;
  EXPECT_NE(output.find("\"subject\":\"" + in0 + "\""), std::string::npos) << output;
  EXPECT_NE(output.find("\"subject\":\"" + in1 + "\""), std::string::npos) << output;
  EXPECT_NE(output.find("\"conserved\":true"), std::string::npos) << output;
  EXPECT_EQ(output.find("\"conserved\":false"), std::string::npos) << output;

  // Each partition killed in turn: the fleet's audit fails naming it (exit 6), the other
  // partition's subjects are still audited.
  for (uint32_t down = 0; down < kPartitions; ++down) {
    SCOPED_TRACE("partition " + std::to_string(down) + " down");
    const std::string up_subject = down == 0 ? in1 : in0;
    const std::string down_subject = down == 0 ? in0 : in1;
    ledgers_[down]->kill9();
    EXPECT_EQ(tallyctl({"audit"}, &output), kExitUnavailable) << output;
    EXPECT_NE(output.find("partition " + std::to_string(down) + " (127.0.0.1:"), std::string::npos)
        << output;
    EXPECT_EQ(tallyctl({"audit", "--subject", up_subject}, &output), 0) << output;
    EXPECT_NE(output.find("\"subject\":\"" + up_subject + "\""), std::string::npos) << output;
    EXPECT_EQ(tallyctl({"audit", "--subject", down_subject}, &output), kExitUnavailable) << output;
    ASSERT_TRUE(ledgers_[down]->start().isOk()) << ledgers_[down]->log();  // a new port
  }
  EXPECT_EQ(tallyctl({"audit"}, &output), 0) << output;

  // A subject written to the wrong partition's ledger fails the fleet's audit, naming both.
  ASSERT_NO_FATAL_FAILURE(publishOn(
      1, {makeBudget({.subject = in1, .burst = 100}), makeBudget({.subject = in0, .burst = 100})}));
  ASSERT_NO_FATAL_FAILURE(reserveOn(1, "r-misplaced", in0, 1));
  EXPECT_EQ(tallyctl({"audit"}, &output), kExitAuditFailed) << output;
  EXPECT_NE(output.find("partition 1: holds an account of subject '" + in0 +
                        "', which maps to partition 0"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace tally::testing
