#include "agent/shard_store.h"

#include <sqlite3.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
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
    Result<uint64_t> epoch = outbox_->incrementBootEpoch();
    ASSERT_TRUE(epoch.isOk());
    boot_epoch_ = epoch.value();
    Result<std::unique_ptr<ShardStore>> shards = ShardStore::open(outbox_.get());
    ASSERT_TRUE(shards.isOk()) << shards.status().toString();
    shards_ = std::move(shards).value();
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
  (void)book_->tick(kNowMs + limits::kRetentionMsDefault);
  commit();
  boot();
  EXPECT_EQ(book_->shardCount(), 0u);
  EXPECT_EQ(book_->reservationCount(), 0u);
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
  (void)book_->tick(kNowMs + limits::kRetentionMsDefault);
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
