#include "core/agent_partitions.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "core/partition_map.h"

namespace tally {
namespace {

using Kind = AgentPartitionRoute::Kind;

// A subject of `partition` among `count` (the first "tenant-N" that maps there).
std::string subjectOf(uint32_t partition, uint32_t count) {
  for (int i = 0;; ++i) {
    std::string subject = "tenant-" + std::to_string(i);
    if (partitionOf(subject, count) == partition) return subject;
  }
}

AgentPartitionRoute to(uint32_t partition) {
  return {.kind = Kind::kPartition, .partition = partition};
}

TEST(AgentPartitionsTest, AReserveGoesToItsSubjectsPartition) {
  for (uint32_t partition : {0u, 1u, 2u}) {
    const ReserveRequest reserve{.reservation_id = "r", .subject = subjectOf(partition, 3)};
    EXPECT_EQ(agentPartitionRoute(reserve, 3, nullptr), to(partition)) << partition;
  }
}

TEST(AgentPartitionsTest, AFollowUpGoesToThePartitionRecordedAtItsReserve) {
  const std::map<std::string, uint32_t, std::less<>> records = {{"r0", 0}, {"r1", 1}, {"far", 7}};
  const RecordedPartition recorded = [&](std::string_view id) -> std::optional<uint32_t> {
    const auto found = records.find(id);
    if (found == records.end()) return std::nullopt;
    return found->second;
  };
  const LedgerRequest follow_ups[] = {
      StartRequest{.reservation_id = "r1"},       SettleRequest{.reservation_id = "r1"},
      ReleaseRequest{.reservation_id = "r1"},     QueryRequest{.reservation_id = "r1"},
      MarkUnknownRequest{.reservation_id = "r1"}, ReportOperationRequest{.reservation_id = "r1"},
      ExtendRequest{.reservation_id = "r1"}};
  for (const LedgerRequest& request : follow_ups) {
    EXPECT_EQ(reservationIdOf(request), "r1") << request.index();
    EXPECT_EQ(agentPartitionRoute(request, 2, recorded), to(1)) << request.index();
  }
  EXPECT_EQ(agentPartitionRoute(SettleRequest{.reservation_id = "r0"}, 2, recorded), to(0));
  // Not recorded (or recorded under a larger map): the reservation may be on any partition.
  for (const char* id : {"unseen", "far"}) {
    EXPECT_EQ(agentPartitionRoute(SettleRequest{.reservation_id = id}, 2, recorded).kind,
              Kind::kUnrecorded)
        << id;
  }
  EXPECT_EQ(agentPartitionRoute(StartRequest{.reservation_id = "r1"}, 2, nullptr).kind,
            Kind::kUnrecorded);
}

TEST(AgentPartitionsTest, FleetWideRequestsGoToEveryPartitionAndUnknownOnesNowhere) {
  EXPECT_EQ(agentPartitionRoute(HealthRequest{}, 2, nullptr).kind, Kind::kEvery);
  EXPECT_EQ(agentPartitionRoute(ShowPolicyRequest{}, 2, nullptr).kind, Kind::kEvery);
  EXPECT_EQ(agentPartitionRoute(AuditRequest{}, 2, nullptr).kind, Kind::kEvery);
  EXPECT_EQ(agentPartitionRoute(AuditRequest{.subject = subjectOf(1, 2)}, 2, nullptr), to(1));
  EXPECT_EQ(agentPartitionRoute(UnknownMessage{}, 2, nullptr).kind, Kind::kNotSent);
  EXPECT_EQ(reservationIdOf(HealthRequest{}), "");
}

// One partition: everything to partition 0, recorded or not, as an unpartitioned agent.
TEST(AgentPartitionsTest, OnePartitionRoutesEverythingToIt) {
  const LedgerRequest requests[] = {ReserveRequest{.reservation_id = "r", .subject = "s"},
                                    SettleRequest{.reservation_id = "unseen"}, HealthRequest{},
                                    AuditRequest{}, ShowPolicyRequest{}};
  for (const LedgerRequest& request : requests) {
    EXPECT_EQ(agentPartitionRoute(request, 1, nullptr), to(0)) << request.index();
  }
  EXPECT_EQ(agentPartitionRoute(UnknownMessage{}, 1, nullptr).kind, Kind::kNotSent);
}

}  // namespace
}  // namespace tally
