#include "bench/setup.h"

#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "bench/bench_limits.h"
#include "bench/workload.h"

namespace tally::bench {
namespace {

Status unexpected(const wire::Response& response, const std::string& what) {
  if (const auto* error = std::get_if<wire::ErrorReply>(&response.body)) {
    return Status::unavailable(what + ": " + wire::errorCodeName(error->code) + " " +
                               error->message);
  }
  return Status::corruption(what + ": unexpected reply kind");
}

Result<const wire::PolicyAnswer*> policyAnswer(const Result<wire::Response>& answer,
                                               const std::string& what) {
  if (!answer.isOk()) return Status::unavailable(what + ": " + answer.status().toString());
  const auto* policy = std::get_if<wire::PolicyAnswer>(&answer.value().body);
  if (policy == nullptr) return unexpected(answer.value(), what);
  return policy;
}

}  // namespace

Result<SetupOutcome> setUp(Rpc* rpc, const BenchOptions& options) {
  SetupOutcome outcome;
  Result<wire::Response> health = rpc->call(wire::HealthRequest{}, limits::kSetupCallTimeoutMs);
  if (!health.isOk()) return Status::unavailable("health: " + health.status().toString());
  const auto* reply = std::get_if<wire::HealthReply>(&health.value().body);
  if (reply == nullptr) return unexpected(health.value(), "health");
  // The ledger answers "ok"; an agent names its link to the ledger (HEALTHY, DEGRADED,
  // PARTITIONED, DISCONNECTED) and can only carry the load while the link is usable.
  if (reply->status != "ok" && reply->status != "HEALTHY" && reply->status != "DEGRADED") {
    return Status::unavailable("health: server says " + reply->status);
  }
  outcome.server_version = reply->version;

  // Reservation ids are "<prefix>-<n>": an earlier run with this prefix would turn every reserve
  // into a duplicate of its receipts.
  const std::string first_id = reservationId(options.prefix, 0);
  Result<wire::Response> queried =
      rpc->call(QueryRequest{.reservation_id = first_id}, limits::kSetupCallTimeoutMs);
  if (!queried.isOk()) return Status::unavailable("query: " + queried.status().toString());
  const auto* existing = std::get_if<ReservationReply>(&queried.value().body);
  if (existing == nullptr) return unexpected(queried.value(), "query");
  if (existing->code != ReplyCode::kNotFound) {
    return Status::failedPrecondition("reservation " + first_id +
                                      " already exists on this ledger (an earlier run used "
                                      "--prefix " +
                                      options.prefix + "); pick another prefix");
  }

  Result<wire::Response> shown =
      rpc->call(wire::ShowPolicyRequest{.generation = 0}, limits::kSetupCallTimeoutMs);
  Result<const wire::PolicyAnswer*> active = policyAnswer(shown, "show policy");
  if (!active.isOk()) return active.status();
  if (!options.publish) {
    const std::optional<Policy>& policy = active.value()->policy;
    if (!policy.has_value() ||
        matchBudget(*policy, subjectName(options.prefix, 0), kBenchRoute) == nullptr) {
      return Status::failedPrecondition("--no-publish: the active policy has no budget for " +
                                        subjectName(options.prefix, 0) + " on route " +
                                        kBenchRoute);
    }
    outcome.generation = active.value()->reply.generation;
    return outcome;
  }
  std::vector<Budget> budgets;
  if (active.value()->reply.code == ReplyCode::kOk && active.value()->policy.has_value()) {
    for (const Budget& budget : active.value()->policy->budgets) {
      if (budget.route == kBenchRoute) {
        ++outcome.budgets_dropped;
      } else {
        budgets.push_back(budget);
      }
    }
  } else if (active.value()->reply.code != ReplyCode::kNotFound) {
    return Status::unavailable(std::string("show policy: ") +
                               replyCodeName(active.value()->reply.code) + " " +
                               active.value()->reply.message);
  }
  outcome.budgets_kept = budgets.size();
  budgets.push_back(benchBudget(options.prefix));

  Result<wire::Response> published = rpc->call(
      wire::PublishPolicyRequest{.budgets = std::move(budgets)}, limits::kSetupCallTimeoutMs);
  Result<const wire::PolicyAnswer*> answer = policyAnswer(published, "publish policy");
  if (!answer.isOk()) return answer.status();
  if (answer.value()->reply.code != ReplyCode::kOk) {
    return Status::failedPrecondition(std::string("publish policy: ") +
                                      replyCodeName(answer.value()->reply.code) + " " +
                                      answer.value()->reply.message);
  }
  outcome.published = true;
  outcome.generation = answer.value()->reply.generation;
  return outcome;
}

}  // namespace tally::bench
