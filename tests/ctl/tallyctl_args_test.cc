#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "ctl/args.h"
#include "tests/ctl/ctl_test_support.h"
#include "wire/digest.h"

namespace tally::ctl {
namespace {

Result<Invocation> parse(std::vector<std::string_view> args) { return parseArgs(args); }

Invocation ok(std::vector<std::string_view> args) {
  Result<Invocation> inv = parse(args);
  EXPECT_TRUE(inv.isOk()) << inv.status().toString();
  return inv.isOk() ? inv.value() : Invocation{};
}

using test_support::kRfc8032PublicKey;
using test_support::usageError;

const std::string kHex(64, 'a');

TEST(TallyctlArgsTest, Defaults) {
  const Invocation inv = ok({"health"});
  EXPECT_EQ(inv.command, Command::kHealth);
  EXPECT_EQ(inv.endpoint.kind, client::Endpoint::Kind::kTcp);
  EXPECT_EQ(inv.endpoint.host, "127.0.0.1");
  EXPECT_EQ(inv.endpoint.port, 7411);
  EXPECT_FALSE(inv.json);
  EXPECT_EQ(inv.timeout_ms, 5000u);
}

TEST(TallyctlArgsTest, GlobalFlags) {
  Invocation inv =
      ok({"--ledger", "ledger.internal:9000", "--json", "--timeout-ms", "250", "audit"});
  EXPECT_EQ(inv.endpoint.host, "ledger.internal");
  EXPECT_EQ(inv.endpoint.port, 9000);
  EXPECT_TRUE(inv.json);
  EXPECT_EQ(inv.timeout_ms, 250u);

  inv = ok({"--agent", "/run/tally/agent.sock", "query", "--id", "r1"});
  EXPECT_EQ(inv.endpoint.kind, client::Endpoint::Kind::kUnix);
  EXPECT_EQ(inv.endpoint.path, "/run/tally/agent.sock");

  // After the command, and in --flag=value form.
  inv = ok({"query", "--id=r1", "--json", "--ledger=[::1]:7411"});
  EXPECT_TRUE(inv.json);
  EXPECT_EQ(inv.endpoint.host, "::1");
  EXPECT_EQ(inv.reservation_id, "r1");

  // A primary and its standbys: every address, the first as the endpoint.
  inv = ok({"--ledger", "10.0.0.6:7411,10.0.0.5:7411", "health"});
  ASSERT_EQ(inv.ledgers.size(), 2u);
  EXPECT_EQ(inv.endpoint.host, "10.0.0.6");
  EXPECT_EQ(inv.ledgers[1].host, "10.0.0.5");
  EXPECT_EQ(ok({"health"}).ledgers.size(), 1u);
  EXPECT_TRUE(ok({"--agent", "/run/tally/agent.sock", "health"}).ledgers.empty());
  EXPECT_CONTAINS(usageError({"--ledger", "a:1,,b:2", "health"}), "--ledger");
}

TEST(TallyctlArgsTest, PolicyCommands) {
  Invocation inv = ok({"policy", "publish", "examples/policy.toml"});
  EXPECT_EQ(inv.command, Command::kPolicyPublish);
  EXPECT_EQ(inv.policy_file, "examples/policy.toml");
  EXPECT_EQ(ok({"policy", "rollback"}).command, Command::kPolicyRollback);
  inv = ok({"policy", "show"});
  EXPECT_EQ(inv.command, Command::kPolicyShow);
  EXPECT_EQ(inv.generation, 0u);
  EXPECT_EQ(ok({"policy", "show", "--generation", "3"}).generation, 3u);
}

TEST(TallyctlArgsTest, Reserve) {
  Invocation inv = ok({"reserve", "--id", "r-1", "--subject", "tenant-7", "--route",
                       "chat.generate", "--units", "600"});
  EXPECT_EQ(inv.command, Command::kReserve);
  EXPECT_EQ(inv.reservation_id, "r-1");
  EXPECT_EQ(inv.subject, "tenant-7");
  EXPECT_EQ(inv.route, "chat.generate");
  EXPECT_EQ(inv.units, 600u);
  EXPECT_FALSE(inv.digest.has_value());
  EXPECT_EQ(inv.priority, 0u);

  inv = ok({"reserve", "--id", "r-1", "--subject", "s", "--route", "r", "--units", "1", "--digest",
            kHex, "--priority", "7"});
  ASSERT_TRUE(inv.digest.has_value());
  EXPECT_EQ(wire::digestHex(*inv.digest), kHex);
  EXPECT_EQ(inv.priority, 7u);
  // Either case of hex.
  EXPECT_TRUE(ok({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units", "1",
                  "--digest", std::string(64, 'F')})
                  .digest.has_value());
}

TEST(TallyctlArgsTest, ReserveRegion) {
  EXPECT_EQ(ok({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units", "1"}).region,
            "");
  EXPECT_EQ(ok({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units", "1",
                "--region", "eu-west-1"})
                .region,
            "eu-west-1");
  EXPECT_CONTAINS(usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units",
                              "1", "--region", std::string(65, 'x')}),
                  "--region is longer than 64 bytes");
  EXPECT_CONTAINS(usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units",
                              "1", "--region", ""}),
                  "--region must not be empty");
  EXPECT_CONTAINS(usageError({"start", "--id", "r", "--operation", "o", "--region", "eu"}),
                  "'start' takes no --region");
}

TEST(TallyctlArgsTest, ReservationCommands) {
  Invocation inv = ok({"start", "--id", "r1", "--operation", "op1"});
  EXPECT_EQ(inv.command, Command::kStart);
  EXPECT_EQ(inv.operation_id, "op1");

  inv = ok({"settle", "--id", "r1", "--operation", "op1", "--actual", "200"});
  EXPECT_EQ(inv.command, Command::kSettle);
  EXPECT_EQ(inv.actual_units, 200u);
  EXPECT_EQ(ok({"settle", "--id", "r1", "--operation", "o", "--actual", "0"}).actual_units, 0u);

  EXPECT_EQ(ok({"release", "--id", "r1"}).command, Command::kRelease);

  inv = ok({"extend", "--id", "r1", "--operation", "op1", "--total", "900"});
  EXPECT_EQ(inv.command, Command::kExtend);
  EXPECT_EQ(inv.reservation_id, "r1");
  EXPECT_EQ(inv.operation_id, "op1");
  EXPECT_EQ(inv.total_units, 900u);
  EXPECT_STREQ(commandName(Command::kExtend), "extend");

  inv = ok({"unknown", "--id", "r1", "--operation", "op1"});
  EXPECT_EQ(inv.command, Command::kMarkUnknown);
  EXPECT_EQ(inv.operation_id, "op1");

  inv = ok({"report", "--id", "r1", "--operation", "op1", "--actual", "900"});
  EXPECT_EQ(inv.command, Command::kReport);
  EXPECT_EQ(inv.actual_units, 900u);

  EXPECT_EQ(ok({"query", "--id", "r1"}).command, Command::kQuery);
}

TEST(TallyctlArgsTest, AuditAndHealth) {
  Invocation inv = ok({"audit"});
  EXPECT_EQ(inv.command, Command::kAudit);
  EXPECT_TRUE(inv.subject.empty());
  inv = ok({"audit", "--subject", "tenant-7", "--route", "chat.generate"});
  EXPECT_EQ(inv.subject, "tenant-7");
  EXPECT_EQ(inv.route, "chat.generate");
  EXPECT_EQ(ok({"health"}).command, Command::kHealth);
}

TEST(TallyctlArgsTest, HelpAndVersion) {
  EXPECT_EQ(ok({"--help"}).command, Command::kHelp);
  EXPECT_EQ(ok({"-h"}).command, Command::kHelp);
  EXPECT_EQ(ok({"help"}).command, Command::kHelp);
  EXPECT_EQ(ok({"reserve", "--help"}).command, Command::kHelp);
  EXPECT_EQ(ok({"--bogus", "--help"}).command, Command::kHelp);
  EXPECT_EQ(ok({"--version"}).command, Command::kVersion);
  EXPECT_EQ(ok({"version"}).command, Command::kVersion);
}

TEST(TallyctlArgsTest, UsageNamesEveryCommandAndExitCode) {
  const std::string text = usageText();
  for (const char* word :
       {"policy publish", "policy rollback", "policy show", "reserve", "start", "settle", "release",
        "unknown", "report", "query", "audit", "health", "extend", "--total", "--ledger", "--agent",
        "--json", "--timeout-ms", "--digest"}) {
    EXPECT_CONTAINS(text, word);
  }
  for (const char* code : {"\n  0 ", "\n  2 ", "\n  3 ", "\n  4 ", "\n  5 ", "\n  6 ", "\n  7 ",
                           "\n  8 ", "\n  9 ", "\n  10 "}) {
    EXPECT_CONTAINS(text, code);
  }
}

TEST(TallyctlArgsTest, UnknownCommandsAndFlags) {
  EXPECT_CONTAINS(usageError({}), "no command");
  EXPECT_CONTAINS(usageError({"frobnicate"}), "unknown command 'frobnicate'");
  EXPECT_CONTAINS(usageError({"policy"}), "subcommand");
  EXPECT_CONTAINS(usageError({"policy", "delete"}), "unknown policy subcommand 'delete'");
  EXPECT_CONTAINS(usageError({"policy", "publish"}), "FILE");
  EXPECT_CONTAINS(usageError({"--bogus", "health"}), "unknown flag '--bogus'");
  EXPECT_CONTAINS(usageError({"health", "-x"}), "unknown flag '-x'");
  EXPECT_CONTAINS(usageError({"query", "--id", "r", "--verbose"}), "unknown flag '--verbose'");
  EXPECT_CONTAINS(usageError({"health", "extra"}), "unexpected argument 'extra'");
  EXPECT_CONTAINS(usageError({"policy", "rollback", "now"}), "unexpected argument 'now'");
  EXPECT_CONTAINS(usageError({"--json=yes", "health"}), "--json takes no value");
}

TEST(TallyctlArgsTest, JsonIsSeenAnywhereEvenOnARefusedLine) {
  using Args = std::vector<std::string_view>;
  EXPECT_TRUE(jsonRequested(Args{"--json", "frobnicate"}));
  EXPECT_TRUE(jsonRequested(Args{"frobnicate", "--json"}));
  // After the mistake: the scan does not stop at the first error.
  EXPECT_TRUE(jsonRequested(Args{"--bogus", "health", "--json"}));
  EXPECT_TRUE(jsonRequested(Args{"reserve", "--units", "-5", "--json"}));
  EXPECT_TRUE(jsonRequested(Args{"health", "-x", "--timeout-ms", "0", "--json"}));
  EXPECT_FALSE(jsonRequested(Args{"--bogus", "health"}));
  // Another flag's value, or after "--", is not the flag.
  EXPECT_FALSE(jsonRequested(Args{"query", "--id", "--json"}));
  EXPECT_FALSE(jsonRequested(Args{"query", "--", "--json"}));
  EXPECT_TRUE(ok({"health", "--json"}).json);
  EXPECT_TRUE(ok({"--help", "--json"}).json);
  EXPECT_TRUE(ok({"--json", "--version"}).json);
  // The first mistake is the one reported, whatever follows it.
  EXPECT_CONTAINS(usageError({"--bogus", "--other", "health"}), "unknown flag '--bogus'");
}

TEST(TallyctlArgsTest, FlagNotTakenByCommand) {
  EXPECT_CONTAINS(usageError({"start", "--id", "r", "--operation", "o", "--units", "5"}),
                  "'start' takes no --units");
  EXPECT_CONTAINS(usageError({"release", "--id", "r", "--operation", "o"}),
                  "'release' takes no --operation");
  EXPECT_CONTAINS(usageError({"health", "--id", "r"}), "'health' takes no --id");
  EXPECT_CONTAINS(usageError({"query", "--id", "r", "--digest", kHex}), "takes no --digest");
}

TEST(TallyctlArgsTest, MissingRequiredFlags) {
  const std::vector<std::string_view> reserve = {"reserve", "--id", "r",       "--subject", "s",
                                                 "--route", "r",    "--units", "5"};
  // Dropping any flag/value pair of reserve names that flag.
  for (size_t i = 1; i < reserve.size(); i += 2) {
    std::vector<std::string_view> args = reserve;
    args.erase(args.begin() + static_cast<ptrdiff_t>(i),
               args.begin() + static_cast<ptrdiff_t>(i) + 2);
    EXPECT_CONTAINS(usageError(args), "'reserve' needs " + std::string(reserve[i]));
  }
  EXPECT_CONTAINS(usageError({"start", "--id", "r"}), "'start' needs --operation");
  EXPECT_CONTAINS(usageError({"settle", "--id", "r", "--operation", "o"}),
                  "'settle' needs --actual");
  EXPECT_CONTAINS(usageError({"extend", "--id", "r", "--operation", "o"}),
                  "'extend' needs --total");
  EXPECT_CONTAINS(usageError({"extend", "--id", "r", "--operation", "o", "--total", "0"}),
                  "--total");
  EXPECT_CONTAINS(usageError({"release"}), "'release' needs --id");
  EXPECT_CONTAINS(usageError({"unknown", "--id", "r"}), "'unknown' needs --operation");
  EXPECT_CONTAINS(usageError({"report", "--id", "r", "--actual", "3"}),
                  "'report' needs --operation");
  EXPECT_CONTAINS(usageError({"query"}), "'query' needs --id");
}

TEST(TallyctlArgsTest, FlagWithoutValue) {
  EXPECT_CONTAINS(usageError({"query", "--id"}), "--id needs a value");
  EXPECT_CONTAINS(usageError({"health", "--ledger"}), "--ledger needs a value");
}

TEST(TallyctlArgsTest, BadNumbers) {
  const auto reserveUnits = [](std::string_view units) {
    return usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units", units});
  };
  EXPECT_CONTAINS(reserveUnits("-5"), "--units must not be negative");
  EXPECT_CONTAINS(reserveUnits("abc"), "--units must be a non-negative integer");
  EXPECT_CONTAINS(reserveUnits("12x"), "--units must be a non-negative integer");
  EXPECT_CONTAINS(reserveUnits("1.5"), "--units must be a non-negative integer");
  EXPECT_CONTAINS(reserveUnits(""), "--units must be a non-negative integer");
  EXPECT_CONTAINS(reserveUnits("+5"), "--units must be a non-negative integer");
  EXPECT_CONTAINS(reserveUnits("0"), "--units must be at least 1");
  EXPECT_CONTAINS(reserveUnits("99999999999999999999999"), "--units is too large");
  EXPECT_CONTAINS(usageError({"settle", "--id", "r", "--operation", "o", "--actual", "-1"}),
                  "--actual must not be negative");
  EXPECT_CONTAINS(usageError({"report", "--id", "r", "--operation", "o", "--actual", "x"}),
                  "--actual must be a non-negative integer");
  EXPECT_CONTAINS(usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units",
                              "1", "--priority", "4294967296"}),
                  "--priority is too large");
  EXPECT_CONTAINS(usageError({"--timeout-ms", "0", "health"}), "--timeout-ms must be at least 1");
  EXPECT_CONTAINS(usageError({"--timeout-ms", "soon", "health"}), "--timeout-ms");
}

TEST(TallyctlArgsTest, BadDigest) {
  for (const std::string& digest :
       {std::string(63, 'a'), std::string(65, 'a'), std::string(63, 'a') + "g", std::string()}) {
    EXPECT_CONTAINS(usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units",
                                "1", "--digest", digest}),
                    "--digest must be exactly 64 hexadecimal characters");
  }
}

TEST(TallyctlArgsTest, BadTextValues) {
  EXPECT_CONTAINS(usageError({"query", "--id", ""}), "--id must not be empty");
  const std::string long_id(129, 'x');
  EXPECT_CONTAINS(usageError({"query", "--id", long_id}), "--id is longer than 128 bytes");
  EXPECT_TRUE(parse({"query", "--id", std::string(128, 'x')}).isOk());
  const std::string long_operation(129, 'o');
  EXPECT_CONTAINS(usageError({"start", "--id", "r", "--operation", long_operation}),
                  "--operation is longer than 128 bytes");
}

TEST(TallyctlArgsTest, RepeatedFlags) {
  EXPECT_CONTAINS(usageError({"query", "--id", "a", "--id", "b"}), "--id given twice");
  EXPECT_CONTAINS(usageError({"--json", "--ledger", "a:1", "--ledger", "b:2", "health"}),
                  "--ledger given twice");
}

TEST(TallyctlArgsTest, BadEndpoints) {
  EXPECT_CONTAINS(usageError({"--ledger", "127.0.0.1", "health"}), "--ledger");
  EXPECT_CONTAINS(usageError({"--ledger", "127.0.0.1:0", "health"}), "port");
  EXPECT_CONTAINS(usageError({"--ledger", "127.0.0.1:65536", "health"}), "port");
  EXPECT_CONTAINS(usageError({"--ledger", ":7411", "health"}), "no host");
  EXPECT_CONTAINS(usageError({"--ledger", "::1:7411", "health"}), "[ADDRESS]:PORT");
  EXPECT_CONTAINS(usageError({"--agent", "", "health"}), "--agent");
  EXPECT_CONTAINS(usageError({"--agent", std::string(120, 'p'), "health"}), "--agent");
  EXPECT_CONTAINS(usageError({"--ledger", "a:1", "--agent", "/tmp/s", "health"}),
                  "--ledger and --agent");
}

TEST(TallyctlArgsTest, DoubleDashEndsFlags) {
  // An id that looks like a flag can still be given with '='.
  EXPECT_EQ(ok({"query", "--id=--weird"}).reservation_id, "--weird");
  EXPECT_EQ(ok({"policy", "publish", "--", "-policy.toml"}).policy_file, "-policy.toml");
}

// --- Gateways and emergency shards ------------------------------------------------------------

TEST(TallyctlArgsTest, GatewayCommands) {
  Invocation inv = ok({"gateway", "enroll", "--id", "gw-eu-1", "--public-key", kRfc8032PublicKey});
  EXPECT_EQ(inv.command, Command::kGatewayEnroll);
  EXPECT_EQ(inv.gateway_name, "gw-eu-1");
  ASSERT_TRUE(inv.public_key.has_value());
  EXPECT_EQ((*inv.public_key)[0], 0xd7);
  EXPECT_TRUE(inv.reservation_id.empty());
  EXPECT_EQ(ok({"gateway", "list", "--json"}).command, Command::kGatewayList);
  inv = ok({"gateway", "disable", "--id=gw-2"});
  EXPECT_EQ(inv.command, Command::kGatewayDisable);
  EXPECT_EQ(inv.gateway_name, "gw-2");
  EXPECT_EQ(ok({"--agent", "/tmp/a.sock", "gateway", "enable", "--id", "gw-2"}).command,
            Command::kGatewayEnable);
}

TEST(TallyctlArgsTest, GatewayUsageErrors) {
  EXPECT_CONTAINS(usageError({"gateway"}), "needs a subcommand");
  EXPECT_CONTAINS(usageError({"gateway", "remove", "--id", "g"}), "unknown gateway subcommand");
  EXPECT_CONTAINS(usageError({"gateway", "enroll", "--id", "gw"}), "needs --public-key");
  EXPECT_CONTAINS(usageError({"gateway", "enroll", "--public-key", kRfc8032PublicKey}),
                  "needs --id");
  EXPECT_CONTAINS(usageError({"gateway", "enroll", "--id", "gw", "--public-key", "abc"}),
                  "--public-key: public key");
  EXPECT_CONTAINS(usageError({"gateway", "enroll", "--id", "gw", "--public-key", kRfc8032PublicKey,
                              "--public-key", kRfc8032PublicKey}),
                  "--public-key given twice");
  EXPECT_CONTAINS(
      usageError({"gateway", "enroll", "--id", "gw one", "--public-key", kRfc8032PublicKey}),
      "--id: gateway name");
  EXPECT_CONTAINS(usageError({"gateway", "disable", "--id", std::string(129, 'g')}),
                  "--id: gateway name");
  EXPECT_CONTAINS(usageError({"gateway", "disable"}), "needs --id");
  EXPECT_CONTAINS(usageError({"gateway", "list", "--id", "g"}), "'gateway list' takes no --id");
  EXPECT_CONTAINS(usageError({"gateway", "list", "extra"}), "unexpected argument 'extra'");
}

TEST(TallyctlArgsTest, ShardCommands) {
  Invocation inv = ok({"shard", "list"});
  EXPECT_EQ(inv.command, Command::kShardList);
  EXPECT_TRUE(inv.gateway_name.empty());
  EXPECT_FALSE(inv.shard_state.has_value());
  inv = ok({"shard", "list", "--gateway", "gw-1", "--state", "WRITTEN_OFF"});
  EXPECT_EQ(inv.gateway_name, "gw-1");
  EXPECT_EQ(inv.shard_state, ShardState::kWrittenOff);
  EXPECT_EQ(ok({"shard", "list", "--state=reconciling"}).shard_state, ShardState::kReconciling);
  inv = ok({"shard", "revoke", "--id", "shard-3"});
  EXPECT_EQ(inv.command, Command::kShardRevoke);
  EXPECT_EQ(inv.shard_id, "shard-3");
  EXPECT_TRUE(inv.gateway_name.empty());
  EXPECT_TRUE(inv.reservation_id.empty());
  inv = ok({"shard", "revoke", "--gateway", "gw-1"});
  EXPECT_TRUE(inv.shard_id.empty());
  EXPECT_EQ(inv.gateway_name, "gw-1");
  inv = ok({"shard", "write-off", "--id", "shard-3"});
  EXPECT_EQ(inv.command, Command::kShardWriteOff);
  EXPECT_EQ(inv.shard_id, "shard-3");
}

TEST(TallyctlArgsTest, ShardUsageErrors) {
  EXPECT_CONTAINS(usageError({"shard"}), "needs a subcommand");
  EXPECT_CONTAINS(usageError({"shard", "delete"}), "unknown shard subcommand");
  EXPECT_CONTAINS(usageError({"shard", "revoke"}), "exactly one of --id and --gateway");
  EXPECT_CONTAINS(usageError({"shard", "revoke", "--id", "s", "--gateway", "g"}),
                  "exactly one of --id and --gateway");
  EXPECT_CONTAINS(usageError({"shard", "revoke", "--id", "s", "--id", "t"}), "--id given twice");
  EXPECT_CONTAINS(usageError({"shard", "revoke", "--gateway", "g", "--gateway", "h"}),
                  "--gateway given twice");
  EXPECT_CONTAINS(usageError({"shard", "revoke", "--id", ""}), "--id must not be empty");
  EXPECT_CONTAINS(usageError({"shard", "write-off"}), "needs --id");
  EXPECT_CONTAINS(usageError({"shard", "write-off", "--id", std::string(129, 's')}),
                  "--id is longer than 128 bytes");
  EXPECT_CONTAINS(usageError({"shard", "write-off", "--id", "s", "--gateway", "g"}),
                  "'shard write-off' takes no --gateway");
  EXPECT_CONTAINS(usageError({"shard", "list", "--state", "OPEN"}),
                  "--state must be one of ISSUED, REVOKED, RECONCILING, RECONCILED, CONFLICT, "
                  "WRITTEN_OFF");
  EXPECT_CONTAINS(usageError({"shard", "list", "--gateway", "g/h"}), "--gateway: gateway name");
  EXPECT_CONTAINS(usageError({"reserve", "--id", "r", "--subject", "s", "--route", "r", "--units",
                              "1", "--state", "ISSUED"}),
                  "'reserve' takes no --state");
}

}  // namespace
}  // namespace tally::ctl
