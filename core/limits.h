#pragma once

#include <cstdint>

// Every queue, map, frame and identifier has a named maximum, here and nowhere else.

namespace tally::limits {

inline constexpr uint64_t kReservationIdBytesMax = 128;
inline constexpr uint64_t kOperationIdBytesMax = 128;
inline constexpr uint64_t kSubjectBytesMax = 256;
inline constexpr uint64_t kRouteBytesMax = 256;
inline constexpr uint64_t kRegionBytesMax = 64;
inline constexpr uint64_t kUnitNameBytesMax = 64;

// Units in any one request: reserved, actual, reported actual, shard size.
inline constexpr uint64_t kUnitsPerRequestMax = uint64_t{1} << 40;

// Policy values: bounded so that no sequence of operations over centuries overflows 64 bits
// (docs/LEDGER.md "Bounds" has the arithmetic). Refill is what accumulates: at the maximum,
// minted reaches kBalanceUnitsMax / 2 after 2^35 s (~1,089 years).
inline constexpr uint64_t kBurstUnitsMax = kUnitsPerRequestMax;  // also max_single, max_overdraft
inline constexpr uint64_t kRefillPerSecondMax = uint64_t{1} << 26;
// Every balance of an account. Account refuses (kOverflow) an operation whose result would
// exceed it, and a restore refuses a stored record above it, so the two always agree; bounded
// inputs reach it only after centuries.
inline constexpr uint64_t kBalanceUnitsMax = uint64_t{1} << 62;
inline constexpr uint64_t kHoldTtlMsMax = 7ull * 24 * 3600 * 1000;
inline constexpr uint64_t kHardExecutionLimitMsMax = 30ull * 24 * 3600 * 1000;
inline constexpr uint64_t kBudgetsPerPolicyMax = 100'000;

// Ledger tables. Inserting past these is refused with a typed error, never an abort.
inline constexpr uint64_t kReservationsMax = 50'000'000;
inline constexpr uint64_t kAccountsMax = 10'000'000;
inline constexpr uint64_t kGenerationsMax = 1'000'000;

// Emergency shards (docs/SHARDS.md): the ledger's registry.
inline constexpr uint64_t kShardRequestIdBytesMax = 128;
inline constexpr uint64_t kGatewaysMax = 10'000;
// Key rotation (`tallyctl gateway rotate --overlap-ms`): how long the replaced key stays
// admitted at most (a week), and by default (an hour).
inline constexpr uint64_t kGatewayKeyOverlapMsMax = 7ull * 24 * 3'600'000;
inline constexpr uint64_t kGatewayKeyOverlapMsDefault = 3'600'000;
// Shards kept at once (RECONCILED ones are compacted after retention): every one fits one
// reply (wire kShardsPerReplyMax).
inline constexpr uint64_t kShardsMax = 100'000;
inline constexpr uint64_t kShardsPerGatewayAccountMax = 4;  // live (ISSUED, REVOKED) shards

// Wire.
inline constexpr uint64_t kFrameBytesMaxDefault = 1 << 20;
inline constexpr uint64_t kRequestsInFlightPerConnectionMax = 4096;
// Bytes a server may owe one peer (replies promised, buffered and queued) before it stops
// reading and serving that peer until it drains (net/framed_stream.h).
inline constexpr uint64_t kWriteQueueBytesPerConnectionMax = uint64_t{16} << 20;
inline constexpr uint64_t kConnectionsPerServerMax = 4096;
// How long a stream shut down after its last reply waits for the peer to read everything and
// close its side before it closes anyway (the lingering close of net/framed_stream.h).
inline constexpr uint64_t kLingerMsDefault = 5'000;

// Emergency shards (SPEC §6): identities and reports.
inline constexpr uint64_t kGatewayNameBytesMax = 128;  // [A-Za-z0-9._-], at least one byte
inline constexpr uint64_t kShardReceiptsPerReportMax = 100'000;

// Operators and the audit log (docs/security.md "Operators", "Audit log").
inline constexpr uint64_t kOperatorNameBytesMax = 64;  // [A-Za-z0-9._-], at least one byte
inline constexpr uint64_t kOperatorsMax = 1'000;
// Entries of the audit log kept, newest first; older ones are dropped (a few hundred bytes each:
// at most ~50 MiB of store and memory however long the ledger runs).
inline constexpr uint64_t kAuditLogEntriesKept = 100'000;
inline constexpr uint64_t kAuditLogEntriesPerReplyMax = 1'000;
inline constexpr uint64_t kAuditLogTextBytesMax = 1'024;  // each text field of an entry
// What one page of the audit log holds at most (its texts, estimated): well inside a frame.
inline constexpr uint64_t kAuditLogReplyBytesMax = 256 << 10;

// Retention of terminal reservations before compaction: the idempotency window
// (docs/LEDGER.md "Retention" derives it: the longest hold TTL a client retries a reserve
// within, plus the agent's retry horizon for a settle or an operation receipt, with margin).
inline constexpr uint64_t kRetentionMsDefault = 15ull * 60 * 1000;
// Retention of emergency shards, separate from the receipts' window: the ledger keeps a
// RECONCILED shard this long after its expiry (so an agent that did not hear its report accepted
// gets the answer again on retry, not "no record"), and the agent keeps a final shard and its
// reservations this long after the ledger's final answer (retried ids answered locally).
// docs/LEDGER.md "Retention", docs/SHARDS.md "Compaction".
inline constexpr uint64_t kShardRetentionMsDefault = 24ull * 3600 * 1000;
// Memory the ledger's packed receipts of that window may take (core/receipt_archive.h; ~150
// bytes each at the benchmark's ids, index included): receipts = rate x window, so 4 GiB holds a
// 15-minute window up to ~30,000 reservations/s. Past it new reservations are RESOURCE_EXHAUSTED.
inline constexpr uint64_t kReceiptBytesMaxDefault = uint64_t{4} << 30;

// Accounting-period snapshots kept per account, in memory and in the store (the oldest is
// deleted when a close adds one past it): a day of hourly periods, 24 days of daily ones.
// About 130 bytes each packed in the store, about 300 in memory.
inline constexpr uint64_t kPeriodSnapshotsKept = 24;

// Fair scheduling in the agent (core/fair_scheduler.h).
// Starts waiting for an execution slot (beyond: a retryable UNAVAILABLE), RESERVED reservations
// remembered for their start, scheduled routes, and the fairness window (admissions).
inline constexpr uint64_t kFairWaitingMax = 65'536;
inline constexpr uint64_t kFairReservationsMax = 100'000;
inline constexpr uint64_t kFairRoutesMax = 1'000;
inline constexpr uint64_t kFairnessWindowAdmissionsDefault = 1'000;
inline constexpr uint64_t kFairnessWindowAdmissionsMax = 1'000'000;

// A partitioned agent's records of which partition each reservation was reserved on
// (agent/reservation_partitions.h, docs/scale-out.md "Partitioned subjects"): kept at most (the
// oldest are dropped, checked every kReservationPartitionsTrimEvery records). A record is
// forgotten at the reservation's final answer; those never followed up (a reservation left to
// expire, a settle answered QUEUED) would otherwise stay. Dropping one is safe: its follow-up is
// asked of every partition (decideUnrecorded, core/agent_fleet.h). About 60 bytes each on disk.
inline constexpr uint64_t kReservationPartitionsMax = 1'000'000;
inline constexpr uint64_t kReservationPartitionsTrimEvery = 1'024;

// The agent's HTTP/JSON listener (agent/http_server.h): per request, the request line and
// headers, and the body; per connection, requests parsed and not yet answered, and answer bytes
// queued unsent, before it stops reading that connection; the header and idle timeouts. Its
// lingering close waits kLingerMsDefault, like every framed stream.
inline constexpr uint64_t kHttpHeaderBytesMax = 8 << 10;
inline constexpr uint64_t kHttpBodyBytesMax = 64 << 10;
inline constexpr uint64_t kHttpRequestsInFlightPerConnectionMax = 64;
inline constexpr uint64_t kHttpWriteQueueBytesPerConnectionMax = 1 << 20;
inline constexpr uint64_t kHttpHeaderTimeoutMsDefault = 10'000;
inline constexpr uint64_t kHttpIdleTimeoutMsDefault = 60'000;

}  // namespace tally::limits
