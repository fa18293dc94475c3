#include "tests/sim/network.h"

#include <algorithm>

namespace tally::sim {

void Network::send(NodeId from, NodeId to, std::vector<uint8_t> frame, uint64_t now_ms) {
  ++stats_.sent;
  if (partitioned(from, to) || rng_.chance(config_.drop_permille)) {
    ++stats_.dropped;
    return;
  }
  const int copies = rng_.chance(config_.duplicate_permille) ? 2 : 1;
  if (copies == 2) ++stats_.duplicated;
  for (int i = 0; i < copies; ++i) {
    in_flight_.push_back(Envelope{.from = from,
                                  .to = to,
                                  .deliver_at_ms = now_ms + rng_.below(config_.delay_ms_max + 1),
                                  .seq = next_seq_++,
                                  .frame = frame});
  }
}

std::optional<Envelope> Network::takeDue(uint64_t now_ms) {
  std::vector<size_t> due;
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    if (in_flight_[i].deliver_at_ms <= now_ms) due.push_back(i);
  }
  if (due.empty()) return std::nullopt;
  const size_t index = due[rng_.below(due.size())];
  Envelope envelope = std::move(in_flight_[index]);
  in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(index));
  if (partitioned(envelope.from, envelope.to)) {
    ++stats_.dropped;
    return takeDue(now_ms);
  }
  ++stats_.delivered;
  return envelope;
}

std::optional<uint64_t> Network::nextDueMs() const {
  if (in_flight_.empty()) return std::nullopt;
  uint64_t earliest = in_flight_.front().deliver_at_ms;
  for (const Envelope& envelope : in_flight_) earliest = std::min(earliest, envelope.deliver_at_ms);
  return earliest;
}

void Network::dropTo(NodeId node) {
  const size_t before = in_flight_.size();
  std::erase_if(in_flight_, [node](const Envelope& envelope) { return envelope.to == node; });
  stats_.dropped += before - in_flight_.size();
}

void Network::calm() {
  cut_.clear();
  config_.drop_permille = 0;
  config_.duplicate_permille = 0;
}

}  // namespace tally::sim
