#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>

#include "core/ledger.h"
#include "core/ledger_requests.h"
#include "core/reservation.h"
#include "core/shard_types.h"
#include "net/prometheus.h"
#include "wire/codec.h"

// tally-ledger's metrics, rendered in the Prometheus text format (net/prometheus.h) and served
// by the shared endpoint (net/metrics_server.h, `--metrics HOST:PORT`). Counters and histograms
// are fed by the server as it answers and commits; gauges are read from the Ledger at render
// time (ledgerGauges). Pure; owned by the loop thread. Names are listed in docs/LEDGER.md.

namespace tally::ledger {

// The request kind's label ("reserve", "settle", "shard_issue", …).
const char* requestOpName(const wire::RequestBody& body);

// Read from the Ledger (and the data directory) at each scrape: O(accounts + reservations +
// shards).
struct LedgerGauges {
  uint64_t accounts = 0;
  uint64_t accounts_in_debt = 0;
  uint64_t debt_units = 0;
  // Settles that left debt above max overdraft: the accounts' durable counters, summed.
  uint64_t overdraft_breaches = 0;
  // Accounting periods (docs/LEDGER.md): the most recent close, and kept snapshots that fail
  // their period's equation.
  uint64_t period_last_closed_epoch = 0;  // epochLast of the latest snapshot; 0: none yet
  uint64_t period_last_closed_at_ms = 0;
  uint64_t period_spans_unconserved = 0;
  std::array<uint64_t, kReservationStateCount> reservations{};  // kept, by state
  std::array<uint64_t, kShardStateCount> shards{};
  uint64_t store_bytes = 0;
  uint64_t connections = 0;
};
LedgerGauges ledgerGauges(const Ledger& ledger, uint64_t now_ms);

class LedgerMetrics {
 public:
  // Requests per committed batch.
  static constexpr std::array<uint64_t, 12> kBatchBuckets = {1,  2,   4,   8,   16,   32,
                                                             64, 128, 256, 512, 1024, 4096};

  // One answer: by op and outcome; a rejected reserve also by its limiting dimension.
  void countRequest(const wire::RequestBody& request, const wire::ResponseBody& response);
  // One durable commit: its requests, seal-to-durable latency, and the time in Store::commit
  // (the SQLite write and its fsync).
  void observeCommit(uint64_t requests, uint64_t latency_us, uint64_t store_us);
  // One audit's verdict over the whole ledger (before any subject/route filter).
  void observeAudit(const Audited& audited);

  uint64_t requests(const std::string& op, const std::string& outcome) const;
  uint64_t rejections(LimitingDimension dimension) const;
  uint64_t commits() const { return commit_latency_.count; }

  std::string render(const LedgerGauges& gauges) const;

 private:
  // By the request kind's index in wire::RequestBody (kOpNames), then outcome.
  net::RequestCounts<std::variant_size_v<wire::RequestBody>> requests_;
  std::map<std::string, uint64_t> rejections_;  // dimension
  net::PromHistogram<kBatchBuckets.size()> batch_requests_{.bounds = kBatchBuckets};
  net::PromHistogram<net::kLatencyBucketsUs.size()> commit_latency_{.bounds =
                                                                        net::kLatencyBucketsUs};
  net::PromHistogram<net::kLatencyBucketsUs.size()> store_commit_{.bounds = net::kLatencyBucketsUs};
  uint64_t audits_ = 0;
  bool audit_conserved_ = true;
  uint64_t audit_violations_ = 0;
};

}  // namespace tally::ledger
