#include "core/agent_partitions.h"

#include <type_traits>
#include <variant>

#include "core/partition_map.h"

namespace tally {

std::string_view reservationIdOf(const LedgerRequest& request) {
  return std::visit(
      [](const auto& body) -> std::string_view {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, ReserveRequest> || std::is_same_v<T, StartRequest> ||
                      std::is_same_v<T, SettleRequest> || std::is_same_v<T, ReleaseRequest> ||
                      std::is_same_v<T, QueryRequest> || std::is_same_v<T, MarkUnknownRequest> ||
                      std::is_same_v<T, ReportOperationRequest> ||
                      std::is_same_v<T, ExtendRequest>) {
          return body.reservation_id;
        } else {
          return {};
        }
      },
      request);
}

AgentPartitionRoute agentPartitionRoute(const LedgerRequest& request, uint32_t count,
                                        const RecordedPartition& recorded) {
  using Kind = AgentPartitionRoute::Kind;
  const PartitionTarget target = partitionTarget(request, count);
  if (target.routing == PartitionRouting::kNone) return {.kind = Kind::kNotSent};
  if (count <= 1) return {.kind = Kind::kPartition, .partition = 0};
  switch (target.routing) {
    case PartitionRouting::kOne: return {.kind = Kind::kPartition, .partition = target.partition};
    case PartitionRouting::kByReservation: {
      const std::optional<uint32_t> partition =
          recorded ? recorded(reservationIdOf(request)) : std::nullopt;
      if (!partition.has_value() || *partition >= count) return {.kind = Kind::kUnrecorded};
      return {.kind = Kind::kPartition, .partition = *partition};
    }
    case PartitionRouting::kByShard:  // the shard's id does not name its subject: ask each
    case PartitionRouting::kAll: return {.kind = Kind::kEvery};
    case PartitionRouting::kNone: break;
  }
  return {.kind = Kind::kNotSent};
}

}  // namespace tally
