#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "agent/gateway_server.h"
#include "agent/reservation_partitions.h"
#include "common/log.h"
#include "core/limits.h"
#include "wire/codec.h"

// A partitioned tally-agent's front door (docs/scale-out.md "Partitioned subjects"): every
// gateway request, from the Unix socket and the HTTP API alike, comes here and goes to the
// AgentService of one partition, or of each. Each partition's service has its own ledger link,
// outbox, boot epoch and emergency shards, so a partition whose ledger is down is served from
// its shards while the others keep forwarding.
//
// The decisions are core's: agentPartitionRoute (core/agent_partitions.h) says where a request
// goes; for a fleet-wide one fleetRequestOf / mergeFleetAnswers (core/agent_fleet.h) say whether
// and how the answers are merged; for a follow-up without a record decideUnrecorded picks the
// partition from every partition's query answer; partitionRecordDone says when a record is
// forgotten. This class carries them out:
//  * a reserve: its partition is recorded durably (fsync'd, ReservationPartitions) BEFORE the
//    reserve is handed to that partition's service; a failed write answers kUnavailable ("retry
//    with the same id") and sends nothing;
//  * an answer that shows the reservation final forgets its record; the records are bounded
//    (options.records_max, the oldest dropped: their follow-ups are then asked of every
//    partition);
//  * a follow-up without a record: a query with its id to every partition; the one that holds
//    it is recorded and gets the follow-up.
// With one partition every request goes to services[0] unchanged and nothing is recorded: an
// unpartitioned agent behaves exactly as before.
//
// Borrows what the services' handlers reach, the records (null with one partition) and the logger,
// which must outlive it. Single-threaded (the loop thread).

namespace tally::agent {

struct PartitionRouterOptions {
  // Records kept at most, the oldest dropped every `trim_every` reserves (core/limits.h).
  uint64_t records_max = limits::kReservationPartitionsMax;
  uint64_t trim_every = limits::kReservationPartitionsTrimEvery;
};

class PartitionRouter {
 public:
  // services[i] hands a request to partition i's AgentService; at least one. `records` is
  // required with more than one.
  PartitionRouter(std::vector<RequestHandler> services, ReservationPartitions* records,
                  Logger* logger, PartitionRouterOptions options = {});
  PartitionRouter(const PartitionRouter&) = delete;
  PartitionRouter& operator=(const PartitionRouter&) = delete;

  // The gateway servers' RequestHandler.
  void handle(wire::RequestBody&& body, Respond respond, Alive alive);

  uint32_t partitions() const { return static_cast<uint32_t>(services_.size()); }

 private:
  void toPartition(uint32_t partition, wire::RequestBody&& body, Respond respond, Alive alive);
  // Every partition; `merged` gets answers[i] from partition i once all have answered.
  void toEvery(const wire::RequestBody& body, const Alive& alive,
               std::function<void(std::vector<LedgerReply> answers)> merged);
  void unrecorded(wire::RequestBody&& body, Respond respond, Alive alive);
  // Durably, before the reserve is handed over; every trim_every records, the oldest dropped.
  Status record(const std::string& reservation_id, uint32_t partition);
  // Wraps `respond` to forget the reservation's record once an answer shows it final.
  Respond forgettingWhenFinal(std::string reservation_id, Respond respond);

  std::vector<RequestHandler> services_;
  ReservationPartitions* records_;
  Logger* logger_;
  PartitionRouterOptions options_;
  uint64_t recorded_since_trim_ = 0;
};

}  // namespace tally::agent
