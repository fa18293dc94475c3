#include "core/receipt_archive.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/reservation_table.h"

namespace tally {
namespace {

using S = ReservationState;

Reservation receipt(const std::string& id, uint64_t closed_at_ms = 1'000) {
  return Reservation{.reservation_id = id,
                     .subject = "tenant-1",
                     .route = "/v1/chat",
                     .reserved_units = 5,
                     .created_at_ms = 900,
                     .closed_at_ms = closed_at_ms,
                     .state = S::kReleased};
}

uint64_t hashOf(const std::string& id) { return ReservationTable::hashOf(id); }

bool add(ReceiptArchive* archive, const Reservation& r, uint64_t keep_until_ms) {
  return archive->add(r, hashOf(r.reservation_id), keep_until_ms);
}

TEST(ReceiptArchiveTest, EncodingKeepsEveryField) {
  Reservation full{.reservation_id = "r-1",
                   .subject = std::string(256, 's'),
                   .route = "/v1/chat",
                   .policy_generation = 7,
                   .accounting_epoch_ms = 1'700'000'000'000,
                   .reserved_units = uint64_t{1} << 40,
                   .actual_units = 12,
                   .refunded_units = 3,
                   .debt_units = 9,
                   .operation_id = "op-1",
                   .created_at_ms = 1'700'000'001'000,
                   .expires_at_ms = 1'700'000'031'000,
                   .started_at_ms = 1'700'000'002'000,
                   .closed_at_ms = 1'700'000'003'000,
                   .state = S::kSettledWithDebt,
                   .origin = "shard-9",
                   .closed_by_hard_limit = true,
                   .late_receipt_applied = true,
                   .overdraft_breach = true,
                   .limiting_dimension = LimitingDimension::kCapacity,
                   .retry_after_ms = -1,
                   .priority = 0xffff'ffffu,
                   .requested_generation = 6,
                   .request_fields_known = true,
                   .region = "eu",
                   .gateway_name = "gw-a"};
  for (size_t i = 0; i < full.request_digest.size(); ++i) full.request_digest[i] = uint8_t(i * 7);
  std::string bytes;
  ReceiptArchive::encode(full, &bytes);
  Reservation back;
  ASSERT_TRUE(ReceiptArchive::decode(bytes, &back));
  EXPECT_EQ(back, full);

  // All zero (a time before createdAt too: a restored row may hold anything).
  const Reservation zero{.reservation_id = "z", .created_at_ms = 50, .closed_at_ms = 10};
  ReceiptArchive::encode(zero, &bytes);
  ASSERT_TRUE(ReceiptArchive::decode(bytes, &back));
  EXPECT_EQ(back, zero);

  // A truncated or extended encoding is refused.
  ReceiptArchive::encode(full, &bytes);
  EXPECT_FALSE(ReceiptArchive::decode(std::string_view(bytes).substr(0, bytes.size() - 1), &back));
  EXPECT_FALSE(ReceiptArchive::decode(bytes + "x", &back));
}

TEST(ReceiptArchiveTest, FindsTakesAndCountsReceipts) {
  ReceiptArchive archive(1'000);
  EXPECT_FALSE(archive.contains("a", hashOf("a")));  // no index yet
  ASSERT_TRUE(add(&archive, receipt("a"), 10'000));
  Reservation b = receipt("b");
  b.state = S::kSettled;
  ASSERT_TRUE(add(&archive, b, 10'000));
  EXPECT_EQ(archive.size(), 2u);
  EXPECT_EQ(archive.countOf(S::kReleased), 1u);
  EXPECT_EQ(archive.countOf(S::kSettled), 1u);
  EXPECT_EQ(archive.find("a", hashOf("a")), receipt("a"));
  EXPECT_FALSE(archive.find("c", hashOf("c")).has_value());

  EXPECT_EQ(archive.take("a", hashOf("a")), receipt("a"));
  EXPECT_FALSE(archive.contains("a", hashOf("a")));
  EXPECT_FALSE(archive.take("a", hashOf("a")).has_value());
  EXPECT_EQ(archive.countOf(S::kReleased), 0u);
  EXPECT_EQ(archive.size(), 1u);
  // Taken and added again (the ledger's round trip for a late receipt).
  ASSERT_TRUE(add(&archive, receipt("a"), 10'000));
  std::vector<std::string> ids;
  archive.forEach([&](const Reservation& r) { ids.push_back(r.reservation_id); });
  EXPECT_EQ(ids, (std::vector<std::string>{"b", "a"}));
}

// The packed bytes the simulator's checker caches by: what find and forEach decode, in forEach's
// order, and exactly encode()'s bytes.
TEST(ReceiptArchiveTest, PackedReceiptsAreTheEncodingsForEachDecodes) {
  ReceiptArchive archive(1'000);
  EXPECT_FALSE(archive.findPacked("a", hashOf("a")).has_value());
  Reservation b = receipt("b");
  b.state = S::kSettled;
  b.actual_units = 3;
  ASSERT_TRUE(add(&archive, receipt("a"), 10'000));
  ASSERT_TRUE(add(&archive, b, 10'000));
  std::string encoded_b;
  ReceiptArchive::encode(b, &encoded_b);
  EXPECT_EQ(archive.findPacked("b", hashOf("b")), std::optional<std::string_view>(encoded_b));
  EXPECT_FALSE(archive.findPacked("c", hashOf("c")).has_value());
  std::vector<Reservation> decoded;
  archive.forEachPacked([&](std::string_view bytes) {
    Reservation r;
    ASSERT_TRUE(ReceiptArchive::decode(bytes, &r));
    decoded.push_back(r);
  });
  EXPECT_EQ(decoded, (std::vector<Reservation>{receipt("a"), b}));
  ASSERT_TRUE(archive.take("a", hashOf("a")).has_value());
  size_t visited = 0;
  archive.forEachPacked([&](std::string_view) { ++visited; });
  EXPECT_EQ(visited, 1u);
}

// The version the simulator's checker caches by: it moves on every add, take and compaction
// that forgets something, and on nothing else (find, contains, a take or compact that finds
// nothing, forEach).
TEST(ReceiptArchiveTest, VersionMovesExactlyWhenTheReceiptsChange) {
  ReceiptArchive archive(1'000);
  uint64_t version = archive.version();
  auto moved = [&] {
    const bool changed = archive.version() != version;
    version = archive.version();
    return changed;
  };
  ASSERT_TRUE(add(&archive, receipt("a"), 5'100));
  EXPECT_TRUE(moved());
  ASSERT_TRUE(add(&archive, receipt("b"), 9'000));
  EXPECT_TRUE(moved());
  EXPECT_TRUE(archive.find("a", hashOf("a")).has_value());
  EXPECT_TRUE(archive.contains("b", hashOf("b")));
  EXPECT_FALSE(archive.take("c", hashOf("c")).has_value());
  archive.forEach([](const Reservation&) {});
  std::vector<std::string> forgotten;
  EXPECT_EQ(archive.compact(5'099, 100, &forgotten), 0u);
  EXPECT_FALSE(moved());
  EXPECT_TRUE(archive.take("b", hashOf("b")).has_value());
  EXPECT_TRUE(moved());
  EXPECT_EQ(archive.compact(5'100, 100, &forgotten), 1u);
  EXPECT_TRUE(moved());
}

TEST(ReceiptArchiveTest, CompactsEachReceiptAtItsMomentOrWithinOneBucketAfter) {
  ReceiptArchive archive(1'000);
  ASSERT_TRUE(add(&archive, receipt("early"), 5'100));
  ASSERT_TRUE(add(&archive, receipt("late"), 5'900));
  ASSERT_TRUE(add(&archive, receipt("next"), 6'200));
  std::vector<std::string> forgotten;
  EXPECT_EQ(archive.compact(5'099, 100, &forgotten), 0u);
  EXPECT_EQ(archive.compact(5'100, 100, &forgotten), 1u);
  EXPECT_EQ(forgotten, std::vector<std::string>{"early"});
  EXPECT_TRUE(archive.contains("late", hashOf("late")));
  // Out of order within one bucket: held behind the front until the bucket ends.
  ASSERT_TRUE(add(&archive, receipt("behind"), 5'200));
  EXPECT_EQ(archive.compact(5'300, 100, &forgotten), 0u);
  EXPECT_EQ(archive.compact(6'000, 100, &forgotten), 2u);
  EXPECT_EQ(forgotten, (std::vector<std::string>{"early", "late", "behind"}));
  EXPECT_TRUE(archive.contains("next", hashOf("next")));
  EXPECT_EQ(archive.compact(6'200, 100, &forgotten), 1u);
  EXPECT_EQ(archive.size(), 0u);
}

TEST(ReceiptArchiveTest, MemoryIsReturnedAsTheWindowMovesAndStaysFlat) {
  // A sliding window of 20,000 receipts, 200 closing per ms: the bytes held level off.
  ReceiptArchive archive(100);
  std::map<std::string, bool> kept;
  uint64_t next = 0;
  uint64_t peak_first = 0;
  uint64_t peak_later = 0;
  std::vector<std::string> forgotten;
  for (uint64_t now = 1; now <= 1'000; ++now) {
    for (int i = 0; i < 200; ++i, ++next) {
      Reservation r = receipt("r-" + std::to_string(next), now);
      r.operation_id = std::string(next % 64, 'o');  // receipts of varied sizes
      ASSERT_TRUE(add(&archive, r, now + 100));
    }
    forgotten.clear();
    archive.compact(now, 1'000'000, &forgotten);
    for (const std::string& id : forgotten) {
      const uint64_t n = std::stoull(id.substr(2));
      EXPECT_LE(n / 200 + 1 + 100, now) << id;  // never before its moment
    }
    if (now <= 300) peak_first = std::max(peak_first, archive.bytes());
    if (now > 300) peak_later = std::max(peak_later, archive.bytes());
  }
  EXPECT_LE(archive.size(), 20'000u + 200u * 100u);
  EXPECT_LE(peak_later, peak_first + (uint64_t{1} << 20));
  // Every chunk's gap is seen as one: each receipt kept is visited, and decodes.
  uint64_t visited = 0;
  archive.forEachPacked([&](std::string_view packed) {
    Reservation r;
    EXPECT_TRUE(ReceiptArchive::decode(packed, &r));
    ++visited;
  });
  EXPECT_EQ(visited, archive.size());
  // Every id inside the window is found; every one before it is gone.
  EXPECT_TRUE(archive.contains("r-199999", hashOf("r-199999")));
  EXPECT_FALSE(archive.contains("r-0", hashOf("r-0")));
}

TEST(ReceiptArchiveTest, RandomOperationsMatchAMap) {
  std::mt19937_64 rng(13);
  ReceiptArchive archive(50);
  std::map<std::string, uint64_t> model;  // id -> keep until
  std::vector<std::string> forgotten;
  for (uint64_t now = 0; now < 3'000; ++now) {
    const std::string id = "id-" + std::to_string(rng() % 2'000);
    const uint64_t hash = hashOf(id);
    switch (rng() % 3) {
      case 0:
        if (!model.contains(id)) {
          const uint64_t until = now + 1 + rng() % 200;
          ASSERT_TRUE(archive.add(receipt(id, now), hash, until));
          model[id] = until;
        }
        break;
      case 1: {
        const bool had = model.erase(id) > 0;
        EXPECT_EQ(archive.take(id, hash).has_value(), had);
        break;
      }
      default: EXPECT_EQ(archive.contains(id, hash), model.contains(id)); break;
    }
    forgotten.clear();
    archive.compact(now, 1'000'000, &forgotten);
    for (const std::string& gone : forgotten) {
      ASSERT_TRUE(model.contains(gone));
      EXPECT_LE(model[gone], now);
      EXPECT_GE(model[gone] + 50, now);  // within one bucket of its moment
      model.erase(gone);
    }
    ASSERT_EQ(archive.size(), model.size());
  }
}

}  // namespace
}  // namespace tally
