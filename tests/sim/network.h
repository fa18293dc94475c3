#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tests/sim/rng.h"

// The simulated network between the gateways, the operator and the ledger. It carries encoded
// frames (the real wire encoding, length prefix included), and misbehaves as the seed says:
// each message is delayed by a random time (which reorders), dropped, or delivered twice; a
// link can be partitioned in one direction or both and healed later.

namespace tally::sim {

using NodeId = uint32_t;

struct Envelope {
  NodeId from = 0;
  NodeId to = 0;
  uint64_t deliver_at_ms = 0;
  uint64_t seq = 0;  // send order, for a deterministic choice among equally due messages
  std::vector<uint8_t> frame;
};

struct NetworkConfig {
  uint64_t delay_ms_max = 50;
  uint64_t drop_permille = 0;
  uint64_t duplicate_permille = 0;
};

struct NetworkStats {
  uint64_t sent = 0;
  uint64_t dropped = 0;  // by chance or by a partition
  uint64_t duplicated = 0;
  uint64_t delivered = 0;
};

class Network {
 public:
  Network(Rng rng, NetworkConfig config) : rng_(rng), config_(config) {}

  void send(NodeId from, NodeId to, std::vector<uint8_t> frame, uint64_t now_ms);

  // One message whose delivery time has come, chosen at random among them (so two messages
  // sent in one order may arrive in the other); none if nothing is due. A message over a link
  // partitioned meanwhile is lost.
  std::optional<Envelope> takeDue(uint64_t now_ms);
  // The earliest delivery time in flight, if any.
  std::optional<uint64_t> nextDueMs() const;
  // Loses everything in flight to `node` (its process crashed: the connection is gone).
  void dropTo(NodeId node);

  void partition(NodeId from, NodeId to) { cut_.insert({from, to}); }
  void heal(NodeId from, NodeId to) { cut_.erase({from, to}); }
  bool partitioned(NodeId from, NodeId to) const { return cut_.contains({from, to}); }
  // Heals every link and stops dropping and duplicating (the end of a run).
  void calm();

  size_t inFlight() const { return in_flight_.size(); }
  const NetworkStats& stats() const { return stats_; }

 private:
  Rng rng_;
  NetworkConfig config_;
  std::set<std::pair<NodeId, NodeId>> cut_;
  std::vector<Envelope> in_flight_;
  uint64_t next_seq_ = 0;
  NetworkStats stats_;
};

}  // namespace tally::sim
