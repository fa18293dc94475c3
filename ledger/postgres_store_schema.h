#pragma once

#include <array>
#include <cstdint>
#include <span>

// The PostgreSQL store's schema and statements (ledger/postgres_store.h). Everything lives in
// the schema `tally` of the database the connection string names:
//
//   tally.meta(key, value)       schema_version, ledger_clock_ms, shard_sequence
//   tally.policies               one row per policy generation
//   tally.accounts               one row per (subject, route, generation), with its available,
//                                reserved and spent units readable beside the body
//   tally.reservations           one row per reservation id, with subject, route and state
//   tally.gateways, tally.shards, tally.fences, tally.period_snapshots
//
// Every `body` is the same packed Cap'n Proto record the SQLite store's tables.db holds
// (ledger/store_codec.h) and is authoritative; the readable columns beside it are copies for
// operators (psql), never read back. Keys are `text COLLATE "C"` (byte order, as std::string).
// Unsigned 64-bit values (generations, fences, epochs) are stored as int8 bit for bit.

namespace tally::ledger::postgres_schema {

inline constexpr int64_t kSchemaVersion = 1;
inline constexpr const char* kMetaSchemaVersion = "schema_version";
inline constexpr const char* kMetaLedgerClockMs = "ledger_clock_ms";
inline constexpr const char* kMetaShardSequence = "shard_sequence";

// Taken (pg_try_advisory_lock, session level) by the one ledger that writes the database: a
// second ledger pointed at it is refused at open. 0x74616c6c79 is "tally".
inline constexpr int64_t kWriterLockKey = 0x74616c6c79;

// The tables of version kSchemaVersion, created in one transaction with the meta rows.
inline constexpr std::array<const char*, 9> kSchema = {
    "CREATE TABLE tally.meta(key text COLLATE \"C\" PRIMARY KEY, value int8 NOT NULL)",
    "CREATE TABLE tally.policies(generation int8 PRIMARY KEY, body bytea NOT NULL)",
    "CREATE TABLE tally.accounts(subject text COLLATE \"C\", route text COLLATE \"C\", "
    "generation int8, available int8, reserved int8, spent int8, body bytea NOT NULL, "
    "PRIMARY KEY(subject, route, generation))",
    "CREATE TABLE tally.reservations(id text COLLATE \"C\" PRIMARY KEY, "
    "subject text COLLATE \"C\" NOT NULL, route text COLLATE \"C\" NOT NULL, state text NOT NULL, "
    "body bytea NOT NULL)",
    "CREATE TABLE tally.gateways(name text COLLATE \"C\" PRIMARY KEY, body bytea NOT NULL)",
    "CREATE TABLE tally.shards(id text COLLATE \"C\" PRIMARY KEY, body bytea NOT NULL)",
    "CREATE TABLE tally.fences(subject text COLLATE \"C\", route text COLLATE \"C\", "
    "fence int8 NOT NULL, PRIMARY KEY(subject, route))",
    "CREATE TABLE tally.period_snapshots(subject text COLLATE \"C\", route text COLLATE \"C\", "
    "generation int8, epoch_first int8, body bytea NOT NULL, "
    "PRIMARY KEY(subject, route, generation, epoch_first))",
    "INSERT INTO tally.meta(key, value) VALUES ('ledger_clock_ms', 0), ('shard_sequence', 0)",
};

// A step from one schema version to the next: its statements run, in order, in the transaction
// that opens the database, and schema_version becomes to_version. Opening a database at an older
// version runs every step from its version on. (Version 1 is the first: none yet.)
struct Migration {
  int64_t from_version = 0;
  std::span<const char* const> statements;
};
inline constexpr std::array<Migration, 0> kMigrations = {};

// Prepared statements (names and SQL). Parameters are binary arrays of the rows one batch
// writes, so a batch costs one statement per table it touches, however many rows it carries.
struct Statement {
  const char* name;
  const char* sql;
};

inline constexpr Statement kUpsertPolicies = {
    "tally_upsert_policies",
    "INSERT INTO tally.policies(generation, body) SELECT * FROM unnest($1::int8[], $2::bytea[]) "
    "ON CONFLICT (generation) DO UPDATE SET body = excluded.body"};
inline constexpr Statement kUpsertAccounts = {
    "tally_upsert_accounts",
    "INSERT INTO tally.accounts(subject, route, generation, available, reserved, spent, body) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], "
    "$6::int8[], $7::bytea[]) "
    "ON CONFLICT (subject, route, generation) DO UPDATE SET available = excluded.available, "
    "reserved = excluded.reserved, spent = excluded.spent, body = excluded.body"};
inline constexpr Statement kDeleteReservations = {
    "tally_delete_reservations", "DELETE FROM tally.reservations WHERE id = ANY($1::text[])"};
inline constexpr Statement kUpsertReservations = {
    "tally_upsert_reservations",
    "INSERT INTO tally.reservations(id, subject, route, state, body) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[]) "
    "ON CONFLICT (id) DO UPDATE SET subject = excluded.subject, route = excluded.route, "
    "state = excluded.state, body = excluded.body"};
inline constexpr Statement kUpsertGateways = {
    "tally_upsert_gateways",
    "INSERT INTO tally.gateways(name, body) SELECT * FROM unnest($1::text[], $2::bytea[]) "
    "ON CONFLICT (name) DO UPDATE SET body = excluded.body"};
inline constexpr Statement kDeleteShards = {"tally_delete_shards",
                                            "DELETE FROM tally.shards WHERE id = ANY($1::text[])"};
inline constexpr Statement kUpsertShards = {
    "tally_upsert_shards",
    "INSERT INTO tally.shards(id, body) SELECT * FROM unnest($1::text[], $2::bytea[]) "
    "ON CONFLICT (id) DO UPDATE SET body = excluded.body"};
inline constexpr Statement kUpsertFences = {
    "tally_upsert_fences",
    "INSERT INTO tally.fences(subject, route, fence) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) "
    "ON CONFLICT (subject, route) DO UPDATE SET fence = excluded.fence"};
inline constexpr Statement kDeletePeriodSnapshots = {
    "tally_delete_period_snapshots",
    "DELETE FROM tally.period_snapshots p USING unnest($1::text[], $2::text[], $3::int8[], "
    "$4::int8[]) AS d(subject, route, generation, epoch_first) WHERE p.subject = d.subject AND "
    "p.route = d.route AND p.generation = d.generation AND p.epoch_first = d.epoch_first"};
inline constexpr Statement kUpsertPeriodSnapshots = {
    "tally_upsert_period_snapshots",
    "INSERT INTO tally.period_snapshots(subject, route, generation, epoch_first, body) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::bytea[]) "
    "ON CONFLICT (subject, route, generation, epoch_first) DO UPDATE SET body = excluded.body"};
// Raises ledger_clock_ms and shard_sequence (never lowers them): $1 and $2.
inline constexpr Statement kRaiseMeta = {
    "tally_raise_meta",
    "UPDATE tally.meta SET value = GREATEST(value, CASE key WHEN 'ledger_clock_ms' THEN $1::int8 "
    "ELSE $2::int8 END) WHERE key IN ('ledger_clock_ms', 'shard_sequence')"};
inline constexpr Statement kBegin = {"tally_begin", "BEGIN"};
inline constexpr Statement kCommit = {"tally_commit", "COMMIT"};

inline constexpr std::array<const Statement*, 13> kStatements = {
    &kUpsertPolicies,
    &kUpsertAccounts,
    &kDeleteReservations,
    &kUpsertReservations,
    &kUpsertGateways,
    &kDeleteShards,
    &kUpsertShards,
    &kUpsertFences,
    &kDeletePeriodSnapshots,
    &kUpsertPeriodSnapshots,
    &kRaiseMeta,
    &kBegin,
    &kCommit,
};

// load(): each in one REPEATABLE READ, READ ONLY transaction.
inline constexpr const char* kSelectMeta = "SELECT key, value FROM tally.meta";
inline constexpr const char* kSelectPolicies = "SELECT generation, body FROM tally.policies";
inline constexpr const char* kSelectAccounts =
    "SELECT subject, route, generation, body FROM tally.accounts";
inline constexpr const char* kSelectReservations =
    "SELECT id, body FROM tally.reservations ORDER BY id";
inline constexpr const char* kSelectGateways = "SELECT name, body FROM tally.gateways";
inline constexpr const char* kSelectShards = "SELECT id, body FROM tally.shards";
inline constexpr const char* kSelectFences = "SELECT subject, route, fence FROM tally.fences";
inline constexpr const char* kSelectPeriodSnapshots =
    "SELECT subject, route, generation, epoch_first, body FROM tally.period_snapshots";

}  // namespace tally::ledger::postgres_schema
