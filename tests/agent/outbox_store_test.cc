#include "agent/outbox_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tests/support/kill_acknowledged.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

OutboxEntry entry(uint64_t seq, OutboxKind kind = OutboxKind::kSettle) {
  return OutboxEntry{.seq = seq,
                     .kind = kind,
                     .reservation_id = "r-" + std::to_string(seq),
                     .operation_id = seq % 2 == 0 ? "op-" + std::to_string(seq) : "",
                     .actual_units = seq * 10,
                     .enqueued_at_ms = 1'000 + seq,
                     .attempts = static_cast<uint32_t>(seq % 3),
                     .next_attempt_ms = 2'000 + seq};
}

std::unique_ptr<OutboxStore> openOrDie(const std::string& dir, OutboxStoreOptions options = {}) {
  Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir, options);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  return store.isOk() ? std::move(store).value() : nullptr;
}

std::vector<OutboxEntry> loadOrDie(OutboxStore* store) {
  Result<std::vector<OutboxEntry>> entries = store->load();
  EXPECT_TRUE(entries.isOk()) << entries.status().toString();
  return entries.isOk() ? std::move(entries).value() : std::vector<OutboxEntry>{};
}

TEST(OutboxStoreTest, RoundTripsEveryKindAndField) {
  TempDir dir;
  auto store = openOrDie(dir.file("data"));
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(loadOrDie(store.get()).empty());
  std::vector<OutboxEntry> written = {entry(1, OutboxKind::kSettle), entry(2, OutboxKind::kRelease),
                                      entry(3, OutboxKind::kMarkUnknown),
                                      entry(4, OutboxKind::kReportOperation)};
  written[3].actual_units = (uint64_t{1} << 62);
  for (const OutboxEntry& e : written) ASSERT_TRUE(store->append(e).isOk());
  EXPECT_EQ(loadOrDie(store.get()), written);

  struct stat info {};
  ASSERT_EQ(::stat(dir.file("data").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0750u);
}

TEST(OutboxStoreTest, LoadsBySeqWhateverTheAppendOrder) {
  TempDir dir;
  auto store = openOrDie(dir.path());
  ASSERT_TRUE(store->appendBatch({entry(7), entry(3), entry(5)}).isOk());
  ASSERT_TRUE(store->append(entry(1)).isOk());
  std::vector<OutboxEntry> loaded = loadOrDie(store.get());
  ASSERT_EQ(loaded.size(), 4u);
  EXPECT_EQ(loaded[0].seq, 1u);
  EXPECT_EQ(loaded[1].seq, 3u);
  EXPECT_EQ(loaded[2].seq, 5u);
  EXPECT_EQ(loaded[3].seq, 7u);
}

TEST(OutboxStoreTest, RemoveDeletesOnlyThatEntryAndIsIdempotent) {
  TempDir dir;
  auto store = openOrDie(dir.path());
  ASSERT_TRUE(store->appendBatch({entry(1), entry(2), entry(3)}).isOk());
  ASSERT_TRUE(store->remove(2).isOk());
  ASSERT_TRUE(store->remove(2).isOk());   // redelivered: harmless
  ASSERT_TRUE(store->remove(99).isOk());  // never stored
  EXPECT_EQ(loadOrDie(store.get()), (std::vector<OutboxEntry>{entry(1), entry(3)}));
}

TEST(OutboxStoreTest, InvalidEntriesAreRefusedAndABatchIsAllOrNothing) {
  TempDir dir;
  auto store = openOrDie(dir.path());
  EXPECT_EQ(store->append(entry(0)).code(), StatusCode::kInvalidArgument);
  OutboxEntry huge = entry(1);
  huge.actual_units = ~uint64_t{0};
  EXPECT_EQ(store->append(huge).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->append(entry(1)).isOk());
  EXPECT_EQ(store->append(entry(1)).code(), StatusCode::kInvalidArgument);  // seq already stored
  // The duplicate 1 fails the whole batch: 2 and 3 are not stored either.
  EXPECT_EQ(store->appendBatch({entry(2), entry(1), entry(3)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(loadOrDie(store.get()), (std::vector<OutboxEntry>{entry(1)}));
  ASSERT_TRUE(store->appendBatch({entry(2), entry(3)}).isOk());  // still usable
  EXPECT_EQ(loadOrDie(store.get()).size(), 3u);
}

// The boot epoch is shard/store.h's (tests/shard/store_test.cc).
TEST(OutboxStoreTest, ReopenKeepsEntriesAndMeta) {
  TempDir dir;
  {
    auto store = openOrDie(dir.path());
    ASSERT_TRUE(store->appendBatch({entry(1), entry(2), entry(3)}).isOk());
    ASSERT_TRUE(store->remove(1).isOk());
    ASSERT_TRUE(store->putMeta("policy_generation", 42).isOk());
    ASSERT_TRUE(store->putMeta("policy_generation", 43).isOk());
    ASSERT_TRUE(store->putMeta("negative", -5).isOk());
    EXPECT_EQ(store->putMeta("", 1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->putMeta(std::string(257, 'k'), 1).code(), StatusCode::kInvalidArgument);
    Result<std::optional<int64_t>> missing = store->getMeta("missing");
    ASSERT_TRUE(missing.isOk());
    EXPECT_FALSE(missing.value().has_value());
  }
  for (int start = 2; start <= 4; ++start) {
    auto store = openOrDie(dir.path());
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(loadOrDie(store.get()), (std::vector<OutboxEntry>{entry(2), entry(3)}));
    Result<std::optional<int64_t>> generation = store->getMeta("policy_generation");
    ASSERT_TRUE(generation.isOk());
    EXPECT_EQ(generation.value(), std::optional<int64_t>(43));
    Result<std::optional<int64_t>> negative = store->getMeta("negative");
    ASSERT_TRUE(negative.isOk());
    EXPECT_EQ(negative.value(), std::optional<int64_t>(-5));
    // Reserved names live apart from the agent's own keys.
    Result<std::optional<int64_t>> reserved = store->getMeta("boot_epoch");
    ASSERT_TRUE(reserved.isOk());
    EXPECT_FALSE(reserved.value().has_value());
  }
}

TEST(OutboxStoreTest, SecondOpenOfTheSameDirIsRefused) {
  TempDir dir;
  auto first = openOrDie(dir.path());
  Result<std::unique_ptr<OutboxStore>> second = OutboxStore::open(dir.path());
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
  first.reset();
  EXPECT_NE(openOrDie(dir.path()), nullptr);  // free again once the first closed
}

TEST(OutboxStoreTest, AnotherSchemaVersionIsRefused) {
  TempDir dir;
  openOrDie(dir.path()).reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.file("agent.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE meta SET value = 3 WHERE key = 'schema_version'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir.path());
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("schema_version 3"), std::string::npos)
      << store.status().toString();
}

TEST(OutboxStoreTest, AForeignDatabaseIsRefused) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.file("agent.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE other (x INTEGER)", nullptr, nullptr, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir.path());
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
}

TEST(OutboxStoreTest, DiskFullIsResourceExhaustedAndKeepsWhatWasStored) {
  TempDir dir;
  auto store = openOrDie(dir.path(), {.database_pages_max = 16});
  ASSERT_NE(store, nullptr);
  Status status;
  uint64_t seq = 0;
  while (status.isOk() && seq < 100'000) {
    OutboxEntry e = entry(++seq);
    e.reservation_id = std::string(120, 'x') + std::to_string(seq);
    status = store->append(e);
  }
  ASSERT_EQ(status.code(), StatusCode::kResourceExhausted) << status.toString();
  EXPECT_NE(status.message().find("disk full"), std::string::npos);
  EXPECT_EQ(loadOrDie(store.get()).size(), seq - 1);
  // Room comes back after removals.
  ASSERT_TRUE(store->remove(1).isOk());
  ASSERT_TRUE(store->remove(2).isOk());
  OutboxEntry again = entry(seq);
  EXPECT_TRUE(store->append(again).isOk());
}

// A child appends entries and acknowledges each seq on a pipe once append() returned; the parent
// SIGKILLs it mid-stream. Every acknowledged entry must be there after reopening.
TEST(OutboxStoreTest, EveryAcknowledgedEntrySurvivesKill9) {
  TempDir dir;
  constexpr uint64_t kAcksBeforeKill = 150;
  constexpr uint64_t kEntriesMax = 100'000;
  std::set<uint64_t> acknowledged;
  ASSERT_NO_FATAL_FAILURE(testing::killAfterAcknowledgements(
      kAcksBeforeKill,
      [&](int ack_fd) {
        Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir.path());
        if (!store.isOk()) ::_exit(2);
        for (uint64_t seq = 1; seq <= kEntriesMax; ++seq) {
          // Alternate single appends and small batches: both must be durable on return.
          if (seq % 4 == 0) {
            if (!store.value()->appendBatch({entry(seq), entry(seq + 1)}).isOk()) ::_exit(3);
            for (uint64_t acked : {seq, seq + 1}) {
              if (::write(ack_fd, &acked, sizeof(acked)) != sizeof(acked)) ::_exit(4);
            }
            ++seq;
            continue;
          }
          if (!store.value()->append(entry(seq)).isOk()) ::_exit(3);
          if (::write(ack_fd, &seq, sizeof(seq)) != sizeof(seq)) ::_exit(4);
        }
      },
      &acknowledged));

  auto store = openOrDie(dir.path());
  ASSERT_NE(store, nullptr);
  std::vector<OutboxEntry> loaded = loadOrDie(store.get());
  std::set<uint64_t> present;
  for (const OutboxEntry& e : loaded) {
    EXPECT_EQ(e, entry(e.seq));  // no torn or mixed-up rows
    present.insert(e.seq);
  }
  for (uint64_t acked : acknowledged) EXPECT_TRUE(present.count(acked) == 1) << "lost " << acked;
  // Entries come by seq without holes: the child appended in order.
  ASSERT_FALSE(loaded.empty());
  EXPECT_EQ(loaded.back().seq, loaded.size());
}

}  // namespace
}  // namespace tally::agent
