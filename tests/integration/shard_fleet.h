#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/ledger_types.h"
#include "core/shard_types.h"
#include "tests/integration/agent_harness.h"

// The fixture of the emergency-shard fault tests (SPEC §6, §8; docs/SHARDS.md): one real
// tally-ledger with its signing key and a policy with emergency mode on, real tally-agents each
// with its own gateway identity enrolled at the ledger (or sharing one, for the copied-data-dir
// fault), and the checks every test ends with. Every wait polls an observable condition (a
// metric, the ledger's shard list, the agent's health) with a deadline.

namespace tally::testing {

inline constexpr const char* kShardSubject = "tenant-1";
inline constexpr const char* kShardRoute = "chat";

struct ShardPolicySpec {
  Units burst = 1'000;
  Units shard_units = 100;
  uint64_t shard_ttl_ms = 60'000;
};
Budget shardBudget(const ShardPolicySpec& spec);

struct ShardAgentSpec {
  std::string gateway_name;  // empty: "gw-<index>"
  uint64_t shards_on_hand = 1;
  uint64_t refresh_before_expiry_ms = 1'000;
  uint64_t hold_ttl_ms = 600'000;
};

// A reservation answer counted per origin: what a shard admitted during a partition.
struct Admissions {
  std::map<std::string, Units> units_by_origin;  // origin (shard id; "" = central) -> Σ units
  std::vector<std::string> admitted_ids;
  size_t rejected = 0;
  Units shardUnits() const;
};

// The ledger's shards issued to `gateway_name` ("" = every gateway), as `client` lists them;
// empty if the call fails. The one with `shard_id`, if listed.
std::vector<ShardLedgerView> listLedgerShards(client::BlockingClient& client,
                                              const std::string& gateway_name);
std::optional<ShardLedgerView> findShard(const std::vector<ShardLedgerView>& shards,
                                         const std::string& shard_id);

class ShardFleetTest : public AgentFleetTest {
 protected:
  // `tally-ledger identity --json` on the data dir (creating the key), then the ledger, then the
  // policy (its generation in *generation if given).
  void startShardLedger(const ShardPolicySpec& spec = {}, Generation* generation = nullptr);
  // `tally-agent --data-dir … --gateway-name NAME identity --json`, then `gateway enroll`.
  void enrollGateway(size_t index, const std::string& gateway_name);
  // Enrolls agent `index` (unless already done) and starts it with the ledger key and an
  // [emergency] account for (kShardSubject, kShardRoute).
  void startShardAgent(size_t index, const std::string& ledger_address,
                       const ShardAgentSpec& spec = {});
  AgentSettings shardSettings(const ShardAgentSpec& spec) const;
  std::string gatewayName(size_t index) const;

  // Bounded polling; the condition is checked once more at the deadline.
  bool waitFor(const std::function<bool()>& done, uint64_t timeout_ms = kDeliveryTimeoutMs);
  // A metric of agent `index` (summed over matching samples), or -1 if the scrape failed.
  double metric(size_t index, const std::string& name,
                const std::map<std::string, std::string>& labels = {});
  std::string metricsText(size_t index);
  // The agent's own health answer: HEALTHY, DEGRADED, PARTITIONED, DISCONNECTED (or "error").
  std::string agentHealth(size_t index);
  // Waits until agent `index` no longer uses the ledger: PARTITIONED (connected, past the
  // thresholds) or DISCONNECTED (no connection, e.g. the ledger is dead).
  bool waitCutOff(size_t index);
  // Waits until agent `index` holds a usable shard and the ledger lists an ISSUED shard of its
  // gateway other than `exclude`; returns the ledger's view of that shard.
  std::optional<ShardLedgerView> waitUsableShard(size_t index, const std::string& exclude = "");

  // The ledger's shards (of one gateway, if given).
  std::vector<ShardLedgerView> ledgerShards(const std::string& gateway_name = "");
  std::optional<ShardLedgerView> ledgerShard(const std::string& shard_id);
  std::optional<ShardLedgerView> waitShard(const std::string& shard_id,
                                           const std::function<bool(const ShardLedgerView&)>& done,
                                           uint64_t timeout_ms = kDeliveryTimeoutMs);
  // tallyctl against the ledger; its stdout (kUnavailable if it exited non-zero).
  Result<std::string> tallyctl(const std::vector<std::string>& args);

  // `count` reserves of `units` through agent `index`, ids PREFIX-0…; counts who admitted what.
  Admissions reserveMany(size_t index, const std::string& prefix, size_t count, Units units);

  // The checks after every fault (SPEC §8): the audit conserves (central and every shard's
  // equation allocated = spent + reminted + retired, every account's retiredForEmergency = Σ
  // retired of its shards); nothing reminted beyond what the last accepted report proved unused
  // (a duplicate recovery would exceed it); a reconciling shard keeps its holding (RESERVED,
  // STARTED, USAGE_UNKNOWN) units retired; no account or shard has negative balances.
  void checkShardInvariants(AuditReport* report = nullptr);

  std::string ledger_key_;
  std::map<size_t, std::string> gateway_names_;  // enrolled
  int tallyctl_calls_ = 0;
};

std::string describe(const ShardLedgerView& view);
bool isShardOrigin(const std::string& origin);

}  // namespace tally::testing
