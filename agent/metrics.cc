#include "agent/metrics.h"

#include <cstdio>
#include <type_traits>
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

void AgentMetrics::countRequest(Op op, const std::string& outcome, uint64_t duration_us) {
  ++requests_[{opName(op), outcome}];
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

uint64_t AgentMetrics::requests(Op op, const std::string& outcome) const {
  auto it = requests_.find({opName(op), outcome});
  return it == requests_.end() ? 0 : it->second;
}

uint64_t AgentMetrics::shadowDecisions(const std::string& outcome,
                                       LimitingDimension dimension) const {
  auto it = shadow_.find({outcome, limitingDimensionName(dimension)});
  return it == shadow_.end() ? 0 : it->second;
}

void AgentMetrics::renderShards(std::string* out, const GaugeSnapshot& g) const {
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
  header(out, "tally_agent_shards", "gauge", "Emergency shards held, by condition.");
  sample(out, "tally_agent_shards", "condition=\"usable\"", std::to_string(g.shards_usable));
  sample(out, "tally_agent_shards", "condition=\"closed\"", std::to_string(g.shards_closed));
  sample(out, "tally_agent_shards", "condition=\"quarantined\"",
         std::to_string(g.shards_quarantined));
  sample(out, "tally_agent_shards", "condition=\"unreconcilable\"",
         std::to_string(g.shards_unreconcilable));
  header(out, "tally_agent_shard_available_units", "gauge",
         "Units still available for admission in usable shards.");
  sample(out, "tally_agent_shard_available_units", "", std::to_string(g.shard_available_units));
  header(out, "tally_agent_shard_oldest_unreconciled_age_seconds", "gauge",
         "Time since the oldest closed, not yet reconciled shard was closed.");
  sample(out, "tally_agent_shard_oldest_unreconciled_age_seconds", "",
         seconds(g.shard_oldest_unreconciled_age_ms * 1000));
}

std::string AgentMetrics::render(const GaugeSnapshot& g) const {
  std::string out;
  header(&out, "tally_agent_requests_total", "counter",
         "Gateway requests by operation and outcome.");
  for (const auto& [key, value] : requests_) {
    sample(&out, "tally_agent_requests_total",
           "op=\"" + key.first + "\",outcome=\"" + key.second + "\"", std::to_string(value));
  }
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
  header(&out, "tally_agent_ledger_health", "gauge",
         "Link to the ledger: 0 HEALTHY, 1 DEGRADED, 2 PARTITIONED (or not connected).");
  const LinkHealth shown = g.connected ? g.health : LinkHealth::kPartitioned;
  sample(&out, "tally_agent_ledger_health",
         std::string("state=\"") + linkHealthName(shown) + "\",connected=\"" +
             (g.connected ? "true" : "false") + "\"",
         std::to_string(static_cast<int>(shown)));
  if (!g.ledger_address.empty()) {
    header(&out, "tally_agent_ledger_address", "gauge",
           "1 for the ledger address the link uses now (of --ledger's list).");
    sample(&out, "tally_agent_ledger_address", "address=\"" + g.ledger_address + "\"", "1");
    header(&out, "tally_agent_ledger_not_primary_total", "counter",
           "NOT_PRIMARY answers (a standby) that moved the link to another address.");
    sample(&out, "tally_agent_ledger_not_primary_total", "",
           std::to_string(g.ledger_not_primary_answers));
  }
  header(&out, "tally_agent_outbox_depth", "gauge", "Operations queued in the durable outbox.");
  sample(&out, "tally_agent_outbox_depth", "", std::to_string(g.outbox_depth));
  header(&out, "tally_agent_outbox_oldest_age_seconds", "gauge",
         "Age of the oldest queued outbox entry.");
  sample(&out, "tally_agent_outbox_oldest_age_seconds", "", seconds(g.outbox_oldest_age_ms * 1000));
  header(&out, "tally_agent_reservation_unknown", "gauge",
         "Reservations whose ledger answer was lost (RESERVATION_UNKNOWN), not yet resolved.");
  sample(&out, "tally_agent_reservation_unknown", "", std::to_string(g.reservation_unknown));
  header(&out, "tally_agent_reservation_unknown_oldest_age_seconds", "gauge",
         "Age of the oldest unresolved RESERVATION_UNKNOWN.");
  sample(&out, "tally_agent_reservation_unknown_oldest_age_seconds", "",
         seconds(g.reservation_unknown_oldest_age_ms * 1000));
  header(&out, "tally_agent_usage_unknown", "gauge",
         "Reservations marked USAGE_UNKNOWN through this agent and not yet resolved by a receipt "
         "(best effort).");
  sample(&out, "tally_agent_usage_unknown", "", std::to_string(g.usage_unknown));
  header(&out, "tally_agent_usage_unknown_oldest_age_seconds", "gauge",
         "Age of the oldest USAGE_UNKNOWN marked through this agent.");
  sample(&out, "tally_agent_usage_unknown_oldest_age_seconds", "",
         seconds(g.usage_unknown_oldest_age_ms * 1000));
  header(&out, "tally_agent_shadow_decisions_total", "counter",
         "Shadow-mode ledger decisions by outcome and limiting dimension (the agent admitted).");
  for (const auto& [key, value] : shadow_) {
    sample(&out, "tally_agent_shadow_decisions_total",
           "outcome=\"" + key.first + "\",dimension=\"" + key.second + "\"", std::to_string(value));
  }
  header(&out, "tally_agent_local_reservations", "gauge",
         "Reservations admitted locally (rollout off / shadow) still tracked by the agent.");
  sample(&out, "tally_agent_local_reservations", "", std::to_string(g.local_reservations));
  header(&out, "tally_agent_boot_epoch", "gauge", "This agent's boot epoch.");
  sample(&out, "tally_agent_boot_epoch", "", std::to_string(g.boot_epoch));
  renderShards(&out, g);
  renderFair(&out, g);
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

void AgentMetrics::renderFair(std::string* out, const GaugeSnapshot& g) {
  if (g.fair_routes.empty()) return;
  const auto each = [&](const char* name, const char* type, const char* help, auto value_of) {
    header(out, name, type, help);
    for (const FairRouteGauges& route : g.fair_routes) {
      sample(out, name, "route=\"" + labelValue(route.route) + "\"", value_of(route));
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
