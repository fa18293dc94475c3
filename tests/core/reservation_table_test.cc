#include "core/reservation_table.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace tally {
namespace {

Reservation reservationNamed(const std::string& id, Units units = 1) {
  return Reservation{.reservation_id = id, .subject = "s", .route = "r", .reserved_units = units};
}

ReservationTable::Record* insert(ReservationTable* table, const std::string& id, Units units = 1) {
  return table->insert(reservationNamed(id, units), ReservationTable::hashOf(id));
}

TEST(ReservationTableTest, FindsWhatWasInsertedAndNothingElse) {
  ReservationTable table;
  EXPECT_EQ(table.find("a"), nullptr);  // an empty table has no index yet
  ReservationTable::Record* a = insert(&table, "a", 7);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(table.find("a"), a);
  EXPECT_EQ(a->reservation.reserved_units, 7u);
  EXPECT_FALSE(a->change_pending);
  EXPECT_EQ(table.find("b"), nullptr);
  EXPECT_EQ(table.size(), 1u);
}

TEST(ReservationTableTest, EraseFreesTheSlotForReuseAndClearsTheRecord) {
  ReservationTable table;
  ReservationTable::Record* a = insert(&table, "a");
  a->change_pending = true;
  EXPECT_TRUE(table.erase("a"));
  EXPECT_FALSE(table.erase("a"));
  EXPECT_EQ(table.find("a"), nullptr);
  EXPECT_EQ(table.size(), 0u);
  ReservationTable::Record* b = insert(&table, "b");
  EXPECT_EQ(b, a);  // the freed slot, cleared
  EXPECT_FALSE(b->change_pending);
  EXPECT_EQ(b->reservation.reservation_id, "b");
  // The same id can come back after its erase.
  ReservationTable::Record* again = insert(&table, "a");
  EXPECT_EQ(table.find("a"), again);
}

TEST(ReservationTableTest, HandleNamesOneInsertAndNothingAfterItsErase) {
  ReservationTable table;
  ReservationTable::Record* a = insert(&table, "a");
  const ReservationTable::Handle handle = ReservationTable::handleOf(*a);
  EXPECT_EQ(table.resolve(handle), a);
  insert(&table, "b");
  EXPECT_EQ(table.resolve(handle), a);
  ASSERT_TRUE(table.erase("a"));
  EXPECT_EQ(table.resolve(handle), nullptr);
  // The slot and even the id come back as a new record: the old handle still names nothing.
  ReservationTable::Record* again = insert(&table, "a");
  EXPECT_EQ(again, a);
  EXPECT_EQ(table.resolve(handle), nullptr);
  EXPECT_EQ(table.resolve(ReservationTable::handleOf(*again)), again);
}

TEST(ReservationTableTest, ForEachVisitsEveryRecordInSlotOrder) {
  ReservationTable table;
  for (int i = 0; i < 5; ++i) insert(&table, "r" + std::to_string(i));
  EXPECT_TRUE(table.erase("r1"));
  EXPECT_TRUE(table.erase("r3"));
  std::vector<std::string> seen;
  table.forEach([&](const ReservationTable::Record& record) {
    seen.push_back(record.reservation.reservation_id);
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"r0", "r2", "r4"}));
}

// A model check: random inserts and erases (small id spaces make long probe runs, wrap-around and
// backward shifts frequent) against std::map; records never move while they are present.
TEST(ReservationTableTest, MatchesAMapThroughRandomInsertsAndErases) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 random(seed);
    const uint64_t id_space = 8 + random() % 3000;
    ReservationTable table;
    std::map<std::string, std::pair<Units, const ReservationTable::Record*>> model;
    for (int step = 0; step < 20'000; ++step) {
      const std::string id = "id-" + std::to_string(random() % id_space);
      auto it = model.find(id);
      if (random() % 3 != 0) {
        if (it != model.end()) continue;
        const Units units = 1 + random() % 1000;
        model[id] = {units, insert(&table, id, units)};
      } else {
        ASSERT_EQ(table.erase(id), it != model.end()) << "seed " << seed << " step " << step;
        if (it != model.end()) model.erase(it);
      }
      ASSERT_EQ(table.size(), model.size());
      if (step % 97 != 0) continue;
      for (const auto& [key, expected] : model) {
        const ReservationTable::Record* found = table.find(key);
        ASSERT_EQ(found, expected.second) << "seed " << seed << " id " << key;
        ASSERT_EQ(found->reservation.reserved_units, expected.first);
      }
      size_t visited = 0;
      table.forEach([&](const ReservationTable::Record& record) {
        ++visited;
        EXPECT_TRUE(model.contains(record.reservation.reservation_id));
      });
      ASSERT_EQ(visited, model.size());
    }
  }
}

TEST(ReservationTableTest, GrowsToManyRecords) {
  ReservationTable table;
  constexpr int kCount = 200'000;
  std::vector<const ReservationTable::Record*> records;
  records.reserve(kCount);
  for (int i = 0; i < kCount; ++i) {
    records.push_back(insert(&table, "bench-1234-" + std::to_string(i), static_cast<Units>(i)));
  }
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(table.find("bench-1234-" + std::to_string(i)), records[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(table.find("bench-1234-" + std::to_string(kCount)), nullptr);
  EXPECT_EQ(table.size(), static_cast<size_t>(kCount));
}

TEST(ReservationTableDeathTest, InsertingAPresentIdIsABug) {
  ReservationTable table;
  insert(&table, "a");
  EXPECT_DEATH(insert(&table, "a"), "");
}

}  // namespace
}  // namespace tally
