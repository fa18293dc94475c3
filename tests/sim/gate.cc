#include "tests/sim/gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tally::sim {
namespace {

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// JSON field names of the gate, in the order issue 10 lists them.
struct Field {
  const char* name;
  Check check;
};
constexpr Field kFields[] = {
    {"conservationViolations", Check::kConservation},
    {"overspend", Check::kOverspend},
    {"secondReservations", Check::kSecondReservation},
    {"duplicateShardConsumption", Check::kDuplicateShardConsumption},
    {"unrecordedDebt", Check::kUnrecordedDebt},
    {"duplicateRefunds", Check::kDuplicateRefund},
    {"unknownTreatedAsUnconsumed", Check::kUnknownTreatedAsUnconsumed},
    {"lostAcknowledged", Check::kLostAcknowledged},
    {"unknownUnresolved", Check::kUnknownUnresolved},
    {"shardsUnreconciled", Check::kShardUnreconciled},
    {"outboxesUndrained", Check::kOutboxUndrained},
    {"fairnessOverBudget", Check::kFairnessOverBudget},
    {"fairSchedulingViolations", Check::kFairScheduling},
};

void addFairness(std::map<std::string, TenantFairness>* into, const TenantFairness& tenant) {
  TenantFairness& worst = (*into)[tenant.tenant];
  if (worst.windows == 0) {
    worst = tenant;
    return;
  }
  worst.error = std::max(worst.error, tenant.error);
  worst.budget_permille = std::min(worst.budget_permille, tenant.budget_permille);
  worst.windows += tenant.windows;
}

}  // namespace

uint64_t GateSummary::errorPermille(const TenantFairness& tenant) {
  return static_cast<uint64_t>(std::ceil(tenant.error * 1000 - kFairnessEpsilonPermille));
}

void GateSummary::add(const RunResult& result) {
  ++interleavings_;
  closed_periods_checked_ += result.closed_periods_checked;
  shard_admissions_ += result.shard_admissions;
  agent_restarts_ += result.agent_restarts;
  for (size_t i = 0; i < kCheckCount; ++i) counts_[i] += result.failed[i] ? 1 : 0;
  for (const TenantFairness& tenant : result.fairness) addFairness(&fairness_, tenant);
  for (const uint64_t ms : result.convergence_ms) {
    ++histogram_[std::min<uint64_t>(ms / kBucketMs, kBuckets)];
    ++samples_;
  }
  if (!result.ok())
    failed_.push_back(FailedRun{.seed = result.seed, .first = result.findings.front()});
  std::sort(failed_.begin(), failed_.end(),
            [](const FailedRun& a, const FailedRun& b) { return a.seed < b.seed; });
  if (failed_.size() > kFailedRunsKept) failed_.resize(kFailedRunsKept);
}

void GateSummary::merge(const GateSummary& other) {
  interleavings_ += other.interleavings_;
  closed_periods_checked_ += other.closed_periods_checked_;
  shard_admissions_ += other.shard_admissions_;
  agent_restarts_ += other.agent_restarts_;
  for (size_t i = 0; i < kCheckCount; ++i) counts_[i] += other.counts_[i];
  for (const auto& [name, tenant] : other.fairness_) addFairness(&fairness_, tenant);
  for (size_t i = 0; i < histogram_.size(); ++i) histogram_[i] += other.histogram_[i];
  samples_ += other.samples_;
  failed_.insert(failed_.end(), other.failed_.begin(), other.failed_.end());
  std::sort(failed_.begin(), failed_.end(),
            [](const FailedRun& a, const FailedRun& b) { return a.seed < b.seed; });
  if (failed_.size() > kFailedRunsKept) failed_.resize(kFailedRunsKept);
}

uint64_t GateSummary::unknownConvergenceP99Ms() const {
  if (samples_ == 0) return 0;
  const uint64_t rank = (samples_ * 99 + 99) / 100;  // ceil(0.99 n)
  uint64_t seen = 0;
  for (size_t i = 0; i < histogram_.size(); ++i) {
    seen += histogram_[i];
    if (seen >= rank) return (i + 1) * kBucketMs;  // the bucket's upper edge
  }
  return histogram_.size() * kBucketMs;
}

bool GateSummary::passes() const {
  for (const uint64_t count : counts_) {
    if (count != 0) return false;
  }
  for (const auto& [name, tenant] : fairness_) {
    if (errorPermille(tenant) > tenant.budget_permille) return false;
  }
  return unknownConvergenceP99Ms() <= kUnknownConvergenceMsMax;
}

std::string GateSummary::json() const {
  std::string out = "{\"interleavings\":" + std::to_string(interleavings_);
  for (const Field& field : kFields) {
    out += ",\"" + std::string(field.name) + "\":" + std::to_string(count(field.check));
  }
  out += ",\"unknownConvergenceP99Ms\":" + std::to_string(unknownConvergenceP99Ms());
  // Per tenant, in ‰ of a window's admissions (docs/SIMULATION.md "Fair scheduling").
  out += ",\"fairness\":[";
  bool first = true;
  for (const auto& [name, tenant] : fairness_) {
    out += (first ? "" : ",") + std::string("{\"tenant\":") + jsonString(name) +
           ",\"error\":" + std::to_string(errorPermille(tenant)) +
           ",\"budget\":" + std::to_string(tenant.budget_permille) +
           ",\"windows\":" + std::to_string(tenant.windows) + "}";
    first = false;
  }
  out += "]";
  out += ",\"closedPeriodsChecked\":" + std::to_string(closed_periods_checked_);
  out += ",\"shardAdmissions\":" + std::to_string(shard_admissions_);
  out += ",\"agentRestarts\":" + std::to_string(agent_restarts_);
  out += ",\"failedSeeds\":[";
  for (size_t i = 0; i < failed_.size(); ++i) {
    out += (i == 0 ? "" : ",") + std::string("{\"seed\":") + std::to_string(failed_[i].seed) +
           ",\"check\":" + jsonString(checkName(failed_[i].first.check)) +
           ",\"detail\":" + jsonString(failed_[i].first.detail) + "}";
  }
  return out + "]}";
}

std::string GateSummary::text() const {
  std::string out = "interleavings: " + std::to_string(interleavings_) + "\n";
  for (const Field& field : kFields) {
    out += "  " + std::string(field.name) + ": " + std::to_string(count(field.check)) + "\n";
  }
  out += "  unknownConvergenceP99Ms: " + std::to_string(unknownConvergenceP99Ms()) + " (limit " +
         std::to_string(kUnknownConvergenceMsMax) + ")\n";
  if (fairness_.empty()) out += "  fairness: no window measured\n";
  for (const auto& [name, tenant] : fairness_) {
    const uint64_t error = errorPermille(tenant);
    out += "  fairness " + name + ": error " + std::to_string(error) + "‰ (budget " +
           std::to_string(tenant.budget_permille) + "‰, " + std::to_string(tenant.windows) +
           " windows)" + (error > tenant.budget_permille ? " OVER BUDGET" : "") + "\n";
  }
  out += "  closedPeriodsChecked: " + std::to_string(closed_periods_checked_) + "\n";
  out += "  shardAdmissions: " + std::to_string(shard_admissions_) + "\n";
  out += "  agentRestarts: " + std::to_string(agent_restarts_) + "\n";
  for (const FailedRun& run : failed_) {
    out += "FAILED seed " + std::to_string(run.seed) + ": " + checkName(run.first.check) + ": " +
           run.first.detail + "\n  replay: tally-sim --replay " + std::to_string(run.seed) + "\n";
  }
  out += passes() ? "gate: PASS\n" : "gate: FAIL\n";
  return out;
}

}  // namespace tally::sim
