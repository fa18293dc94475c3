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
//   tally.lease                  one row (id = 1): the writer's lease and its epoch (version 2)
//   tally.operators              enrolled operators (version 3)
//   tally.audit_log              privileged actions, one row per sequence, with when, who, what
//                                and how it ended readable beside the body (version 3)
//
// Every `body` is the same packed Cap'n Proto record the SQLite store's tables.db holds
// (ledger/store_codec.h) and is authoritative; the readable columns beside it are copies for
// operators (psql), never read back. Keys are `text COLLATE "C"` (byte order, as std::string).
// Unsigned 64-bit values (generations, fences, epochs) are stored as int8 bit for bit.

namespace tally::ledger::postgres_schema {

inline constexpr int64_t kSchemaVersion = 3;
inline constexpr const char* kMetaSchemaVersion = "schema_version";
inline constexpr const char* kMetaLedgerClockMs = "ledger_clock_ms";
inline constexpr const char* kMetaShardSequence = "shard_sequence";

// The lease (version 2): one row naming the ledger that may write, the epoch it took it at
// (only ever grows: every acquisition adds one), where it serves, its PostgreSQL backend pid (a
// holder whose session is gone may be replaced at once) and when its lease lapses (server clock).
inline constexpr const char* kCreateLease =
    "CREATE TABLE tally.lease(id int4 PRIMARY KEY CHECK (id = 1), epoch int8 NOT NULL, "
    "holder text NOT NULL, address text NOT NULL, backend_pid int4 NOT NULL, "
    "expires_at timestamptz NOT NULL)";
inline constexpr const char* kInsertLease =
    "INSERT INTO tally.lease VALUES (1, 0, '', '', 0, '-infinity')";

// Operators and the audit log (version 3).
inline constexpr const char* kCreateOperators =
    "CREATE TABLE tally.operators(name text COLLATE \"C\" PRIMARY KEY, body bytea NOT NULL)";
inline constexpr const char* kCreateAuditLog =
    "CREATE TABLE tally.audit_log(seq int8 PRIMARY KEY, at_ms int8 NOT NULL, actor text NOT NULL, "
    "action text NOT NULL, outcome text NOT NULL, body bytea NOT NULL)";

// The tables of version kSchemaVersion, created in one transaction with the meta rows.
inline constexpr std::array<const char*, 13> kSchema = {
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
    kCreateLease,
    kInsertLease,
    kCreateOperators,
    kCreateAuditLog,
};

// A step from one schema version to the next: its statements run, in order, in the transaction
// that opens the database, and schema_version becomes to_version. Opening a database at an older
// version runs every step from its version on.
struct Migration {
  int64_t from_version = 0;
  std::span<const char* const> statements;
};
inline constexpr std::array<const char*, 2> kMigrationTo2 = {kCreateLease, kInsertLease};
inline constexpr std::array<const char*, 2> kMigrationTo3 = {kCreateOperators, kCreateAuditLog};
inline constexpr std::array<Migration, 2> kMigrations = {Migration{1, kMigrationTo2},
                                                         Migration{2, kMigrationTo3}};

// The lease. $1 holder, $2 address, $3 lease_ms: takes it when it has lapsed or its holder's
// session is gone, with the next epoch; no row when another ledger holds it.
inline constexpr const char* kAcquireLease =
    "UPDATE tally.lease l SET epoch = l.epoch + 1, holder = $1::text, address = $2::text, "
    "backend_pid = pg_backend_pid(), "
    "expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond' "
    "WHERE l.id = 1 AND (l.expires_at < clock_timestamp() OR NOT EXISTS "
    "(SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend_pid)) RETURNING l.epoch";
// At a clean close: $1 epoch, $2 holder.
inline constexpr const char* kReleaseLease =
    "UPDATE tally.lease SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1::int8 AND "
    "holder = $2::text";
inline constexpr const char* kSelectLease =
    "SELECT epoch, holder, address, "
    "(GREATEST(0, extract(epoch FROM expires_at - clock_timestamp()) * 1000))::int8 "
    "FROM tally.lease WHERE id = 1";

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
inline constexpr Statement kUpsertOperators = {
    "tally_upsert_operators",
    "INSERT INTO tally.operators(name, body) SELECT * FROM unnest($1::text[], $2::bytea[]) "
    "ON CONFLICT (name) DO UPDATE SET body = excluded.body"};
inline constexpr Statement kDeleteAuditLogBelow = {
    "tally_delete_audit_log_below", "DELETE FROM tally.audit_log WHERE seq < $1::int8"};
inline constexpr Statement kInsertAuditLog = {
    "tally_insert_audit_log",
    "INSERT INTO tally.audit_log(seq, at_ms, actor, action, outcome, body) "
    "SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::text[], "
    "$6::bytea[]) ON CONFLICT (seq) DO UPDATE SET body = excluded.body"};
// Raises ledger_clock_ms and shard_sequence (never lowers them): $1 and $2.
inline constexpr Statement kRaiseMeta = {
    "tally_raise_meta",
    "UPDATE tally.meta SET value = GREATEST(value, CASE key WHEN 'ledger_clock_ms' THEN $1::int8 "
    "ELSE $2::int8 END) WHERE key IN ('ledger_clock_ms', 'shard_sequence')"};
// The fence, first in every commit's transaction: renews the lease of $1 epoch, $2 holder for $3
// ms, and fails the transaction (an error, so the rest of the pipeline and COMMIT are skipped)
// unless it still holds it. The row lock it takes orders the commit before any takeover.
inline constexpr Statement kFence = {
    "tally_fence",
    "WITH renewed AS (UPDATE tally.lease SET expires_at = clock_timestamp() + "
    "$3::int8 * interval '1 millisecond' WHERE id = 1 AND epoch = $1::int8 AND holder = $2::text "
    "RETURNING 1) SELECT (CASE count(*) WHEN 1 THEN '1' ELSE 'tally: lease lost' END)::int4 "
    "FROM renewed"};
// The same renewal outside a commit (an idle primary): a row while it still holds the lease.
inline constexpr Statement kRenewLease = {
    "tally_renew_lease",
    "UPDATE tally.lease SET expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond' "
    "WHERE id = 1 AND epoch = $1::int8 AND holder = $2::text RETURNING epoch"};
inline constexpr Statement kBegin = {"tally_begin", "BEGIN"};
inline constexpr Statement kCommit = {"tally_commit", "COMMIT"};

inline constexpr std::array<const Statement*, 17> kStatements = {
    &kUpsertOperators,
    &kDeleteAuditLogBelow,
    &kInsertAuditLog,
    &kFence,
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
inline constexpr const char* kSelectOperators = "SELECT name, body FROM tally.operators";
inline constexpr const char* kSelectAuditLog = "SELECT seq, body FROM tally.audit_log ORDER BY seq";
inline constexpr const char* kSelectPeriodSnapshots =
    "SELECT subject, route, generation, epoch_first, body FROM tally.period_snapshots";

}  // namespace tally::ledger::postgres_schema
