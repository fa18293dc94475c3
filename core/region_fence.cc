#include "core/region_fence.h"

#include <utility>

#include "core/agent_decisions.h"

namespace tally {

std::optional<ReservationReply> shardRegionRefusal(const std::optional<Policy>& policy,
                                                   const ReserveRequest& request,
                                                   int64_t unavailable_retry_after_ms,
                                                   uint64_t now_ms) {
  if (request.region.empty()) return std::nullopt;  // every budget admits it
  if (!policy.has_value()) {
    ReservationReply reply =
        ledgerUnavailableRejection(request, unavailable_retry_after_ms, now_ms);
    reply.receipt.region = request.region;
    reply.message = "the ledger is unreachable and this agent has no policy to check region '" +
                    request.region + "' against; retry later";
    return reply;
  }
  const Budget* budget = matchBudget(*policy, request.subject, request.route);
  if (budget == nullptr || regionAdmits(*budget, request.region)) return std::nullopt;
  ReservationReply reply = ledgerUnavailableRejection(request, kRetryNever, now_ms);
  reply.receipt.region = request.region;
  reply.receipt.limiting_dimension = LimitingDimension::kNoBudget;
  reply.message = regionRefusal(*budget, request.region);
  return reply;
}

}  // namespace tally
