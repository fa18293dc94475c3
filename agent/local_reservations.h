#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include "core/ledger_types.h"
#include "core/reservation.h"

// Reservations the agent admitted on its own, without the ledger's word: rollout mode `off`
// (origin "off") and shadow-mode would-be rejections (origin "shadow"). They never touch a
// ledger account; the table only keeps their lifecycle consistent (start CAS, exactly-once
// settle/release, same receipt for a duplicate) so that gateways see the same protocol in
// every mode.
//
// Pure and bounded: at entries_max, the terminal reservation that became terminal first is
// evicted; if none is terminal, admission answers kResourceExhausted. Time is an argument.
// Not thread-safe: owned by the agent service on the loop thread.

namespace tally::agent {

inline constexpr const char* kOriginOff = "off";
inline constexpr const char* kOriginShadow = "shadow";

struct LocalReservationsOptions {
  uint64_t entries_max = 100'000;
};

class LocalReservations {
 public:
  explicit LocalReservations(LocalReservationsOptions options = {});

  // A new local RESERVED receipt; the same id and digest again is a duplicate, a different
  // digest kIdempotencyConflict.
  ReservationReply admit(const ReserveRequest& request, const std::string& origin, uint64_t now_ms);

  bool contains(const std::string& reservation_id) const;
  ReservationReply start(const StartRequest& request, uint64_t now_ms);
  ReservationReply settle(const SettleRequest& request, uint64_t now_ms);
  ReservationReply release(const ReleaseRequest& request, uint64_t now_ms);
  ReservationReply markUnknown(const MarkUnknownRequest& request, uint64_t now_ms);
  ReservationReply reportOperation(const ReportOperationRequest& request, uint64_t now_ms);
  ReservationReply query(const QueryRequest& request) const;

  size_t size() const { return entries_.size(); }

 private:
  Reservation* find(const std::string& id);
  // Settles a STARTED / USAGE_UNKNOWN reservation with `actual_units`.
  ReservationReply finish(Reservation* r, const std::string& operation_id, Units actual_units,
                          uint64_t now_ms);
  void becameTerminal(const std::string& id);
  bool makeRoom();

  LocalReservationsOptions options_;
  std::unordered_map<std::string, Reservation> entries_;
  std::deque<std::string> terminal_order_;  // eviction candidates, oldest first
};

}  // namespace tally::agent
