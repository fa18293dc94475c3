// OperatorRegistry, AuditLog and auditLogEntryOf (docs/security.md "Operators", "Audit log").

#include "core/operator_registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/audit_entry.h"
#include "core/audit_log.h"
#include "core/ledger.h"
#include "core/limits.h"

namespace tally {
namespace {

PublicKey key(uint8_t n) { return PublicKey{n, 0xAA}; }

TEST(OperatorRegistryTest, TheFirstOperatorIsTheLedgersKeyAndTheOthersAreEnrolled) {
  OperatorRegistry registry;
  EXPECT_TRUE(registry.all().empty());
  registry.setFirstOperatorKey(key(1));
  OperatorReply enrolled = registry.enroll("ro", key(2), OperatorRole::kAudit, false, 100);
  ASSERT_EQ(enrolled.code, ReplyCode::kOk) << enrolled.message;
  EXPECT_FALSE(enrolled.duplicate);
  ASSERT_EQ(registry.all().size(), 2u);
  EXPECT_EQ(registry.all()[0], firstOperator(key(1)));
  EXPECT_EQ(registry.all()[1].name, "ro");
  EXPECT_EQ(registry.all()[1].enrolled_at_ms, 100u);
  // The same enroll again changes nothing; another key or role under the name is a conflict.
  EXPECT_TRUE(registry.enroll("ro", key(2), OperatorRole::kAudit, false, 200).duplicate);
  EXPECT_EQ(registry.enroll("ro", key(3), OperatorRole::kAudit, false, 200).code,
            ReplyCode::kIdempotencyConflict);
  EXPECT_EQ(registry.enroll("ro", key(2), OperatorRole::kAdmin, false, 200).code,
            ReplyCode::kIdempotencyConflict);
  // One key, one identity: not the first operator's, another operator's, or a gateway's.
  EXPECT_EQ(registry.enroll("x", key(1), OperatorRole::kAudit, false, 0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry.enroll("x", key(2), OperatorRole::kAudit, false, 0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry.enroll("x", key(4), OperatorRole::kAudit, true, 0).code,
            ReplyCode::kInvalidArgument);
  // Names: not the first operator's, and of the allowed bytes.
  EXPECT_EQ(registry.enroll("admin", key(5), OperatorRole::kAdmin, false, 0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry.enroll("bad name", key(5), OperatorRole::kAdmin, false, 0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry
                .enroll(std::string(limits::kOperatorNameBytesMax + 1, 'a'), key(5),
                        OperatorRole::kAdmin, false, 0)
                .code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry.enroll("zero", PublicKey{}, OperatorRole::kAdmin, false, 0).code,
            ReplyCode::kInvalidArgument);
  std::vector<const OperatorRecord*> changed = registry.takeChanged();
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0]->name, "ro");
  EXPECT_TRUE(registry.takeChanged().empty());
}

TEST(OperatorRegistryTest, DisablingMakesTheKeyNobodyAndTheFirstOperatorCannotBeDisabled) {
  OperatorRegistry registry;
  registry.setFirstOperatorKey(key(1));
  ASSERT_EQ(registry.enroll("pol", key(2), OperatorRole::kPolicy, false, 1).code, ReplyCode::kOk);
  (void)registry.takeChanged();
  EXPECT_EQ(registry.setEnabled("admin", false).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(registry.setEnabled("nobody", false).code, ReplyCode::kNotFound);
  ASSERT_EQ(registry.setEnabled("pol", false).code, ReplyCode::kOk);
  EXPECT_TRUE(registry.setEnabled("pol", false).duplicate);
  ASSERT_EQ(registry.takeChanged().size(), 1u);
  const LinkPeer peer = identifyLinkPeer(ShardRegistry(nullptr, 0), registry.all(), key(2), 0);
  EXPECT_EQ(peer.role, LinkRole::kNobody);
  EXPECT_EQ(peer.why_nobody, "operator 'pol' is disabled");
  EXPECT_TRUE(linkRefusal(peer, PublishPolicyRequest{}).has_value());
  ASSERT_EQ(registry.setEnabled("pol", true).code, ReplyCode::kOk);
  EXPECT_EQ(identifyLinkPeer(ShardRegistry(nullptr, 0), registry.all(), key(2), 0).role,
            LinkRole::kOperator);
}

TEST(OperatorRegistryTest, ARestoredRegistryIsTheEnrolledOneAndRefusesWhatNoEnrollMakes) {
  OperatorRegistry restored;
  const OperatorRecord ro{.name = "ro", .public_key = key(2), .role = OperatorRole::kAudit};
  ASSERT_TRUE(restored.restore(ro).isOk());
  EXPECT_FALSE(restored.restore(ro).isOk());  // twice
  EXPECT_FALSE(restored.restore({.name = "admin", .public_key = key(3)}).isOk());
  EXPECT_FALSE(restored.restore({.name = "z", .public_key = PublicKey{}}).isOk());
  EXPECT_TRUE(restored.takeChanged().empty());  // restored state is already durable
  EXPECT_EQ(restored.list().operators, (std::vector<OperatorRecord>{ro}));
}

AuditLogEntry entryNamed(std::string action) { return AuditLogEntry{.action = std::move(action)}; }

TEST(AuditLogTest, EntriesAreNumberedPagedAndTakenOnce) {
  AuditLog log;
  EXPECT_EQ(log.page(0, 0).entries.size(), 0u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(log.append(entryNamed("a" + std::to_string(i))), i + 1u);
  AuditLog::Changes changes = log.takeChanges();
  ASSERT_EQ(changes.appended.size(), 5u);
  EXPECT_EQ(changes.appended.front()->sequence, 1u);
  EXPECT_EQ(changes.kept_from, 0u);
  EXPECT_TRUE(log.takeChanges().empty());
  AuditLogReply page = log.page(0, 2);
  ASSERT_EQ(page.entries.size(), 2u);
  EXPECT_EQ(page.entries[1].sequence, 2u);
  EXPECT_TRUE(page.more);
  EXPECT_EQ(page.last_sequence, 5u);
  page = log.page(2, 10);
  ASSERT_EQ(page.entries.size(), 3u);
  EXPECT_EQ(page.entries[0].action, "a2");
  EXPECT_FALSE(page.more);
  EXPECT_TRUE(log.page(5, 10).entries.empty());
  EXPECT_TRUE(log.page(99, 10).entries.empty());
}

TEST(AuditLogTest, OnlyTheNewestEntriesAreKeptAndTheDropIsTaken) {
  AuditLog log;
  for (uint64_t i = 0; i < limits::kAuditLogEntriesKept + 3; ++i) (void)log.append({});
  EXPECT_EQ(log.size(), limits::kAuditLogEntriesKept);
  AuditLog::Changes changes = log.takeChanges();
  EXPECT_EQ(changes.appended.size(), limits::kAuditLogEntriesKept);
  EXPECT_EQ(changes.kept_from, 4u);
  EXPECT_EQ(changes.appended.front()->sequence, 4u);
  AuditLogReply page = log.page(0, 1);
  EXPECT_EQ(page.first_kept_sequence, 4u);
  ASSERT_EQ(page.entries.size(), 1u);
  EXPECT_EQ(page.entries[0].sequence, 4u);
}

TEST(AuditLogTest, APageOfLongEntriesStaysWithinItsByteBound) {
  AuditLog log;
  for (int i = 0; i < 1'000; ++i) {
    (void)log.append({.target = std::string(limits::kAuditLogTextBytesMax, 't'),
                      .detail = std::string(limits::kAuditLogTextBytesMax, 'd')});
  }
  const AuditLogReply page = log.page(0, 0);
  EXPECT_TRUE(page.more);
  EXPECT_GT(page.entries.size(), 10u);
  EXPECT_LT(page.entries.size() * 2 * limits::kAuditLogTextBytesMax,
            limits::kAuditLogReplyBytesMax + 1);
  // The next page starts where this one stopped.
  EXPECT_EQ(log.page(page.entries.back().sequence, 0).entries.front().sequence,
            page.entries.back().sequence + 1);
}

TEST(AuditLogTest, ARestoreMustBeContiguous) {
  AuditLog log;
  ASSERT_TRUE(log.restore({.sequence = 7}).isOk());
  ASSERT_TRUE(log.restore({.sequence = 8}).isOk());
  EXPECT_FALSE(log.restore({.sequence = 10}).isOk());
  EXPECT_EQ(log.append({}), 9u);
}

TEST(AuditEntryTest, SaysWhoAskedWhatAndHowItEnded) {
  const RequestDigest digest{1, 2, 3};
  const LinkPeer ro{
      .role = LinkRole::kOperator, .operator_name = "ro", .operator_role = OperatorRole::kAudit};
  const std::optional<std::string> refusal = linkRefusal(ro, PublishPolicyRequest{});
  ASSERT_TRUE(refusal.has_value());
  AuditLogEntry refused = auditLogEntryOf(ro, PublishPolicyRequest{}, refusal, nullptr, digest);
  EXPECT_EQ(refused.actor, "ro");
  EXPECT_EQ(refused.actor_kind, "operator");
  EXPECT_EQ(refused.actor_role, "audit");
  EXPECT_EQ(refused.action, "policy publish");
  EXPECT_EQ(refused.outcome, "refused");
  EXPECT_EQ(refused.detail, *refusal);
  EXPECT_EQ(refused.request_digest, digest);

  const LinkPeer admin{
      .role = LinkRole::kOperator, .operator_name = "admin", .operator_role = OperatorRole::kAdmin};
  const LedgerReply served = GatewayReply{.code = ReplyCode::kOk};
  AuditLogEntry disable = auditLogEntryOf(admin, SetGatewayEnabledRequest{.gateway_name = "gw-1"},
                                          std::nullopt, &served, digest);
  EXPECT_EQ(disable.action, "gateway disable");
  EXPECT_EQ(disable.target, "gateway 'gw-1'");
  EXPECT_EQ(disable.outcome, "ok");
  const LedgerReply missing = OperatorReply{.code = ReplyCode::kNotFound, .message = "no operator"};
  AuditLogEntry enroll = auditLogEntryOf(
      admin, EnrollOperatorRequest{.operator_name = "sh", .role = OperatorRole::kShards},
      std::nullopt, &missing, digest);
  EXPECT_EQ(enroll.target, "operator 'sh' role shards");
  EXPECT_EQ(enroll.outcome, "NOT_FOUND");
  EXPECT_EQ(enroll.detail, "no operator");
  const LedgerReply published = PolicyAnswer{.reply = {.code = ReplyCode::kOk, .generation = 4}};
  EXPECT_EQ(auditLogEntryOf(LinkPeer{.role = LinkRole::kUnauthenticated}, PublishPolicyRequest{},
                            std::nullopt, &published, digest)
                .detail,
            "generation 4");
}

TEST(LedgerOperatorsTest, AnActionAndItsAuditEntryAreTakenInTheSameChanges) {
  Ledger ledger;
  ledger.operators().setFirstOperatorKey(key(1));
  ASSERT_EQ(ledger.enrollGateway("gw-1", key(9), 10).code, ReplyCode::kOk);
  EXPECT_EQ(ledger.enrollOperator("ops", key(9), OperatorRole::kAdmin, 11).code,
            ReplyCode::kInvalidArgument);  // a gateway's key
  EXPECT_EQ(ledger.enrollGateway("gw-2", key(1), 12).code,
            ReplyCode::kInvalidArgument);  // the operator's key
  ASSERT_EQ(ledger.enrollOperator("ops", key(5), OperatorRole::kShards, 13).code, ReplyCode::kOk);
  EXPECT_EQ(ledger.appendAuditLog(entryNamed("operator enroll"), 14), 1u);
  LedgerChanges changes = ledger.takeChanges();
  EXPECT_EQ(changes.operators, (std::vector<std::string>{"ops"}));
  EXPECT_EQ(changes.audit_log, (std::vector<uint64_t>{1}));
  EXPECT_EQ(changes.gateways, (std::vector<std::string>{"gw-1"}));
  EXPECT_EQ(ledger.auditLog(0, 0).entries.at(0).at_ms, 14u);
  EXPECT_TRUE(ledger.takeChanges().empty());
}

}  // namespace
}  // namespace tally
