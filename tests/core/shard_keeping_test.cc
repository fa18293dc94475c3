#include "core/shard_keeping.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/core/fake_shard_crypto.h"

// The agent's shard-keeping decisions alone (core/shard_keeping.h): no sockets, files or clocks.
// A time is just a number; the store is an in-memory fake that can be made to fail.

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'800'000'000'000;
constexpr uint64_t kBootEpoch = 7;
constexpr uint64_t kShardTtlMs = 600'000;
constexpr uint64_t kIssueRetryMs = 5'000;
constexpr uint64_t kOffRetryMs = 60'000;
constexpr uint64_t kStatusPollMs = 2'000;
const SubjectRoute kAccount{"tenant-a", "chat"};

PublicKey keyOf(uint8_t b) {
  PublicKey key{};
  key.fill(b);
  return key;
}

class FakeStore : public ShardBookStore {
 public:
  Status commit(const ShardBook&, const ShardBookChanges& changes) override {
    ++attempts;
    if (failing) return Status::ioError("disk full");
    commits.push_back(changes);
    return Status::ok();
  }
  bool failing = false;
  int attempts = 0;
  std::vector<ShardBookChanges> commits;
};

template <typename T>
std::vector<T> only(const ShardKeepingEffects& effects) {
  std::vector<T> found;
  for (const ShardKeepingEffect& effect : effects) {
    if (const T* value = std::get_if<T>(&effect)) found.push_back(*value);
  }
  return found;
}

std::vector<std::string> events(const ShardKeepingEffects& effects) {
  std::vector<std::string> names;
  for (const ShardNote& note : only<ShardNote>(effects)) {
    if (!note.event.empty()) names.push_back(note.event);
  }
  return names;
}

bool counted(const ShardKeepingEffects& effects, ShardCounter counter, const std::string& label) {
  for (const ShardNote& note : only<ShardNote>(effects)) {
    if (note.counter == counter && note.label == label) return true;
  }
  return false;
}

class ShardKeepingTest : public ::testing::Test {
 protected:
  explicit ShardKeepingTest(uint64_t shards_on_hand = 1)
      : keeping_({.gateway_id = keyOf(1),
                  .boot_epoch = kBootEpoch,
                  .crypto = &crypto_,
                  .retention_ms = 3'600'000,
                  .hold_ttl_ms = 30'000},
                 {.accounts = {kAccount},
                  .shards_on_hand = shards_on_hand,
                  .refresh_before_expiry_ms = 30'000,
                  .accounts_max = 2,
                  .account_idle_ms = 600'000,
                  .status_poll_ms = kStatusPollMs,
                  .issue_retry_ms = kIssueRetryMs,
                  .emergency_off_retry_ms = kOffRetryMs,
                  .gateway_name = "gw-1",
                  .gateway_id = keyOf(1),
                  .boot_epoch = kBootEpoch,
                  .request_nonce = 0xabc},
                 &store_) {}

  ShardGrant grant(const std::string& id, const ShardIssueRequest& request, Units units = 100,
                   uint64_t fence = 1) const {
    ShardGrant g{.shard_id = id,
                 .subject = request.subject,
                 .route = request.route,
                 .policy_generation = 3,
                 .accounting_epoch_ms = kT0 - kT0 % 3'600'000,
                 .gateway_id = request.gateway_id,
                 .gateway_name = request.gateway_name,
                 .gateway_boot_epoch = request.gateway_boot_epoch,
                 .fence = fence,
                 .allocated_units = units,
                 .issued_at_ms = kT0,
                 .expires_at_ms = kT0 + kShardTtlMs};
    crypto_.signGrant(&g);
    return g;
  }

  static ShardCallResult answered(ShardReply reply) {
    std::string label = replyCodeName(reply.code);
    return {.answered = true, .reply = std::move(reply), .label = std::move(label)};
  }
  static ShardCallResult lost() { return {.answered = false, .error = "timed out"}; }
  static ShardReply granted(const ShardGrant& g) {
    return ShardReply{.code = ReplyCode::kOk,
                      .shards = {ShardLedgerView{.grant = g, .current_fence = g.fence}}};
  }

  // The one issue request maintain() sends now.
  ShardSendIssue expectIssue(uint64_t now_ms) {
    keeping_.maintain(now_ms, true);
    const std::vector<ShardSendIssue> issues = only<ShardSendIssue>(keeping_.takeEffects());
    EXPECT_EQ(issues.size(), 1u);
    return issues.empty() ? ShardSendIssue{} : issues.front();
  }

  // Healthy: issue one shard of `units` for kAccount and answer it.
  ShardGrant obtainShard(const std::string& id, Units units = 100) {
    const ShardSendIssue issue = expectIssue(kT0);
    const ShardGrant g = grant(id, issue.request, units);
    keeping_.onIssueAnswer(kAccount, answered(granted(g)), kT0);
    EXPECT_TRUE(counted(keeping_.takeEffects(), ShardCounter::kIssue, "issued"));
    return g;
  }

  static ReserveRequest reserveOf(const std::string& id, Units units) {
    return {.reservation_id = id, .subject = "tenant-a", .route = "chat", .units = units};
  }

  testing::KeyedFakeShardCrypto crypto_;
  FakeStore store_;
  ShardKeeping keeping_;
};

class ShardKeepingTwoOnHandTest : public ShardKeepingTest {
 protected:
  ShardKeepingTwoOnHandTest() : ShardKeepingTest(2) {}
};

// Shards are asked for only while the link is usable; one issue in flight per account; the
// request id names gateway, boot epoch, the per-process nonce and a sequence number.
TEST_F(ShardKeepingTest, IssuesWhileHealthyOneInFlightPerAccount) {
  keeping_.maintain(kT0, false);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty()) << "partitioned: no issue";
  const ShardSendIssue issue = expectIssue(kT0);
  EXPECT_EQ(issue.account, kAccount);
  EXPECT_EQ(issue.request.request_id, "gw-1/7/0000000000000abc/1");
  EXPECT_EQ(issue.request.gateway_boot_epoch, kBootEpoch);
  EXPECT_EQ(issue.request.subject, "tenant-a");
  keeping_.maintain(kT0 + 1'000'000, true);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty()) << "one in flight";
}

// The grant is persisted before anything relies on it; with the shard on hand, no more issues.
TEST_F(ShardKeepingTest, AGrantIsPersistedAndSatisfiesShardsOnHand) {
  obtainShard("s1");
  ASSERT_FALSE(store_.commits.empty());
  EXPECT_EQ(store_.commits.back().shards_upserted, std::vector<std::string>{"s1"});
  EXPECT_EQ(keeping_.gauges(kT0).usable, 1u);
  EXPECT_EQ(keeping_.gauges(kT0).available_units, 100u);
  keeping_.maintain(kT0 + kIssueRetryMs, true);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty());
}

TEST_F(ShardKeepingTwoOnHandTest, AfterAGrantTheNextIssueIsDueAtOnce) {
  obtainShard("s1");
  const ShardSendIssue second = expectIssue(kT0);
  EXPECT_EQ(second.request.request_id, "gw-1/7/0000000000000abc/2") << "a fresh id";
}

// A lost answer may have carved a shard: the same request (same id) again, after the retry
// delay, so the ledger answers that shard instead of carving another.
TEST_F(ShardKeepingTest, AnUnansweredIssueIsRetriedAsIsAfterTheRetryDelay) {
  const ShardSendIssue first = expectIssue(kT0);
  keeping_.onIssueAnswer(kAccount, lost(), kT0 + 10);
  EXPECT_TRUE(counted(keeping_.takeEffects(), ShardCounter::kIssue, "failed"));
  keeping_.maintain(kT0 + 10 + kIssueRetryMs - 1, true);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty()) << "not before the delay";
  const ShardSendIssue again = expectIssue(kT0 + 10 + kIssueRetryMs);
  EXPECT_EQ(again.request, first.request);
}

TEST_F(ShardKeepingTest, EmergencyOffWaitsLongerThanOtherRefusalsAndTakesAFreshId) {
  const ShardSendIssue first = expectIssue(kT0);
  keeping_.onIssueAnswer(kAccount, answered(ShardReply{.code = ReplyCode::kInvalidState}), kT0);
  ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kIssue, "emergency-off"));
  EXPECT_EQ(events(effects), std::vector<std::string>{"shard_issue_refused"});
  keeping_.maintain(kT0 + kOffRetryMs - 1, true);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty());
  const ShardSendIssue second = expectIssue(kT0 + kOffRetryMs);
  EXPECT_NE(second.request.request_id, first.request.request_id) << "answered: not retried as is";

  keeping_.onIssueAnswer(kAccount, answered(ShardReply{.code = ReplyCode::kRejected}),
                         kT0 + kOffRetryMs);
  EXPECT_TRUE(counted(keeping_.takeEffects(), ShardCounter::kIssue, "refused"));
  keeping_.maintain(kT0 + kOffRetryMs + kIssueRetryMs - 1, true);
  EXPECT_TRUE(only<ShardSendIssue>(keeping_.takeEffects()).empty());
  (void)expectIssue(kT0 + kOffRetryMs + kIssueRetryMs);
}

TEST_F(ShardKeepingTest, AGrantThatDoesNotVerifyIsRefusedAndNeverUsed) {
  const ShardSendIssue issue = expectIssue(kT0);
  ShardGrant forged = grant("s1", issue.request);
  forged.allocated_units = 1'000'000;  // the signature no longer matches
  keeping_.onIssueAnswer(kAccount, answered(granted(forged)), kT0);
  const ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_EQ(events(effects), std::vector<std::string>{"shard_grant_refused"});
  EXPECT_FALSE(counted(effects, ShardCounter::kIssue, "issued"));
  EXPECT_EQ(keeping_.book().shardCount(), 0u);
}

// Partition admission from a usable shard; the answer waits for the iteration's commit, which
// persists it first.
TEST_F(ShardKeepingTest, AnAdmissionIsAnsweredOnlyAfterItsCommit) {
  obtainShard("s1");
  const size_t commits = store_.commits.size();
  ASSERT_TRUE(keeping_.admit(11, reserveOf("r1", 30), kT0 + 100));
  ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kAdmission, "admitted"));
  EXPECT_TRUE(only<ShardGatewayAnswer>(effects).empty()) << "not durable yet";
  EXPECT_TRUE(keeping_.owns("r1"));
  keeping_.apply(12, QueryRequest{.reservation_id = "r1"}, kT0 + 100);
  EXPECT_TRUE(keeping_.waitingForCommit());
  keeping_.commit();
  EXPECT_EQ(store_.commits.size(), commits + 1) << "one transaction for the iteration";
  EXPECT_EQ(store_.commits.back().reservations_upserted, std::vector<std::string>{"r1"});
  const std::vector<ShardGatewayAnswer> answers = only<ShardGatewayAnswer>(keeping_.takeEffects());
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].token, 11u);
  ASSERT_TRUE(answers[0].reply.has_value());
  EXPECT_EQ(answers[0].reply->code, ReplyCode::kOk);
  EXPECT_EQ(answers[0].reply->receipt.origin, "s1");
  EXPECT_EQ(answers[1].token, 12u);
  EXPECT_EQ(answers[1].reply->receipt.reservation_id, "r1");
}

TEST_F(ShardKeepingTest, NoUsableShardAdmitsNothingAndAnswersNothing) {
  EXPECT_FALSE(keeping_.admit(1, reserveOf("r1", 30), kT0));
  const ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kAdmission, "no-shard"));
  EXPECT_FALSE(keeping_.owns("r1"));
  EXPECT_FALSE(keeping_.waitingForCommit());
  obtainShard("s1", 20);
  EXPECT_FALSE(keeping_.admit(2, reserveOf("r2", 30), kT0)) << "more than the shard holds";
}

// A failed write answers kUnavailable (never a reply that depends on lost state) and its
// changes are retried, merged, with the next commit.
TEST_F(ShardKeepingTest, AFailedCommitAnswersUnavailableAndIsRetriedWithTheNext) {
  obtainShard("s1");
  store_.failing = true;
  ASSERT_TRUE(keeping_.admit(1, reserveOf("r1", 10), kT0));
  keeping_.commit();
  ShardKeepingEffects effects = keeping_.takeEffects();
  std::vector<ShardGatewayAnswer> answers = only<ShardGatewayAnswer>(effects);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_FALSE(answers[0].reply.has_value());
  EXPECT_NE(answers[0].unavailable.find("retry with the same ids"), std::string::npos);
  EXPECT_EQ(events(effects),
            (std::vector<std::string>{"shard_admitted", "shard_store_write_failed"}));
  EXPECT_TRUE(keeping_.storeFailing());

  keeping_.maintain(kT0 + 1, true);
  effects = keeping_.takeEffects();
  EXPECT_TRUE(only<ShardSendReport>(effects).empty() && only<ShardSendStatus>(effects).empty())
      << "nothing is sent while the store fails";
  EXPECT_TRUE(events(effects).empty()) << "the failure is logged once";

  store_.failing = false;
  ASSERT_TRUE(keeping_.admit(2, reserveOf("r2", 10), kT0 + 2));
  keeping_.commit();
  effects = keeping_.takeEffects();
  EXPECT_EQ(events(effects),
            (std::vector<std::string>{"shard_admitted", "shard_store_write_recovered"}));
  EXPECT_EQ(store_.commits.back().reservations_upserted, (std::vector<std::string>{"r1", "r2"}));
  answers = only<ShardGatewayAnswer>(effects);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].reply.has_value());
}

// Reconnect: a shard used during the partition is closed and reported; the ledger's answer is
// recorded and persisted; a report is retried only after the retry delay.
TEST_F(ShardKeepingTest, OnReconnectAUsedShardIsClosedReportedAndReconciled) {
  const ShardGrant g = obtainShard("s1");
  ASSERT_TRUE(keeping_.admit(1, reserveOf("r1", 30), kT0 + 10));
  keeping_.commit();
  (void)keeping_.takeEffects();
  keeping_.maintain(kT0 + 20, false);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty()) << "still partitioned";

  keeping_.maintain(kT0 + 30, true);
  ShardKeepingEffects effects = keeping_.takeEffects();
  const std::vector<std::string> names = events(effects);
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "shard_closed");
  EXPECT_TRUE(counted(effects, ShardCounter::kEvent, "closed-reconnect"));
  std::vector<ShardSendReport> reports = only<ShardSendReport>(effects);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].shard_id, "s1");
  EXPECT_EQ(reports[0].report.balances.local_reserved, 30u);
  keeping_.maintain(kT0 + 40, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty()) << "one in flight";

  keeping_.onReportAnswer("s1", lost(), kT0 + 50);
  EXPECT_TRUE(counted(keeping_.takeEffects(), ShardCounter::kReport, "failed"));
  keeping_.maintain(kT0 + 50 + kIssueRetryMs - 1, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty()) << "not before the delay";
  keeping_.maintain(kT0 + 50 + kIssueRetryMs, true);
  reports = only<ShardSendReport>(keeping_.takeEffects());
  ASSERT_EQ(reports.size(), 1u);

  ShardLedgerView view{.grant = g,
                       .state = ShardState::kReconciled,
                       .current_fence = g.fence,
                       .spent_units = 30,
                       .reminted_units = 70,
                       .reported = true,
                       .last_reported = reports[0].report.balances};
  const size_t commits = store_.commits.size();
  keeping_.onReportAnswer("s1", answered(ShardReply{.code = ReplyCode::kOk, .shards = {view}}),
                          kT0 + 60'000);
  effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kReport, "RECONCILED"));
  EXPECT_EQ(events(effects), std::vector<std::string>{"shard_reconciled"});
  EXPECT_EQ(store_.commits.size(), commits + 1) << "the ledger's answer is persisted";
  const ShardBook::Shard* shard = keeping_.book().findShard("s1");
  ASSERT_NE(shard, nullptr);
  EXPECT_TRUE(shard->record.ledger_known);
  EXPECT_EQ(shard->record.ledger_state, ShardState::kReconciled);
  keeping_.maintain(kT0 + 120'000, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty()) << "final: never again";
}

// The field `name` of the first note with `event`, or "" if there is none.
std::string noteField(const ShardKeepingEffects& effects, const std::string& event,
                      const std::string& name) {
  for (const ShardNote& note : only<ShardNote>(effects)) {
    if (note.event != event) continue;
    for (const auto& [key, value] : note.fields) {
      if (key == name) return value;
    }
  }
  return "";
}

// The ledger compacted the shard (after its shard_retention_ms) before we heard our report
// accepted, and now answers kNotFound. Transient failures before that (a lost answer, a
// permission refusal, resource exhaustion) are retried; the typed "no record" answer is not:
// the shard is kept, durably, as unreconcilable with its balances, is no longer pending, and is
// never reported again, even when one of its reservations resolves later.
TEST_F(ShardKeepingTest, AForgottenShardStopsTheRetriesAndIsKeptUnreconcilable) {
  (void)obtainShard("s1");
  ASSERT_TRUE(keeping_.admit(1, reserveOf("r1", 30), kT0 + 10));
  ASSERT_TRUE(keeping_.admit(2, reserveOf("r2", 20), kT0 + 10));
  keeping_.commit();
  (void)keeping_.takeEffects();
  keeping_.apply(3, StartRequest{"r1", "op-1"}, kT0 + 15);
  keeping_.apply(4, SettleRequest{"r1", "op-1", 25}, kT0 + 15);
  keeping_.commit();
  (void)keeping_.takeEffects();
  keeping_.maintain(kT0 + 20, false);  // partitioned
  (void)keeping_.takeEffects();
  uint64_t now = kT0 + 30;
  keeping_.maintain(now, true);
  ASSERT_EQ(only<ShardSendReport>(keeping_.takeEffects()).size(), 1u);

  // Transient: each is retried after the delay.
  const std::vector<ShardCallResult> transient = {
      lost(),
      answered(ShardReply{.code = ReplyCode::kRejected,
                          .message = "gateway 'gw-1' is disabled",
                          .permission_denied = true}),
      answered(ShardReply{.code = ReplyCode::kResourceExhausted, .message = "busy"}),
  };
  for (const ShardCallResult& result : transient) {
    keeping_.onReportAnswer("s1", result, now + 1);
    (void)keeping_.takeEffects();
    EXPECT_EQ(keeping_.book().shardsNeedingReport(), std::vector<std::string>{"s1"});
    EXPECT_EQ(keeping_.gauges(now + 1).unreconcilable, 0u);
    now += 1 + kIssueRetryMs;
    keeping_.maintain(now, true);
    ASSERT_EQ(only<ShardSendReport>(keeping_.takeEffects()).size(), 1u)
        << result.label << ": retried";
  }

  const size_t commits = store_.commits.size();
  keeping_.onReportAnswer(
      "s1",
      answered(ShardReply{.code = ReplyCode::kNotFound, .message = "no record of shard 's1'"}),
      now + 1);
  ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kEvent, "unreconcilable"));
  EXPECT_TRUE(counted(effects, ShardCounter::kReport, "unreconcilable"));
  EXPECT_EQ(events(effects), std::vector<std::string>{"shard_unreconcilable"});
  EXPECT_EQ(noteField(effects, "shard_unreconcilable", "shard_id"), "s1");
  EXPECT_EQ(noteField(effects, "shard_unreconcilable", "reason"), "forgotten");
  EXPECT_EQ(noteField(effects, "shard_unreconcilable", "spent"), "25");
  EXPECT_EQ(noteField(effects, "shard_unreconcilable", "reserved"), "20");
  EXPECT_EQ(only<ShardNote>(effects).back().level, ShardNoteLevel::kError);
  ASSERT_EQ(store_.commits.size(), commits + 1) << "kept durably";
  EXPECT_EQ(store_.commits.back().shards_upserted, std::vector<std::string>{"s1"});
  const ShardBook::Shard* shard = keeping_.book().findShard("s1");
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->record.unreconcilable, ShardUnreconcilable::kForgotten);
  EXPECT_EQ(shard->account.balances().local_spent, 25u) << "its usage is kept";
  EXPECT_TRUE(keeping_.book().shardsNeedingReport().empty());
  ShardGauges gauges = keeping_.gauges(now + 60'000);
  EXPECT_EQ(gauges.unreconcilable, 1u);
  EXPECT_EQ(gauges.closed, 0u);
  EXPECT_EQ(gauges.oldest_unreconciled_age_ms, 0u) << "no longer pending";

  // Never sent again: not after the retry delay, not when a holding reservation resolves.
  keeping_.maintain(now + 2, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty());
  keeping_.apply(5, ReleaseRequest{"r2"}, now + 3);
  keeping_.commit();
  (void)keeping_.takeEffects();
  EXPECT_EQ(keeping_.book().findShard("s1")->account.balances().local_reserved, 0u);
  keeping_.maintain(now + 4 + 10 * kIssueRetryMs, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty());
  EXPECT_TRUE(keeping_.book().shardsNeedingReport().empty());

  // Kept for the book's retention from the moment it was marked, then forgotten (logged).
  keeping_.maintain(now + 1 + 3'600'000 - 1, true);
  EXPECT_NE(keeping_.book().findShard("s1"), nullptr);
  (void)keeping_.takeEffects();
  keeping_.maintain(now + 1 + 3'600'000, true);
  effects = keeping_.takeEffects();
  EXPECT_EQ(keeping_.book().findShard("s1"), nullptr);
  EXPECT_EQ(noteField(effects, "shard_forgotten", "shard_id"), "s1");
}

// An operator wrote the shard off while we still held a report it never heard: the refusal
// (invalidState, the shard WRITTEN_OFF) marks it unreconcilable too, for the operator to see.
TEST_F(ShardKeepingTest, AReportRefusedAsWrittenOffIsKeptUnreconcilable) {
  const ShardGrant g = obtainShard("s1");
  ASSERT_TRUE(keeping_.admit(1, reserveOf("r1", 30), kT0 + 10));
  keeping_.commit();
  keeping_.maintain(kT0 + 20, false);
  (void)keeping_.takeEffects();
  keeping_.maintain(kT0 + 30, true);
  ASSERT_EQ(only<ShardSendReport>(keeping_.takeEffects()).size(), 1u);
  keeping_.onReportAnswer(
      "s1",
      answered(ShardReply{.code = ReplyCode::kInvalidState,
                          .message = "the shard was written off",
                          .shards = {ShardLedgerView{.grant = g,
                                                     .state = ShardState::kWrittenOff,
                                                     .current_fence = g.fence,
                                                     .retired_units = 100,
                                                     .written_off = true}}}),
      kT0 + 40);
  const ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kEvent, "unreconcilable"));
  EXPECT_EQ(noteField(effects, "shard_unreconcilable", "reason"), "written-off");
  const ShardBook::Shard* shard = keeping_.book().findShard("s1");
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->record.unreconcilable, ShardUnreconcilable::kWrittenOff);
  EXPECT_EQ(keeping_.gauges(kT0 + 40).unreconcilable, 1u);
  keeping_.maintain(kT0 + 40 + kIssueRetryMs, true);
  EXPECT_TRUE(only<ShardSendReport>(keeping_.takeEffects()).empty());
}

// Open shards are polled (one poll in flight, every status_poll_ms); revoked → closed.
TEST_F(ShardKeepingTest, StatusPollsCloseARevokedShard) {
  const ShardGrant g = obtainShard("s1");
  keeping_.maintain(kT0 + 1, true);
  std::vector<ShardSendStatus> polls = only<ShardSendStatus>(keeping_.takeEffects());
  ASSERT_EQ(polls.size(), 1u);
  EXPECT_EQ(polls[0].shard_ids, std::vector<std::string>{"s1"});
  keeping_.maintain(kT0 + 1 + kStatusPollMs, true);
  EXPECT_TRUE(only<ShardSendStatus>(keeping_.takeEffects()).empty()) << "one in flight";
  keeping_.onStatusAnswer(
      answered(ShardReply{
          .code = ReplyCode::kOk,
          .shards = {ShardLedgerView{
              .grant = g, .state = ShardState::kRevoked, .current_fence = g.fence + 1}}}),
      kT0 + 2);
  const ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_TRUE(counted(effects, ShardCounter::kEvent, "closed-revoked"));
  EXPECT_TRUE(keeping_.book().findShard("s1")->account.closed());
  EXPECT_EQ(keeping_.gauges(kT0 + 2).usable, 0u);
  EXPECT_FALSE(keeping_.admit(1, reserveOf("r1", 1), kT0 + 3)) << "never admits from it";
}

TEST_F(ShardKeepingTest, ARefusedStatusPollChangesNothingAndIsRetriedLater) {
  obtainShard("s1");
  keeping_.maintain(kT0 + 1, true);
  ASSERT_EQ(only<ShardSendStatus>(keeping_.takeEffects()).size(), 1u);
  keeping_.onStatusAnswer(answered(ShardReply{.code = ReplyCode::kRejected}), kT0 + 2);
  EXPECT_EQ(events(keeping_.takeEffects()), std::vector<std::string>{"shard_status_refused"});
  keeping_.maintain(kT0 + 1 + kStatusPollMs, true);
  EXPECT_EQ(only<ShardSendStatus>(keeping_.takeEffects()).size(), 1u);
}

// Learned accounts: kept while reserved, bounded (the oldest learned makes room), dropped
// after account_idle_ms; configured accounts stay.
TEST_F(ShardKeepingTest, LearnedAccountsAreBoundedAndDroppedWhenIdle) {
  keeping_.learnAccount({"t-1", "chat"}, kT0);
  keeping_.learnAccount({"t-2", "chat"}, kT0 + 1);
  keeping_.learnAccount({"t-3", "chat"}, kT0 + 2);  // accounts_max = 2: t-1 makes room
  EXPECT_EQ(events(keeping_.takeEffects()).size(), 3u);
  keeping_.maintain(kT0 + 3, true);
  std::vector<SubjectRoute> asked;
  for (const ShardSendIssue& issue : only<ShardSendIssue>(keeping_.takeEffects())) {
    asked.push_back(issue.account);
  }
  EXPECT_EQ(asked, (std::vector<SubjectRoute>{{"t-2", "chat"}, {"t-3", "chat"}, kAccount}));
  for (const SubjectRoute& account : asked) keeping_.onIssueAnswer(account, lost(), kT0 + 4);
  (void)keeping_.takeEffects();

  keeping_.maintain(kT0 + 2 + 600'000, true);
  const std::vector<std::string> names = events(keeping_.takeEffects());
  EXPECT_EQ(std::count(names.begin(), names.end(), "shard_account_dropped"), 2)
      << "both learned accounts idle; the configured one stays";
}

TEST_F(ShardKeepingTest, RestoreNotesQuarantinedAndBootEpochClosures) {
  keeping_.restored({.quarantined = {"bad"}, .closed_at_boot = {}});
  const ShardKeepingEffects effects = keeping_.takeEffects();
  EXPECT_EQ(events(effects), (std::vector<std::string>{"shard_quarantined", "shards_restored"}));
  EXPECT_TRUE(counted(effects, ShardCounter::kEvent, "quarantined"));
}

}  // namespace
}  // namespace tally
