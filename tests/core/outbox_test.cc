#include "core/outbox.h"

#include <gtest/gtest.h>

namespace tally {
namespace {

constexpr uint64_t kT0 = 5'000;

OutboxEntry settle(const std::string& id, Units actual) {
  return {.kind = OutboxKind::kSettle,
          .reservation_id = id,
          .operation_id = "op-" + id,
          .actual_units = actual};
}

TEST(OutboxTest, DeliversInOrderOneAtATime) {
  Outbox outbox;
  uint64_t a = 0, b = 0;
  ASSERT_EQ(outbox.append(settle("r1", 10), kT0, &a), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r2", 20), kT0, &b), OutboxCode::kOk);
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  const OutboxEntry* head = outbox.due(kT0);
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->reservation_id, "r1");
  ASSERT_EQ(outbox.markSent(a), OutboxCode::kOk);
  EXPECT_EQ(outbox.due(kT0), nullptr);  // one in flight at a time
  EXPECT_EQ(outbox.markSent(b), OutboxCode::kNotHead);
  ASSERT_EQ(outbox.onDelivered(a), OutboxCode::kOk);
  head = outbox.due(kT0);
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->reservation_id, "r2");
  EXPECT_EQ(outbox.size(), 1u);
}

// A batch whose durable write failed is taken back: it is never due, it does not block what is
// queued after it, and what was durable before it stays, in order.
TEST(OutboxTest, DiscardingANotDurableTailKeepsTheDurableHeadAndUnblocksTheQueue) {
  Outbox outbox;
  uint64_t durable = 0, lost1 = 0, lost2 = 0, later = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &durable), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r2", 2), kT0, &lost1), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r3", 3), kT0, &lost2), OutboxCode::kOk);
  ASSERT_EQ(outbox.markSent(durable), OutboxCode::kOk);
  size_t discarded = 0;
  EXPECT_EQ(outbox.discardFrom(durable, &discarded), OutboxCode::kNotHead);  // in flight
  EXPECT_EQ(discarded, 0u);
  EXPECT_EQ(outbox.size(), 3u);
  ASSERT_EQ(outbox.discardFrom(lost1, &discarded), OutboxCode::kOk);
  EXPECT_EQ(discarded, 2u);
  ASSERT_EQ(outbox.size(), 1u);
  ASSERT_EQ(outbox.onDelivered(durable), OutboxCode::kOk);
  EXPECT_EQ(outbox.due(kT0), nullptr);
  ASSERT_EQ(outbox.append(settle("r4", 4), kT0, &later), OutboxCode::kOk);
  EXPECT_GT(later, lost2);  // seqs never reused
  const OutboxEntry* head = outbox.due(kT0);
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->reservation_id, "r4");
}

TEST(OutboxTest, FailureBacksOffExponentiallyWithJitterAndCap) {
  Outbox outbox({.entries_max = 10, .backoff_initial_ms = 100, .backoff_max_ms = 1'000});
  uint64_t seq = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &seq), OutboxCode::kOk);
  const uint64_t expected_waits[] = {100, 200, 400, 800, 1'000, 1'000};
  uint64_t now = kT0;
  for (uint64_t wait : expected_waits) {
    ASSERT_NE(outbox.due(now), nullptr);
    ASSERT_EQ(outbox.markSent(seq), OutboxCode::kOk);
    ASSERT_EQ(outbox.onFailed(seq, now, 0), OutboxCode::kOk);
    EXPECT_EQ(outbox.due(now + wait - 1), nullptr);
    EXPECT_NE(outbox.due(now + wait), nullptr);
    now += wait;
  }
  EXPECT_EQ(outbox.entries().front().attempts, 6u);
  // Jitter adds up to 100% of the base, still capped.
  ASSERT_EQ(outbox.markSent(seq), OutboxCode::kOk);
  ASSERT_EQ(outbox.onFailed(seq, now, 500), OutboxCode::kOk);
  EXPECT_EQ(outbox.entries().front().next_attempt_ms, now + 1'000);
}

TEST(OutboxTest, FirstRetryJitterIsHalfTheBase) {
  Outbox outbox({.entries_max = 10, .backoff_initial_ms = 100, .backoff_max_ms = 10'000});
  uint64_t seq = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &seq), OutboxCode::kOk);
  ASSERT_EQ(outbox.markSent(seq), OutboxCode::kOk);
  ASSERT_EQ(outbox.onFailed(seq, kT0, 500), OutboxCode::kOk);
  EXPECT_EQ(outbox.entries().front().next_attempt_ms, kT0 + 150);
}

TEST(OutboxTest, FullOutboxRefusesAndChangesNothing) {
  Outbox outbox({.entries_max = 2, .backoff_initial_ms = 1, .backoff_max_ms = 1});
  uint64_t seq = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &seq), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r2", 1), kT0, &seq), OutboxCode::kOk);
  EXPECT_EQ(outbox.append(settle("r3", 1), kT0, &seq), OutboxCode::kFull);
  EXPECT_EQ(seq, 2u);
  EXPECT_EQ(outbox.size(), 2u);
}

TEST(OutboxTest, DeliveryOrFailureOfANonHeadIsRefused) {
  Outbox outbox;
  uint64_t a = 0, b = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &a), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r2", 1), kT0, &b), OutboxCode::kOk);
  EXPECT_EQ(outbox.onDelivered(a), OutboxCode::kNotInFlight);
  EXPECT_EQ(outbox.onDelivered(b), OutboxCode::kNotHead);
  EXPECT_EQ(outbox.onFailed(b, kT0, 0), OutboxCode::kNotHead);
  EXPECT_EQ(outbox.size(), 2u);
}

TEST(OutboxTest, RestoreKeepsOrderAndContinuesSequence) {
  Outbox outbox;
  OutboxEntry e7 = settle("r7", 7);
  e7.seq = 7;
  OutboxEntry e3 = settle("r3", 3);
  e3.seq = 3;
  outbox.restore({e7, e3});
  ASSERT_EQ(outbox.size(), 2u);
  EXPECT_EQ(outbox.due(kT0)->seq, 3u);
  uint64_t seq = 0;
  ASSERT_EQ(outbox.append(settle("r8", 8), kT0, &seq), OutboxCode::kOk);
  EXPECT_EQ(seq, 8u);
}

TEST(OutboxTest, OldestAge) {
  Outbox outbox;
  EXPECT_EQ(outbox.oldestAgeMs(kT0), 0u);
  uint64_t seq = 0;
  ASSERT_EQ(outbox.append(settle("r1", 1), kT0, &seq), OutboxCode::kOk);
  ASSERT_EQ(outbox.append(settle("r2", 1), kT0 + 50, &seq), OutboxCode::kOk);
  EXPECT_EQ(outbox.oldestAgeMs(kT0 + 300), 300u);
}

}  // namespace
}  // namespace tally
