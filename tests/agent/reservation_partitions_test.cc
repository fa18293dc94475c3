#include "agent/reservation_partitions.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "agent/outbox_store.h"
#include "tests/support/kill_acknowledged.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

struct Opened {
  std::unique_ptr<OutboxStore> store;
  std::unique_ptr<ReservationPartitions> partitions;
};

Opened openOrDie(const std::string& dir) {
  Opened opened;
  Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  if (!store.isOk()) return opened;
  opened.store = std::move(store).value();
  Result<std::unique_ptr<ReservationPartitions>> partitions =
      ReservationPartitions::open(opened.store->connection());
  EXPECT_TRUE(partitions.isOk()) << partitions.status().toString();
  if (partitions.isOk()) opened.partitions = std::move(partitions).value();
  return opened;
}

std::optional<uint32_t> findOrDie(ReservationPartitions* partitions, const std::string& id) {
  Result<std::optional<uint32_t>> found = partitions->find(id);
  EXPECT_TRUE(found.isOk()) << found.status().toString();
  return found.isOk() ? found.value() : std::nullopt;
}

TEST(ReservationPartitionsTest, RecordsFindsReplacesAndForgets) {
  TempDir dir;
  Opened opened = openOrDie(dir.path());
  ASSERT_NE(opened.partitions, nullptr);
  ReservationPartitions* partitions = opened.partitions.get();
  EXPECT_EQ(findOrDie(partitions, "r-1"), std::nullopt);
  ASSERT_TRUE(partitions->record("r-1", 1).isOk());
  ASSERT_TRUE(partitions->record("r-2", 0).isOk());
  EXPECT_EQ(findOrDie(partitions, "r-1"), 1u);
  EXPECT_EQ(findOrDie(partitions, "r-2"), 0u);
  ASSERT_TRUE(partitions->record("r-1", 3).isOk());
  EXPECT_EQ(findOrDie(partitions, "r-1"), 3u);
  ASSERT_TRUE(partitions->forget("r-1").isOk());
  ASSERT_TRUE(partitions->forget("never-recorded").isOk());
  EXPECT_EQ(findOrDie(partitions, "r-1"), std::nullopt);
  EXPECT_EQ(findOrDie(partitions, "r-2"), 0u);
  Result<uint64_t> size = partitions->size();
  ASSERT_TRUE(size.isOk());
  EXPECT_EQ(size.value(), 1u);
  EXPECT_FALSE(ReservationPartitions::open(nullptr).isOk());
}

TEST(ReservationPartitionsTest, TrimKeepsTheNewestRecords) {
  TempDir dir;
  Opened opened = openOrDie(dir.path());
  ASSERT_NE(opened.partitions, nullptr);
  ReservationPartitions* partitions = opened.partitions.get();
  for (int i = 1; i <= 10; ++i) {
    ASSERT_TRUE(partitions->record("r-" + std::to_string(i), 1).isOk());
  }
  ASSERT_TRUE(partitions->record("r-2", 0).isOk());  // recorded again: still the second oldest
  ASSERT_TRUE(partitions->trim(4).isOk());
  Result<uint64_t> size = partitions->size();
  ASSERT_TRUE(size.isOk());
  EXPECT_EQ(size.value(), 4u);
  for (int i = 1; i <= 6; ++i) {
    EXPECT_EQ(findOrDie(partitions, "r-" + std::to_string(i)), std::nullopt) << i;
  }
  for (int i = 7; i <= 10; ++i) EXPECT_EQ(findOrDie(partitions, "r-" + std::to_string(i)), 1u);
  ASSERT_TRUE(partitions->trim(100).isOk());  // fewer than the bound: nothing dropped
  size = partitions->size();
  ASSERT_TRUE(size.isOk());
  EXPECT_EQ(size.value(), 4u);
}

// A child records reservations and acknowledges each on a pipe once record() returned; the
// parent SIGKILLs it mid-stream. Every acknowledged record is found after reopening.
TEST(ReservationPartitionsTest, EveryAcknowledgedRecordSurvivesKill9) {
  TempDir dir;
  constexpr uint64_t kAcksBeforeKill = 100;
  constexpr uint64_t kRecordsMax = 100'000;
  std::set<uint64_t> acknowledged;
  ASSERT_NO_FATAL_FAILURE(testing::killAfterAcknowledgements(
      kAcksBeforeKill,
      [&](int ack_fd) {
        Opened opened = openOrDie(dir.path());
        if (opened.partitions == nullptr) ::_exit(2);
        for (uint64_t i = 1; i <= kRecordsMax; ++i) {
          const std::string id = "r-" + std::to_string(i);
          if (!opened.partitions->record(id, static_cast<uint32_t>(i % 2)).isOk()) ::_exit(3);
          if (::write(ack_fd, &i, sizeof(i)) != sizeof(i)) ::_exit(4);
        }
      },
      &acknowledged));

  Opened opened = openOrDie(dir.path());
  ASSERT_NE(opened.partitions, nullptr);
  for (uint64_t acked : acknowledged) {
    EXPECT_EQ(findOrDie(opened.partitions.get(), "r-" + std::to_string(acked)),
              static_cast<uint32_t>(acked % 2))
        << "lost r-" << acked;
  }
}

}  // namespace
}  // namespace tally::agent
