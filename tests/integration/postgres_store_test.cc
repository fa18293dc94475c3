// PostgresStore (ledger/postgres_store.h) against a real PostgreSQL server: what commit() writes
// is what load() returns, across a reopen; the writer lock, the schema version and the data dir
// guard refuse what they must; damaged rows are corruption naming the row; the readable columns
// are there for psql.

#include "ledger/postgres_store.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "tests/integration/postgres_environment.h"
#include "tests/support/temp_dir.h"

namespace tally::ledger {
namespace {

using testing::conninfoFor;
using testing::sharedPostgres;
using testing::TempDir;

PolicyRecord makePolicy(Generation generation) {
  Budget budget{.subject_pattern = "tenant-*",
                .route = "chat",
                .region = "test",
                .unit = "tokens",
                .refill_per_second = 10,
                .burst = 1000 + generation,
                .max_single_reservation = 500,
                .hold_ttl_ms = 30'000,
                .hard_execution_limit_ms = 60'000,
                .max_overdraft = 50};
  return PolicyRecord{.policy = {.generation = generation, .budgets = {budget}}};
}

AccountRecord makeAccount(const std::string& subject, Generation generation, uint64_t n) {
  return AccountRecord{.key = {.subject = subject, .route = "chat", .generation = generation},
                       .balances = {.opening = 1000 + n,
                                    .minted = 2000 + n,
                                    .available = 400 + n,
                                    .reserved = 600 + n,
                                    .spent = 1900 + n},
                       .refill_clock_ms = 1'700'000'000'000 + n};
}

Reservation makeReservation(const std::string& id, uint64_t n) {
  Reservation r;
  r.reservation_id = id;
  r.subject = "tenant-" + std::to_string(n % 3);
  r.route = "chat";
  r.policy_generation = 1;
  r.reserved_units = 10 + n;
  r.created_at_ms = 1000 + n;
  r.expires_at_ms = 31'000 + n;
  r.state = ReservationState::kReserved;
  return r;
}

GatewayRecord makeGateway(const std::string& name) {
  GatewayRecord record{.gateway_name = name, .enrolled_at_ms = 5};
  record.public_key[0] = 7;
  return record;
}

ShardRecord makeShard(const std::string& id, Units spent) {
  ShardRecord record;
  record.grant.shard_id = id;
  record.spent_units = spent;
  return record;
}

PeriodSnapshot makeSnapshot(const std::string& subject, uint64_t epoch_first) {
  return PeriodSnapshot{.key = {.subject = subject, .route = "chat", .generation = 1},
                        .epoch_first = epoch_first,
                        .epoch_last = epoch_first,
                        .opened_at_ms = 10,
                        .closed_at_ms = 20};
}

std::unique_ptr<PostgresStore> openOrFail(const std::string& dir, const std::string& conninfo) {
  Result<std::unique_ptr<PostgresStore>> store = PostgresStore::open(dir, conninfo);
  if (!store.isOk()) {
    ADD_FAILURE() << "open " << dir << ": " << store.status().toString();
    return nullptr;
  }
  return std::move(store).value();
}

StoreContents loadOrFail(PostgresStore* store) {
  Result<StoreContents> contents = store->load();
  if (!contents.isOk()) {
    ADD_FAILURE() << "load: " << contents.status().toString();
    return {};
  }
  return std::move(contents).value();
}

std::string databaseOf(const std::string& conninfo) {
  return conninfo.substr(conninfo.rfind("dbname=") + 7);
}

TEST(PostgresStoreTest, LoadReturnsTheLatestImageOfEveryRowInOrderAcrossAReopen) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  {
    std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
    ASSERT_NE(store, nullptr);
    StoreContents empty = loadOrFail(store.get());
    EXPECT_TRUE(empty.policies.empty() && empty.accounts.empty() && empty.reservations.empty());
    EXPECT_EQ(empty.ledger_clock_ms, 0u);

    StoreBatch first;
    first.policies = {makePolicy(2), makePolicy(1)};
    first.accounts = {makeAccount("tenant-b", 1, 1), makeAccount("tenant-a", 1, 2)};
    first.reservations = {makeReservation("r-2", 2), makeReservation("r-1", 1),
                          makeReservation("r-3", 3)};
    first.gateways = {makeGateway("gw-2"), makeGateway("gw-1")};
    first.shards = {makeShard("s-1", 1), makeShard("s-2", 2)};
    first.fences = {FenceRecord{.key = {.subject = "tenant-a", .route = "chat"}, .fence = 3}};
    first.period_snapshots = {makeSnapshot("tenant-a", 5), makeSnapshot("tenant-a", 4)};
    first.ledger_clock_ms = 5000;
    first.shard_sequence = 9;
    ASSERT_TRUE(store->commit(first).isOk());

    // A later image replaces an earlier one; deletions apply before upserts (r-1 deleted and
    // reused in one batch stays); a row named twice in one batch keeps its last image; the
    // clock and the shard sequence never go back.
    StoreBatch second;
    Reservation reused = makeReservation("r-1", 11);
    reused.state = ReservationState::kSettled;
    second.deleted_reservations = {"r-1", "r-2"};
    second.reservations = {makeReservation("r-1", 10), reused};
    second.accounts = {makeAccount("tenant-a", 1, 20)};
    second.deleted_shards = {"s-1"};
    second.shards = {makeShard("s-2", 22)};
    second.deleted_period_snapshots = {PeriodKey{
        .key = {.subject = "tenant-a", .route = "chat", .generation = 1}, .epoch_first = 4}};
    second.ledger_clock_ms = 4000;
    second.shard_sequence = 8;
    ASSERT_TRUE(store->commit(second).isOk());
    EXPECT_EQ(store->stats().commits, 2u);
  }
  // Reopened: everything comes back from PostgreSQL.
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  const StoreContents contents = loadOrFail(store.get());
  ASSERT_EQ(contents.policies.size(), 2u);
  EXPECT_TRUE(contents.policies[0] == makePolicy(1));
  EXPECT_TRUE(contents.policies[1] == makePolicy(2));
  ASSERT_EQ(contents.accounts.size(), 2u);
  EXPECT_TRUE(contents.accounts[0] == makeAccount("tenant-a", 1, 20));
  EXPECT_TRUE(contents.accounts[1] == makeAccount("tenant-b", 1, 1));
  ASSERT_EQ(contents.reservations.size(), 2u);
  Reservation settled = makeReservation("r-1", 11);
  settled.state = ReservationState::kSettled;
  EXPECT_TRUE(contents.reservations[0] == settled);
  EXPECT_TRUE(contents.reservations[1] == makeReservation("r-3", 3));
  ASSERT_EQ(contents.gateways.size(), 2u);
  EXPECT_TRUE(contents.gateways[0] == makeGateway("gw-1"));
  ASSERT_EQ(contents.shards.size(), 1u);
  EXPECT_EQ(contents.shards[0].grant.shard_id, "s-2");
  EXPECT_EQ(contents.shards[0].spent_units, 22u);
  ASSERT_EQ(contents.fences.size(), 1u);
  EXPECT_EQ(contents.fences[0].fence, 3u);
  ASSERT_EQ(contents.period_snapshots.size(), 1u);
  EXPECT_TRUE(contents.period_snapshots[0] == makeSnapshot("tenant-a", 5));
  EXPECT_EQ(contents.ledger_clock_ms, 5000u);
  EXPECT_EQ(contents.shard_sequence, 9u);
}

TEST(PostgresStoreTest, TheRowsAreReadableWithPsql) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  StoreBatch batch;
  batch.accounts = {makeAccount("tenant-a", 1, 0)};
  batch.reservations = {makeReservation("r-1", 0)};
  ASSERT_TRUE(store->commit(batch).isOk());
  const std::string db = databaseOf(conninfo);
  Result<std::string> rows = sharedPostgres().psql(
      db, "SELECT subject, route, generation, available, reserved, spent FROM tally.accounts");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "tenant-a|chat|1|400|600|1900\n");
  rows = sharedPostgres().psql(db, "SELECT id, subject, route, state FROM tally.reservations");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), std::string("r-1|tenant-0|chat|") +
                              reservationStateName(ReservationState::kReserved) + "\n");
  rows = sharedPostgres().psql(db, "SELECT value FROM tally.meta WHERE key = 'schema_version'");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "3\n");
}

TEST(PostgresStoreTest, ASecondLedgerOnTheSameDatabaseIsRefusedUntilTheFirstLetsGo) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  std::unique_ptr<PostgresStore> first = openOrFail(dir.file("one"), conninfo);
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<PostgresStore>> second = PostgresStore::open(dir.file("two"), conninfo);
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("writer lock"), std::string::npos)
      << second.status().toString();
  first.reset();
  EXPECT_NE(openOrFail(dir.file("two"), conninfo), nullptr);
}

// The lease: every open takes the next epoch (once the holder before has let go), and a store
// whose epoch another ledger has taken commits nothing more, then or later, and says so.
TEST(PostgresStoreTest, EveryOpenTakesTheNextEpochAndADeposedStoreCommitsNothing) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  const std::string db = databaseOf(conninfo);
  int64_t first_epoch = 0;
  {
    std::unique_ptr<PostgresStore> first = openOrFail(dir.file("data"), conninfo);
    ASSERT_NE(first, nullptr);
    first_epoch = first->epoch();
    EXPECT_GE(first_epoch, 1);
  }
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->epoch(), first_epoch + 1);
  StoreBatch kept;
  kept.reservations = {makeReservation("r-kept", 1)};
  ASSERT_TRUE(store->commit(kept).isOk());
  ASSERT_TRUE(store->renewLease().isOk());
  EXPECT_FALSE(store->deposed());

  // Another ledger takes the lease (as a standby does once it lapses).
  ASSERT_TRUE(sharedPostgres()
                  .psql(db, "UPDATE tally.lease SET epoch = epoch + 1, holder = 'standby'")
                  .isOk());
  StoreBatch fenced;
  fenced.reservations = {makeReservation("r-fenced", 2)};
  const Status refused = store->commit(fenced);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("deposed"), std::string::npos) << refused.toString();
  EXPECT_NE(refused.message().find("holder standby"), std::string::npos) << refused.toString();
  EXPECT_TRUE(store->deposed());
  EXPECT_FALSE(store->commit(fenced).isOk());
  EXPECT_FALSE(store->renewLease().isOk());
  Result<std::string> rows =
      sharedPostgres().psql(db, "SELECT id FROM tally.reservations ORDER BY id");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "r-kept\n");
}

// Renewing finds out too, between commits (an idle primary).
TEST(PostgresStoreTest, RenewingTheLeaseOfADeposedStoreFails) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(sharedPostgres()
                  .psql(databaseOf(conninfo),
                        "UPDATE tally.lease SET epoch = epoch + 1, holder = 'standby'")
                  .isOk());
  const Status renewed = store->renewLease();
  EXPECT_EQ(renewed.code(), StatusCode::kFailedPrecondition) << renewed.toString();
  EXPECT_TRUE(store->deposed());
}

// A database of schema version 1 (before the lease) is migrated at open: the lease table is
// created and taken.
TEST(PostgresStoreTest, ASchemaOfVersionOneGainsTheLease) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  const std::string db = databaseOf(conninfo);
  {
    std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
    ASSERT_NE(store, nullptr);
    StoreBatch batch;
    batch.reservations = {makeReservation("r-1", 1)};
    ASSERT_TRUE(store->commit(batch).isOk());
  }
  ASSERT_TRUE(sharedPostgres()
                  .psql(db,
                        "DROP TABLE tally.lease; DROP TABLE tally.operators; DROP TABLE "
                        "tally.audit_log; UPDATE tally.meta SET value = 1 WHERE key = "
                        "'schema_version'")
                  .isOk());
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->epoch(), 1);
  EXPECT_EQ(loadOrFail(store.get()).reservations.size(), 1u);
  Result<std::string> rows =
      sharedPostgres().psql(db, "SELECT value FROM tally.meta WHERE key = 'schema_version'");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  EXPECT_EQ(rows.value(), "3\n");
}

TEST(PostgresStoreTest, ANewerSchemaIsRefusedNamingItsVersion) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  ASSERT_NE(openOrFail(dir.file("data"), conninfo), nullptr);  // creates the schema
  ASSERT_TRUE(sharedPostgres()
                  .psql(databaseOf(conninfo),
                        "UPDATE tally.meta SET value = 99 WHERE key = 'schema_version'")
                  .isOk());
  Result<std::unique_ptr<PostgresStore>> store = PostgresStore::open(dir.file("data"), conninfo);
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("version 99"), std::string::npos)
      << store.status().toString();
}

TEST(PostgresStoreTest, ADataDirHoldingASqliteStoreIsRefused) {
  TempDir dir;
  const std::string data = dir.file("data");
  ASSERT_EQ(::mkdir(data.c_str(), 0750), 0);
  const int fd = ::open((data + "/ledger.db").c_str(), O_CREAT | O_WRONLY, 0640);
  ASSERT_GE(fd, 0);
  ::close(fd);
  Result<std::unique_ptr<PostgresStore>> store = PostgresStore::open(data, conninfoFor(dir.path()));
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("SQLite store"), std::string::npos);
}

TEST(PostgresStoreTest, ADamagedBodyIsCorruptionNamingItsRow) {
  TempDir dir;
  const std::string conninfo = conninfoFor(dir.path());
  std::unique_ptr<PostgresStore> store = openOrFail(dir.file("data"), conninfo);
  ASSERT_NE(store, nullptr);
  StoreBatch batch;
  batch.reservations = {makeReservation("r-1", 0)};
  ASSERT_TRUE(store->commit(batch).isOk());
  ASSERT_TRUE(sharedPostgres()
                  .psql(databaseOf(conninfo),
                        "UPDATE tally.reservations SET body = '\\x0102' WHERE id = 'r-1'")
                  .isOk());
  Result<StoreContents> contents = store->load();
  ASSERT_FALSE(contents.isOk());
  EXPECT_EQ(contents.status().code(), StatusCode::kCorruption);
  EXPECT_NE(contents.status().message().find("tally.reservations id 'r-1'"), std::string::npos)
      << contents.status().toString();
  // The failed load left no transaction open: the store still commits.
  EXPECT_TRUE(store->commit(batch).isOk());
}

TEST(PostgresStoreTest, AnUnreachableServerIsRefusedAtOpen) {
  TempDir dir;
  Result<std::unique_ptr<PostgresStore>> store =
      PostgresStore::open(dir.file("data"), "host=" + dir.path() + " port=1 dbname=none");
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("connect"), std::string::npos);
}

}  // namespace
}  // namespace tally::ledger
