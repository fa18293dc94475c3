#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/ledger_types.h"
#include "core/reservation.h"

// Reservations the agent admitted on its own, without the ledger's word: rollout mode `off`
// (origin "off") and shadow-mode would-be rejections (origin "shadow"). Nothing holds their
// units (no account, no shard); the one reservation lifecycle (core/reservation_lifecycle.h)
// keeps them consistent (start-vs-expiry CAS, exactly-once settle/release, the same receipt for
// a duplicate, IDEMPOTENCY_CONFLICT for a different request under a known id) so that gateways
// see the same protocol in every mode.
//
// Pure and bounded: a RESERVED reservation expires hold_ttl_ms after admission, and a
// USAGE_UNKNOWN one is closed as fully consumed hard_execution_limit_ms after it started, as the
// Ledger does (both in tick()); a STARTED one stays until its receipt or mark-unknown (SPEC §5).
// At entries_max, the reservation that became terminal first is evicted; if none is terminal,
// admission answers kResourceExhausted. Time is an argument. Not thread-safe: owned by the
// agent on its loop thread.

namespace tally {

inline constexpr const char* kOriginOff = "off";
inline constexpr const char* kOriginShadow = "shadow";

struct LocalBookOptions {
  uint64_t entries_max = 100'000;
  uint64_t hold_ttl_ms = 30'000;  // as ShardBookOptions::hold_ttl_ms
  // USAGE_UNKNOWN closes as fully consumed at startedAt + this (1..kHardExecutionLimitMsMax).
  // A budget's hard_execution_limit_ms is a required policy key with no default; 10 min is the
  // value of examples/policy.toml and SPEC's bound for UNKNOWN to converge (p99 within 10 min).
  uint64_t hard_execution_limit_ms = 600'000;
};

class LocalBook {
 public:
  explicit LocalBook(LocalBookOptions options = {});
  LocalBook(const LocalBook&) = delete;
  LocalBook& operator=(const LocalBook&) = delete;

  // A new local RESERVED receipt; the same request again is a duplicate, a different one under
  // the same id kIdempotencyConflict.
  ReservationReply admit(const ReserveRequest& request, const std::string& origin, uint64_t now_ms);

  bool contains(const std::string& reservation_id) const;
  ReservationReply start(const StartRequest& request, uint64_t now_ms);
  ReservationReply settle(const SettleRequest& request, uint64_t now_ms);
  ReservationReply release(const ReleaseRequest& request, uint64_t now_ms);
  ReservationReply markUnknown(const MarkUnknownRequest& request, uint64_t now_ms);
  ReservationReply reportOperation(const ReportOperationRequest& request, uint64_t now_ms);
  ReservationReply query(const QueryRequest& request) const;
  // Streaming top-up (lifecycle::extend): nothing holds a local reservation's units, so a
  // STARTED one always grows to the total asked (up to kUnitsPerRequestMax); the same state,
  // operation and duplicate rules as the Ledger's.
  ReservationReply extend(const ExtendRequest& request, uint64_t now_ms);

  // Expires RESERVED reservations at expiresAt and closes USAGE_UNKNOWN ones at startedAt +
  // hard_execution_limit_ms as fully consumed (lifecycle::closeByHardLimit: a later, larger
  // receipt is charged once, as in the Ledger). Both become eviction candidates. Returns how many
  // reservations it closed.
  uint64_t tick(uint64_t now_ms);

  size_t size() const { return entries_.size(); }

 private:
  // The CapacityHolder of a local reservation: no units, only the expiry index and the
  // eviction order. Defined in local_book.cc.
  class NoHolder;

  Reservation* find(const std::string& reservation_id);
  uint64_t hardLimitAt(const Reservation& reservation) const;
  bool makeRoom();

  LocalBookOptions options_;
  std::unordered_map<std::string, Reservation> entries_;
  std::set<std::pair<uint64_t, std::string>> expiry_;  // RESERVED ones by expiresAt
  // USAGE_UNKNOWN ones by startedAt + hard_execution_limit_ms
  std::set<std::pair<uint64_t, std::string>> hard_limit_;
  std::deque<std::string> terminal_order_;  // eviction candidates, oldest first
};

}  // namespace tally
