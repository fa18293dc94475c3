#include "bench/verify.h"

#include <algorithm>
#include <charconv>
#include <variant>

#include "bench/bench_limits.h"
#include "bench/workload.h"

namespace tally::bench {
namespace {

constexpr size_t kViolationsShownMax = 5;

// The subject index of "<prefix>-<i>", or -1 if `subject` is not one of this run's.
int64_t subjectIndex(const std::string& prefix, uint32_t subjects, const std::string& subject) {
  if (subject.size() <= prefix.size() + 1 || subject.compare(0, prefix.size(), prefix) != 0 ||
      subject[prefix.size()] != '-') {
    return -1;
  }
  const char* begin = subject.data() + prefix.size() + 1;
  const char* end = subject.data() + subject.size();
  if (*begin == '0' && end - begin > 1) return -1;  // "<prefix>-01" is not ours
  uint32_t index = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || ptr != end || index >= subjects) return -1;
  return index;
}

Status unexpected(const wire::Response& response, const std::string& what) {
  if (const auto* error = std::get_if<wire::ErrorReply>(&response.body)) {
    return Status::unavailable(what + ": " + wire::errorCodeName(error->code) + " " +
                               error->message);
  }
  return Status::corruption(what + ": unexpected reply kind");
}

void keep(const AuditReport& report, const std::string& prefix, uint32_t subjects,
          BenchAudit* out) {
  out->conserved = out->conserved && report.conserved;
  for (const std::string& violation : report.violations) {
    if (out->violations.size() < kViolationsShownMax) out->violations.push_back(violation);
  }
  for (const AccountView& view : report.accounts) {
    const int64_t index = subjectIndex(prefix, subjects, view.key.subject);
    if (index < 0 || view.key.route != kBenchRoute) continue;
    out->accounts.push_back(view);
    out->subject_of.push_back(static_cast<uint32_t>(index));
  }
}

// The route's accounts, a page at a time (AuditRequest::routes_max), each page with the
// ledger's whole verdict.
Result<BenchAudit> auditInPages(Rpc* rpc, const std::string& prefix, uint32_t subjects) {
  BenchAudit audit{.pages = 0};
  wire::AuditRequest request{.route = kBenchRoute, .routes_max = limits::kAuditRoutesPerPage};
  for (;;) {
    Result<wire::Response> answer = rpc->call(request, limits::kVerifyTimeoutMs);
    if (!answer.isOk()) return answer.status();
    const auto* report = std::get_if<AuditReport>(&answer.value().body);
    if (report == nullptr) return unexpected(answer.value(), "audit page");
    ++audit.pages;
    keep(*report, prefix, subjects, &audit);
    if (!report->more || report->accounts.empty()) return audit;
    request.after_subject = report->accounts.back().key.subject;
    request.after_route = report->accounts.back().key.route;
  }
}

// Checks the sampled reservations against a replay of the workload.
void verifySample(Rpc* rpc, const VerifyInput& input, VerifyReport* report) {
  const uint64_t n = std::min<uint64_t>(input.sample_queries, input.cycles_created);
  if (n == 0) return;
  std::vector<CycleParams> sample;
  sample.reserve(n);
  Workload replay(input.seed, input.subjects);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t seq = i * input.cycles_created / n;  // spread evenly over the run
    CycleParams params = replay.next();
    while (params.seq < seq) params = replay.next();
    sample.push_back(params);
  }
  std::vector<wire::RequestBody> queries;
  for (const CycleParams& params : sample) {
    queries.push_back(QueryRequest{.reservation_id = reservationId(input.prefix, params.seq)});
  }
  Result<std::vector<wire::Response>> answers =
      rpc->callAll(std::move(queries), limits::kVerifyWindow, limits::kVerifyTimeoutMs);
  if (!answers.isOk()) {
    report->failures.push_back("query sample: " + answers.status().toString());
    return;
  }
  uint64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < sample.size(); ++i) {
    const CycleParams& want = sample[i];
    const std::string id = reservationId(input.prefix, want.seq);
    const auto* reply = std::get_if<ReservationReply>(&answers.value()[i].body);
    std::string why;
    if (reply == nullptr) {
      why = "not a reservation reply";
    } else if (reply->code != ReplyCode::kOk) {
      why = replyCodeName(reply->code);
    } else {
      const Reservation& r = reply->receipt;
      const ReservationState settled =
          want.overuse() ? ReservationState::kSettledWithDebt : ReservationState::kSettled;
      if (r.state != settled || r.debt_units != 0) {
        why = std::string("state ") + reservationStateName(r.state) + ", debt " +
              std::to_string(r.debt_units);
      } else if (r.subject != subjectName(input.prefix, want.subject) || r.route != kBenchRoute ||
                 r.reserved_units != want.units || r.actual_units != want.actual ||
                 r.operation_id != operationId(want.seq)) {
        why = "receipt differs from the replayed cycle (subject " + r.subject + ", units " +
              std::to_string(r.reserved_units) + "/" + std::to_string(want.units) + ", actual " +
              std::to_string(r.actual_units) + "/" + std::to_string(want.actual) + ")";
      }
    }
    if (!why.empty() && bad++ == 0) first = id + ": " + why;
  }
  if (bad > 0) {
    report->failures.push_back(std::to_string(bad) + " of " + std::to_string(n) +
                               " sampled reservations wrong; first: " + first);
  } else {
    report->notes.push_back("queried " + std::to_string(n) +
                            " reservations: all settled (SETTLED, or SETTLED_WITH_DEBT with 0 debt "
                            "for over-use) with the replayed units and actuals");
  }
}

void verifyAccounts(const BenchAudit& audit, const VerifyInput& input, VerifyReport* report) {
  if (!audit.conserved) {
    std::string text = "ledger audit: conservation=false";
    for (const std::string& v : audit.violations) text += "; " + v;
    report->failures.push_back(text);
  }
  uint64_t held = 0;
  uint64_t indebted = 0;
  uint64_t unconserved = 0;
  std::string first;
  for (size_t k = 0; k < audit.accounts.size(); ++k) {
    const AccountView& view = audit.accounts[k];
    if (!view.conserved) ++unconserved;
    if (view.balances.reserved != 0) ++held;
    if (view.debt != 0) ++indebted;
    if (first.empty() && (!view.conserved || view.balances.reserved != 0 || view.debt != 0)) {
      first = view.key.subject + " gen " + std::to_string(view.key.generation) + ": reserved " +
              std::to_string(view.balances.reserved) + ", debt " + std::to_string(view.debt);
    }
  }
  if (unconserved + held + indebted > 0) {
    report->failures.push_back(std::to_string(unconserved) + " accounts not conserved, " +
                               std::to_string(held) + " still holding units, " +
                               std::to_string(indebted) + " in debt; first: " + first);
  }
  const std::vector<Units> consumed = audit.consumedPerSubject(input.subjects);
  uint64_t mismatched = 0;
  std::string first_mismatch;
  for (uint32_t i = 0; i < input.subjects; ++i) {
    const Units want = input.baseline_consumed[i] + input.settled_actual[i];
    if (consumed[i] == want) continue;
    if (mismatched++ == 0) {
      first_mismatch = subjectName(input.prefix, i) + ": spent+debt " +
                       std::to_string(consumed[i]) + ", expected " + std::to_string(want);
    }
  }
  if (mismatched > 0) {
    report->failures.push_back(
        "spent+debt differs from what was settled on " + std::to_string(mismatched) + " of " +
        std::to_string(input.subjects) + " subjects; first: " + first_mismatch);
  }
  std::string example;
  if (!audit.accounts.empty()) {
    const AccountView& v = audit.accounts.front();
    const Balances& b = v.balances;
    example = "; e.g. " + v.key.subject + ": opening " + std::to_string(b.opening) + " + minted " +
              std::to_string(b.minted) + " = available " + std::to_string(b.available) +
              " + reserved " + std::to_string(b.reserved) + " + spent " + std::to_string(b.spent) +
              "; debt " + std::to_string(v.debt);
  }
  report->notes.push_back("audit: conservation=" + std::string(audit.conserved ? "true" : "false") +
                          ", " + std::to_string(audit.accounts.size()) + " bench accounts" +
                          (audit.pages > 1
                               ? " (audited in " + std::to_string(audit.pages) + " pages)"
                               : std::string()) +
                          example);
}

}  // namespace

std::vector<Units> BenchAudit::consumedPerSubject(uint32_t subjects) const {
  std::vector<Units> consumed(subjects, 0);
  for (size_t k = 0; k < accounts.size(); ++k) {
    consumed[subject_of[k]] += accounts[k].balances.spent + accounts[k].debt;
  }
  return consumed;
}

Result<BenchAudit> auditBench(Rpc* rpc, const std::string& prefix, uint32_t subjects) {
  return auditInPages(rpc, prefix, subjects);
}

VerifyReport verifyRun(Rpc* rpc, const VerifyInput& input) {
  VerifyReport report;
  Result<BenchAudit> audit = auditBench(rpc, input.prefix, input.subjects);
  if (!audit.isOk()) {
    report.failures.push_back("audit: " + audit.status().toString());
  } else {
    verifyAccounts(audit.value(), input, &report);
  }
  verifySample(rpc, input, &report);
  return report;
}

}  // namespace tally::bench
