#include "tests/integration/shard_fleet.h"

#include <gtest/gtest.h>

#include <sstream>
#include <utility>
#include <variant>

namespace tally::testing {

Budget shardBudget(const ShardPolicySpec& spec) {
  Budget budget = makeBudget({.subject = kShardSubject, .route = kShardRoute, .burst = spec.burst});
  budget.emergency = {
      .enabled = true, .shard_units = spec.shard_units, .shard_ttl_ms = spec.shard_ttl_ms};
  return budget;
}

Units Admissions::shardUnits() const {
  Units sum = 0;
  for (const auto& [origin, units] : units_by_origin) {
    if (isShardOrigin(origin)) sum += units;
  }
  return sum;
}

bool isShardOrigin(const std::string& origin) { return origin.rfind("shard-", 0) == 0; }

std::string describe(const ShardLedgerView& view) {
  std::ostringstream out;
  out << view.grant.shard_id << " " << shardStateName(view.state)
      << " gw=" << view.grant.gateway_name << " gen=" << view.grant.policy_generation
      << " boot=" << view.grant.gateway_boot_epoch << " fence=" << view.grant.fence << "/"
      << view.current_fence << " allocated=" << view.grant.allocated_units
      << " spent=" << view.spent_units << " reminted=" << view.reminted_units
      << " retired=" << view.retired_units << " debt=" << view.debt_units
      << " conserved=" << view.conserved;
  if (view.reported) {
    const ShardBalances& l = view.last_reported;
    out << " local{avail=" << l.local_available << " reserved=" << l.local_reserved
        << " spent=" << l.local_spent << " retired=" << l.local_retired
        << " overspent=" << l.overspent << "}";
  }
  return out.str();
}

void ShardFleetTest::startShardLedger(const ShardPolicySpec& spec, Generation* generation) {
  TALLY_ASSIGN_OR_FAIL(const std::string out,
                       runForOutput(binaryPath("tally-ledger"),
                                    {"--data-dir", ledger_.dataDir(), "identity", "--json"},
                                    dir_.file("ledger-identity.log")));
  ledger_key_ = jsonString(out, "publicKey");
  ASSERT_EQ(ledger_key_.size(), 44u) << out;
  ASSERT_EQ(jsonString(out, "keyId").size(), 16u) << out;
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({shardBudget(spec)}, generation));
}

std::string ShardFleetTest::gatewayName(size_t index) const {
  auto it = gateway_names_.find(index);
  return it == gateway_names_.end() ? "gw-" + std::to_string(index) : it->second;
}

void ShardFleetTest::enrollGateway(size_t index, const std::string& gateway_name) {
  const std::string tag = "agent" + std::to_string(index);
  TALLY_ASSIGN_OR_FAIL(const std::string out,
                       runForOutput(binaryPath("tally-agent"),
                                    {"--data-dir", dir_.file(tag), "--gateway-name", gateway_name,
                                     "identity", "--json"},
                                    dir_.file(tag + "-identity.log")));
  ASSERT_EQ(jsonString(out, "gatewayId"), gateway_name) << out;
  TALLY_ASSIGN_OR_FAIL(const std::string enrolled,
                       tallyctl({"gateway", "enroll", "--id", gateway_name, "--public-key",
                                 jsonString(out, "publicKey")}));
  ASSERT_NE(enrolled.find("\"code\":\"OK\""), std::string::npos) << enrolled;
  gateway_names_[index] = gateway_name;
}

AgentSettings ShardFleetTest::shardSettings(const ShardAgentSpec& spec) const {
  AgentSettings settings;
  settings.failures_to_partition = 2;
  settings.partition_after_ms = 800;
  settings.extra_args = {"--ledger-public-key", ledger_key_};
  std::ostringstream toml;
  toml << "[emergency]\naccounts = [\"" << kShardSubject << " " << kShardRoute << "\"]\n"
       << "shards_on_hand = " << spec.shards_on_hand << "\n"
       << "refresh_before_expiry_ms = " << spec.refresh_before_expiry_ms << "\n"
       << "hold_ttl_ms = " << spec.hold_ttl_ms << "\n";
  settings.extra_toml = toml.str();
  return settings;
}

void ShardFleetTest::startShardAgent(size_t index, const std::string& ledger_address,
                                     const ShardAgentSpec& spec) {
  if (gateway_names_.count(index) == 0) {
    const std::string name =
        spec.gateway_name.empty() ? "gw-" + std::to_string(index) : spec.gateway_name;
    ASSERT_NO_FATAL_FAILURE(enrollGateway(index, name));
  }
  ASSERT_NO_FATAL_FAILURE(startAgent(index, ledger_address, shardSettings(spec)));
}

bool ShardFleetTest::waitFor(const std::function<bool()>& done, uint64_t timeout_ms) {
  return pollUntil(done, timeout_ms, 25);
}

std::string ShardFleetTest::metricsText(size_t index) {
  Result<std::string> body = httpGet(agents_.at(index)->metricsPort(), "/metrics", 5'000);
  return body.isOk() ? body.value() : std::string();
}

double ShardFleetTest::metric(size_t index, const std::string& name,
                              const std::map<std::string, std::string>& labels) {
  Result<std::string> body = httpGet(agents_.at(index)->metricsPort(), "/metrics", 5'000);
  return body.isOk() ? metricSum(body.value(), name, labels) : -1;
}

std::string ShardFleetTest::agentHealth(size_t index) {
  Result<std::unique_ptr<client::BlockingClient>> connected = agents_.at(index)->connect();
  if (!connected.isOk()) return "error";
  Result<wire::Response> response = connected.value()->call(wire::HealthRequest{}, kCallTimeoutMs);
  if (!response.isOk()) return "error";
  const auto* reply = std::get_if<wire::HealthReply>(&response.value().body);
  return reply == nullptr ? "?" : reply->status;
}

bool ShardFleetTest::waitCutOff(size_t index) {
  return waitFor([&] {
    const std::string status = agentHealth(index);
    return status == "PARTITIONED" || status == "DISCONNECTED";
  });
}

std::optional<ShardLedgerView> ShardFleetTest::waitUsableShard(size_t index,
                                                               const std::string& exclude) {
  std::optional<ShardLedgerView> found;
  const std::string name = gatewayName(index);
  const bool ok = waitFor([&] {
    if (metric(index, "tally_agent_shards", {{"condition", "usable"}}) < 1) return false;
    for (const ShardLedgerView& view : ledgerShards(name)) {
      if (view.state == ShardState::kIssued && view.grant.shard_id != exclude) found = view;
    }
    return found.has_value();
  });
  return ok ? found : std::nullopt;
}

std::vector<ShardLedgerView> listLedgerShards(client::BlockingClient& client,
                                              const std::string& gateway_name) {
  Result<wire::Response> response =
      client.call(wire::ListShardsRequest{.gateway_name = gateway_name}, kCallTimeoutMs);
  if (!response.isOk()) return {};
  const auto* reply = std::get_if<ShardReply>(&response.value().body);
  return reply == nullptr ? std::vector<ShardLedgerView>{} : reply->shards;
}

std::optional<ShardLedgerView> findShard(const std::vector<ShardLedgerView>& shards,
                                         const std::string& shard_id) {
  for (const ShardLedgerView& view : shards) {
    if (view.grant.shard_id == shard_id) return view;
  }
  return std::nullopt;
}

std::vector<ShardLedgerView> ShardFleetTest::ledgerShards(const std::string& gateway_name) {
  return listLedgerShards(*client_, gateway_name);
}

std::optional<ShardLedgerView> ShardFleetTest::ledgerShard(const std::string& shard_id) {
  return findShard(ledgerShards(), shard_id);
}

std::optional<ShardLedgerView> ShardFleetTest::waitShard(
    const std::string& shard_id, const std::function<bool(const ShardLedgerView&)>& done,
    uint64_t timeout_ms) {
  std::optional<ShardLedgerView> view;
  waitFor(
      [&] {
        view = ledgerShard(shard_id);
        return view.has_value() && done(*view);
      },
      timeout_ms);
  return view;
}

Result<std::string> ShardFleetTest::tallyctl(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"--ledger", ledgerAddress(), "--json", "--insecure"};
  full.insert(full.end(), args.begin(), args.end());
  // One output file per call: runForOutput returns the whole file, and Process appends.
  return runForOutput(binaryPath("tallyctl"), full,
                      dir_.file("tallyctl-" + std::to_string(++tallyctl_calls_) + ".log"));
}

Admissions ShardFleetTest::reserveMany(size_t index, const std::string& prefix, size_t count,
                                       Units units) {
  Admissions admissions;
  std::unique_ptr<client::BlockingClient> gw = gateway(index);
  if (gw == nullptr) return admissions;
  for (size_t i = 0; i < count; ++i) {
    const std::string id = prefix + "-" + std::to_string(i);
    Result<AgentAnswer> answer = callAgent(*gw, makeReserve({.id = id, .units = units}));
    if (answer.isOk() && !answer.value().is_error && answer.value().reply.code == ReplyCode::kOk) {
      admissions.units_by_origin[answer.value().reply.receipt.origin] += units;
      admissions.admitted_ids.push_back(id);
    } else {
      ++admissions.rejected;
    }
  }
  return admissions;
}

void ShardFleetTest::checkShardInvariants(AuditReport* out) {
  AuditReport report;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&report));
  std::map<AccountKey, Units> retired_by_account;
  for (const ShardLedgerView& view : report.shards) {
    const std::string what = describe(view);
    EXPECT_TRUE(view.conserved) << what;
    EXPECT_EQ(view.grant.allocated_units,
              view.spent_units + view.reminted_units + view.retired_units)
        << what;
    const ShardBalances& local = view.last_reported;
    if (!view.reported) {
      EXPECT_EQ(view.reminted_units, 0u) << "reminted without a report: " << what;
    } else {
      EXPECT_EQ(local.allocated, local.local_available + local.local_reserved + local.local_spent +
                                     local.local_retired)
          << "the agent's equation: " << what;
      EXPECT_LE(view.reminted_units, local.local_available + local.local_retired)
          << "reminted more than the report proved unused: " << what;
    }
    if (view.state == ShardState::kReconciling) {
      EXPECT_GE(view.retired_units, local.local_reserved)
          << "holding (STARTED/UNKNOWN) units left retirement: " << what;
    }
    retired_by_account[AccountKey{view.grant.subject, view.grant.route,
                                  view.grant.policy_generation}] += view.retired_units;
  }
  for (const AccountView& account : report.accounts) {
    EXPECT_EQ(account.balances.retired_for_emergency, retired_by_account[account.key])
        << "retiredForEmergency of " << account.key.subject << "/" << account.key.route << " gen "
        << account.key.generation << " is not the shards' retired sum\n"
        << describe(report);
  }
  if (out != nullptr) *out = std::move(report);
}

}  // namespace tally::testing
