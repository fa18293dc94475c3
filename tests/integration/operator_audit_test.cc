// Operators with roles and the audit log, with the real tally-ledger and tallyctl over TLS
// (docs/security.md "Operators", "Audit log"): a second operator is created with `operator
// keygen`, enrolled with a role, refused what its role does not allow (and the refusal is in the
// audit log), disabled (its key refused at the handshake), and the log and the operators
// survive a kill -9.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/integration/tls_link_fixture.h"

namespace tally::testing {
namespace {

class OperatorAuditTest : public TlsLinkFixture {};

TEST_F(OperatorAuditTest, ARoleBoundsAnOperatorAndEveryPrivilegedActionIsLogged) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());  // audit log entry 1: admin, policy publish, ok

  const std::string ro_key_file = dir_.file("ro.key");
  const CtlRun keygen = tallyctl({"operator", "keygen", "--key", ro_key_file, "--json"});
  ASSERT_EQ(keygen.code, 0) << keygen.output;
  const std::string ro_key = jsonString(keygen.output, "publicKey");
  ASSERT_FALSE(ro_key.empty()) << keygen.output;
  const CtlRun enrolled =
      asOperator({"operator", "enroll", "--id", "ro", "--public-key", ro_key, "--role", "audit"});
  ASSERT_EQ(enrolled.code, 0) << enrolled.output;  // entry 2
  const std::string ledger_key = ledgerPublicKey();
  auto asRo = [&](std::vector<std::string> args) {
    args.insert(args.begin(),
                {"--ledger", address_, "--key", ro_key_file, "--ledger-key", ledger_key, "--json"});
    return tallyctl(args);
  };

  // The reads are served; a publish is refused naming the role, and nothing changes.
  EXPECT_EQ(asRo({"health"}).code, 0);
  EXPECT_EQ(asRo({"policy", "show"}).code, 0);
  const CtlRun refused = asRo({"policy", "publish", dir_.file("policy.toml")});  // entry 3
  EXPECT_EQ(refused.code, 11) << refused.output;
  EXPECT_NE(refused.output.find("operator 'ro' has role audit, and it needs role policy or admin"),
            std::string::npos)
      << refused.output;
  const CtlRun enroll_refused =
      asRo({"operator", "enroll", "--id", "ro2", "--public-key", ro_key, "--role", "admin"});  // 4
  EXPECT_EQ(enroll_refused.code, 11) << enroll_refused.output;

  // The audit log has all four, in order; the audit role may read it.
  const CtlRun log = asRo({"audit-log"});
  ASSERT_EQ(log.code, 0) << log.output;
  EXPECT_NE(log.output.find("\"sequence\":1"), std::string::npos) << log.output;
  EXPECT_NE(log.output.find("\"lastSequence\":4"), std::string::npos) << log.output;
  EXPECT_NE(log.output.find("\"actor\":\"admin\",\"actorKind\":\"operator\",\"actorRole\":"
                            "\"admin\",\"action\":\"policy publish\""),
            std::string::npos)
      << log.output;
  EXPECT_NE(log.output.find("\"action\":\"operator enroll\",\"target\":\"operator 'ro' role "
                            "audit\",\"outcome\":\"ok\""),
            std::string::npos)
      << log.output;
  EXPECT_NE(log.output.find("\"actor\":\"ro\",\"actorKind\":\"operator\",\"actorRole\":\"audit\","
                            "\"action\":\"policy publish\""),
            std::string::npos)
      << log.output;
  EXPECT_EQ(countOf(log.output, "\"outcome\":\"refused\""), 2u) << log.output;
  EXPECT_EQ(countOf(log.output, "\"requestDigest\":\""), 4u) << log.output;
  // Reads are not privileged actions: none of ro's health, show or audit-log is logged.
  EXPECT_EQ(countOf(log.output, "\"sequence\":"), 4u) << log.output;

  // Disabled: ro's key is refused from now on (exit 11), and the disable is logged (entry 5).
  ASSERT_EQ(asOperator({"operator", "disable", "--id", "ro"}).code, 0);
  const CtlRun after_disable = asRo({"health"});
  EXPECT_EQ(after_disable.code, 11) << after_disable.output;

  // kill -9: the operators and the log are in the store.
  ledger_->kill9();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  const CtlRun listed = asOperator({"operator", "list"});
  ASSERT_EQ(listed.code, 0) << listed.output;
  EXPECT_NE(listed.output.find("\"operatorId\":\"ro\",\"publicKey\":\"" + ro_key +
                               "\",\"role\":\"audit\",\"enabled\":false"),
            std::string::npos)
      << listed.output;
  EXPECT_NE(listed.output.find("\"operatorId\":\"admin\""), std::string::npos) << listed.output;
  EXPECT_EQ(asRo({"health"}).code, 11);
  const CtlRun kept = asOperator({"audit-log", "--after", "3"});
  ASSERT_EQ(kept.code, 0) << kept.output;
  EXPECT_EQ(countOf(kept.output, "\"sequence\":"), 2u) << kept.output;
  EXPECT_NE(kept.output.find("\"action\":\"operator disable\",\"target\":\"operator 'ro'\","
                             "\"outcome\":\"ok\""),
            std::string::npos)
      << kept.output;
  // The first operator cannot be disabled through the protocol (its key is DATA_DIR's).
  const CtlRun admin_disable = asOperator({"operator", "disable", "--id", "admin"});
  EXPECT_NE(admin_disable.code, 0) << admin_disable.output;
  EXPECT_NE(admin_disable.output.find("replace DATA_DIR/operator.key"), std::string::npos)
      << admin_disable.output;
}

// A `policy` operator may publish but not enroll a gateway nor revoke shards (refusals in the
// audit log); and the first operator's key, if leaked, is shut out by replacing
// DATA_DIR/operator.key and restarting (docs/security.md "Operators"): the old key is refused,
// the new one is admin, and the other operators stay as they were.
TEST_F(OperatorAuditTest, APolicyOperatorCannotEnrollAGatewayAndAReplacedFirstKeyShutsTheOldOut) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());  // writes policy.toml; entry 1
  const std::string pol_key_file = dir_.file("pol.key");
  const CtlRun keygen = tallyctl({"operator", "keygen", "--key", pol_key_file, "--json"});
  ASSERT_EQ(keygen.code, 0) << keygen.output;
  const std::string pol_key = jsonString(keygen.output, "publicKey");
  ASSERT_EQ(
      asOperator({"operator", "enroll", "--id", "pol", "--public-key", pol_key, "--role", "policy"})
          .code,
      0);  // entry 2
  const std::string ledger_key = ledgerPublicKey();
  auto withKey = [&](const std::string& key_file, std::vector<std::string> args) {
    args.insert(args.begin(),
                {"--ledger", address_, "--key", key_file, "--ledger-key", ledger_key, "--json"});
    return tallyctl(args);
  };
  const CtlRun published = withKey(pol_key_file, {"policy", "publish", dir_.file("policy.toml")});
  EXPECT_EQ(published.code, 0) << published.output;  // entry 3
  const std::string gateway_key = agentIdentity(dir_.file("agent"), "gw-1");
  const CtlRun enroll =
      withKey(pol_key_file, {"gateway", "enroll", "--id", "gw-1", "--public-key", gateway_key});
  EXPECT_EQ(enroll.code, 11) << enroll.output;  // entry 4
  EXPECT_NE(enroll.output.find("gateway enroll refused: operator 'pol' has role policy, and it "
                               "needs role admin"),
            std::string::npos)
      << enroll.output;
  EXPECT_EQ(withKey(pol_key_file, {"shard", "revoke", "--gateway", "gw-1"}).code, 11);  // entry 5
  const CtlRun log = asOperator({"audit-log"});
  ASSERT_EQ(log.code, 0) << log.output;
  EXPECT_NE(log.output.find("\"actor\":\"pol\",\"actorKind\":\"operator\",\"actorRole\":"
                            "\"policy\",\"action\":\"policy publish\""),
            std::string::npos)
      << log.output;
  EXPECT_NE(log.output.find("\"actor\":\"pol\",\"actorKind\":\"operator\",\"actorRole\":"
                            "\"policy\",\"action\":\"gateway enroll\",\"target\":\"gateway "
                            "'gw-1'\",\"outcome\":\"refused\""),
            std::string::npos)
      << log.output;
  EXPECT_EQ(countOf(log.output, "\"outcome\":\"refused\""), 2u) << log.output;
  const CtlRun gateways = asOperator({"gateway", "list"});
  ASSERT_EQ(gateways.code, 0) << gateways.output;
  EXPECT_EQ(gateways.output.find("gw-1"), std::string::npos) << gateways.output;

  // The first operator's key replaced: the ledger stopped, the file removed (kept aside here to
  // try it), the ledger started again creates a new one.
  const std::string old_key_file = dir_.file("old-operator.key");
  std::filesystem::copy_file(operatorKey(), old_key_file);
  ledger_->kill9();
  ASSERT_TRUE(std::filesystem::remove(operatorKey()));
  ASSERT_NO_FATAL_FAILURE(startLedger());
  EXPECT_EQ(countOf(ledger_->log(), "event=operator_key_created"), 2u) << ledger_->log();
  const CtlRun old_refused = withKey(old_key_file, {"health"});
  EXPECT_EQ(old_refused.code, 11) << old_refused.output;
  const CtlRun new_admin = asOperator({"operator", "list"});
  ASSERT_EQ(new_admin.code, 0) << new_admin.output;
  EXPECT_NE(new_admin.output.find("\"operatorId\":\"pol\""), std::string::npos) << new_admin.output;
  EXPECT_EQ(withKey(pol_key_file, {"policy", "show"}).code, 0);
}

}  // namespace
}  // namespace tally::testing
