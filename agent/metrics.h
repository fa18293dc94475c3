#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/link_health.h"
#include "core/types.h"
#include "net/prometheus.h"
#include "wire/codec.h"

// tally-agent's metrics, rendered in the Prometheus text exposition format (version 0.0.4).
// Counters and histograms are kept here; gauges are read at render time from a snapshot the
// caller assembles. Pure (no I/O, no clock); owned by the loop thread.

namespace tally::agent {

enum class Op : uint8_t {
  kReserve = 0,
  kStart,
  kSettle,
  kRelease,
  kMarkUnknown,
  kReportOperation,
  kQuery,
  kHealth,
  kOther,
};
inline constexpr size_t kOpCount = 9;
const char* opName(Op op);
Op opFor(const wire::RequestBody& body);

// The outcome label of one answer (net/prometheus.h, shared with tally-ledger).
using net::outcomeLabel;
using net::outcomeName;

// One fairly scheduled route (core/fair_scheduler.h, docs/AGENT.md "Fair scheduling").
struct FairRouteGauges {
  std::string route;
  uint64_t started_max = 0;
  uint64_t started = 0;       // execution slots held
  uint64_t waiting = 0;       // starts waiting for one
  double fairness_error = 0;  // the last complete window's (core/fairness_meter.h); 0 before one
  uint64_t windows = 0;       // windows completed
};

struct GaugeSnapshot {
  LinkHealth health = LinkHealth::kHealthy;
  bool connected = false;
  uint64_t outbox_depth = 0;
  uint64_t outbox_oldest_age_ms = 0;
  uint64_t reservation_unknown = 0;
  uint64_t reservation_unknown_oldest_age_ms = 0;
  uint64_t usage_unknown = 0;
  uint64_t usage_unknown_oldest_age_ms = 0;
  uint64_t boot_epoch = 0;
  uint64_t local_reservations = 0;
  // Emergency shards (agent/shard_keeper.h).
  uint64_t shards_usable = 0;
  uint64_t shards_closed = 0;  // closed, not quarantined, kept until reconciled + retention
  uint64_t shards_quarantined = 0;
  uint64_t shards_unreconcilable = 0;  // the ledger has no record of them / wrote them off
  uint64_t shard_available_units = 0;
  uint64_t shard_oldest_unreconciled_age_ms = 0;
  std::vector<FairRouteGauges> fair_routes;  // by route
  // The ledger address the link uses now (of `--ledger H:P,H:P`), and the NOT_PRIMARY answers
  // that moved it (central-client/ledger_addresses.h). Empty: not shown.
  std::string ledger_address;
  uint64_t ledger_not_primary_answers = 0;
};

class AgentMetrics {
 public:
  // Upper bounds of the request-duration histogram buckets, in microseconds.
  static constexpr std::array<uint64_t, 15> kBucketsUs = net::kLatencyBucketsUs;

  void countRequest(Op op, std::string_view outcome, uint64_t duration_us);
  void countRejection(LimitingDimension dimension);
  void countShadowDecision(const std::string& outcome, LimitingDimension dimension);
  // Emergency shards: admissions ("admitted", "no-shard"), reports by the ledger's answer
  // (RECONCILED, RECONCILING, CONFLICT, …, "duplicate", "refused", "failed"), issue requests
  // ("issued", "emergency-off", "refused", "failed", …) and events ("quarantined", "conflict",
  // "closed-<reason>").
  void countShardAdmission(const std::string& outcome) { ++shard_admissions_[outcome]; }
  void countShardReport(const std::string& result) { ++shard_reports_[result]; }
  void countShardIssue(const std::string& result) { ++shard_issues_[result]; }
  void countShardEvent(const std::string& event) { ++shard_events_[event]; }
  uint64_t shardEvents(const std::string& event) const {
    auto it = shard_events_.find(event);
    return it == shard_events_.end() ? 0 : it->second;
  }

  uint64_t requests(Op op, std::string_view outcome) const;
  uint64_t shadowDecisions(const std::string& outcome, LimitingDimension dimension) const;

  std::string render(const GaugeSnapshot& gauges) const;
  // A partitioned agent (docs/scale-out.md "Partitioned subjects"): gauges[i] is partition i's
  // (its link, outbox, unknowns, boot epoch, shards, fair routes). With more than one, each of
  // those samples carries a `partition="I"` label first; with one the text is render()'s.
  // Counters are the agent's (every partition's together), unlabelled.
  std::string render(std::span<const GaugeSnapshot> gauges) const;

 private:
  void renderShards(std::string* out, std::span<const GaugeSnapshot> gauges) const;
  static void renderFair(std::string* out, std::span<const GaugeSnapshot> gauges);

  using Histogram = net::PromHistogram<kBucketsUs.size()>;

  net::RequestCounts<kOpCount> requests_;                           // by Op, then outcome
  std::map<std::string, uint64_t> rejections_;                      // dimension
  std::map<std::pair<std::string, std::string>, uint64_t> shadow_;  // (outcome, dimension)
  std::array<Histogram, kOpCount> durations_{};
  std::map<std::string, uint64_t> shard_admissions_;
  std::map<std::string, uint64_t> shard_reports_;
  std::map<std::string, uint64_t> shard_issues_;
  std::map<std::string, uint64_t> shard_events_;
};

}  // namespace tally::agent
