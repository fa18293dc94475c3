#include "ctl/partitioned.h"

#include <string>
#include <variant>
#include <vector>

#include "core/partition_map.h"

namespace tally::ctl {
namespace {

std::string addressesOf(const std::vector<client::Endpoint>& endpoints) {
  std::string text;
  for (const client::Endpoint& endpoint : endpoints) {
    if (!text.empty()) text += ',';
    text += client::endpointName(endpoint);
  }
  return text;
}

}  // namespace

CommandOutput runPartitionedCommand(const Invocation& inv, const PartitionCallFn& call) {
  const auto count = static_cast<uint32_t>(inv.partitions.size());
  if (inv.command != Command::kAudit || count == 0) {
    return runCommand(inv, [&call](const wire::RequestBody& body) { return call(0, body); });
  }
  Result<wire::RequestBody> request = buildRequest(inv);
  if (!request.isOk()) return runCommand(inv, nullptr);  // renders the usage error
  const PartitionTarget target = partitionTarget(request.value(), count);
  if (target.routing == PartitionRouting::kOne) {
    return renderAnswer(inv, call(target.partition, request.value()));
  }
  std::vector<AuditReport> reports;
  for (uint32_t i = 0; i < count; ++i) {
    Result<wire::Response> answer = call(i, request.value());
    const AuditReport* report =
        answer.isOk() ? std::get_if<AuditReport>(&answer.value().body) : nullptr;
    if (report == nullptr) {
      // That partition's failure (unavailable, NOT_PRIMARY everywhere, …) is the command's.
      CommandOutput output = renderAnswer(inv, answer);
      output.err = "tallyctl: audit: partition " + std::to_string(i) + " (" +
                   addressesOf(inv.partitions[i]) + ") did not answer with its audit\n" +
                   output.err;
      return output;
    }
    reports.push_back(*report);
  }
  return renderAnswer(inv, wire::Response{.body = mergePartitionAudits(reports)});
}

}  // namespace tally::ctl
