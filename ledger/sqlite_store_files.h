#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/sqlite_connection.h"
#include "common/sqlite_support.h"
#include "core/status.h"
#include "ledger/store.h"
#include "ledger/store_codec.h"

// What the store's two files hold, below SqliteStore (ledger/sqlite_store.h): their schemas and
// statements, folding decoded log rows into latest images, writing those images into tables.db
// and reading everything back. No threads and no policy here: the callers own the connections,
// the transactions and the order of events.
//
//   DIR/log/       the commit log (ledger/commit_log.h): one StoreBatchV1 per record
//   DIR/tables.db  meta(schema_version, folded_seq,      policies, accounts, reservations,
//                       ledger_clock_ms, shard_sequence) gateways, shards, fences,
//                                                        period_snapshots, operators,
//                                                        audit_log: the latest image
//                                                        of each row, folded from log
//
// Invariant across the two: the log holds every record with seq > folded_seq, in one contiguous
// run. Schema versions 5 and older kept the log in DIR/ledger.db, meta(schema_version,
// trimmed_seq) and log(seq, body), with trimmed_seq <= folded_seq; SqliteStore migrates it.

namespace tally::ledger::store_files {

inline constexpr int64_t kSchemaVersion = 7;
// The versions this build migrates from, oldest first, each by its Migration's statements:
// 2 lacked the shard tables (gateways, shards, fences) and meta.shard_sequence; 3 lacked
// period_snapshots (accounting-period close); 4 lacked operators and audit_log; 5 kept the commit
// log in ledger.db (SqliteStore moves it to DIR/log/; tables.db is unchanged); 6 wrote the log's
// batches packed (read as they are; tables.db is unchanged). Opening an older file runs every
// step from its version on, in one transaction, and bumps schema_version.
inline constexpr int64_t kOldestMigratedSchemaVersion = 2;
struct Migration {
  int64_t from_version = 0;
  std::span<const char* const> statements;
};
inline constexpr const char* kMetaSchemaVersion = "schema_version";
inline constexpr const char* kMetaTrimmedSeq = "trimmed_seq";  // ledger.db: log rows <= it gone
inline constexpr const char* kMetaFoldedSeq = "folded_seq";    // tables.db: log rows <= it in
inline constexpr const char* kMetaLedgerClockMs = "ledger_clock_ms";  // tables.db
inline constexpr const char* kMetaShardSequence = "shard_sequence";   // tables.db

// --- ledger.db ----------------------------------------------------------------------------------

inline constexpr std::array<const char*, 2> kLogSchema = {
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)",
    "CREATE TABLE log(seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
};

// The statements migrateLegacyLog() runs on a schema-5-or-older ledger.db.
enum LogStatement : size_t {
  kLogSelectAfter,
  kLogGetMeta,
  kLogStatementCount,
};

inline constexpr std::array<const char*, kLogStatementCount> kLogStatementSql = {
    "SELECT seq, body FROM log WHERE seq > ?1 ORDER BY seq",
    "SELECT value FROM meta WHERE key = ?1",
};

// --- tables.db ----------------------------------------------------------------------------------

// What version 3 added to tables.db: also the migration from version 2.
inline constexpr std::array<const char*, 3> kTablesShardSchema = {
    "CREATE TABLE gateways(name TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE shards(id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE fences(subject TEXT, route TEXT, fence INTEGER NOT NULL, "
    "PRIMARY KEY(subject, route)) WITHOUT ROWID",
};
// What version 4 added to tables.db: also the migration from version 3.
inline constexpr std::array<const char*, 1> kTablesPeriodSchema = {
    "CREATE TABLE period_snapshots(subject TEXT, route TEXT, generation INTEGER, "
    "epoch_first INTEGER, body BLOB NOT NULL, "
    "PRIMARY KEY(subject, route, generation, epoch_first)) WITHOUT ROWID",
};
// What version 5 added to tables.db: also the migration from version 4.
inline constexpr std::array<const char*, 2> kTablesOperatorSchema = {
    "CREATE TABLE operators(name TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE audit_log(seq INTEGER PRIMARY KEY, body BLOB NOT NULL)",
};
inline constexpr std::array<Migration, 5> kTablesMigrations = {
    Migration{.from_version = 2, .statements = kTablesShardSchema},
    Migration{.from_version = 3, .statements = kTablesPeriodSchema},
    Migration{.from_version = 4, .statements = kTablesOperatorSchema},
    Migration{.from_version = 5},
    Migration{.from_version = 6},
};
// ledger.db's log (versions 5 and older, read once to migrate it) is the same table in every
// version: only schema_version moves.
inline constexpr std::array<Migration, 4> kLogMigrations = {
    Migration{.from_version = 2},
    Migration{.from_version = 3},
    Migration{.from_version = 4},
    Migration{.from_version = 5},
};
inline constexpr std::array<const char*, 10> kTablesSchema = {
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER)",
    "CREATE TABLE policies(generation INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE TABLE accounts(subject TEXT, route TEXT, generation INTEGER, body BLOB NOT NULL, "
    "PRIMARY KEY(subject, route, generation)) WITHOUT ROWID",
    "CREATE TABLE reservations(id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID",
    kTablesShardSchema[0],
    kTablesShardSchema[1],
    kTablesShardSchema[2],
    kTablesPeriodSchema[0],
    kTablesOperatorSchema[0],
    kTablesOperatorSchema[1],
};

enum TablesStatement : size_t {
  kTablesBegin,
  kTablesBeginRead,
  kTablesCommit,
  kTablesUpsertPolicy,
  kTablesUpsertAccount,
  kTablesUpsertReservation,
  kTablesDeleteReservation,
  kTablesSetMetaMax,
  kTablesGetMeta,
  kTablesSelectPolicies,
  kTablesSelectAccounts,
  kTablesSelectReservations,
  kTablesUpsertGateway,
  kTablesUpsertShard,
  kTablesUpsertFence,
  kTablesSelectGateways,
  kTablesSelectShards,
  kTablesSelectFences,
  kTablesDeleteShard,
  kTablesUpsertPeriodSnapshot,
  kTablesDeletePeriodSnapshot,
  kTablesSelectPeriodSnapshots,
  kTablesCountReservations,
  kTablesUpsertOperator,
  kTablesSelectOperators,
  kTablesInsertAuditLog,
  kTablesDeleteAuditLogBelow,
  kTablesSelectAuditLog,
  kTablesStatementCount,
};

inline constexpr std::array<const char*, kTablesStatementCount> kTablesStatementSql = {
    "BEGIN IMMEDIATE",
    "BEGIN DEFERRED",
    "COMMIT",
    "INSERT OR REPLACE INTO policies(generation, body) VALUES(?1, ?2)",
    "INSERT OR REPLACE INTO accounts(subject, route, generation, body) VALUES(?1, ?2, ?3, ?4)",
    "INSERT OR REPLACE INTO reservations(id, body) VALUES(?1, ?2)",
    "DELETE FROM reservations WHERE id = ?1",
    "INSERT INTO meta(key, value) VALUES(?1, ?2) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
    "SELECT value FROM meta WHERE key = ?1",
    "SELECT generation, body FROM policies ORDER BY generation",
    "SELECT subject, route, generation, body FROM accounts ORDER BY subject, route, generation",
    "SELECT id, body FROM reservations ORDER BY id",
    "INSERT OR REPLACE INTO gateways(name, body) VALUES(?1, ?2)",
    "INSERT OR REPLACE INTO shards(id, body) VALUES(?1, ?2)",
    "INSERT OR REPLACE INTO fences(subject, route, fence) VALUES(?1, ?2, ?3)",
    "SELECT name, body FROM gateways ORDER BY name",
    "SELECT id, body FROM shards ORDER BY id",
    "SELECT subject, route, fence FROM fences ORDER BY subject, route",
    "DELETE FROM shards WHERE id = ?1",
    "INSERT OR REPLACE INTO period_snapshots(subject, route, generation, epoch_first, body) "
    "VALUES(?1, ?2, ?3, ?4, ?5)",
    "DELETE FROM period_snapshots WHERE subject = ?1 AND route = ?2 AND generation = ?3 AND "
    "epoch_first = ?4",
    "SELECT subject, route, generation, epoch_first, body FROM period_snapshots "
    "ORDER BY subject, route, generation, epoch_first",
    "SELECT count(*) FROM reservations",
    "INSERT OR REPLACE INTO operators(name, body) VALUES(?1, ?2)",
    "SELECT name, body FROM operators ORDER BY name",
    "INSERT OR REPLACE INTO audit_log(seq, body) VALUES(?1, ?2)",
    "DELETE FROM audit_log WHERE seq < ?1",
    "SELECT seq, body FROM audit_log ORDER BY seq",
};

// --- Folding ------------------------------------------------------------------------------------

// load()'s replay of the log after folded_seq: the latest image of every row a run of log
// batches touched, every batch fully decoded (the read-back check of all of them). A reservation
// mapped to nullopt was deleted. (The fold thread uses BatchFolder instead, which decodes only
// the latest images.)
struct LogFold {
  std::map<Generation, PolicyRecord> policies;
  std::map<AccountKey, AccountRecord> accounts;
  std::unordered_map<std::string, std::optional<Reservation>> reservations;
  std::map<std::string, GatewayRecord> gateways;
  std::map<std::string, std::optional<ShardRecord>> shards;  // nullopt: deleted
  std::map<SubjectRoute, FenceRecord> fences;
  std::map<PeriodKey, std::optional<PeriodSnapshot>> period_snapshots;  // nullopt: deleted
  std::map<std::string, OperatorRecord> operators;
  std::map<uint64_t, AuditLogEntry> audit_log;
  uint64_t audit_log_kept_from = 0;  // entries below it dropped
  uint64_t ledger_clock_ms = 0;
  uint64_t shard_sequence = 0;
  int64_t first_seq = 0;  // 0 while empty
  int64_t last_seq = 0;
  uint64_t rows = 0;

  void apply(StoreBatch&& batch);
};

// Decodes the body of log row `seq` (the read-back check of the record) and folds it into
// `fold`. kCorruption, naming the seq, for a damaged body or a gap in the run of seqs.
Status foldLogRow(int64_t seq, std::span<const uint8_t> body, uint64_t bytes_max, LogFold* fold);

// --- Meta, in either file -----------------------------------------------------------------------

// `get` and `set_max` are that file's GetMeta and SetMetaMax statements.
Status readMeta(sqlite3* db, sqlite3_stmt* get, const char* key, std::optional<int64_t>* value);
Status setMetaMax(sqlite3* db, sqlite3_stmt* set_max, const char* key, int64_t value);
// Meta `key` of the file at `path` (0 when absent): a counter, so a negative one is kCorruption
// naming it.
Status readCounter(sqlite3* db, sqlite3_stmt* get, const std::string& path, const char* key,
                   int64_t* value);
// readCounter of tables.db's folded_seq, with tables.db's GetMeta statement.
Status readFoldedSeq(sqlite3* db, sqlite3_stmt* get, const std::string& path, int64_t* folded_seq);

// Creates `schema` and schema_version in a new file, or checks an existing file: it must hold
// `marker_table` and schema_version kSchemaVersion (kFailedPrecondition otherwise, naming the
// version found). A file at an older version that `migrations` covers is migrated in the same
// transaction: the statements of every step from its version on run, in order, and
// schema_version becomes kSchemaVersion.
Status createOrCheckSchema(const sqlite::Connection& connection,
                           std::span<const char* const> schema, const char* marker_table,
                           std::span<const Migration> migrations);

// --- tables.db ----------------------------------------------------------------------------------

// Writes `net`, the net effect of the log rows up to `last_seq` after tables.db's folded_seq
// (deletions and upserts disjoint, see BatchFolder), into tables.db's tables and raises
// folded_seq to last_seq and ledger_clock_ms, inside the caller's transaction on `tables`.
// Writes `net`'s reservations and deletions in id order (sorting its deletions), so that
// consecutive writes share B-tree pages.
Status writeFold(const sqlite::Connection& tables, StoreBatch* net, int64_t last_seq);

// tables.db's contents, read inside the caller's read transaction.
struct TablesImage {
  std::map<Generation, PolicyRecord> policies;
  std::map<AccountKey, AccountRecord> accounts;
  std::vector<Reservation> reservations;  // ascending id
  std::map<std::string, GatewayRecord> gateways;
  std::map<std::string, ShardRecord> shards;
  std::map<SubjectRoute, FenceRecord> fences;
  std::map<PeriodKey, PeriodSnapshot> period_snapshots;
  std::map<std::string, OperatorRecord> operators;
  std::map<uint64_t, AuditLogEntry> audit_log;
  uint64_t ledger_clock_ms = 0;
  uint64_t shard_sequence = 0;
  int64_t folded_seq = 0;
};
Status readTables(const sqlite::Connection& tables, uint64_t bytes_max, TablesImage* image);

// The tables' contents with the log's later images applied over them.
StoreContents mergeContents(TablesImage image, LogFold fold);

}  // namespace tally::ledger::store_files
