#include "ledger/sqlite_store.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <capnp/serialize-packed.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <kj/io.h>
#include <zlib.h>

#include "core/limits.h"
#include "ledger/commit_log.h"
#include "ledger/store_codec.h"

namespace tally::ledger {
namespace {

// --- Fixtures and sample records ------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/tally-store-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Budget makeBudget(uint64_t n) {
  return Budget{.subject_pattern = "tenant-" + std::to_string(n) + "-*",
                .route = "/v1/chat/" + std::to_string(n),
                .region = "eu-west-1",
                .unit = "tokens",
                .refill_per_second = 100 + n,
                .burst = 1000 + n,
                .estimator_digest = "sha256:abc" + std::to_string(n),
                .max_single_reservation = 600 + n,
                .hold_ttl_ms = 30'000 + n,
                .hard_execution_limit_ms = 600'000 + n,
                .max_overdraft = 50 + n,
                .priority = 3,
                .weight = 7,
                .fairness_budget_permille = 25,
                .accounting_epoch = EpochPeriod::kDay,
                .emergency = {.enabled = true, .shard_units = 100 + n, .shard_ttl_ms = 60'000},
                .rollout = {.mode = RolloutMode::kShadow, .percent = 40}};
}

PolicyRecord makePolicy(Generation generation, Generation republished_from = 0) {
  Policy policy{.generation = generation, .budgets = {makeBudget(generation), makeBudget(99)}};
  return PolicyRecord{.policy = policy, .republished_from = republished_from};
}

AccountRecord makeAccount(const std::string& subject, Generation generation, uint64_t n) {
  return AccountRecord{.key = {.subject = subject, .route = "/v1/chat", .generation = generation},
                       .balances = {.opening = 1000 + n,
                                    .minted = 2000 + n,
                                    .overdraft_issued = 30 + n,
                                    .available = 400 + n,
                                    .reserved = 600 + n,
                                    .spent = 1900 + n,
                                    .retired_for_emergency = 70 + n,
                                    .overdraft_repaid = 20 + n,
                                    .transferred_out = 40 + n},
                       .refill_clock_ms = 1'700'000'000'000 + n,
                       .refill_carry = 999};
}

// Every field differs from its default.
Reservation makeReservation(const std::string& id, uint64_t n) {
  Reservation r;
  r.reservation_id = id;
  for (size_t i = 0; i < r.request_digest.size(); ++i) {
    r.request_digest[i] = static_cast<uint8_t>(n * 31 + i + 1);
  }
  r.subject = "tenant-" + std::to_string(n % 7);
  r.route = "/v1/chat";
  r.policy_generation = 3 + n;
  r.accounting_epoch_ms = 1'700'000'000'000 + n;
  r.reserved_units = 600 + n;
  r.actual_units = 700 + n;
  r.refunded_units = 11 + n;
  r.debt_units = 100 + n;
  r.operation_id = ("op-" + id).substr(0, limits::kOperationIdBytesMax);
  r.created_at_ms = 1000 + n;
  r.expires_at_ms = 31'000 + n;
  r.started_at_ms = 1500 + n;
  r.closed_at_ms = 1800 + n;
  r.state = static_cast<ReservationState>(1 + n % (kReservationStateCount - 1));
  r.origin = "shard-" + std::to_string(n);
  r.closed_by_hard_limit = true;
  r.late_receipt_applied = true;
  r.overdraft_breach = true;
  r.limiting_dimension = LimitingDimension::kFrozenRoute;
  r.retry_after_ms = -1 - static_cast<int64_t>(n);
  return r;
}

// A policy far beyond the batch encoder's estimate: its batch has several segments.
PolicyRecord policyOfManyBudgets() {
  PolicyRecord record{.policy = {.generation = 1}};
  for (int i = 0; i < 400; ++i) {
    record.policy.budgets.push_back(Budget{.subject_pattern = "tenant-" + std::to_string(i) + "-*",
                                           .route = "route-" + std::string(40, 'r'),
                                           .unit = "tokens",
                                           .refill_per_second = 10,
                                           .burst = 100});
  }
  return record;
}

// The packed form of a flat log batch (encodeBatch): what builds of schema version 6 and older
// wrote into the log.
std::vector<uint8_t> packedOf(std::span<const uint8_t> flat) {
  EXPECT_GT(flat.size(), kFlatMarkerBytes);
  EXPECT_TRUE(std::all_of(flat.begin(), flat.begin() + kFlatMarkerBytes,
                          [](uint8_t byte) { return byte == 0; }));
  const std::span<const uint8_t> message = flat.subspan(kFlatMarkerBytes);
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(message.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), message.data(), message.size());
  capnp::FlatArrayMessageReader reader(words);
  std::vector<kj::ArrayPtr<const capnp::word>> segments;
  for (unsigned id = 0; reader.getSegment(id) != nullptr; ++id) {
    segments.push_back(reader.getSegment(id));
  }
  kj::VectorOutputStream output;
  capnp::writePackedMessage(output, kj::arrayPtr(segments.data(), segments.size()));
  const kj::ArrayPtr<kj::byte> packed = output.getArray();
  return std::vector<uint8_t>(packed.begin(), packed.end());
}

// What load() must return: the same semantics as the store, kept in plain maps.
struct Model {
  std::map<Generation, PolicyRecord> policies;
  std::map<AccountKey, AccountRecord> accounts;
  std::map<std::string, Reservation> reservations;
  uint64_t ledger_clock_ms = 0;

  void apply(const StoreBatch& batch) {
    for (const std::string& id : batch.deleted_reservations) reservations.erase(id);
    for (const Reservation& r : batch.reservations) reservations[r.reservation_id] = r;
    for (const PolicyRecord& p : batch.policies) policies[p.policy.generation] = p;
    for (const AccountRecord& a : batch.accounts) accounts[a.key] = a;
    ledger_clock_ms = std::max(ledger_clock_ms, batch.ledger_clock_ms);
  }
};

void expectContents(const StoreContents& actual, const Model& expected) {
  ASSERT_EQ(actual.policies.size(), expected.policies.size());
  size_t i = 0;
  for (const auto& [generation, record] : expected.policies) {
    EXPECT_TRUE(actual.policies[i] == record) << "policy generation " << generation;
    ++i;
  }
  ASSERT_EQ(actual.accounts.size(), expected.accounts.size());
  std::map<AccountKey, AccountRecord> accounts;
  for (const AccountRecord& a : actual.accounts) accounts[a.key] = a;
  for (const auto& [key, record] : expected.accounts) {
    EXPECT_TRUE(accounts.count(key) && accounts[key] == record)
        << "account " << key.subject << " " << key.route << " " << key.generation;
  }
  ASSERT_EQ(actual.reservations.size(), expected.reservations.size());
  // load() returns them in id order (the table's order, with the log's tail merged in place).
  EXPECT_TRUE(std::is_sorted(actual.reservations.begin(), actual.reservations.end(),
                             [](const Reservation& a, const Reservation& b) {
                               return a.reservation_id < b.reservation_id;
                             }));
  std::map<std::string, Reservation> reservations;
  for (const Reservation& r : actual.reservations) reservations[r.reservation_id] = r;
  for (const auto& [id, record] : expected.reservations) {
    EXPECT_TRUE(reservations.count(id) && reservations[id] == record) << "reservation " << id;
  }
  EXPECT_EQ(actual.ledger_clock_ms, expected.ledger_clock_ms);
}

std::unique_ptr<SqliteStore> openOrDie(const std::string& dir, SqliteStoreOptions options = {}) {
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dir, options);
  if (!store.isOk()) {
    ADD_FAILURE() << "open " << dir << ": " << store.status().toString();
    return nullptr;
  }
  return std::move(store).value();
}

StoreContents loadOrDie(SqliteStore* store) {
  Result<StoreContents> contents = store->load();
  if (!contents.isOk()) {
    ADD_FAILURE() << "load: " << contents.status().toString();
    return {};
  }
  return std::move(contents).value();
}

// Runs SQL on the database file directly, as an outsider would damage it.
void rawSql(const std::string& db_path, const std::string& sql, const std::vector<uint8_t>* blob) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  if (blob != nullptr) {
    ASSERT_EQ(sqlite3_bind_blob64(stmt, 1, blob->data(), blob->size(), SQLITE_TRANSIENT),
              SQLITE_OK);
  }
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE) << sqlite3_errmsg(db);
  EXPECT_EQ(sqlite3_changes(db), 1) << sql;
  EXPECT_EQ(sqlite3_finalize(stmt), SQLITE_OK);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
}

// Where record `seq` lies in the log of data dir `dir`, found by reading the segments as the
// format (ledger/commit_log.h) lays them out.
struct RecordLocation {
  std::string path;
  uint64_t offset = 0;  // of the header
  uint32_t bytes = 0;   // of the body
};
RecordLocation findRecord(const std::string& dir, int64_t seq) {
  std::vector<std::string> segments;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir + "/" + SqliteStore::kLogDirName)) {
    segments.push_back(entry.path().string());
  }
  std::sort(segments.begin(), segments.end());
  for (const std::string& path : segments) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) continue;
    uint64_t offset = 0;
    uint8_t header[CommitLog::kRecordHeaderBytes];
    while (std::fseek(f, static_cast<long>(offset), SEEK_SET) == 0 &&
           std::fread(header, 1, sizeof header, f) == sizeof header) {
      uint32_t magic = 0;
      int64_t found = 0;
      uint32_t bytes = 0;
      std::memcpy(&magic, header, 4);
      std::memcpy(&found, header + 8, 8);
      std::memcpy(&bytes, header + 16, 4);
      if (magic != CommitLog::kRecordMagic) break;
      if (found == seq) {
        std::fclose(f);
        return {.path = path, .offset = offset, .bytes = bytes};
      }
      offset += CommitLog::kRecordHeaderBytes + bytes;
    }
    std::fclose(f);
  }
  ADD_FAILURE() << "log record " << seq << " not found in " << dir;
  return {};
}

// Overwrites the body of log record `seq` with `body` (of the same length), as an outsider
// would damage it; `fix_checksum`: and rewrites its checksum to match, so that only decoding the
// batch can tell.
void damageRecord(const std::string& dir, int64_t seq, std::vector<uint8_t> body,
                  bool fix_checksum) {
  const RecordLocation at = findRecord(dir, seq);
  ASSERT_FALSE(at.path.empty());
  body.resize(at.bytes, 0);
  const int fd = ::open(at.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, body.data(), body.size(),
                     static_cast<off_t>(at.offset + CommitLog::kRecordHeaderBytes)),
            static_cast<ssize_t>(body.size()));
  if (fix_checksum) {
    uint8_t header[CommitLog::kRecordHeaderBytes];
    ASSERT_EQ(::pread(fd, header, sizeof header, static_cast<off_t>(at.offset)),
              static_cast<ssize_t>(sizeof header));
    uLong crc = ::crc32(0L, Z_NULL, 0);
    crc = ::crc32(crc, header + 8, sizeof header - 8);
    crc = ::crc32(crc, body.data(), static_cast<uInt>(body.size()));
    const auto crc32 = static_cast<uint32_t>(crc);
    ASSERT_EQ(::pwrite(fd, &crc32, 4, static_cast<off_t>(at.offset + 4)), 4);
  }
  ::close(fd);
}

// Log segment files in data dir `dir`.
size_t segmentFiles(const std::string& dir) {
  size_t count = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(dir + "/" + SqliteStore::kLogDirName)) {
    count += entry.path().extension() == CommitLog::kSegmentSuffix ? 1 : 0;
  }
  return count;
}

class StoreTest : public ::testing::Test {
 protected:
  std::string dataDir() const { return tmp_.path() + "/data"; }
  // Where schema versions 5 and older kept the log.
  std::string dbPath() const { return dataDir() + "/" + SqliteStore::kLegacyLogFileName; }
  std::string logPath() const { return dataDir() + "/" + SqliteStore::kLogDirName; }
  std::string tablesPath() const { return dataDir() + "/" + SqliteStore::kTablesFileName; }

  TempDir tmp_;
};

// --- Round trip -------------------------------------------------------------------------------

TEST_F(StoreTest, RoundTripsEveryFieldAcrossReopen) {
  Model model;
  std::vector<StoreBatch> batches(3);
  batches[0].policies = {makePolicy(1), makePolicy(2)};
  batches[0].accounts = {makeAccount("tenant-1", 1, 1), makeAccount("tenant-2", 2, 2)};
  batches[0].reservations = {makeReservation("r-1", 1), makeReservation("r-2", 2),
                             makeReservation("r-3", 3)};
  batches[0].ledger_clock_ms = 5000;
  batches[1].policies = {makePolicy(3, 1)};  // a rollback republishing generation 1
  batches[1].accounts = {makeAccount("tenant-1", 1, 10), makeAccount("tenant-1", 3, 11)};
  batches[1].reservations = {makeReservation("r-1", 21)};
  batches[1].deleted_reservations = {"r-2"};
  batches[1].ledger_clock_ms = 7000;
  batches[2].reservations = {makeReservation(std::string(128, 'x'), 4)};  // longest id allowed
  batches[2].ledger_clock_ms = 6000;  // a lower mark never lowers the high-water mark
  {
    auto store = openOrDie(dataDir());
    ASSERT_NE(store, nullptr);
    for (const StoreBatch& batch : batches) {
      ASSERT_TRUE(store->commit(batch).isOk());
      model.apply(batch);
    }
    expectContents(loadOrDie(store.get()), model);
  }
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  StoreContents contents = loadOrDie(store.get());
  expectContents(contents, model);
  EXPECT_EQ(contents.ledger_clock_ms, 7000u);
  // Policies come back in ascending generation.
  ASSERT_EQ(contents.policies.size(), 3u);
  EXPECT_EQ(contents.policies[2].republished_from, 1u);
}

TEST_F(StoreTest, CodecRoundTripsLateReceiptApplied) {
  // limitReservation.v1 has no field for it; the store record carries it beside the wire type.
  for (bool late : {false, true}) {
    Reservation r = makeReservation("r", 5);
    r.late_receipt_applied = late;
    Result<Reservation> decoded = decodeReservationRecord(blobBytes(encodeReservationRecord(r)));
    ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
    EXPECT_TRUE(decoded.value() == r);
  }
}

TEST_F(StoreTest, CodecRoundTripsTheRequestsOwnFields) {
  // The idempotency check compares priority and the generation pin (issue 9): they persist.
  Reservation r = makeReservation("r", 5);
  r.priority = 7;
  r.requested_generation = 4;
  r.request_fields_known = true;
  Result<Reservation> decoded = decodeReservationRecord(blobBytes(encodeReservationRecord(r)));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_TRUE(decoded.value() == r);
  // A row written before the fields existed has none of them: Cap'n Proto reads the defaults,
  // so it loads as "not known" and its repeats are compared on the fields it does have.
  Reservation old = makeReservation("old", 6);
  ASSERT_FALSE(old.request_fields_known);
  decoded = decodeReservationRecord(blobBytes(encodeReservationRecord(old)));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_FALSE(decoded.value().request_fields_known);
  EXPECT_EQ(decoded.value().priority, 0u);
}

TEST_F(StoreTest, CodecRoundTripsTheRequestsRegion) {
  // The idempotency check compares the region: it persists, and a row without one (written
  // before regions, or for a request without one) loads as "".
  Reservation r = makeReservation("r", 5);
  r.region = "eu-west-1";
  Result<Reservation> decoded = decodeReservationRecord(blobBytes(encodeReservationRecord(r)));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_TRUE(decoded.value() == r);
  decoded = decodeReservationRecord(blobBytes(encodeReservationRecord(makeReservation("old", 6))));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_EQ(decoded.value().region, "");
}

TEST_F(StoreTest, LargeZeroHeavyBatchRoundTrips) {
  // Default-valued records pack tightly; the decoder's traversal budget must still cover them.
  StoreBatch batch;
  for (uint64_t i = 0; i < 20'000; ++i) {
    Reservation r;
    r.reservation_id = "z" + std::to_string(i);
    batch.reservations.push_back(r);
    batch.accounts.push_back(AccountRecord{.key = {.subject = "s" + std::to_string(i)}});
  }
  Blob blob = encodeBatch(batch);
  Result<StoreBatch> decoded = decodeBatch(blobBytes(blob));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_TRUE(decoded.value().reservations == batch.reservations);
  EXPECT_TRUE(decoded.value().accounts == batch.accounts);
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->commit(batch).isOk());
  Model model;
  model.apply(batch);
  expectContents(loadOrDie(store.get()), model);
  ASSERT_TRUE(store->checkpoint().isOk());
  expectContents(loadOrDie(store.get()), model);
}

// A message that outgrows its first segment is read one segment at first and the rest on use:
// its later segments are not trailing garbage. A policy of many budgets is far beyond the
// encoder's estimate, so its batch has several segments; before packedTrailingBytes the log row
// was refused as corrupt by the fold and by every restart (a ledger that could not come back).
TEST_F(StoreTest, ABatchOfSeveralSegmentsRoundTripsThroughTheLogTheFoldAndReopen) {
  const PolicyRecord record = policyOfManyBudgets();
  const StoreBatch batch{.policies = {record}, .ledger_clock_ms = 7};
  Blob blob = encodeBatch(batch);
  Result<StoreBatch> decoded = decodeBatch(blobBytes(blob));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  ASSERT_EQ(decoded.value().policies.size(), 1u);
  EXPECT_TRUE(decoded.value().policies[0] == record);
  // Bytes after the whole message are still refused, in either form.
  for (std::vector<uint8_t> padded :
       {std::vector<uint8_t>(blob.begin(), blob.end()), packedOf(blobBytes(blob))}) {
    padded.insert(padded.end(), {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08});
    Result<StoreBatch> padded_decoded = decodeBatch(padded);
    ASSERT_FALSE(padded_decoded.isOk());
    EXPECT_EQ(padded_decoded.status().code(), StatusCode::kCorruption);
    EXPECT_NE(padded_decoded.status().message().find("trailing"), std::string::npos)
        << padded_decoded.status().toString();
  }
  {
    auto store = openOrDie(dataDir());
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(batch).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());   // the fold reads the log row
    ASSERT_TRUE(store->commit(batch).isOk());  // and a reopen replays this one
  }
  auto reopened = openOrDie(dataDir());
  ASSERT_NE(reopened, nullptr);
  StoreContents contents = loadOrDie(reopened.get());
  ASSERT_EQ(contents.policies.size(), 1u);
  EXPECT_TRUE(contents.policies[0] == record);
}

// Operators and the audit log: through the log, the fold (with a drop below a sequence) and a
// reopen that replays the log after the fold.
TEST_F(StoreTest, OperatorsAndTheAuditLogSurviveTheFoldADropAndAReopen) {
  auto entry = [](uint64_t sequence) {
    return AuditLogEntry{.sequence = sequence,
                         .at_ms = 1000 + sequence,
                         .actor = "ro",
                         .actor_kind = "operator",
                         .actor_role = "audit",
                         .action = "policy publish",
                         .target = "3 budgets",
                         .outcome = "refused",
                         .detail = "policy publish refused: operator 'ro' has role audit",
                         .request_digest = {static_cast<uint8_t>(sequence)}};
  };
  const OperatorRecord ro{.name = "ro",
                          .public_key = {7},
                          .role = OperatorRole::kAudit,
                          .enabled = true,
                          .enrolled_at_ms = 5};
  OperatorRecord ro_disabled = ro;
  ro_disabled.enabled = false;
  const OperatorRecord pol{.name = "pol", .public_key = {8}, .role = OperatorRole::kPolicy};
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit({.operators = {ro}, .audit_log = {entry(1), entry(2)}}).isOk());
    ASSERT_TRUE(store->commit({.audit_log = {entry(3)}}).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());  // folded into tables.db
    // Left in the log: a later image of ro, a new operator, and a drop of entries below 3.
    ASSERT_TRUE(store
                    ->commit({.operators = {ro_disabled, pol},
                              .audit_log = {entry(4)},
                              .audit_log_kept_from = 3})
                    .isOk());
  }
  auto reopened = openOrDie(dataDir());
  ASSERT_NE(reopened, nullptr);
  StoreContents contents = loadOrDie(reopened.get());
  EXPECT_EQ(contents.operators, (std::vector<OperatorRecord>{pol, ro_disabled}));
  EXPECT_EQ(contents.audit_log, (std::vector<AuditLogEntry>{entry(3), entry(4)}));
  // And once everything is folded.
  ASSERT_TRUE(reopened->checkpoint().isOk());
  reopened.reset();
  auto folded = openOrDie(dataDir());
  ASSERT_NE(folded, nullptr);
  contents = loadOrDie(folded.get());
  EXPECT_EQ(contents.operators, (std::vector<OperatorRecord>{pol, ro_disabled}));
  EXPECT_EQ(contents.audit_log, (std::vector<AuditLogEntry>{entry(3), entry(4)}));
}

TEST_F(StoreTest, EmptyStoreLoadsEmpty) {
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), Model{});
  EXPECT_TRUE(store->checkpoint().isOk());
  ASSERT_TRUE(store->commit(StoreBatch{}).isOk());
  expectContents(loadOrDie(store.get()), Model{});
}

// --- Later images, deletions, checkpoints -------------------------------------------------------

TEST_F(StoreTest, LaterImageWinsAndDeletionsStickThroughCheckpointAndReplay) {
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  Model model;
  auto commit = [&](const StoreBatch& batch) {
    ASSERT_TRUE(store->commit(batch).isOk());
    model.apply(batch);
  };
  commit({.accounts = {makeAccount("a", 1, 1)},
          .reservations = {makeReservation("keep", 1), makeReservation("gone", 1)},
          .ledger_clock_ms = 1});
  commit({.accounts = {makeAccount("a", 1, 2)},
          .reservations = {makeReservation("keep", 2)},
          .ledger_clock_ms = 2});
  ASSERT_TRUE(store->checkpoint().isOk());
  EXPECT_EQ(store->pendingLogRows(), 0u);
  // Deleted in the log while its image sits in the table.
  commit({.deleted_reservations = {"gone"}, .ledger_clock_ms = 3});
  expectContents(loadOrDie(store.get()), model);
  ASSERT_TRUE(store->checkpoint().isOk());
  expectContents(loadOrDie(store.get()), model);
  // Upserted and deleted within the log window: the deletion wins over the earlier image.
  commit({.reservations = {makeReservation("brief", 1)}, .ledger_clock_ms = 4});
  commit({.deleted_reservations = {"brief"}, .ledger_clock_ms = 5});
  // Deleted and reused in one batch: deletions apply first, so the new image stays.
  commit({.reservations = {makeReservation("reused", 2)},
          .deleted_reservations = {"reused"},
          .ledger_clock_ms = 6});
  commit({.accounts = {makeAccount("a", 1, 3)},
          .reservations = {makeReservation("keep", 3)},
          .ledger_clock_ms = 7});
  StoreContents replayed = loadOrDie(store.get());
  expectContents(replayed, model);
  EXPECT_EQ(model.reservations.count("gone"), 0u);
  EXPECT_EQ(model.reservations.count("brief"), 0u);
  EXPECT_EQ(model.reservations.count("reused"), 1u);
  EXPECT_EQ(model.accounts.begin()->second, makeAccount("a", 1, 3));

  store.reset();
  store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->pendingLogRows(), 4u);
  expectContents(loadOrDie(store.get()), model);
  ASSERT_TRUE(store->checkpoint().isOk());
  expectContents(loadOrDie(store.get()), model);
  store.reset();
  store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
}

// A random stream of batches over a small key space, so images overwrite and deletions hit.
StoreBatch randomBatch(std::mt19937_64& rng, uint64_t step) {
  StoreBatch batch;
  auto pick = [&](uint64_t n) { return rng() % n; };
  if (pick(10) == 0) batch.policies.push_back(makePolicy(1 + pick(5), pick(3)));
  for (uint64_t i = pick(4); i > 0; --i) {
    batch.accounts.push_back(makeAccount("s" + std::to_string(pick(6)), 1 + pick(3), step));
  }
  for (uint64_t i = pick(6); i > 0; --i) {
    batch.reservations.push_back(makeReservation("r" + std::to_string(pick(40)), step * 10 + i));
  }
  for (uint64_t i = pick(3); i > 0; --i) {
    batch.deleted_reservations.push_back("r" + std::to_string(pick(40)));
  }
  batch.ledger_clock_ms = step * 3 + pick(5);
  return batch;
}

// The commit path's encoder reuses its buffers (and its zeroed first segment) from batch to
// batch; whatever came before, what it writes decodes to the batch, as a fresh encoder's blob
// (encodeBatch) does: small, several-segment and huge batches in turn, then small again after
// the huge one's buffers were released. (The bytes may differ from a fresh encoder's where a
// reused first segment is larger than the batch's estimate: the message then has fewer
// segments.)
TEST_F(StoreTest, BatchEncoderWritesWhatDecodesToTheBatchWhateverCameBefore) {
  std::mt19937_64 rng(11);
  const PolicyRecord wide = policyOfManyBudgets();
  StoreBatch huge;
  for (uint64_t i = 0; i < 40'000; ++i) {
    huge.reservations.push_back(makeReservation("h" + std::to_string(i), i));
  }
  std::vector<StoreBatch> batches;
  for (uint64_t step = 1; step <= 30; ++step) batches.push_back(randomBatch(rng, step));
  batches.push_back(StoreBatch{.policies = {wide}, .ledger_clock_ms = 7});
  batches.push_back(randomBatch(rng, 31));
  batches.push_back(huge);
  batches.push_back(StoreBatch{});
  for (uint64_t step = 32; step <= 40; ++step) batches.push_back(randomBatch(rng, step));
  BatchEncoder encoder;
  for (size_t i = 0; i < batches.size(); ++i) {
    const Blob reference = encodeBatch(batches[i]);
    Result<StoreBatch> expected = decodeBatch(blobBytes(reference));
    ASSERT_TRUE(expected.isOk()) << "batch " << i << ": " << expected.status().toString();
    Result<StoreBatch> decoded = decodeBatch(encoder.encode(batches[i]));
    ASSERT_TRUE(decoded.isOk()) << "batch " << i << ": " << decoded.status().toString();
    EXPECT_TRUE(decoded.value() == expected.value()) << "batch " << i;
    EXPECT_TRUE(decoded.value().reservations == batches[i].reservations) << "batch " << i;
  }
  EXPECT_GT(blobBytes(encodeBatch(huge)).size(), BatchEncoder::kKeptBytesMax / 2);
}

TEST_F(StoreTest, CheckpointAtAnyPointGivesTheSameContents) {
  struct Variant {
    const char* name;
    uint64_t checkpoint_log_rows;
    bool manual;  // also checkpoint by hand at random points
    uint64_t rows_per_fold = 256;
    uint64_t log_segment_bytes = uint64_t{32} << 20;
  };
  const std::vector<Variant> variants = {
      {"never", 0, false},
      {"every-row", 1, false},
      {"every-5", 5, false},
      {"manual", 0, true},
      {"default", 256, true},
      {"one-row-folds-small-segments", 2, true, 1, 2048},
      {"a-segment-per-record", 3, true, 2, 1},
  };
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (const Variant& variant : variants) {
      SCOPED_TRACE(variant.name);
      const std::string dir = tmp_.path() + "/" + std::to_string(seed) + "-" + variant.name;
      const SqliteStoreOptions options{.checkpoint_log_rows = variant.checkpoint_log_rows,
                                       .fold_rows_per_transaction_max = variant.rows_per_fold,
                                       .log_segment_bytes = variant.log_segment_bytes};
      std::mt19937_64 rng(seed);             // the same batches for every variant
      std::mt19937_64 actions(seed + 1000);  // checkpoint and reopen points
      Model model;
      auto store = openOrDie(dir, options);
      ASSERT_NE(store, nullptr);
      for (uint64_t step = 1; step <= 120; ++step) {
        StoreBatch batch = randomBatch(rng, step);
        ASSERT_TRUE(store->commit(batch).isOk());
        ASSERT_TRUE(store->foldStatus().isOk()) << store->foldStatus().toString();
        model.apply(batch);
        if (variant.manual && actions() % 7 == 0) {
          ASSERT_TRUE(store->checkpoint().isOk());
        }
        if (actions() % 23 == 0) {
          store.reset();
          store = openOrDie(dir, options);
          ASSERT_NE(store, nullptr);
        }
        if (step % 15 == 0) expectContents(loadOrDie(store.get()), model);
      }
      expectContents(loadOrDie(store.get()), model);
      ASSERT_TRUE(store->checkpoint().isOk());
      EXPECT_EQ(store->pendingLogRows(), 0u);
      expectContents(loadOrDie(store.get()), model);
    }
  }
}

// --- Crash safety: a real process, killed with SIGKILL -----------------------------------------

// Batch n of the crash workload: reservation r-n (kept forever), tmp-n (replacing tmp-(n-1)),
// the counter account whose `available` is n, and now and then a policy.
StoreBatch crashBatch(uint64_t n) {
  StoreBatch batch;
  batch.reservations = {makeReservation("r-" + std::to_string(n), n),
                        makeReservation("tmp-" + std::to_string(n), n)};
  if (n > 1) batch.deleted_reservations = {"tmp-" + std::to_string(n - 1)};
  AccountRecord counter = makeAccount("counter", 1, 0);
  counter.balances.available = n;
  batch.accounts = {counter};
  for (uint64_t i = 0; i < 8; ++i) {
    batch.accounts.push_back(makeAccount("filler-" + std::to_string(i), 1, n));
  }
  if (n % 50 == 1) batch.policies = {makePolicy(n)};
  batch.ledger_clock_ms = n * 10;
  return batch;
}

// Commits crashBatch(1..last) into a new store in `dir`, folding them up to `checkpoint_after`
// (the rest stays in the log), and applies them to *model.
void commitCrashBatches(const std::string& dir, uint64_t last, uint64_t checkpoint_after,
                        Model* model) {
  auto store = openOrDie(dir, {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  for (uint64_t n = 1; n <= last; ++n) {
    ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
    model->apply(crashBatch(n));
    if (n == checkpoint_after) {
      ASSERT_TRUE(store->checkpoint().isOk());
    }
  }
}

constexpr uint64_t kChildBatchesMax = 1'000'000;
constexpr uint64_t kChildFailed = ~uint64_t{0};
constexpr int kAckTimeoutMs = 30'000;

// The committed prefix of the crash workload a store holds: the counter account's `available`.
uint64_t committedPrefix(const StoreContents& contents) {
  for (const AccountRecord& a : contents.accounts) {
    if (a.key.subject == "counter") return a.balances.available;
  }
  return 0;
}

// The child: opens the store, continues the crash workload after the prefix the dir holds, and
// acknowledges each batch n on `ack_fd` only after commit() returned. Never returns into the
// test framework.
[[noreturn]] void runCrashChild(const std::string& dir, const SqliteStoreOptions& options,
                                int ack_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto opened = SqliteStore::open(dir, options);
  if (!opened.isOk()) {
    (void)!::write(ack_fd, &kChildFailed, sizeof kChildFailed);
    ::_exit(3);
  }
  auto store = std::move(opened).value();
  Result<StoreContents> loaded = store->load();
  if (!loaded.isOk()) {
    (void)!::write(ack_fd, &kChildFailed, sizeof kChildFailed);
    ::_exit(6);
  }
  for (uint64_t n = committedPrefix(loaded.value()) + 1; n <= kChildBatchesMax; ++n) {
    if (!store->commit(crashBatch(n)).isOk() || !store->foldStatus().isOk()) {
      (void)!::write(ack_fd, &kChildFailed, sizeof kChildFailed);
      ::_exit(4);
    }
    if (::write(ack_fd, &n, sizeof n) != static_cast<ssize_t>(sizeof n)) ::_exit(5);
  }
  ::_exit(0);
}

// Reads acknowledgements (8-byte batch numbers) until `want` more arrived or the pipe closed;
// every wait is bounded by kAckTimeoutMs. Returns the highest number seen.
uint64_t readAcks(int fd, uint64_t want, uint64_t* count, bool* child_failed) {
  uint64_t highest = 0;
  std::vector<uint8_t> pending;
  while (*count < want) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    int ready = ::poll(&p, 1, kAckTimeoutMs);
    if (ready <= 0) {
      ADD_FAILURE() << "no acknowledgement within " << kAckTimeoutMs << " ms";
      break;
    }
    uint8_t buffer[4096];
    ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // the child is gone
    pending.insert(pending.end(), buffer, buffer + got);
    size_t whole = pending.size() / sizeof(uint64_t) * sizeof(uint64_t);
    for (size_t at = 0; at < whole; at += sizeof(uint64_t)) {
      uint64_t seq = 0;
      std::memcpy(&seq, pending.data() + at, sizeof seq);
      if (seq == kChildFailed) {
        *child_failed = true;
        return highest;
      }
      if (highest != 0) {
        EXPECT_EQ(seq, highest + 1) << "acknowledgements arrive in commit order";
      }
      highest = seq;
      ++*count;
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(whole));
  }
  return highest;
}

// Runs a crash child on `dir` until it acknowledged `acks` batches, lets it run `extra_us` more,
// then kills it with SIGKILL. *acknowledged: the highest batch it acknowledged.
void runAndKill(const std::string& dir, const SqliteStoreOptions& options, uint64_t acks,
                uint64_t extra_us, uint64_t* acknowledged) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  std::fflush(nullptr);
  pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    ::close(fds[0]);
    runCrashChild(dir, options, fds[1]);
  }
  ::close(fds[1]);
  uint64_t count = 0;
  bool child_failed = false;
  *acknowledged = readAcks(fds[0], acks, &count, &child_failed);
  if (extra_us > 0 && !child_failed) ::usleep(static_cast<useconds_t>(extra_us));
  ASSERT_EQ(::kill(child, SIGKILL), 0) << std::strerror(errno);
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  // Acknowledgements written between the last read and the kill count too.
  *acknowledged =
      std::max(*acknowledged, readAcks(fds[0], kChildBatchesMax, &count, &child_failed));
  ::close(fds[0]);
  ASSERT_FALSE(child_failed) << "the child's store failed";
  ASSERT_TRUE(WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL)
      << "the child ended on its own, status " << wait_status;
  ASSERT_GE(count, acks);
}

// After a crash: the committed batches form a prefix 1..m with m >= every acknowledged batch,
// and the contents are exactly what that prefix wrote. Then the store goes on: one more batch,
// and (when `fold`) a full checkpoint. *folded_seq: tables.db's folded_seq as found.
void checkCrashRecovery(const std::string& dir, uint64_t acknowledged, bool fold = true,
                        int64_t* folded_seq = nullptr) {
  auto store = openOrDie(dir, {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  if (folded_seq != nullptr) *folded_seq = store->foldedSeq();
  Result<StoreContents> loaded = store->load();
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  const StoreContents& contents = loaded.value();
  const uint64_t committed = committedPrefix(contents);
  ASSERT_GE(committed, acknowledged) << "an acknowledged batch was lost";
  Model model;
  for (uint64_t n = 1; n <= committed; ++n) model.apply(crashBatch(n));
  expectContents(contents, model);
  for (uint64_t n = 1; n <= acknowledged; ++n) {
    ASSERT_EQ(model.reservations.count("r-" + std::to_string(n)), 1u);
  }
  StoreBatch next = crashBatch(committed + 1);
  ASSERT_TRUE(store->commit(next).isOk());
  model.apply(next);
  if (fold) {
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  expectContents(loadOrDie(store.get()), model);
}

struct CrashCase {
  uint64_t acks_before_kill;
  uint64_t checkpoint_log_rows;
};

void PrintTo(const CrashCase& crash, std::ostream* out) {
  *out << "kill after " << crash.acks_before_kill << " acks, fold every "
       << crash.checkpoint_log_rows << " rows";
}

class CrashTest : public StoreTest, public ::testing::WithParamInterface<CrashCase> {};

TEST_P(CrashTest, SigkillLosesNoAcknowledgedBatch) {
  const CrashCase crash = GetParam();
  uint64_t acknowledged = 0;
  ASSERT_NO_FATAL_FAILURE(runAndKill(dataDir(), {.checkpoint_log_rows = crash.checkpoint_log_rows},
                                     crash.acks_before_kill, 0, &acknowledged));
  checkCrashRecovery(dataDir(), acknowledged);
}

INSTANTIATE_TEST_SUITE_P(KillPoints, CrashTest,
                         ::testing::Values(CrashCase{50, 256}, CrashCase{137, 7},
                                           CrashCase{400, 256}, CrashCase{400, 3},
                                           CrashCase{223, 1}, CrashCase{311, 0}),
                         [](const ::testing::TestParamInfo<CrashCase>& info) {
                           return "after" + std::to_string(info.param.acks_before_kill) + "_every" +
                                  std::to_string(info.param.checkpoint_log_rows);
                         });

// Kills a child again and again on one data dir while its fold thread is busy all the time (tiny
// folds and tiny log segments, so folds and segment recycling are always in progress), at random
// points. Each recovery must hold every acknowledged batch and nothing else.
TEST_F(StoreTest, SigkillDuringFoldAtRandomPointsLosesNothing) {
  const uint64_t seed = 20240611;
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const SqliteStoreOptions busy_fold{
      .checkpoint_log_rows = 2, .fold_rows_per_transaction_max = 3, .log_segment_bytes = 2048};
  constexpr int kRounds = 16;
  int rounds_with_fold_progress = 0;
  int64_t folded_before = 0;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t acks = 5 + rng() % 250;
    const uint64_t extra_us = rng() % 4000;
    SCOPED_TRACE("round " + std::to_string(round) + ": kill after " + std::to_string(acks) +
                 " acks + " + std::to_string(extra_us) + " us");
    uint64_t acknowledged = 0;
    ASSERT_NO_FATAL_FAILURE(runAndKill(dataDir(), busy_fold, acks, extra_us, &acknowledged));
    int64_t folded_at_kill = 0;
    // Every other round leaves the log unfolded, so the next child starts with work to fold.
    ASSERT_NO_FATAL_FAILURE(
        checkCrashRecovery(dataDir(), acknowledged, round % 2 == 0, &folded_at_kill));
    if (folded_at_kill > folded_before) ++rounds_with_fold_progress;
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    folded_before = store->foldedSeq();
  }
  EXPECT_GE(rounds_with_fold_progress, kRounds / 2) << "the fold thread was not busy at the kills";
}

// --- The fold thread ----------------------------------------------------------------------------

// Waits (bounded) until `done` holds.
template <typename F>
bool eventually(F&& done, int timeout_ms = 20'000) {
  for (int waited_ms = 0; waited_ms < timeout_ms; waited_ms += 2) {
    if (done()) return true;
    ::usleep(2000);
  }
  return done();
}

// One integer from a raw query on a database file.
int64_t rawInt(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  int64_t value = -1;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      value = sqlite3_column_int64(stmt, 0);
    }
    EXPECT_EQ(sqlite3_finalize(stmt), SQLITE_OK) << sql;
  }
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  EXPECT_GE(value, 0) << db_path << ": " << sql;
  return value;
}

void removeDatabaseFile(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
}

TEST_F(StoreTest, FoldThreadCatchesUpWhileCommitsContinue) {
  const SqliteStoreOptions options{
      .checkpoint_log_rows = 4, .fold_rows_per_transaction_max = 3, .log_segment_bytes = 8192};
  auto store = openOrDie(dataDir(), options);
  ASSERT_NE(store, nullptr);
  std::mt19937_64 rng(11);
  Model model;
  constexpr uint64_t kSteps = 1500;
  uint64_t loads_while_folding = 0;
  for (uint64_t step = 1; step <= kSteps; ++step) {
    StoreBatch batch = randomBatch(rng, step);
    ASSERT_TRUE(store->commit(batch).isOk());
    model.apply(batch);
    if (step % 10 == 0) {
      // The fold thread runs meanwhile: tables.db and the log change under this load().
      const int64_t folded = store->foldedSeq();
      expectContents(loadOrDie(store.get()), model);
      if (folded > 0 && folded < static_cast<int64_t>(step)) ++loads_while_folding;
    }
  }
  ASSERT_TRUE(store->foldStatus().isOk()) << store->foldStatus().toString();
  const SqliteStoreStats stats = store->stats();
  EXPECT_GT(stats.folds, 0u);
  EXPECT_GT(stats.log_segments_recycled, 0u);
  EXPECT_GT(loads_while_folding, 0u);
  EXPECT_TRUE(eventually([&] { return store->foldedSeq() + 4 > static_cast<int64_t>(kSteps); }))
      << "folded only up to " << store->foldedSeq();
  ASSERT_TRUE(store->checkpoint().isOk());
  EXPECT_EQ(store->foldedSeq(), static_cast<int64_t>(kSteps));
  EXPECT_EQ(store->pendingLogRows(), 0u);
  expectContents(loadOrDie(store.get()), model);
  store.reset();
  store = openOrDie(dataDir(), options);
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
}

TEST_F(StoreTest, FoldedLogRecordsAreRecycledAndTheLogStaysBounded) {
  // About 15 records of ~8.6 KB to a segment.
  const SqliteStoreOptions options{.checkpoint_log_rows = 16, .log_segment_bytes = 128 << 10};
  auto store = openOrDie(dataDir(), options);
  ASSERT_NE(store, nullptr);
  constexpr uint64_t kSteps = 3000;
  uint64_t pending_max = 0;
  uint64_t on_disk_max = 0;
  for (uint64_t n = 1; n <= kSteps; ++n) {
    StoreBatch batch = crashBatch(n);
    for (uint64_t i = 0; i < 12; ++i) {  // about 8 KiB per batch
      batch.reservations.push_back(makeReservation("bulk-" + std::to_string(i), n));
    }
    ASSERT_TRUE(store->commit(batch).isOk());
    pending_max = std::max(pending_max, store->pendingLogRows());
    on_disk_max = std::max(on_disk_max, store->logDiskBytes());
  }
  ASSERT_TRUE(store->foldStatus().isOk()) << store->foldStatus().toString();
  // Releases ride on commits: once the fold caught up, the next commits release what it folded.
  ASSERT_TRUE(eventually([&] { return store->foldedSeq() + 16 > static_cast<int64_t>(kSteps); }));
  for (uint64_t n = kSteps + 1; n <= kSteps + 2; ++n) {
    ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
  }
  EXPECT_LE(store->pendingLogRows(), 16u + 2u);
  const SqliteStoreStats stats = store->stats();
  const uint64_t written = stats.log_bytes;
  RecordProperty("log_bytes_written", std::to_string(written));
  RecordProperty("log_disk_bytes_max", std::to_string(on_disk_max));
  RecordProperty("pending_log_rows_max", std::to_string(pending_max));
  EXPECT_GT(written, uint64_t{6} << 20);
  EXPECT_LT(pending_max, 1000u) << "the fold thread fell behind without bound";
  // Folded segments are reused, not left behind: the log on disk is what is not yet folded and
  // about two segments more, not what was ever written.
  EXPECT_GT(stats.log_segments_recycled, 50u);
  // The segments the unfolded records span, the current one and one waiting to be reused.
  const uint64_t record_bytes = written / stats.commits;
  const uint64_t segments_for_pending =
      4 + (pending_max * record_bytes) / options.log_segment_bytes;
  EXPECT_LE(stats.log_segments_created, segments_for_pending)
      << "new segments where folded ones could be reused";
  EXPECT_LT(on_disk_max, written / 4) << "the log's segments grow with what was written";
  EXPECT_LE(segmentFiles(dataDir()), segments_for_pending);
}

// Folded records stay in the log until their segment is recycled, and a crash may leave
// tables.db ahead of where load() starts replaying. Replaying such a stretch again changes
// nothing.
TEST_F(StoreTest, ReplayingAnAlreadyFoldedStretchIsHarmless) {
  // One record per segment, so that a segment is recycled as soon as its record is folded.
  const SqliteStoreOptions one_record_segments{.checkpoint_log_rows = 0, .log_segment_bytes = 1};
  std::mt19937_64 rng(5);
  Model model;
  {
    auto store = openOrDie(dataDir(), one_record_segments);
    ASSERT_NE(store, nullptr);
    for (uint64_t step = 1; step <= 60; ++step) {
      StoreBatch batch = randomBatch(rng, step);
      ASSERT_TRUE(store->commit(batch).isOk());
      model.apply(batch);
      if (step == 30) {
        ASSERT_TRUE(store->checkpoint().isOk());  // folded and released up to 30
      }
    }
    EXPECT_GT(store->stats().log_segments_recycled, 0u);
  }
  {
    // The fold thread folds 31..60 on its own; no commit follows to release them.
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 1, .log_segment_bytes = 1});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(eventually([&] { return store->foldedSeq() == 60; }));
  }
  EXPECT_EQ(rawInt(tablesPath(), "SELECT value FROM meta WHERE key = 'folded_seq'"), 60);
  // 31..60 (folded, not released) and nothing before 31: those segments were recycled.
  EXPECT_EQ(segmentFiles(dataDir()), 30u);
  EXPECT_FALSE(std::filesystem::exists(logPath() + "/" + CommitLog::segmentName(30)));
  // As if tables.db's latest folds had not recorded folded_seq: load() replays those records
  // over tables that already hold them.
  for (int64_t folded : {45, 30}) {
    SCOPED_TRACE("folded_seq lowered to " + std::to_string(folded));
    rawSql(tablesPath(),
           "UPDATE meta SET value = " + std::to_string(folded) + " WHERE key = 'folded_seq'",
           nullptr);
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    expectContents(loadOrDie(store.get()), model);
  }
  // Below what the log still holds, records would be missing: refused, not silently replayed.
  rawSql(tablesPath(), "UPDATE meta SET value = 29 WHERE key = 'folded_seq'", nullptr);
  Result<std::unique_ptr<SqliteStore>> refused = SqliteStore::open(dataDir());
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption) << refused.status().toString();
  EXPECT_NE(refused.status().message().find("records from seq 30 on are needed"), std::string::npos)
      << refused.status().toString();
}

TEST_F(StoreTest, MissingTablesDbIsRebuiltFromAWholeLogAndRefusedOtherwise) {
  Model model;
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 5; ++n) {
      ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
      model.apply(crashBatch(n));
    }
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  // The log still holds every record from seq 1: tables.db is rebuilt from it.
  removeDatabaseFile(tablesPath());
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0, .log_segment_bytes = 1});
    ASSERT_NE(store, nullptr);
    expectContents(loadOrDie(store.get()), model);
    // One record per segment from here on: the first segments are recycled.
    for (uint64_t n = 6; n <= 10; ++n) {
      ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
      model.apply(crashBatch(n));
      ASSERT_TRUE(store->checkpoint().isOk());
    }
    ASSERT_TRUE(store->commit(crashBatch(11)).isOk());
    EXPECT_GT(store->stats().log_segments_recycled, 0u);
  }
  removeDatabaseFile(tablesPath());
  for (int attempt = 0; attempt < 2; ++attempt) {  // and it stays refused
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
    ASSERT_FALSE(store.isOk());
    EXPECT_EQ(store.status().code(), StatusCode::kCorruption);
    EXPECT_NE(store.status().message().find("tables.db is missing or older than the log"),
              std::string::npos)
        << store.status().toString();
  }
}

TEST_F(StoreTest, MissingLogIsRefused) {
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 5; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  for (bool keep_dir : {true, false}) {
    SCOPED_TRACE(keep_dir ? "segments deleted" : "log dir deleted");
    std::filesystem::remove_all(logPath());
    if (keep_dir) std::filesystem::create_directory(logPath());
    for (int attempt = 0; attempt < 2; ++attempt) {  // and it stays refused
      Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
      ASSERT_FALSE(store.isOk());
      EXPECT_EQ(store.status().code(), StatusCode::kCorruption);
      EXPECT_NE(store.status().message().find("holds no log segment"), std::string::npos)
          << store.status().toString();
    }
  }
}

TEST_F(StoreTest, SchemaVersion1IsRefusedWithAClearMessage) {
  // The one-file layout of schema version 1: the log and the tables both in ledger.db.
  std::filesystem::create_directories(dataDir());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dbPath().c_str(), &db), SQLITE_OK);
  for (const char* sql : {
           "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)",
           "CREATE TABLE log(seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
           "CREATE TABLE reservations(id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
           "INSERT INTO meta(key, value) VALUES('schema_version', 1)",
       }) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  const std::string& message = store.status().message();
  EXPECT_NE(message.find("ledger.db has schema_version 1; this build reads only 7"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("there is no migration"), std::string::npos) << message;
}

TEST_F(StoreTest, FoldTransactionsAreBoundedInRowsAndBytes) {
  Model model;
  {
    auto store =
        openOrDie(dataDir(), {.checkpoint_log_rows = 0, .fold_rows_per_transaction_max = 3});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 20; ++n) {
      ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
      model.apply(crashBatch(n));
    }
    ASSERT_TRUE(store->checkpoint().isOk());
    EXPECT_EQ(store->stats().folds, 7u);  // 3+3+3+3+3+3+2 rows
    EXPECT_EQ(store->stats().folded_rows, 20u);
  }
  // A byte budget below one row: one row per transaction, never zero.
  auto store =
      openOrDie(dataDir(), {.checkpoint_log_rows = 0, .fold_bytes_per_transaction_max = 1});
  ASSERT_NE(store, nullptr);
  for (uint64_t n = 21; n <= 25; ++n) {
    ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
    model.apply(crashBatch(n));
  }
  ASSERT_TRUE(store->checkpoint().isOk());
  EXPECT_EQ(store->stats().folds, 5u);
  EXPECT_EQ(store->foldedSeq(), 25);
  expectContents(loadOrDie(store.get()), model);
}

TEST_F(StoreTest, FoldFailureInTheBackgroundStopsCommits) {
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 5; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
  }
  // A record that reads back intact (its checksum matches) but does not decode.
  damageRecord(dataDir(), 2, std::vector<uint8_t>(4096, 0xff), /*fix_checksum=*/true);
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 1});
  ASSERT_NE(store, nullptr);
  // With 5 rows pending and a threshold of 1 the fold thread may start (and fail) at open,
  // before this commit; either way the commit after the failure is refused.
  const Status sixth = store->commit(crashBatch(6));
  ASSERT_TRUE(sixth.isOk() || sixth.code() == StatusCode::kFailedPrecondition) << sixth.toString();
  ASSERT_TRUE(eventually([&] { return !store->foldStatus().isOk(); }));
  EXPECT_EQ(store->foldStatus().code(), StatusCode::kCorruption);
  EXPECT_NE(store->foldStatus().message().find("log seq 2"), std::string::npos)
      << store->foldStatus().toString();
  EXPECT_EQ(store->commit(crashBatch(7)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->checkpoint().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->foldedSeq(), 0);
  EXPECT_EQ(store->pendingLogRows(), sixth.isOk() ? 6u : 5u);
}

// --- Refusals and damage ------------------------------------------------------------------------

TEST_F(StoreTest, SecondOpenOfTheSameDirIsRefused) {
  auto first = openOrDie(dataDir());
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<SqliteStore>> second = SqliteStore::open(dataDir());
  ASSERT_FALSE(second.isOk());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status().toString();
  first.reset();
  EXPECT_NE(openOrDie(dataDir()), nullptr) << "the lock is released with the store";
}

TEST_F(StoreTest, CreatesMissingDataDirWithPrivateMode) {
  const std::string dir = tmp_.path() + "/a/b/data";
  auto store = openOrDie(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(std::filesystem::is_directory(dir));
  auto perms = std::filesystem::status(dir).permissions();
  EXPECT_EQ(perms & std::filesystem::perms::others_all, std::filesystem::perms::none);
  EXPECT_TRUE(std::filesystem::exists(dir + "/LOCK"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/log/" + CommitLog::segmentName(1)));
  EXPECT_TRUE(std::filesystem::exists(dir + "/tables.db"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/ledger.db"));
}

TEST_F(StoreTest, DataDirThatIsAFileIsRefused) {
  const std::string path = tmp_.path() + "/file";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(path);
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().toString();
}

// The log's batches are flat (store_codec.h): a zero word, then the unpacked message. The
// packed form that schema version 6 wrote still decodes to the same batch, and the two differ
// in their first byte.
TEST_F(StoreTest, LogBatchesAreWrittenFlatAndBothFormsDecode) {
  const std::vector<StoreBatch> batches = {
      crashBatch(3), {.policies = {policyOfManyBudgets()}, .ledger_clock_ms = 7}};
  for (const StoreBatch& batch : batches) {
    const Blob flat = encodeBatch(batch);
    const std::vector<uint8_t> packed = packedOf(blobBytes(flat));
    ASSERT_NE(packed[0], 0) << "a packed message starts with a non-zero tag";
    EXPECT_LT(packed.size(), flat.size());
    for (std::span<const uint8_t> bytes : {blobBytes(flat), std::span<const uint8_t>(packed)}) {
      Result<StoreBatch> decoded = decodeBatch(bytes);
      ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
      EXPECT_TRUE(decoded.value() == batch);
    }
    // A flat body at an address that is not word-aligned (a caller's buffer) reads the same.
    std::vector<uint8_t> shifted(flat.size() + 1);
    std::memcpy(shifted.data() + 1, flat.begin(), flat.size());
    Result<StoreBatch> decoded = decodeBatch(std::span<const uint8_t>(shifted).subspan(1));
    ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
    EXPECT_TRUE(decoded.value() == batch);
  }
}

TEST_F(StoreTest, DamagedFlatBatchesAreCorruptionNotCrashes) {
  const Blob flat = encodeBatch(crashBatch(3));
  const std::span<const uint8_t> bytes = blobBytes(flat);
  struct Case {
    const char* name;
    std::vector<uint8_t> body;
    const char* says;
  };
  std::vector<uint8_t> zero_words(64, 0);
  std::vector<uint8_t> huge_segment(bytes.begin(), bytes.end());
  huge_segment[kFlatMarkerBytes + 4] = 0xff;  // the first segment's size, far past the end
  huge_segment[kFlatMarkerBytes + 5] = 0xff;
  const std::vector<Case> cases = {
      {"only the marker", std::vector<uint8_t>(bytes.begin(), bytes.begin() + kFlatMarkerBytes),
       "malformed"},
      {"not whole words", std::vector<uint8_t>(bytes.begin(), bytes.end() - 3), "whole words"},
      {"cut short by a word", std::vector<uint8_t>(bytes.begin(), bytes.end() - 8), "malformed"},
      {"all zero", zero_words, "malformed"},
      {"a segment past the end", huge_segment, "malformed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Result<StoreBatch> decoded = decodeBatch(c.body);
    ASSERT_FALSE(decoded.isOk());
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
    EXPECT_NE(decoded.status().message().find(c.says), std::string::npos)
        << decoded.status().toString();
    BatchFolder folder;
    EXPECT_EQ(folder.add(kj::heapArray<kj::byte>(c.body.data(), c.body.size())).code(),
              StatusCode::kCorruption);
  }
}

// The fold reads a run that mixes both forms (a schema version 6 log, then this build's
// records) into the same net effect as the run written flat.
TEST_F(StoreTest, TheFolderFoldsPackedAndFlatBatchesAlike) {
  auto fold = [](bool first_packed) -> StoreBatch {
    BatchFolder folder;
    for (uint64_t n = 1; n <= 4; ++n) {
      const Blob flat = encodeBatch(crashBatch(n));
      if (first_packed && n <= 2) {
        const std::vector<uint8_t> packed = packedOf(blobBytes(flat));
        EXPECT_TRUE(folder.add(kj::heapArray<kj::byte>(packed.data(), packed.size())).isOk());
      } else {
        EXPECT_TRUE(folder.add(kj::heapArray<kj::byte>(flat.begin(), flat.size())).isOk());
      }
    }
    Result<StoreBatch> net = folder.finish();
    EXPECT_TRUE(net.isOk()) << net.status().toString();
    return net.isOk() ? net.value() : StoreBatch{};
  };
  const StoreBatch flat = fold(false);
  EXPECT_FALSE(flat.reservations.empty());
  EXPECT_TRUE(fold(true) == flat);
}

// The fold thread reuses one batch for every fold: finishInto clears what the last fold left and
// keeps the lists' capacity.
TEST_F(StoreTest, FinishingIntoAReusedBatchGivesWhatAFreshFinishGives) {
  auto folderOf = [](uint64_t first, uint64_t last) {
    auto folder = std::make_unique<BatchFolder>();
    for (uint64_t n = first; n <= last; ++n) {
      const Blob blob = encodeBatch(crashBatch(n));
      EXPECT_TRUE(folder->add(kj::heapArray<kj::byte>(blob.begin(), blob.size())).isOk());
    }
    return folder;
  };
  StoreBatch reused;
  ASSERT_TRUE(folderOf(1, 60)->finishInto(&reused).isOk());
  const size_t capacity = reused.reservations.capacity();
  ASSERT_GE(capacity, 60u);
  const std::unique_ptr<BatchFolder> second = folderOf(61, 63);
  ASSERT_TRUE(second->finishInto(&reused).isOk());
  Result<StoreBatch> fresh = second->finish();
  ASSERT_TRUE(fresh.isOk()) << fresh.status().toString();
  EXPECT_EQ(reused.reservations.size(), fresh.value().reservations.size());
  EXPECT_TRUE(reused == fresh.value());
  EXPECT_EQ(reused.reservations.capacity(), capacity);
}

// Every field, whatever crashBatch sets: the static_assert beside StoreBatch keeps listsOf whole.
TEST(StoreBatchTest, ClearEmptiesEveryListKeepingItsCapacityAndZeroesTheRest) {
  StoreBatch batch;
  std::apply([](auto&... list) { (list.emplace_back(), ...); }, StoreBatch::listsOf(batch));
  batch.ledger_clock_ms = 1;
  batch.shard_sequence = 2;
  batch.audit_log_kept_from = 3;
  ASSERT_FALSE(batch.empty());
  batch.clear();
  EXPECT_TRUE(batch == StoreBatch{});
  EXPECT_TRUE(batch.empty());
  const bool every_capacity_kept =
      std::apply([](const auto&... list) { return ((list.capacity() >= 1) && ...); },
                 StoreBatch::listsOf(batch));
  EXPECT_TRUE(every_capacity_kept);
  // Each list alone makes a batch non-empty.
  for (size_t index = 0; index < std::tuple_size_v<decltype(StoreBatch::listsOf(batch))>; ++index) {
    StoreBatch one;
    size_t at = 0;
    std::apply([&](auto&... list) { ((at++ == index ? (list.emplace_back(), 0) : 0), ...); },
               StoreBatch::listsOf(one));
    EXPECT_FALSE(one.empty()) << "list " << index;
  }
}

TEST_F(StoreTest, CorruptLogBodyIsReportedWithItsSeq) {
  const std::vector<uint8_t> garbage(4096, 0xff);
  // Record 4's own body, whose segment table claims more words than the record holds.
  Blob real = encodeBatch(crashBatch(4));
  std::vector<uint8_t> overlong(blobBytes(real).begin(), blobBytes(real).end());
  overlong[kFlatMarkerBytes + 6] = 0x01;  // the first segment's size in words, + 65,536
  int variant = 0;
  // Intact checksums over bodies that do not decode: found when the record is decoded.
  for (const std::vector<uint8_t>* body :
       {&garbage, static_cast<const std::vector<uint8_t>*>(&overlong)}) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    const std::string dir = tmp_.path() + "/corrupt-" + std::to_string(variant++);
    {
      auto store = openOrDie(dir, {.checkpoint_log_rows = 0});
      ASSERT_NE(store, nullptr);
      for (uint64_t n = 1; n <= 3; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
      ASSERT_TRUE(store->checkpoint().isOk());
      // Seqs are never reused after a checkpoint: these are 4 and 5.
      for (uint64_t n = 4; n <= 5; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
    }
    damageRecord(dir, 4, *body, /*fix_checksum=*/true);
    auto store = openOrDie(dir, {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    Result<StoreContents> loaded = store->load();
    ASSERT_FALSE(loaded.isOk());
    EXPECT_EQ(loaded.status().code(), StatusCode::kCorruption);
    EXPECT_NE(loaded.status().message().find("log seq 4"), std::string::npos)
        << loaded.status().toString();
    // A checkpoint refuses to fold it and leaves everything in place; the store stops.
    Status folded = store->checkpoint();
    EXPECT_EQ(folded.code(), StatusCode::kCorruption) << folded.toString();
    EXPECT_EQ(store->pendingLogRows(), 2u);
    EXPECT_EQ(store->commit(crashBatch(6)).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(store->load().status().code(), StatusCode::kCorruption);
  }
  // A checksum that no longer matches, with a later record after it: damage, not a torn write
  // at the end, so opening refuses rather than treat the log as ending at seq 3.
  const std::string dir = tmp_.path() + "/flipped";
  {
    auto store = openOrDie(dir, {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 5; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
  }
  damageRecord(dir, 4, garbage, /*fix_checksum=*/false);
  Result<std::unique_ptr<SqliteStore>> refused = SqliteStore::open(dir);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find("log record seq 4 is damaged, and later records"),
            std::string::npos)
      << refused.status().toString();
}

// The last record torn by a crash in the middle of its write: it was never acknowledged, and the
// log ends before it; the next commit takes its seq and its place.
TEST_F(StoreTest, ATornLastRecordEndsTheLog) {
  Model model;
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 4; ++n) ASSERT_TRUE(store->commit(crashBatch(n)).isOk());
  }
  for (uint64_t n = 1; n <= 3; ++n) model.apply(crashBatch(n));
  const RecordLocation fourth = findRecord(dataDir(), 4);
  ASSERT_FALSE(fourth.path.empty());
  // Half of the record's body is gone (the fallocated rest of the segment reads as zeros).
  std::vector<uint8_t> zeros(fourth.bytes / 2 + 1, 0);
  const int fd = ::open(fourth.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(),
                     static_cast<off_t>(fourth.offset + CommitLog::kRecordHeaderBytes +
                                        fourth.bytes - zeros.size())),
            static_cast<ssize_t>(zeros.size()));
  ::close(fd);
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
  StoreBatch again = crashBatch(4);
  ASSERT_TRUE(store->commit(again).isOk());
  model.apply(again);
  store.reset();
  store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
  ASSERT_TRUE(store->checkpoint().isOk());
  EXPECT_EQ(store->foldedSeq(), 4);
}

TEST_F(StoreTest, CorruptTableBodyIsReportedWithItsKey) {
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(crashBatch(1)).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());
    EXPECT_EQ(store->pendingLogRows(), 0u);
  }
  // Well-formed, but the image of another row.
  Blob other = encodeReservationRecord(makeReservation("r-2", 2));
  const std::vector<uint8_t> wrong(blobBytes(other).begin(), blobBytes(other).end());
  rawSql(tablesPath(), "UPDATE reservations SET body = ?1 WHERE id = 'r-1'", &wrong);
  const std::vector<uint8_t> garbage(40, 0xee);
  rawSql(tablesPath(), "UPDATE accounts SET body = ?1 WHERE subject = 'counter'", &garbage);
  {
    auto store = openOrDie(dataDir());
    ASSERT_NE(store, nullptr);
    Result<StoreContents> loaded = store->load();
    ASSERT_FALSE(loaded.isOk());
    EXPECT_EQ(loaded.status().code(), StatusCode::kCorruption);
    EXPECT_NE(loaded.status().message().find("accounts (counter"), std::string::npos)
        << loaded.status().toString();
  }
  Blob counter = encodeAccountRecord(crashBatch(1).accounts[0]);
  const std::vector<uint8_t> fixed(blobBytes(counter).begin(), blobBytes(counter).end());
  rawSql(tablesPath(), "UPDATE accounts SET body = ?1 WHERE subject = 'counter'", &fixed);
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  Result<StoreContents> loaded = store->load();
  ASSERT_FALSE(loaded.isOk());
  EXPECT_NE(loaded.status().message().find("reservations id 'r-1': body holds id 'r-2'"),
            std::string::npos)
      << loaded.status().toString();
}

TEST_F(StoreTest, OtherSchemaVersionIsRefused) {
  {
    auto store = openOrDie(dataDir());
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(crashBatch(1)).isOk());
  }
  {
    const std::string path = tablesPath();
    rawSql(path, "UPDATE meta SET value = 8 WHERE key = 'schema_version'", nullptr);
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
    ASSERT_FALSE(store.isOk());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(
        store.status().message().find(path + " has schema_version 8; this build reads only 7"),
        std::string::npos)
        << store.status().toString();
    // Refusing changed nothing: with the version restored, the data is all there.
    rawSql(path, "UPDATE meta SET value = 7 WHERE key = 'schema_version'", nullptr);
  }
  auto reopened = openOrDie(dataDir());
  ASSERT_NE(reopened, nullptr);
  Model model;
  model.apply(crashBatch(1));
  expectContents(loadOrDie(reopened.get()), model);
}

TEST_F(StoreTest, ForeignDatabaseIsRefused) {
  std::filesystem::create_directories(dataDir());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dbPath().c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition) << store.status().toString();
}

TEST_F(StoreTest, NegativeCountersInTablesDbAreCorruptionNamingThem) {
  Model model;
  // Folded, so tables.db's meta holds all three.
  ASSERT_NO_FATAL_FAILURE(commitCrashBatches(dataDir(), 1, 1, &model));
  const std::string path = tablesPath();
  for (const char* key : {"folded_seq", "ledger_clock_ms", "shard_sequence"}) {
    SCOPED_TRACE(key);
    const std::string where = std::string(" WHERE key = '") + key + "'";
    const int64_t kept = rawInt(path, "SELECT value FROM meta" + where);
    rawSql(path, "UPDATE meta SET value = -1" + where, nullptr);
    // folded_seq is read when the store opens, the others when it loads.
    Status status = Status::ok();
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
    if (!store.isOk()) {
      status = store.status();
    } else {
      status = store.value()->load().status();
    }
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.toString();
    EXPECT_NE(status.message().find(path + ": negative " + key), std::string::npos)
        << status.toString();
    rawSql(path, "UPDATE meta SET value = " + std::to_string(kept) + where, nullptr);
  }
  auto reopened = openOrDie(dataDir());
  ASSERT_NE(reopened, nullptr);
  expectContents(loadOrDie(reopened.get()), model);
}

TEST_F(StoreTest, NotADatabaseIsCorruption) {
  std::filesystem::create_directories(dataDir());
  std::FILE* f = std::fopen(dbPath().c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(std::string(8192, 'z').c_str(), f);
  std::fclose(f);
  Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dataDir());
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption) << store.status().toString();
}

// Batches of about 20 reservations (~3 KiB encoded).
StoreBatch bulkBatch(uint64_t n) {
  StoreBatch batch = crashBatch(n);
  for (uint64_t i = 0; i < 20; ++i) {
    batch.reservations.push_back(makeReservation("bulk-" + std::to_string(n * 100 + i), i));
  }
  return batch;
}

// The log on a full disk: RLIMIT_FSIZE stands in for it (writes past the limit fail as a full
// disk's do, with EFBIG instead of ENOSPC), since a test cannot fill the machine's disk.
TEST_F(StoreTest, FullDiskUnderTheLogIsResourceExhaustedAndNotSticky) {
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  Model model;
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  sighandler_t previous = ::signal(SIGXFSZ, SIG_IGN);  // a failed write, not a killed process
  rlimit small = before;
  small.rlim_cur = 256 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status status;
  for (uint64_t n = 1; n <= 1000; ++n) {
    StoreBatch batch = bulkBatch(n);
    status = store->commit(batch);
    if (!status.isOk()) break;
    model.apply(batch);
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  ::signal(SIGXFSZ, previous);
  ASSERT_EQ(status.code(), StatusCode::kResourceExhausted) << status.toString();
  EXPECT_GT(model.reservations.size(), 20u) << "the limit was hit before anything was committed";
  // Not sticky: nothing of the failed batch counts; the store still reads and commits.
  expectContents(loadOrDie(store.get()), model);
  StoreBatch tiny{.ledger_clock_ms = model.ledger_clock_ms + 1};
  ASSERT_TRUE(store->commit(tiny).isOk());
  model.apply(tiny);
  store.reset();
  store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
}

// tables.db full (PRAGMA max_page_count): the fold fails without stopping commits, and folds
// once there is room again.
TEST_F(StoreTest, FullTablesDbFailsTheFoldButNotCommits) {
  Model model;
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0, .database_pages_max = 40});
    ASSERT_NE(store, nullptr);
    for (uint64_t n = 1; n <= 100; ++n) {
      ASSERT_TRUE(store->commit(bulkBatch(n)).isOk());
      model.apply(bulkBatch(n));
    }
    const Status folded = store->checkpoint();
    ASSERT_EQ(folded.code(), StatusCode::kResourceExhausted) << folded.toString();
    EXPECT_NE(folded.message().find("disk full"), std::string::npos) << folded.toString();
    EXPECT_EQ(store->foldedSeq(), 0);
    ASSERT_TRUE(store->commit(bulkBatch(101)).isOk());
    model.apply(bulkBatch(101));
    expectContents(loadOrDie(store.get()), model);
  }
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->checkpoint().isOk());
  EXPECT_EQ(store->foldedSeq(), 101);
  expectContents(loadOrDie(store.get()), model);
}

TEST_F(StoreTest, OversizedBatchIsRefused) {
  auto store = openOrDie(dataDir(), {.batch_bytes_max = 4096});
  ASSERT_NE(store, nullptr);
  StoreBatch big;
  for (uint64_t i = 0; i < 100; ++i) big.reservations.push_back(makeReservation("b", i));
  EXPECT_EQ(store->commit(big).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store->commit(crashBatch(1)).isOk());
  Model model;
  model.apply(crashBatch(1));
  expectContents(loadOrDie(store.get()), model);
}

// --- Emergency shards: gateways, shards, fences, the shard sequence
// -------------------------------

GatewayRecord makeGateway(const std::string& name, uint8_t key, bool enabled) {
  GatewayRecord record{.gateway_name = name, .enabled = enabled, .enrolled_at_ms = 1234u + key};
  record.public_key.fill(key);
  return record;
}

// Every field differs from its default.
ShardRecord makeShard(uint64_t n, ShardState state) {
  ShardRecord r;
  r.grant = ShardGrant{.shard_id = "shard-" + std::to_string(n),
                       .subject = "tenant-" + std::to_string(n),
                       .route = "/v1/chat",
                       .policy_generation = 2 + n,
                       .accounting_epoch_ms = 1'700'000'000'000 + n,
                       .gateway_name = "gw-" + std::to_string(n),
                       .gateway_boot_epoch = 4 + n,
                       .fence = 5 + n,
                       .allocated_units = 100 + n,
                       .issued_at_ms = 6 + n,
                       .expires_at_ms = 60'006 + n,
                       .ledger_key_id = "0123456789abcdef"};
  r.grant.gateway_id.fill(static_cast<uint8_t>(n + 1));
  r.grant.signature.fill(static_cast<uint8_t>(n + 2));
  r.issue_request = ShardIssueRequest{.request_id = "req-" + std::to_string(n),
                                      .gateway_name = r.grant.gateway_name,
                                      .gateway_id = r.grant.gateway_id,
                                      .gateway_boot_epoch = r.grant.gateway_boot_epoch,
                                      .subject = r.grant.subject,
                                      .route = r.grant.route};
  r.issue_request.signature.fill(static_cast<uint8_t>(n + 3));
  r.state = state;
  r.spent_units = 10 + n;
  r.reminted_units = 20 + n;
  r.retired_units = 70 - n;
  r.debt_units = 3 + n;
  r.reported = true;
  r.report_boot_epoch = 5 + n;
  r.last_reported = {.allocated = r.grant.allocated_units,
                     .local_available = 1,
                     .local_reserved = 2,
                     .local_spent = 3,
                     .local_retired = 94 + n,
                     .overspent = 7};
  Reservation receipt = makeReservation("rcpt-" + std::to_string(n), n);
  receipt.late_receipt_applied = false;  // not part of limitReservation.v1
  receipt.origin = r.grant.shard_id;
  r.receipts = {receipt};
  r.remint_due_at_ms = 60'006 + n;
  r.remint_target_units = 9;
  return r;
}

void expectShardContents(const StoreContents& actual, const std::vector<GatewayRecord>& gateways,
                         const std::vector<ShardRecord>& shards,
                         const std::vector<FenceRecord>& fences, uint64_t shard_sequence) {
  EXPECT_TRUE(actual.gateways == gateways);
  ASSERT_EQ(actual.shards.size(), shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    EXPECT_TRUE(actual.shards[i] == shards[i]) << shards[i].grant.shard_id;
  }
  EXPECT_TRUE(actual.fences == fences);
  EXPECT_EQ(actual.shard_sequence, shard_sequence);
}

TEST_F(StoreTest, ShardRowsRoundTripThroughTheLogTheFoldAndReopen) {
  const ShardRecord one = makeShard(1, ShardState::kReconciling);
  ShardRecord one_later = makeShard(1, ShardState::kConflict);
  one_later.debt_units = 40;
  const ShardRecord two = makeShard(2, ShardState::kIssued);
  const FenceRecord fence{.key = {"tenant-1", "/v1/chat"}, .fence = 2};
  const FenceRecord fence_later{.key = {"tenant-1", "/v1/chat"}, .fence = 3};
  const std::vector<StoreBatch> batches = {
      {.ledger_clock_ms = 1,
       .gateways = {makeGateway("gw-a", 1, true), makeGateway("gw-b", 2, true)},
       .shards = {one, two},
       .fences = {fence},
       .shard_sequence = 2},
      {.ledger_clock_ms = 2,
       .gateways = {makeGateway("gw-a", 1, false)},
       .shards = {one_later},
       .fences = {fence_later},
       .shard_sequence = 0},  // a batch that used no sequence number never lowers it
  };
  // The codec alone.
  for (const StoreBatch& batch : batches) {
    Result<StoreBatch> decoded = decodeBatch(blobBytes(encodeBatch(batch)));
    ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
    EXPECT_TRUE(decoded.value().gateways == batch.gateways);
    EXPECT_TRUE(decoded.value().shards == batch.shards);
    EXPECT_TRUE(decoded.value().fences == batch.fences);
    EXPECT_EQ(decoded.value().shard_sequence, batch.shard_sequence);
  }
  Result<ShardRecord> shard = decodeShardRecord(blobBytes(encodeShardRecord(one)));
  ASSERT_TRUE(shard.isOk()) << shard.status().toString();
  EXPECT_TRUE(shard.value() == one);
  const std::vector<GatewayRecord> gateways = {makeGateway("gw-a", 1, false),
                                               makeGateway("gw-b", 2, true)};
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    for (const StoreBatch& batch : batches) ASSERT_TRUE(store->commit(batch).isOk());
    // From the log, then from the folded tables.
    expectShardContents(loadOrDie(store.get()), gateways, {one_later, two}, {fence_later}, 2);
    ASSERT_TRUE(store->checkpoint().isOk());
    expectShardContents(loadOrDie(store.get()), gateways, {one_later, two}, {fence_later}, 2);
    // A compacted shard: gone when the log is replayed over the tables, and once folded.
    ASSERT_TRUE(
        store->commit({.ledger_clock_ms = 3, .shard_sequence = 3, .deleted_shards = {"shard-2"}})
            .isOk());
    expectShardContents(loadOrDie(store.get()), gateways, {one_later}, {fence_later}, 3);
    ASSERT_TRUE(store->checkpoint().isOk());
    expectShardContents(loadOrDie(store.get()), gateways, {one_later}, {fence_later}, 3);
  }
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  expectShardContents(loadOrDie(store.get()), gateways, {one_later}, {fence_later}, 3);
  Result<StoreBatch> decoded = decodeBatch(blobBytes(encodeBatch({.deleted_shards = {"shard-2"}})));
  ASSERT_TRUE(decoded.isOk());
  EXPECT_EQ(decoded.value().deleted_shards, std::vector<std::string>{"shard-2"});
}

// Runs statements on a database file directly (no row-count expectation).
void execSql(const std::string& db_path, const std::vector<std::string>& statements) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  for (const std::string& sql : statements) {
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sql << ": " << sqlite3_errmsg(db);
  }
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
}

int64_t schemaVersionOf(const std::string& db_path) {
  sqlite3* db = nullptr;
  int64_t version = -1;
  EXPECT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &stmt,
                               nullptr),
            SQLITE_OK);
  if (sqlite3_step(stmt) == SQLITE_ROW) version = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return version;
}

// The bodies of the log's records after `folded`, packed as schema versions 6 and older wrote
// them.
void readPackedBodies(const std::string& log_dir, int64_t folded,
                      std::vector<std::vector<uint8_t>>* bodies) {
  Result<std::unique_ptr<CommitLog>> log = CommitLog::open(log_dir, folded, true);
  ASSERT_TRUE(log.isOk()) << log.status().toString();
  for (int64_t seq = folded + 1; seq <= log.value()->lastSeq(); ++seq) {
    std::vector<uint8_t> flat;
    ASSERT_TRUE(log.value()->read(seq, &flat).isOk());
    bodies->push_back(packedOf(flat));
  }
}

// Turns the (closed) store's data dir back into what schema version 6 wrote: tables.db at
// version 6, and the log's records after folded_seq packed.
void revertToSchemaVersion6(const std::string& data_dir) {
  const std::string tables = data_dir + "/" + SqliteStore::kTablesFileName;
  const int64_t folded = rawInt(tables, "SELECT value FROM meta WHERE key = 'folded_seq'");
  const std::string log_dir = data_dir + "/" + SqliteStore::kLogDirName;
  std::vector<std::vector<uint8_t>> bodies;
  ASSERT_NO_FATAL_FAILURE(readPackedBodies(log_dir, folded, &bodies));
  std::filesystem::remove_all(log_dir);
  Result<std::unique_ptr<CommitLog>> log = CommitLog::open(log_dir, folded, false);
  ASSERT_TRUE(log.isOk()) << log.status().toString();
  ASSERT_TRUE(log.value()->ensureSegment().isOk());
  for (size_t i = 0; i < bodies.size(); ++i) {
    ASSERT_TRUE(log.value()->append(folded + 1 + static_cast<int64_t>(i), bodies[i]).isOk());
  }
  execSql(tables, {"UPDATE meta SET value = 6 WHERE key = 'schema_version'"});
}

// Turns the (closed) store's data dir back into the layout of schema version `version` <= 5:
// the log's records after folded_seq become rows (packed) of a new DIR/ledger.db, and DIR/log
// goes.
void revertToLegacyLog(const std::string& data_dir, int64_t version) {
  const std::string tables = data_dir + "/" + SqliteStore::kTablesFileName;
  const int64_t folded = rawInt(tables, "SELECT value FROM meta WHERE key = 'folded_seq'");
  const std::string log_dir = data_dir + "/" + SqliteStore::kLogDirName;
  std::vector<std::string> statements = {
      "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)",
      "CREATE TABLE log(seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
      "INSERT INTO meta(key, value) VALUES('schema_version', " + std::to_string(version) + ")",
      "INSERT INTO meta(key, value) VALUES('trimmed_seq', " + std::to_string(folded) + ")",
  };
  std::vector<std::vector<uint8_t>> bodies;
  ASSERT_NO_FATAL_FAILURE(readPackedBodies(log_dir, folded, &bodies));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((data_dir + "/" + SqliteStore::kLegacyLogFileName).c_str(), &db),
            SQLITE_OK);
  for (const std::string& sql : statements) {
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  for (size_t i = 0; i < bodies.size(); ++i) {
    sqlite3_stmt* insert = nullptr;
    ASSERT_EQ(
        sqlite3_prepare_v2(db, "INSERT INTO log(seq, body) VALUES(?1, ?2)", -1, &insert, nullptr),
        SQLITE_OK);
    sqlite3_bind_int64(insert, 1, folded + 1 + static_cast<int64_t>(i));
    sqlite3_bind_blob64(insert, 2, bodies[i].data(), bodies[i].size(), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(insert), SQLITE_DONE);
    sqlite3_finalize(insert);
  }
  ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  std::filesystem::remove_all(log_dir);
}

TEST_F(StoreTest, DataDirOfSchemaVersion2IsMigrated) {
  Model model;
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(crashBatch(1)).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());           // folded into tables.db
    ASSERT_TRUE(store->commit(crashBatch(2)).isOk());  // and one left in the log
    model.apply(crashBatch(1));
    model.apply(crashBatch(2));
  }
  // Turn the dir back into what the build before emergency shards wrote.
  execSql(tablesPath(),
          {"DROP TABLE gateways", "DROP TABLE shards", "DROP TABLE fences",
           "DROP TABLE period_snapshots", "DROP TABLE operators", "DROP TABLE audit_log",
           "UPDATE meta SET value = 2 WHERE key = 'schema_version'"});
  ASSERT_NO_FATAL_FAILURE(revertToLegacyLog(dataDir(), 2));
  ASSERT_EQ(schemaVersionOf(tablesPath()), 2);
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(schemaVersionOf(tablesPath()), SqliteStore::kSchemaVersion);
    EXPECT_FALSE(std::filesystem::exists(dbPath())) << "the old log stays behind";
    EXPECT_TRUE(std::filesystem::exists(logPath()));
    StoreContents contents = loadOrDie(store.get());
    expectContents(contents, model);
    expectShardContents(contents, {}, {}, {}, 0);
    // The new tables work.
    ASSERT_TRUE(store
                    ->commit({.ledger_clock_ms = 30,
                              .gateways = {makeGateway("gw-a", 1, true)},
                              .shards = {makeShard(1, ShardState::kIssued)},
                              .shard_sequence = 1})
                    .isOk());
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  const StoreContents contents = loadOrDie(store.get());
  expectShardContents(contents, {makeGateway("gw-a", 1, true)}, {makeShard(1, ShardState::kIssued)},
                      {}, 1);
  EXPECT_EQ(contents.reservations.size(), model.reservations.size());
}

PeriodSnapshot makeSnapshot(const std::string& subject, uint64_t epoch_first, uint64_t n) {
  return PeriodSnapshot{.key = {.subject = subject, .route = "/v1/chat", .generation = 1},
                        .epoch_period = n % 2 == 0 ? EpochPeriod::kHour : EpochPeriod::kDay,
                        .epoch_first = epoch_first,
                        .epoch_last = epoch_first + n,
                        .opened_at_ms = 1'700'000'000'000 + n,
                        .closed_at_ms = 1'700'000'100'000 + n,
                        .opening = {.opening = 1000, .available = 1000 - n, .spent = n},
                        .closing = {.opening = 1000,
                                    .minted = 5 + n,
                                    .overdraft_issued = 3,
                                    .available = 900,
                                    .reserved = 7,
                                    .spent = 101 + n,
                                    .retired_for_emergency = 0,
                                    .overdraft_repaid = 0,
                                    .transferred_out = 0},
                        .conserved = n % 3 != 0};
}

AccountRecord withPeriod(AccountRecord record, uint64_t epoch_first) {
  record.period = PeriodState{.epoch_first = epoch_first,
                              .opened_at_ms = 1'700'000'000'000 + epoch_first,
                              .opening = record.balances};
  record.period.opening.spent -= 1;
  return record;
}

TEST_F(StoreTest, PeriodSnapshotsAndAccountPeriodsRoundTripThroughTheLogAndTheTables) {
  const AccountRecord account = withPeriod(makeAccount("tenant-1", 1, 3), 472'223);
  const PeriodSnapshot first = makeSnapshot("tenant-1", 472'220, 1);
  const PeriodSnapshot second = makeSnapshot("tenant-1", 472'222, 2);
  const PeriodSnapshot other = makeSnapshot("tenant-2", 472'222, 3);
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(
        store
            ->commit(
                {.accounts = {account}, .ledger_clock_ms = 10, .period_snapshots = {first, second}})
            .isOk());
    StoreContents contents = loadOrDie(store.get());  // from the log
    ASSERT_EQ(contents.accounts.size(), 1u);
    EXPECT_EQ(contents.accounts[0], account);
    EXPECT_EQ(contents.period_snapshots, (std::vector<PeriodSnapshot>{first, second}));
    ASSERT_TRUE(store->checkpoint().isOk());  // folded into tables.db
    // The next batch drops the oldest and adds another account's; it stays in the log.
    ASSERT_TRUE(store
                    ->commit({.ledger_clock_ms = 20,
                              .period_snapshots = {other},
                              .deleted_period_snapshots = {{.key = first.key,
                                                            .epoch_first = first.epoch_first}}})
                    .isOk());
    contents = loadOrDie(store.get());
    EXPECT_EQ(contents.period_snapshots, (std::vector<PeriodSnapshot>{second, other}));
  }
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    const StoreContents contents = loadOrDie(store.get());
    EXPECT_EQ(contents.period_snapshots, (std::vector<PeriodSnapshot>{second, other}));
    ASSERT_EQ(contents.accounts.size(), 1u);
    EXPECT_EQ(contents.accounts[0].period, account.period);
    ASSERT_TRUE(store->checkpoint().isOk());  // the second pass reads it all from tables.db
  }
}

TEST_F(StoreTest, APeriodSnapshotBodyUnderAnotherKeyIsCorruption) {
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(
        store->commit({.ledger_clock_ms = 1, .period_snapshots = {makeSnapshot("tenant-1", 5, 1)}})
            .isOk());
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  execSql(tablesPath(), {"UPDATE period_snapshots SET epoch_first = 6"});
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  Result<StoreContents> loaded = store->load();
  ASSERT_FALSE(loaded.isOk());
  EXPECT_EQ(loaded.status().code(), StatusCode::kCorruption);
  EXPECT_NE(loaded.status().message().find("period_snapshots (tenant-1, /v1/chat, 1, 6)"),
            std::string::npos)
      << loaded.status().toString();
}

TEST_F(StoreTest, DataDirOfSchemaVersion3IsMigrated) {
  Model model;
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->commit(crashBatch(1)).isOk());
    ASSERT_TRUE(store->checkpoint().isOk());           // folded into tables.db
    ASSERT_TRUE(store->commit(crashBatch(2)).isOk());  // and one left in the log
    model.apply(crashBatch(1));
    model.apply(crashBatch(2));
  }
  // Turn the dir back into what the build before accounting periods wrote (its account records
  // had no period fields: they read as zero, which crashBatch's accounts are).
  execSql(tablesPath(),
          {"DROP TABLE period_snapshots", "DROP TABLE operators", "DROP TABLE audit_log",
           "UPDATE meta SET value = 3 WHERE key = 'schema_version'"});
  ASSERT_NO_FATAL_FAILURE(revertToLegacyLog(dataDir(), 3));
  ASSERT_EQ(schemaVersionOf(tablesPath()), 3);
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(schemaVersionOf(tablesPath()), SqliteStore::kSchemaVersion);
    EXPECT_FALSE(std::filesystem::exists(dbPath())) << "the old log stays behind";
    EXPECT_TRUE(std::filesystem::exists(logPath()));
    StoreContents contents = loadOrDie(store.get());
    expectContents(contents, model);
    EXPECT_TRUE(contents.period_snapshots.empty());
    for (const AccountRecord& account : contents.accounts) EXPECT_EQ(account.period, PeriodState{});
    // The new table works.
    ASSERT_TRUE(
        store->commit({.ledger_clock_ms = 30, .period_snapshots = {makeSnapshot("counter", 9, 2)}})
            .isOk());
    ASSERT_TRUE(store->checkpoint().isOk());
  }
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  const StoreContents contents = loadOrDie(store.get());
  EXPECT_EQ(contents.period_snapshots,
            (std::vector<PeriodSnapshot>{makeSnapshot("counter", 9, 2)}));
  model.apply(StoreBatch{.ledger_clock_ms = 30});
  expectContents(contents, model);
}

// Schema version 6 kept the log in DIR/log/ as this build does, with its batches packed: they
// are read, replayed and folded as they are, beside the flat records written after the upgrade.
TEST_F(StoreTest, DataDirOfSchemaVersion6WithPackedBatchesIsMigrated) {
  Model model;
  ASSERT_NO_FATAL_FAILURE(commitCrashBatches(dataDir(), 4, 2, &model));  // 3 and 4 in the log
  ASSERT_NO_FATAL_FAILURE(revertToSchemaVersion6(dataDir()));
  ASSERT_EQ(schemaVersionOf(tablesPath()), 6);
  {
    Result<std::unique_ptr<CommitLog>> log = CommitLog::open(logPath(), 2, true);
    ASSERT_TRUE(log.isOk()) << log.status().toString();
    ASSERT_EQ(log.value()->lastSeq(), 4);
    std::vector<uint8_t> body;
    ASSERT_TRUE(log.value()->read(3, &body).isOk());
    ASSERT_NE(body[0], 0) << "record 3 is packed";
  }
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(schemaVersionOf(tablesPath()), SqliteStore::kSchemaVersion);
    expectContents(loadOrDie(store.get()), model);
    ASSERT_TRUE(store->commit(crashBatch(5)).isOk());  // flat, after the packed ones
    model.apply(crashBatch(5));
    expectContents(loadOrDie(store.get()), model);
  }
  {
    // The packed and the flat records replayed from the log, then folded together.
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    expectContents(loadOrDie(store.get()), model);
    ASSERT_TRUE(store->checkpoint().isOk());
    EXPECT_EQ(store->foldedSeq(), 5);
  }
  auto store = openOrDie(dataDir());
  ASSERT_NE(store, nullptr);
  expectContents(loadOrDie(store.get()), model);
}

// A migration cut short by a crash is finished by the next open: before the new log was renamed
// into place (a staging dir left behind), and after it (ledger.db left behind).
TEST_F(StoreTest, AnInterruptedMigrationIsFinishedOnTheNextOpen) {
  Model model;
  ASSERT_NO_FATAL_FAILURE(commitCrashBatches(dataDir(), 6, 3, &model));
  ASSERT_NO_FATAL_FAILURE(revertToLegacyLog(dataDir(), 5));
  // Crashed while copying: a partial staging log.
  std::filesystem::create_directories(dataDir() + "/log.migrating");
  std::ofstream(dataDir() + "/log.migrating/" + CommitLog::segmentName(4)) << "partial";
  {
    auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
    ASSERT_NE(store, nullptr);
    expectContents(loadOrDie(store.get()), model);
    EXPECT_FALSE(std::filesystem::exists(dataDir() + "/log.migrating"));
    EXPECT_FALSE(std::filesystem::exists(dbPath()));
  }
  // Crashed after the rename, before ledger.db was deleted: the log wins, ledger.db goes.
  const std::string stale = dbPath();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(stale.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_close(db), SQLITE_OK);
  }
  auto store = openOrDie(dataDir(), {.checkpoint_log_rows = 0});
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(std::filesystem::exists(stale));
  expectContents(loadOrDie(store.get()), model);
}

}  // namespace
}  // namespace tally::ledger
