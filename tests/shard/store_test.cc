#include "shard/store.h"

#include <sqlite3.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/outbox_store.h"
#include "tests/core/fake_shard_crypto.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

constexpr uint64_t kNowMs = 1'800'000'000'000;

PublicKey ourKey() {
  PublicKey key{};
  key.fill(4);
  return key;
}

class ShardStoreTest : public ::testing::Test {
 protected:
  // Opens the data dir as the agent does at start: outbox store, boot epoch, shard store, book.
  void boot() {
    book_.reset();
    shards_.reset();
    outbox_.reset();
    Result<std::unique_ptr<OutboxStore>> outbox = OutboxStore::open(dir_.path());
    ASSERT_TRUE(outbox.isOk()) << outbox.status().toString();
    outbox_ = std::move(outbox).value();
    Result<std::unique_ptr<ShardStore>> shards = ShardStore::open(outbox_->connection());
    ASSERT_TRUE(shards.isOk()) << shards.status().toString();
    shards_ = std::move(shards).value();
    Result<uint64_t> epoch = shards_->incrementBootEpoch();
    ASSERT_TRUE(epoch.isOk()) << epoch.status().toString();
    boot_epoch_ = epoch.value();
    book_ = std::make_unique<ShardBook>(
        ShardBookOptions{.gateway_id = ourKey(), .boot_epoch = boot_epoch_, .crypto = &crypto_});
    Result<ShardRestoreReport> report = shards_->restore(book_.get(), kNowMs);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    report_ = std::move(report).value();
  }

  ShardGrant grant(const std::string& id, Units units = 100) const {
    ShardGrant g{.shard_id = id,
                 .subject = "tenant-a",
                 .route = "chat",
                 .policy_generation = 2,
                 .accounting_epoch_ms = 1'000,
                 .gateway_id = ourKey(),
                 .gateway_name = "gw",
                 .gateway_boot_epoch = boot_epoch_,
                 .fence = 3,
                 .allocated_units = units,
                 .issued_at_ms = kNowMs,
                 .expires_at_ms = kNowMs + 600'000};
    crypto_.signGrant(&g);
    return g;
  }

  void commit() { ASSERT_TRUE(shards_->commit(*book_, book_->takeChanges()).isOk()); }

  TempDir dir_;
  tally::testing::KeyedFakeShardCrypto crypto_;
  std::unique_ptr<OutboxStore> outbox_;
  std::unique_ptr<ShardStore> shards_;
  std::unique_ptr<ShardBook> book_;
  ShardRestoreReport report_;
  uint64_t boot_epoch_ = 0;
};

// What a partitioned agent checks in an unpartitioned agent's agent.db before it starts.
TEST_F(ShardStoreTest, CountsStoredShardsAndZeroForAFileThatNeverHeldAny) {
  {
    Result<std::unique_ptr<OutboxStore>> outbox_only = OutboxStore::open(dir_.path());
    ASSERT_TRUE(outbox_only.isOk()) << outbox_only.status().toString();
    Result<uint64_t> none = countStoredShards(outbox_only.value()->connection());
    ASSERT_TRUE(none.isOk()) << none.status().toString();
    EXPECT_EQ(none.value(), 0u);
  }
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-1"), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book_->addShard(grant("shard-2", 40), kNowMs), ShardAddCode::kOk);
  commit();
  Result<uint64_t> two = countStoredShards(outbox_->connection());
  ASSERT_TRUE(two.isOk()) << two.status().toString();
  EXPECT_EQ(two.value(), 2u);
}

TEST_F(ShardStoreTest, RoundTripsShardsReservationsAndFencesAcrossARestart) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-1"), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book_->addShard(grant("shard-2", 40), kNowMs), ShardAddCode::kOk);
  ReserveRequest request{.reservation_id = "r-1",
                         .request_digest = Digest{7},
                         .subject = "tenant-a",
                         .route = "chat",
                         .units = 30};
  ASSERT_TRUE(book_->reserve(request, kNowMs).has_value());
  ASSERT_EQ(book_->start({"r-1", "op-1"}, kNowMs).code, ReplyCode::kOk);
  ASSERT_EQ(book_->markUnknown({"r-1", "op-1"}, kNowMs).code, ReplyCode::kOk);
  request.reservation_id = "r-2";
  request.units = 5;
  ASSERT_TRUE(book_->reserve(request, kNowMs).has_value());
  commit();
  const ShardGrant first = book_->findShard("shard-1")->record.grant;
  const ShardGrant second = book_->findShard("shard-2")->record.grant;
  const Reservation r1 = *book_->findReservation("r-1");
  const Reservation r2 = *book_->findReservation("r-2");
  const ShardBalances balances = book_->findShard(r1.origin)->account.balances();

  boot();  // a restart: boot epoch + 1
  EXPECT_TRUE(report_.quarantined.empty());
  EXPECT_EQ(report_.closed_at_boot, (std::vector<std::string>{"shard-1", "shard-2"}));
  EXPECT_EQ(book_->findShard("shard-1")->record.grant, first);
  EXPECT_EQ(book_->findShard("shard-2")->record.grant, second);
  EXPECT_EQ(*book_->findReservation("r-1"), r1);
  EXPECT_EQ(*book_->findReservation("r-2"), r2);
  EXPECT_EQ(book_->highestFence({"tenant-a", "chat"}), 3u);
  // Closed at boot: what was available is retired; UNKNOWN still holds its units.
  const ShardBalances after = book_->findShard(r1.origin)->account.balances();
  EXPECT_EQ(after.local_reserved, balances.local_reserved);
  EXPECT_EQ(after.local_available, 0u);
  EXPECT_EQ(after.local_retired, balances.local_available);
  EXPECT_EQ(book_->usableShardCount({"tenant-a", "chat"}, kNowMs), 0u);
  EXPECT_EQ(book_->shardsNeedingReport().size(), 2u);

  boot();  // the close at boot was itself durable
  EXPECT_TRUE(report_.closed_at_boot.empty());
  EXPECT_TRUE(book_->findShard("shard-1")->account.closed());
  EXPECT_EQ(book_->findShard("shard-1")->record.close_reason, ShardCloseReason::kBootEpoch);
  EXPECT_TRUE(book_->audit().empty());
}

TEST_F(ShardStoreTest, TheBootEpochIncrementsAtEveryOpen) {
  for (uint64_t expected = 1; expected <= 3; ++expected) {
    boot();
    EXPECT_EQ(boot_epoch_, expected);
  }
}

// agent.db as an agent of schema_version 1 wrote it: the boot epoch was a row of the outbox's
// meta table, next to one undelivered outbox entry and one kv integer.
void writeVersion1AgentDb(const std::string& dir, int64_t boot_epoch) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/agent.db").c_str(), &db), SQLITE_OK);
  const std::string sql =
      "PRAGMA journal_mode=WAL;"
      "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT;"
      "CREATE TABLE outbox (seq INTEGER PRIMARY KEY NOT NULL, kind INTEGER NOT NULL,"
      " reservation_id TEXT NOT NULL, operation_id TEXT NOT NULL, actual_units INTEGER NOT NULL,"
      " enqueued_at_ms INTEGER NOT NULL, attempts INTEGER NOT NULL,"
      " next_attempt_ms INTEGER NOT NULL) STRICT;"
      "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) STRICT;"
      "INSERT INTO meta(key, value) VALUES('schema_version', 1), ('boot_epoch', " +
      std::to_string(boot_epoch) +
      ");"
      "INSERT INTO outbox VALUES(5, 0, 'r-old', '', 12, 1000, 0, 1000);"
      "INSERT INTO kv VALUES('policy_generation', 4);";
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "");
  sqlite3_free(error);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
}

std::optional<int64_t> queryValue(const std::string& dir, const std::string& sql) {
  sqlite3* db = nullptr;
  std::optional<int64_t> value;
  EXPECT_EQ(sqlite3_open((dir + "/agent.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
  if (sqlite3_step(stmt) == SQLITE_ROW) value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

TEST_F(ShardStoreTest, AnAgentDbOfTheOlderLayoutKeepsItsBootEpochAndNeverGoesLower) {
  writeVersion1AgentDb(dir_.path(), 41);
  boot();
  EXPECT_EQ(boot_epoch_, 42u);
  // The rest of the file is untouched: the undelivered entry and the kv integer survive.
  Result<std::vector<OutboxEntry>> entries = outbox_->load();
  ASSERT_TRUE(entries.isOk());
  ASSERT_EQ(entries.value().size(), 1u);
  EXPECT_EQ(entries.value()[0].reservation_id, "r-old");
  Result<std::optional<int64_t>> generation = outbox_->getMeta("policy_generation");
  ASSERT_TRUE(generation.isOk());
  EXPECT_EQ(generation.value(), std::optional<int64_t>(4));
  book_.reset();  // close the file before reading it directly
  shards_.reset();
  outbox_.reset();
  // Moved, not copied: the old row is gone and the file says so (an older build refuses it
  // rather than start again from epoch 1).
  EXPECT_EQ(queryValue(dir_.path(), "SELECT count(*) FROM meta WHERE key = 'boot_epoch'"), 0);
  EXPECT_EQ(queryValue(dir_.path(), "SELECT value FROM meta WHERE key = 'schema_version'"), 2);
  boot();
  EXPECT_EQ(boot_epoch_, 43u);
}

TEST_F(ShardStoreTest, AnInterruptedMoveKeepsTheLargerBootEpoch) {
  // Both rows present (the move never committed, or a file edited by hand): the larger wins.
  writeVersion1AgentDb(dir_.path(), 9);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_.path() + "/agent.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE gateway_state (key TEXT PRIMARY KEY NOT NULL,"
                           " value INTEGER NOT NULL) STRICT;"
                           "INSERT INTO gateway_state VALUES('boot_epoch', 20);"
                           "UPDATE meta SET value = 2 WHERE key = 'schema_version';",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  }
  boot();
  EXPECT_EQ(boot_epoch_, 21u);
}

TEST_F(ShardStoreTest, ADamagedBootEpochIsCorruption) {
  boot();
  ASSERT_EQ(sqlite3_exec(outbox_->connection(),
                         "UPDATE gateway_state SET value = -1 WHERE key = 'boot_epoch'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  Result<uint64_t> epoch = shards_->incrementBootEpoch();
  EXPECT_EQ(epoch.status().code(), StatusCode::kCorruption);
}

TEST_F(ShardStoreTest, ForgottenShardsAndReservationsAreDeleted) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-1"), kNowMs), ShardAddCode::kOk);
  ASSERT_TRUE(book_
                  ->reserve({.reservation_id = "r",
                             .request_digest = Digest{1},
                             .subject = "tenant-a",
                             .route = "chat",
                             .units = 3},
                            kNowMs)
                  .has_value());
  ASSERT_EQ(book_->release({"r"}, kNowMs).code, ReplyCode::kOk);
  ASSERT_TRUE(book_->close("shard-1", ShardCloseReason::kReconnect, kNowMs));
  commit();
  ShardLedgerView view{.grant = book_->findShard("shard-1")->record.grant,
                       .state = ShardState::kReconciled,
                       .reported = true,
                       .last_reported = book_->findShard("shard-1")->account.balances()};
  (void)book_->onLedgerAnswer("shard-1", view, kNowMs);
  (void)book_->tick(kNowMs + limits::kShardRetentionMsDefault);
  commit();
  boot();
  EXPECT_EQ(book_->shardCount(), 0u);
  EXPECT_EQ(book_->reservationCount(), 0u);
}

// An unreconcilable shard (the ledger has no record of it) survives restarts as such: never
// reported again. A shards table written before the column existed gains it, every row "no".
TEST_F(ShardStoreTest, AnUnreconcilableShardStaysSoAcrossARestartAndOlderTablesGainTheColumn) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-1"), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book_->addShard(grant("shard-2"), kNowMs), ShardAddCode::kOk);
  ASSERT_TRUE(book_->close("shard-1", ShardCloseReason::kReconnect, kNowMs));
  commit();
  // As a build before the column wrote the table.
  ASSERT_EQ(sqlite3_exec(outbox_->connection(), "ALTER TABLE shards DROP COLUMN unreconcilable",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  boot();
  ASSERT_EQ(book_->shardCount(), 2u);
  EXPECT_EQ(book_->findShard("shard-1")->record.unreconcilable, ShardUnreconcilable::kNo);
  EXPECT_EQ(book_->shardsNeedingReport(), (std::vector<std::string>{"shard-1", "shard-2"}));
  ASSERT_TRUE(
      book_->markUnreconcilable("shard-1", ShardUnreconcilable::kForgotten, kNowMs + 1'000));
  commit();
  boot();
  const ShardBook::Shard* shard = book_->findShard("shard-1");
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->record.unreconcilable, ShardUnreconcilable::kForgotten);
  EXPECT_EQ(shard->record.final_at_ms, kNowMs + 1'000);
  EXPECT_EQ(book_->shardsNeedingReport(), std::vector<std::string>{"shard-2"});
  // A value no build wrote is corruption.
  ASSERT_EQ(sqlite3_exec(outbox_->connection(), "UPDATE shards SET unreconcilable = 9", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  book_ = std::make_unique<ShardBook>(
      ShardBookOptions{.gateway_id = ourKey(), .boot_epoch = boot_epoch_, .crypto = &crypto_});
  Result<ShardRestoreReport> damaged = shards_->restore(book_.get(), kNowMs);
  ASSERT_FALSE(damaged.isOk());
  EXPECT_EQ(damaged.status().code(), StatusCode::kCorruption);
}

// A failed commit's changes are retried merged with later ones (agent/shard_keeper.cc): a row
// named as upserted that the book forgot in between is deleted, not an error.
TEST_F(ShardStoreTest, MergedChangesNamingAForgottenShardDeleteIt) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-1"), kNowMs), ShardAddCode::kOk);
  commit();
  ASSERT_TRUE(book_
                  ->reserve({.reservation_id = "r",
                             .request_digest = Digest{1},
                             .subject = "tenant-a",
                             .route = "chat",
                             .units = 3},
                            kNowMs)
                  .has_value());
  ShardBookChanges unsaved = book_->takeChanges();  // as if this commit had failed
  ASSERT_EQ(book_->release({"r"}, kNowMs).code, ReplyCode::kOk);
  ASSERT_TRUE(book_->close("shard-1", ShardCloseReason::kReconnect, kNowMs));
  ShardLedgerView view{.grant = book_->findShard("shard-1")->record.grant,
                       .state = ShardState::kReconciled,
                       .reported = true,
                       .last_reported = book_->findShard("shard-1")->account.balances()};
  (void)book_->onLedgerAnswer("shard-1", view, kNowMs);
  (void)book_->tick(kNowMs + limits::kShardRetentionMsDefault);
  ASSERT_EQ(book_->shardCount(), 0u);
  const ShardBookChanges later = book_->takeChanges();
  unsaved.shards_deleted = later.shards_deleted;
  unsaved.reservations_deleted = later.reservations_deleted;
  ASSERT_EQ(unsaved.shards_upserted, std::vector<std::string>{"shard-1"});
  ASSERT_EQ(unsaved.reservations_upserted, std::vector<std::string>{"r"});
  ASSERT_TRUE(shards_->commit(*book_, unsaved).isOk());
  boot();
  EXPECT_EQ(book_->shardCount(), 0u);
  EXPECT_EQ(book_->reservationCount(), 0u);
}

// Flips one byte of the stored grant's subject: the blob still decodes, the signature fails.
void tamperGrant(const std::string& db_path, const std::string& shard_id) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT grant_blob FROM shards WHERE shard_id = ?1", -1, &stmt,
                               nullptr),
            SQLITE_OK);
  sqlite3_bind_text(stmt, 1, shard_id.c_str(), -1, SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  const auto* data = static_cast<const uint8_t*>(sqlite3_column_blob(stmt, 0));
  std::vector<uint8_t> blob(data, data + sqlite3_column_bytes(stmt, 0));
  sqlite3_finalize(stmt);
  const std::string needle = "tenant-a";
  auto at = std::search(blob.begin(), blob.end(), needle.begin(), needle.end());
  ASSERT_NE(at, blob.end());
  *(at + 7) = 'b';  // tenant-a → tenant-b
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE shards SET grant_blob = ?1 WHERE shard_id = ?2", -1,
                               &stmt, nullptr),
            SQLITE_OK);
  sqlite3_bind_blob(stmt, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(stmt, 2, shard_id.c_str(), -1, SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_DONE);
  sqlite3_finalize(stmt);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
}

TEST_F(ShardStoreTest, ATamperedGrantIsQuarantinedNeverUsedNeverReported) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-good"), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book_->addShard(grant("shard-evil"), kNowMs), ShardAddCode::kOk);
  commit();
  book_.reset();
  shards_.reset();
  outbox_.reset();
  tamperGrant(dir_.file(OutboxStore::kDatabaseFileName), "shard-evil");

  boot();
  EXPECT_EQ(report_.quarantined, std::vector<std::string>{"shard-evil"});
  const ShardBook::Shard* evil = book_->findShard("shard-evil");
  ASSERT_NE(evil, nullptr);
  EXPECT_TRUE(evil->record.quarantined);
  EXPECT_TRUE(evil->account.closed());
  EXPECT_EQ(book_->buildReport("shard-evil", kNowMs), std::nullopt);
  EXPECT_EQ(book_->shardsNeedingReport(), std::vector<std::string>{"shard-good"});

  // Still quarantined at the next start: the tampered blob is kept as evidence, never rewritten.
  boot();
  EXPECT_EQ(report_.quarantined, std::vector<std::string>{"shard-evil"});
}

TEST_F(ShardStoreTest, AnUndecodableGrantIsQuarantinedToo) {
  boot();
  ASSERT_EQ(book_->addShard(grant("shard-x"), kNowMs), ShardAddCode::kOk);
  commit();
  book_.reset();
  shards_.reset();
  outbox_.reset();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(dir_.file(OutboxStore::kDatabaseFileName).c_str(), &db), SQLITE_OK);
    ASSERT_EQ(
        sqlite3_exec(db, "UPDATE shards SET grant_blob = x'ff00ff'", nullptr, nullptr, nullptr),
        SQLITE_OK);
    ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  }
  boot();
  EXPECT_EQ(report_.quarantined, std::vector<std::string>{"shard-x"});
  EXPECT_EQ(book_->usableShardCount({"tenant-a", "chat"}, kNowMs), 0u);
}

}  // namespace
}  // namespace tally::agent
