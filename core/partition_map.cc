#include "core/partition_map.h"

#include <algorithm>
#include <variant>

namespace tally {
namespace {

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// `text` split at every `separator` (an empty text is one empty item).
std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> items;
  for (size_t at = 0;;) {
    const size_t end = text.find(separator, at);
    items.push_back(text.substr(at, end == std::string_view::npos ? text.npos : end - at));
    if (end == std::string_view::npos) return items;
    at = end + 1;
  }
}

bool isPattern(std::string_view subject_pattern) {
  return subject_pattern.find('*') != std::string_view::npos;
}

}  // namespace

uint64_t subjectHash(std::string_view subject) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : subject) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

uint32_t partitionOf(std::string_view subject, uint32_t count) {
  return count <= 1 ? 0 : static_cast<uint32_t>(subjectHash(subject) % count);
}

Result<PartitionMap> parsePartitionMap(std::string_view text) {
  if (trimmed(text).empty()) return Status::invalidArgument("partition map: empty");
  PartitionMap map;
  const std::vector<std::string_view> partitions = split(text, ';');
  if (partitions.size() > kPartitionsMax) {
    return Status::invalidArgument("partition map: " + std::to_string(partitions.size()) +
                                   " partitions, at most " + std::to_string(kPartitionsMax));
  }
  for (size_t i = 0; i < partitions.size(); ++i) {
    std::vector<std::string>& addresses = map.partitions.emplace_back();
    for (std::string_view address : split(partitions[i], ',')) {
      address = trimmed(address);
      if (address.empty()) {
        return Status::invalidArgument("partition map: partition " + std::to_string(i) +
                                       " has an empty address ('" + std::string(partitions[i]) +
                                       "')");
      }
      addresses.emplace_back(address);
    }
  }
  return map;
}

std::string formatPartitionMap(const PartitionMap& map) {
  std::string text;
  for (size_t i = 0; i < map.partitions.size(); ++i) {
    if (i > 0) text += ';';
    for (size_t j = 0; j < map.partitions[i].size(); ++j) {
      if (j > 0) text += ',';
      text += map.partitions[i][j];
    }
  }
  return text;
}

PartitionTarget partitionTarget(const LedgerRequest& request, uint32_t count) {
  auto one = [count](std::string_view subject) {
    return PartitionTarget{.routing = PartitionRouting::kOne,
                           .partition = partitionOf(subject, count)};
  };
  return std::visit(
      [&](const auto& body) -> PartitionTarget {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, ReserveRequest> || std::is_same_v<T, ShardIssueRequest>) {
          return one(body.subject);
        } else if constexpr (std::is_same_v<T, AuditRequest>) {
          return body.subject.empty() ? PartitionTarget{.routing = PartitionRouting::kAll}
                                      : one(body.subject);
        } else if constexpr (std::is_same_v<T, StartRequest> || std::is_same_v<T, SettleRequest> ||
                             std::is_same_v<T, ReleaseRequest> || std::is_same_v<T, QueryRequest> ||
                             std::is_same_v<T, MarkUnknownRequest> ||
                             std::is_same_v<T, ReportOperationRequest> ||
                             std::is_same_v<T, ExtendRequest>) {
          return {.routing = PartitionRouting::kByReservation};
        } else if constexpr (std::is_same_v<T, ShardReport>) {
          return one(body.shard.subject);  // the grant names its subject
        } else if constexpr (std::is_same_v<T, WriteOffShardRequest> ||
                             std::is_same_v<T, ShardStatusRequest>) {
          return {.routing = PartitionRouting::kByShard};
        } else if constexpr (std::is_same_v<T, UnknownMessage>) {
          return {.routing = PartitionRouting::kNone};
        } else {
          return {.routing = PartitionRouting::kAll};
        }
      },
      request);
}

std::vector<std::vector<Budget>> splitBudgets(std::span<const Budget> budgets, uint32_t count) {
  std::vector<std::vector<Budget>> split_budgets(std::max<uint32_t>(count, 1));
  for (const Budget& budget : budgets) {
    if (isPattern(budget.subject_pattern)) {
      for (std::vector<Budget>& partition : split_budgets) partition.push_back(budget);
    } else {
      split_budgets[partitionOf(budget.subject_pattern, count)].push_back(budget);
    }
  }
  return split_budgets;
}

AuditReport mergePartitionAudits(std::span<const AuditReport> reports) {
  AuditReport merged;
  const auto count = static_cast<uint32_t>(reports.size());
  for (uint32_t i = 0; i < count; ++i) {
    const AuditReport& report = reports[i];
    const std::string prefix = "partition " + std::to_string(i) + ": ";
    merged.as_of_ms = std::max(merged.as_of_ms, report.as_of_ms);
    merged.conserved = merged.conserved && report.conserved;
    for (const std::string& violation : report.violations) {
      merged.violations.push_back(prefix + violation);
    }
    auto misplaced = [&](std::string_view what, std::string_view subject) {
      const uint32_t owner = partitionOf(subject, count);
      if (owner == i) return;
      merged.conserved = false;
      merged.violations.push_back(prefix + std::string(what) + " of subject '" +
                                  std::string(subject) + "', which maps to partition " +
                                  std::to_string(owner));
    };
    for (const AccountView& account : report.accounts) {
      misplaced("holds an account", account.key.subject);
      merged.accounts.push_back(account);
    }
    for (const ShardLedgerView& shard : report.shards) {
      misplaced("issued shard " + shard.grant.shard_id, shard.grant.subject);
      merged.shards.push_back(shard);
    }
  }
  std::stable_sort(merged.accounts.begin(), merged.accounts.end(),
                   [](const AccountView& a, const AccountView& b) { return a.key < b.key; });
  std::stable_sort(merged.shards.begin(), merged.shards.end(),
                   [](const ShardLedgerView& a, const ShardLedgerView& b) {
                     return a.grant.shard_id < b.grant.shard_id;
                   });
  return merged;
}

}  // namespace tally
