#include "ledger/metrics.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <variant>

#include "core/checked_math.h"

namespace tally::ledger {

using net::promHeader;
using net::promSample;

namespace {

// By the index of wire::RequestBody's alternatives.
constexpr auto kOpNames = std::to_array<const char*>({"unknown",
                                                      "reserve",
                                                      "start",
                                                      "settle",
                                                      "release",
                                                      "query",
                                                      "mark_unknown",
                                                      "report_operation",
                                                      "audit",
                                                      "health",
                                                      "publish_policy",
                                                      "rollback_policy",
                                                      "show_policy",
                                                      "enroll_gateway",
                                                      "list_gateways",
                                                      "set_gateway_enabled",
                                                      "shard_issue",
                                                      "shard_report",
                                                      "shard_status",
                                                      "list_shards",
                                                      "revoke_shards",
                                                      "write_off_shard",
                                                      "extend",
                                                      "enroll_operator",
                                                      "set_operator_enabled",
                                                      "list_operators",
                                                      "audit_log"});
static_assert(kOpNames.size() == std::variant_size_v<wire::RequestBody>);

std::string_view outcomeOf(const wire::ResponseBody& response) {
  if (const auto* shard = std::get_if<ShardReply>(&response)) {
    return net::replyCodeOutcome(shard->code);
  }
  if (const auto* gateway = std::get_if<GatewayReply>(&response)) {
    return net::replyCodeOutcome(gateway->code);
  }
  if (const auto* operators = std::get_if<OperatorReply>(&response)) {
    return net::replyCodeOutcome(operators->code);
  }
  return net::outcomeName(response);
}

std::string count(uint64_t value) { return std::to_string(value); }

}  // namespace

const char* requestOpName(const wire::RequestBody& body) { return kOpNames[body.index()]; }

LedgerGauges ledgerGauges(const Ledger& ledger, uint64_t now_ms) {
  LedgerGauges gauges;
  for (const AccountView& view : ledger.accounts().view(now_ms)) {
    ++gauges.accounts;
    if (view.debt > 0) {
      ++gauges.accounts_in_debt;
      gauges.debt_units += view.debt;
    }
    gauges.overdraft_breaches =
        saturatingAdd(gauges.overdraft_breaches, view.overdraft_breaches.count);
  }
  if (const PeriodSnapshot* latest = ledger.periods().latest()) {
    gauges.period_last_closed_epoch = latest->epoch_last;
    gauges.period_last_closed_at_ms = latest->closed_at_ms;
  }
  for (const PeriodSpan& span : ledger.periods().spans()) {
    if (!span.conserved) ++gauges.period_spans_unconserved;
  }
  const auto by_state = ledger.reservationCountsByState();
  for (size_t state = 0; state < by_state.size(); ++state)
    gauges.reservations[state] = by_state[state];
  for (const ShardLedgerView& shard : ledger.listShards("", std::nullopt).shards) {
    ++gauges.shards[static_cast<size_t>(shard.state)];
  }
  return gauges;
}

void LedgerMetrics::countRequest(const wire::RequestBody& request,
                                 const wire::ResponseBody& response) {
  requests_.add(request.index(), outcomeOf(response));
  if (const auto* reply = std::get_if<ReservationReply>(&response)) {
    if (std::holds_alternative<ReserveRequest>(request) &&
        reply->receipt.state == ReservationState::kRejected && !reply->duplicate) {
      ++rejections_[limitingDimensionName(reply->receipt.limiting_dimension)];
    }
  }
}

void LedgerMetrics::observeCommit(uint64_t requests, uint64_t latency_us, uint64_t store_us) {
  batch_requests_.observe(requests);
  commit_latency_.observe(latency_us);
  store_commit_.observe(store_us);
}

void LedgerMetrics::observeAudit(const Audited& audited) {
  ++audits_;
  audit_conserved_ = audited.conserved;
  audit_violations_ = audited.violations;
}

uint64_t LedgerMetrics::requests(const std::string& op, const std::string& outcome) const {
  for (size_t i = 0; i < std::size(kOpNames); ++i) {
    if (op == kOpNames[i]) return requests_.get(i, outcome);
  }
  return 0;
}

uint64_t LedgerMetrics::rejections(LimitingDimension dimension) const {
  auto it = rejections_.find(limitingDimensionName(dimension));
  return it == rejections_.end() ? 0 : it->second;
}

std::string LedgerMetrics::render(const LedgerGauges& g) const {
  std::string out;
  promHeader(&out, "tally_ledger_requests_total", "counter", "Requests by operation and outcome.");
  requests_.render(&out, "tally_ledger_requests_total", kOpNames);
  promHeader(&out, "tally_ledger_rejections_total", "counter",
             "Reservations rejected (first answers, not duplicates), by limiting dimension.");
  for (const auto& [dimension, value] : rejections_) {
    promSample(&out, "tally_ledger_rejections_total", "dimension=\"" + dimension + "\"",
               count(value));
  }
  promHeader(&out, "tally_ledger_commit_batch_requests", "histogram",
             "Requests answered by one durable commit (group commit batch size).");
  batch_requests_.render(&out, "tally_ledger_commit_batch_requests", "", false);
  promHeader(&out, "tally_ledger_commit_duration_seconds", "histogram",
             "From sealing a batch to its being durable (queueing on the commit thread included).");
  commit_latency_.render(&out, "tally_ledger_commit_duration_seconds", "", true);
  promHeader(&out, "tally_ledger_store_commit_seconds", "histogram",
             "Time inside the store's commit: the SQLite write and its fsync (synchronous=FULL).");
  store_commit_.render(&out, "tally_ledger_store_commit_seconds", "", true);
  promHeader(&out, "tally_ledger_accounts", "gauge", "Accounts kept.");
  promSample(&out, "tally_ledger_accounts", "", count(g.accounts));
  promHeader(&out, "tally_ledger_accounts_in_debt", "gauge", "Accounts owing overdraft debt.");
  promSample(&out, "tally_ledger_accounts_in_debt", "", count(g.accounts_in_debt));
  promHeader(&out, "tally_ledger_debt_units", "gauge", "Debt owed, summed over all accounts.");
  promSample(&out, "tally_ledger_debt_units", "", count(g.debt_units));
  promHeader(&out, "tally_ledger_overdraft_breaches", "gauge",
             "Settles that left an account's debt above the policy's maximum overdraft, summed "
             "over accounts (durable per account: never goes down, compaction included).");
  promSample(&out, "tally_ledger_overdraft_breaches", "", count(g.overdraft_breaches));
  promHeader(&out, "tally_ledger_period_last_closed_epoch", "gauge",
             "Accounting epoch the most recent period close ended (epochLast; 0: none yet).");
  promSample(&out, "tally_ledger_period_last_closed_epoch", "", count(g.period_last_closed_epoch));
  promHeader(&out, "tally_ledger_period_last_closed_timestamp_seconds", "gauge",
             "Ledger time of the most recent period close (Unix seconds; 0: none yet).");
  promSample(&out, "tally_ledger_period_last_closed_timestamp_seconds", "",
             count(g.period_last_closed_at_ms / 1000));
  promHeader(&out, "tally_ledger_period_spans_unconserved", "gauge",
             "Closed accounting periods kept in which some account's snapshot fails the "
             "period's equation (alert on > 0).");
  promSample(&out, "tally_ledger_period_spans_unconserved", "", count(g.period_spans_unconserved));
  promHeader(&out, "tally_ledger_reservations", "gauge",
             "Reservations kept, by state (terminal ones until compacted after retention).");
  for (int state = 0; state < kReservationStateCount; ++state) {
    promSample(
        &out, "tally_ledger_reservations",
        std::string("state=\"") + reservationStateName(static_cast<ReservationState>(state)) + "\"",
        count(g.reservations[static_cast<size_t>(state)]));
  }
  promHeader(&out, "tally_ledger_shards", "gauge", "Emergency shards, by state.");
  for (int state = 0; state < kShardStateCount; ++state) {
    promSample(&out, "tally_ledger_shards",
               std::string("state=\"") + shardStateName(static_cast<ShardState>(state)) + "\"",
               count(g.shards[static_cast<size_t>(state)]));
  }
  promHeader(&out, "tally_ledger_audits_total", "counter", "Audits run (tallyctl audit).");
  promSample(&out, "tally_ledger_audits_total", "", count(audits_));
  promHeader(&out, "tally_ledger_audit_conserved", "gauge",
             "The last audit's result: 1 every equation holds (also before any audit), 0 not.");
  promSample(&out, "tally_ledger_audit_conserved", "", audit_conserved_ ? "1" : "0");
  promHeader(&out, "tally_ledger_audit_violations", "gauge", "Violations the last audit found.");
  promSample(&out, "tally_ledger_audit_violations", "", count(audit_violations_));
  promHeader(&out, "tally_ledger_store_bytes", "gauge",
             "Bytes of the files in the data directory (databases, WAL files, key).");
  promSample(&out, "tally_ledger_store_bytes", "", count(g.store_bytes));
  promHeader(&out, "tally_ledger_connections", "gauge", "Client connections open.");
  promSample(&out, "tally_ledger_connections", "", count(g.connections));
  promHeader(&out, "tally_ledger_standby", "gauge",
             "1 while a standby (answering NOT_PRIMARY; ledger/standby_server.h), 0 serving.");
  promSample(&out, "tally_ledger_standby", "", "0");
  return out;
}

}  // namespace tally::ledger
