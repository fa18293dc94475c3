#include "core/partition_map.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tally {
namespace {

// The first "tenant-N" that partitionOf() puts in `partition` of `count`.
std::string subjectIn(uint32_t partition, uint32_t count) {
  for (int n = 0;; ++n) {
    std::string subject = "tenant-" + std::to_string(n);
    if (partitionOf(subject, count) == partition) return subject;
  }
}

AccountView account(const std::string& subject) {
  return AccountView{.key = {.subject = subject, .route = "chat", .generation = 1}};
}

TEST(PartitionMapTest, TheHashIsFnv1a64OfTheSubjectsBytes) {
  // The published FNV-1a 64 test vectors: the hash is a configuration contract.
  EXPECT_EQ(subjectHash(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(subjectHash("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(subjectHash("foobar"), 0x85944171f73967e8ULL);
  EXPECT_EQ(partitionOf("foobar", 7), 0x85944171f73967e8ULL % 7);
  EXPECT_EQ(partitionOf("foobar", 1), 0u);
  EXPECT_EQ(partitionOf("foobar", 0), 0u);  // no partitions: the one ledger
}

TEST(PartitionMapTest, SubjectsSpreadOverThePartitions) {
  constexpr uint32_t kCount = 4;
  std::vector<int> per_partition(kCount, 0);
  for (int n = 0; n < 4000; ++n)
    ++per_partition[partitionOf("tenant-" + std::to_string(n), kCount)];
  for (uint32_t i = 0; i < kCount; ++i) {
    EXPECT_GT(per_partition[i], 850) << "partition " << i;
    EXPECT_LT(per_partition[i], 1150) << "partition " << i;
  }
}

TEST(PartitionMapTest, ParsesPartitionsSeparatedBySemicolonsOfAddressLists) {
  Result<PartitionMap> parsed = parsePartitionMap("10.0.0.5:7411, 10.0.0.6:7411 ; 10.0.1.5:7411");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
  const PartitionMap& map = parsed.value();
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map.partitions[0], (std::vector<std::string>{"10.0.0.5:7411", "10.0.0.6:7411"}));
  EXPECT_EQ(map.partitions[1], (std::vector<std::string>{"10.0.1.5:7411"}));
  EXPECT_EQ(formatPartitionMap(map), "10.0.0.5:7411,10.0.0.6:7411;10.0.1.5:7411");
  Result<PartitionMap> again = parsePartitionMap(formatPartitionMap(map));
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again.value(), map);
  Result<PartitionMap> one = parsePartitionMap("a:1");
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  EXPECT_EQ(one.value().size(), 1u);
}

TEST(PartitionMapTest, RefusesEmptyPartitionsAddressesAndTooManyPartitions) {
  for (const char* bad : {"", "  ", "a:1;;b:2", "a:1;", ";a:1", "a:1,,b:2", "a:1, "}) {
    Result<PartitionMap> parsed = parsePartitionMap(bad);
    EXPECT_FALSE(parsed.isOk()) << "'" << bad << "'";
    if (!parsed.isOk()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  std::string many = "a:1";
  for (size_t i = 1; i < kPartitionsMax; ++i) many += ";a:1";
  EXPECT_TRUE(parsePartitionMap(many).isOk());
  EXPECT_FALSE(parsePartitionMap(many + ";a:1").isOk());
}

TEST(PartitionMapTest, RoutesEachRequestBySubjectReservationShardOrToAll) {
  constexpr uint32_t kCount = 2;
  const std::string in1 = subjectIn(1, kCount);
  const PartitionTarget reserve = partitionTarget(ReserveRequest{.subject = in1}, kCount);
  EXPECT_EQ(reserve.routing, PartitionRouting::kOne);
  EXPECT_EQ(reserve.partition, 1u);
  EXPECT_EQ(partitionTarget(ShardIssueRequest{.subject = in1}, kCount).partition, 1u);
  ShardReport report;
  report.shard.subject = in1;
  EXPECT_EQ(partitionTarget(report, kCount).routing, PartitionRouting::kOne);
  EXPECT_EQ(partitionTarget(report, kCount).partition, 1u);
  EXPECT_EQ(partitionTarget(AuditRequest{}, kCount).routing, PartitionRouting::kAll);
  const PartitionTarget audit_one = partitionTarget(AuditRequest{.subject = in1}, kCount);
  EXPECT_EQ(audit_one.routing, PartitionRouting::kOne);
  EXPECT_EQ(audit_one.partition, 1u);
  for (const LedgerRequest& by_reservation :
       {LedgerRequest{StartRequest{}}, LedgerRequest{SettleRequest{}},
        LedgerRequest{ReleaseRequest{}}, LedgerRequest{QueryRequest{}},
        LedgerRequest{ExtendRequest{}}, LedgerRequest{MarkUnknownRequest{}},
        LedgerRequest{ReportOperationRequest{}}}) {
    EXPECT_EQ(partitionTarget(by_reservation, kCount).routing, PartitionRouting::kByReservation)
        << by_reservation.index();
  }
  EXPECT_EQ(partitionTarget(WriteOffShardRequest{}, kCount).routing, PartitionRouting::kByShard);
  for (const LedgerRequest& fleet :
       {LedgerRequest{HealthRequest{}}, LedgerRequest{PublishPolicyRequest{}},
        LedgerRequest{ListGatewaysRequest{}}, LedgerRequest{EnrollGatewayRequest{}}}) {
    EXPECT_EQ(partitionTarget(fleet, kCount).routing, PartitionRouting::kAll) << fleet.index();
  }
  EXPECT_EQ(partitionTarget(UnknownMessage{}, kCount).routing, PartitionRouting::kNone);
}

TEST(PartitionMapTest, SplitsBudgetsBySubjectAndGivesPatternsToEveryPartition) {
  constexpr uint32_t kCount = 3;
  const std::string in0 = subjectIn(0, kCount);
  const std::string in2 = subjectIn(2, kCount);
  const std::vector<Budget> budgets{Budget{.subject_pattern = in2, .route = "chat"},
                                    Budget{.subject_pattern = "tenant-*", .route = "chat"},
                                    Budget{.subject_pattern = in0, .route = "chat"}};
  const std::vector<std::vector<Budget>> split = splitBudgets(budgets, kCount);
  ASSERT_EQ(split.size(), 3u);
  ASSERT_EQ(split[0].size(), 2u);
  EXPECT_EQ(split[0][0].subject_pattern, "tenant-*");
  EXPECT_EQ(split[0][1].subject_pattern, in0);
  ASSERT_EQ(split[1].size(), 1u);
  EXPECT_EQ(split[1][0].subject_pattern, "tenant-*");
  ASSERT_EQ(split[2].size(), 2u);
  EXPECT_EQ(split[2][0].subject_pattern, in2);
}

TEST(PartitionMapTest, TheFleetsAuditSumsThePartitionsAndChecksEverySubjectIsInItsOwn) {
  constexpr uint32_t kCount = 2;
  const std::string in0 = subjectIn(0, kCount);
  const std::string in1 = subjectIn(1, kCount);
  std::vector<AuditReport> reports(kCount);
  reports[0].as_of_ms = 100;
  reports[0].accounts = {account(in0)};
  reports[1].as_of_ms = 250;
  reports[1].accounts = {account(in1)};
  AuditReport merged = mergePartitionAudits(reports);
  EXPECT_TRUE(merged.conserved);
  EXPECT_TRUE(merged.violations.empty());
  EXPECT_EQ(merged.as_of_ms, 250u);
  ASSERT_EQ(merged.accounts.size(), 2u);
  EXPECT_LT(merged.accounts[0].key, merged.accounts[1].key);

  // A partition that does not conserve: the fleet does not, and says which.
  reports[1].conserved = false;
  reports[1].violations = {"tenant-x/chat: reserved 5 != held 4"};
  merged = mergePartitionAudits(reports);
  EXPECT_FALSE(merged.conserved);
  ASSERT_EQ(merged.violations.size(), 1u);
  EXPECT_EQ(merged.violations[0], "partition 1: tenant-x/chat: reserved 5 != held 4");

  // A subject on the wrong partition's ledger (a map that differs between writers).
  reports[1] = AuditReport{.accounts = {account(in1), account(in0)}};
  merged = mergePartitionAudits(reports);
  EXPECT_FALSE(merged.conserved);
  ASSERT_EQ(merged.violations.size(), 1u);
  EXPECT_EQ(merged.violations[0],
            "partition 1: holds an account of subject '" + in0 + "', which maps to partition 0");
  EXPECT_EQ(merged.accounts.size(), 3u);
}

}  // namespace
}  // namespace tally
