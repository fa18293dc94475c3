#include "core/agent_fleet.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/partition_map.h"
#include "core/reservation.h"

namespace tally {
namespace {

// Health statuses, best first; any other text ranks after them.
constexpr std::array<std::string_view, 4> kHealthOrder = {"HEALTHY", "DEGRADED", "PARTITIONED",
                                                          "DISCONNECTED"};

size_t healthRank(std::string_view status) {
  const auto found = std::find(kHealthOrder.begin(), kHealthOrder.end(), status);
  return static_cast<size_t>(found - kHealthOrder.begin());
}

std::string partitionName(size_t partition) { return "partition " + std::to_string(partition); }

// What a partition answered instead of the kind expected, as the fleet's failure.
ErrorReply partitionFailure(size_t partition, const char* expected, const LedgerReply& answer) {
  if (const auto* error = std::get_if<ErrorReply>(&answer)) {
    return {.code = error->code,
            .message = partitionName(partition) + " did not answer with its " + expected + ": " +
                       error->message};
  }
  return {.code = ErrorCode::kUnavailable,
          .message = partitionName(partition) + " did not answer with its " + expected};
}

LedgerReply mergeHealth(std::span<const LedgerReply> answers) {
  HealthReply merged{.status = std::string(kHealthOrder.front())};
  for (const LedgerReply& answer : answers) {
    const auto* health = std::get_if<HealthReply>(&answer);
    const std::string status = health != nullptr ? health->status : "UNAVAILABLE";
    if (healthRank(status) > healthRank(merged.status)) merged.status = status;
    if (health == nullptr) continue;
    if (merged.version.empty()) merged.version = health->version;
    merged.now_ms = std::max(merged.now_ms, health->now_ms);
  }
  return merged;
}

LedgerReply mergeAudits(std::span<const LedgerReply> answers) {
  std::vector<AuditReport> reports;
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto* report = std::get_if<AuditReport>(&answers[i]);
    if (report == nullptr) return partitionFailure(i, "audit", answers[i]);
    reports.push_back(*report);
  }
  return mergePartitionAudits(reports);
}

LedgerReply mergePolicies(std::span<const LedgerReply> answers) {
  PolicyAnswer merged{.policy = Policy{}};
  std::string generations;
  bool differ = false;
  for (size_t i = 0; i < answers.size(); ++i) {
    const auto* answer = std::get_if<PolicyAnswer>(&answers[i]);
    if (answer == nullptr || answer->reply.code != ReplyCode::kOk || !answer->policy.has_value()) {
      if (answer != nullptr) {
        PolicyAnswer failed = *answer;
        failed.reply.message = partitionName(i) + ": " + failed.reply.message;
        return failed;
      }
      return partitionFailure(i, "policy", answers[i]);
    }
    const Generation generation = answer->policy->generation;
    if (i == 0) {
      merged.policy->generation = generation;
    } else {
      differ = differ || generation != merged.policy->generation;
      merged.policy->generation = std::min(merged.policy->generation, generation);
      generations += ", ";
    }
    generations += partitionName(i) + " at generation " + std::to_string(generation);
    for (const Budget& budget : answer->policy->budgets) {
      const std::vector<Budget>& kept = merged.policy->budgets;
      if (std::find(kept.begin(), kept.end(), budget) == kept.end()) {
        merged.policy->budgets.push_back(budget);
      }
    }
  }
  merged.reply.generation = merged.policy->generation;
  if (differ) merged.reply.message = "the partitions' policies differ: " + generations;
  return merged;
}

}  // namespace

FleetRequest fleetRequestOf(const LedgerRequest& request) {
  return std::visit(
      [](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, HealthRequest>) {
          return FleetRequest::kMerged;
        } else if constexpr (std::is_same_v<T, AuditRequest>) {
          // Periods are closed per partition and pages are per ledger: neither sums.
          const bool current = !body.period.has_value() && !body.list_periods &&
                               body.routes_max == 0 && body.after_subject.empty() &&
                               body.after_route.empty();
          return current ? FleetRequest::kMerged : FleetRequest::kNotMergeable;
        } else if constexpr (std::is_same_v<T, ShowPolicyRequest>) {
          // "Unless you hold generation G" has no one answer over partitions' own generations.
          return body.unless_generation == 0 ? FleetRequest::kMerged : FleetRequest::kNotMergeable;
        } else {
          return FleetRequest::kFirstOnly;
        }
      },
      request);
}

LedgerReply fleetRefusal(const LedgerRequest& request) {
  const bool audit = std::holds_alternative<AuditRequest>(request);
  return ErrorReply{
      .code = ErrorCode::kInvalidArgument,
      .message = std::string(audit ? "a partitioned agent sums only the audit of current "
                                     "balances of every subject (no periods, no pages)"
                                   : "a partitioned agent shows only the whole active policy") +
                 ": ask one partition's ledger (tallyctl --ledger ADDRESSES, docs/scale-out.md)"};
}

LedgerReply mergeFleetAnswers(const LedgerRequest& request, std::span<const LedgerReply> answers) {
  if (std::holds_alternative<HealthRequest>(request)) return mergeHealth(answers);
  if (std::holds_alternative<AuditRequest>(request)) return mergeAudits(answers);
  if (std::holds_alternative<ShowPolicyRequest>(request)) return mergePolicies(answers);
  return fleetRefusal(request);
}

UnrecordedDecision decideUnrecorded(std::string_view reservation_id,
                                    std::span<const LedgerReply> query_answers) {
  std::vector<uint32_t> holders;
  std::string unanswered;
  const ReservationReply* not_found = nullptr;
  for (size_t i = 0; i < query_answers.size(); ++i) {
    const auto* reply = std::get_if<ReservationReply>(&query_answers[i]);
    if (reply != nullptr && reply->code == ReplyCode::kOk) {
      holders.push_back(static_cast<uint32_t>(i));
    } else if (reply != nullptr && reply->code == ReplyCode::kNotFound) {
      not_found = reply;
    } else {
      unanswered += (unanswered.empty() ? "" : ", ") + std::to_string(i);
    }
  }
  const std::string id(reservation_id);
  if (holders.size() == 1) {
    return {.kind = UnrecordedDecision::Kind::kForward, .partition = holders.front()};
  }
  if (holders.size() > 1) {
    return {.reply = ErrorReply{.code = ErrorCode::kInternal,
                                .message = "reservation " + id + " is held by partitions " +
                                           std::to_string(holders[0]) + " and " +
                                           std::to_string(holders[1]) +
                                           ": the partition map differed between writers"}};
  }
  if (!unanswered.empty() || not_found == nullptr) {
    return {.reply = ErrorReply{
                .code = ErrorCode::kUnavailable,
                .message = "reservation " + id +
                           ": this agent has no record of its partition and partition(s) " +
                           unanswered + " did not answer a query for it; retry with the same id"}};
  }
  return {.reply = *not_found};
}

bool partitionRecordDone(const LedgerReply& answer) {
  const auto* reply = std::get_if<ReservationReply>(&answer);
  if (reply == nullptr || reply->code == ReplyCode::kQueued) return false;
  return reply->code != ReplyCode::kNotFound && isTerminal(reply->receipt.state);
}

}  // namespace tally
