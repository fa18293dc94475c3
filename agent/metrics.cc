#include "agent/metrics.h"

#include <algorithm>
#include <cstdio>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>

namespace tally::agent {
namespace {

using net::promHeader;
using net::promSample;
using net::promSeconds;

void header(std::string* out, const char* name, const char* type, const char* help) {
  promHeader(out, name, type, help);
}
void sample(std::string* out, const std::string& name, const std::string& labels,
            const std::string& value) {
  promSample(out, name, labels, value);
}
std::string seconds(uint64_t us) { return promSeconds(us); }

// Partition i's samples of a gauge: `labels` with partition="i" first when the agent has more
// than one partition (docs/scale-out.md "Partitioned subjects"); unchanged with one.
class PartitionSamples {
 public:
  PartitionSamples(std::string* out, std::span<const GaugeSnapshot> gauges)
      : out_(out), gauges_(gauges) {}
  // One sample of `name` per partition: value_of(snapshot) -> {labels, value}.
  template <typename ValueOf>
  void each(const std::string& name, ValueOf value_of) const {
    for (size_t i = 0; i < gauges_.size(); ++i) {
      const auto [labels, value] = value_of(gauges_[i]);
      std::string all = gauges_.size() > 1 ? "partition=\"" + std::to_string(i) + "\"" : "";
      if (!all.empty() && !labels.empty()) all += ",";
      sample(out_, name, all + labels, value);
    }
  }

 private:
  std::string* out_;
  std::span<const GaugeSnapshot> gauges_;
};

using Sample = std::pair<std::string, std::string>;  // labels, value

// Each Op's name, by its index: the requests counter's op label.
const std::array<const char*, kOpCount>& opNames() {
  static const std::array<const char*, kOpCount> names = [] {
    std::array<const char*, kOpCount> all{};
    for (size_t i = 0; i < all.size(); ++i) all[i] = opName(static_cast<Op>(i));
    return all;
  }();
  return names;
}

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kReserve: return "reserve";
    case Op::kStart: return "start";
    case Op::kSettle: return "settle";
    case Op::kRelease: return "release";
    case Op::kMarkUnknown: return "mark_unknown";
    case Op::kReportOperation: return "report_operation";
    case Op::kQuery: return "query";
    case Op::kHealth: return "health";
    case Op::kOther: return "other";
  }
  return "other";
}

Op opFor(const wire::RequestBody& body) {
  return std::visit(
      [](const auto& request) {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, ReserveRequest>) return Op::kReserve;
        if constexpr (std::is_same_v<T, StartRequest>) return Op::kStart;
        if constexpr (std::is_same_v<T, SettleRequest>) return Op::kSettle;
        if constexpr (std::is_same_v<T, ReleaseRequest>) return Op::kRelease;
        if constexpr (std::is_same_v<T, MarkUnknownRequest>) return Op::kMarkUnknown;
        if constexpr (std::is_same_v<T, ReportOperationRequest>) return Op::kReportOperation;
        if constexpr (std::is_same_v<T, QueryRequest>) return Op::kQuery;
        if constexpr (std::is_same_v<T, wire::HealthRequest>) return Op::kHealth;
        return Op::kOther;
      },
      body);
}

void AgentMetrics::countRequest(Op op, std::string_view outcome, uint64_t duration_us) {
  requests_.add(static_cast<size_t>(op), outcome);
  Histogram& histogram = durations_[static_cast<size_t>(op)];
  if (histogram.count == 0) histogram.bounds = kBucketsUs;
  histogram.observe(duration_us);
}

void AgentMetrics::countRejection(LimitingDimension dimension) {
  ++rejections_[limitingDimensionName(dimension)];
}

void AgentMetrics::countShadowDecision(const std::string& outcome, LimitingDimension dimension) {
  ++shadow_[{outcome, limitingDimensionName(dimension)}];
}

uint64_t AgentMetrics::requests(Op op, std::string_view outcome) const {
  return requests_.get(static_cast<size_t>(op), outcome);
}

uint64_t AgentMetrics::shadowDecisions(const std::string& outcome,
                                       LimitingDimension dimension) const {
  auto it = shadow_.find({outcome, limitingDimensionName(dimension)});
  return it == shadow_.end() ? 0 : it->second;
}

void AgentMetrics::renderShards(std::string* out, std::span<const GaugeSnapshot> gauges) const {
  auto counters = [out](const char* name, const char* help, const char* label,
                        const std::map<std::string, uint64_t>& values) {
    header(out, name, "counter", help);
    for (const auto& [key, value] : values) {
      sample(out, name, std::string(label) + "=\"" + key + "\"", std::to_string(value));
    }
  };
  counters("tally_agent_shard_admissions_total",
           "Partition-time reserves admitted from an emergency shard, or not (no usable shard).",
           "outcome", shard_admissions_);
  counters("tally_agent_shard_reports_total",
           "Shard reports sent to the ledger, by the shard state it answered (or the failure).",
           "result", shard_reports_);
  counters("tally_agent_shard_issues_total", "Shard issue requests, by result.", "result",
           shard_issues_);
  counters("tally_agent_shard_events_total",
           "Shard events: quarantined (stored grant does not verify), conflict (reported by the "
           "ledger), unreconcilable (the ledger will never take its report), closed-<reason>.",
           "event", shard_events_);
  const PartitionSamples samples(out, gauges);
  header(out, "tally_agent_shards", "gauge", "Emergency shards held, by condition.");
  for (const auto& entry : {std::pair{"usable", &GaugeSnapshot::shards_usable},
                            std::pair{"closed", &GaugeSnapshot::shards_closed},
                            std::pair{"quarantined", &GaugeSnapshot::shards_quarantined},
                            std::pair{"unreconcilable", &GaugeSnapshot::shards_unreconcilable}}) {
    // Named copies, not structured bindings: clang 14 cannot capture those.
    const char* condition = entry.first;
    const auto member = entry.second;
    samples.each("tally_agent_shards", [condition, member](const GaugeSnapshot& g) {
      return Sample{std::string("condition=\"") + condition + "\"", std::to_string(g.*member)};
    });
  }
  header(out, "tally_agent_shard_available_units", "gauge",
         "Units still available for admission in usable shards.");
  samples.each("tally_agent_shard_available_units", [](const GaugeSnapshot& g) {
    return Sample{"", std::to_string(g.shard_available_units)};
  });
  header(out, "tally_agent_shard_oldest_unreconciled_age_seconds", "gauge",
         "Time since the oldest closed, not yet reconciled shard was closed.");
  samples.each("tally_agent_shard_oldest_unreconciled_age_seconds", [](const GaugeSnapshot& g) {
    return Sample{"", seconds(g.shard_oldest_unreconciled_age_ms * 1000)};
  });
}

std::string AgentMetrics::render(const GaugeSnapshot& gauges) const {
  return render(std::span<const GaugeSnapshot>(&gauges, 1));
}

std::string AgentMetrics::render(std::span<const GaugeSnapshot> gauges) const {
  std::string out;
  header(&out, "tally_agent_requests_total", "counter",
         "Gateway requests by operation and outcome.");
  requests_.render(&out, "tally_agent_requests_total", opNames());
  header(&out, "tally_agent_rejections_total", "counter",
         "Reservations rejected, by limiting dimension.");
  for (const auto& [dimension, value] : rejections_) {
    sample(&out, "tally_agent_rejections_total", "dimension=\"" + dimension + "\"",
           std::to_string(value));
  }
  header(&out, "tally_agent_request_duration_seconds", "histogram",
         "Time from a gateway request to its answer, per operation.");
  for (size_t op = 0; op < kOpCount; ++op) {
    const Histogram& h = durations_[op];
    if (h.count == 0) continue;
    h.render(&out, "tally_agent_request_duration_seconds",
             "op=\"" + std::string(opName(static_cast<Op>(op))) + "\"", true);
  }
  const PartitionSamples samples(&out, gauges);
  header(&out, "tally_agent_ledger_health", "gauge",
         "Link to the ledger: 0 HEALTHY, 1 DEGRADED, 2 PARTITIONED (or not connected).");
  samples.each("tally_agent_ledger_health", [](const GaugeSnapshot& g) {
    const LinkHealth shown = g.connected ? g.health : LinkHealth::kPartitioned;
    return Sample{std::string("state=\"") + linkHealthName(shown) + "\",connected=\"" +
                      (g.connected ? "true" : "false") + "\"",
                  std::to_string(static_cast<int>(shown))};
  });
  if (!gauges.empty() && !gauges.front().ledger_address.empty()) {
    header(&out, "tally_agent_ledger_address", "gauge",
           "1 for the ledger address the link uses now (of --ledger's list).");
    samples.each("tally_agent_ledger_address", [](const GaugeSnapshot& g) {
      return Sample{"address=\"" + g.ledger_address + "\"", "1"};
    });
    header(&out, "tally_agent_ledger_not_primary_total", "counter",
           "NOT_PRIMARY answers (a standby) that moved the link to another address.");
    samples.each("tally_agent_ledger_not_primary_total", [](const GaugeSnapshot& g) {
      return Sample{"", std::to_string(g.ledger_not_primary_answers)};
    });
  }
  const auto gauge = [&samples, &out](const char* name, const char* help, auto value_of) {
    header(&out, name, "gauge", help);
    samples.each(name, [&value_of](const GaugeSnapshot& g) { return Sample{"", value_of(g)}; });
  };
  gauge("tally_agent_outbox_depth", "Operations queued in the durable outbox.",
        [](const GaugeSnapshot& g) { return std::to_string(g.outbox_depth); });
  gauge("tally_agent_outbox_oldest_age_seconds", "Age of the oldest queued outbox entry.",
        [](const GaugeSnapshot& g) { return seconds(g.outbox_oldest_age_ms * 1000); });
  gauge("tally_agent_reservation_unknown",
        "Reservations whose ledger answer was lost (RESERVATION_UNKNOWN), not yet resolved.",
        [](const GaugeSnapshot& g) { return std::to_string(g.reservation_unknown); });
  gauge("tally_agent_reservation_unknown_oldest_age_seconds",
        "Age of the oldest unresolved RESERVATION_UNKNOWN.",
        [](const GaugeSnapshot& g) { return seconds(g.reservation_unknown_oldest_age_ms * 1000); });
  gauge("tally_agent_usage_unknown",
        "Reservations marked USAGE_UNKNOWN through this agent and not yet resolved by a receipt "
        "(best effort).",
        [](const GaugeSnapshot& g) { return std::to_string(g.usage_unknown); });
  gauge("tally_agent_usage_unknown_oldest_age_seconds",
        "Age of the oldest USAGE_UNKNOWN marked through this agent.",
        [](const GaugeSnapshot& g) { return seconds(g.usage_unknown_oldest_age_ms * 1000); });
  header(&out, "tally_agent_shadow_decisions_total", "counter",
         "Shadow-mode ledger decisions by outcome and limiting dimension (the agent admitted).");
  for (const auto& [key, value] : shadow_) {
    sample(&out, "tally_agent_shadow_decisions_total",
           "outcome=\"" + key.first + "\",dimension=\"" + key.second + "\"", std::to_string(value));
  }
  gauge("tally_agent_local_reservations",
        "Reservations admitted locally (rollout off / shadow) still tracked by the agent.",
        [](const GaugeSnapshot& g) { return std::to_string(g.local_reservations); });
  gauge("tally_agent_boot_epoch", "This agent's boot epoch.",
        [](const GaugeSnapshot& g) { return std::to_string(g.boot_epoch); });
  renderShards(&out, gauges);
  renderFair(&out, gauges);
  return out;
}

namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string labelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string ratio(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6f", value);
  return buffer;
}

}  // namespace

void AgentMetrics::renderFair(std::string* out, std::span<const GaugeSnapshot> gauges) {
  const bool any = std::any_of(gauges.begin(), gauges.end(),
                               [](const GaugeSnapshot& g) { return !g.fair_routes.empty(); });
  if (!any) return;
  const auto each = [&](const char* name, const char* type, const char* help, auto value_of) {
    header(out, name, type, help);
    for (size_t i = 0; i < gauges.size(); ++i) {
      const std::string partition =
          gauges.size() > 1 ? "partition=\"" + std::to_string(i) + "\"," : "";
      for (const FairRouteGauges& route : gauges[i].fair_routes) {
        sample(out, name, partition + "route=\"" + labelValue(route.route) + "\"", value_of(route));
      }
    }
  };
  each("tally_agent_fair_started_max", "gauge", "Execution slots of a fairly scheduled route.",
       [](const FairRouteGauges& r) { return std::to_string(r.started_max); });
  each("tally_agent_fair_started", "gauge", "Execution slots held (starts admitted, unfinished).",
       [](const FairRouteGauges& r) { return std::to_string(r.started); });
  each("tally_agent_fair_waiting", "gauge", "Starts of RESERVED work waiting for a slot.",
       [](const FairRouteGauges& r) { return std::to_string(r.waiting); });
  each("tally_agent_fairness_error", "gauge",
       "Max over backlogged tenants of |admitted share - weighted fair share| in the last "
       "complete window of admissions (0..1).",
       [](const FairRouteGauges& r) { return ratio(r.fairness_error); });
  each("tally_agent_fairness_windows_total", "counter", "Fairness windows completed.",
       [](const FairRouteGauges& r) { return std::to_string(r.windows); });
}

}  // namespace tally::agent
