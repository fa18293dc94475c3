#include "core/link_health.h"

#include <gtest/gtest.h>

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'000'000;

LinkHealthThresholds thresholds() {
  return {.failures_to_degrade = 1,
          .failures_to_partition = 3,
          .slow_request_us = 50'000,
          .partition_after_ms = 2'000,
          .successes_to_recover = 2};
}

TEST(LinkHealthTest, StartsHealthyAndStaysSoOnFastSuccesses) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  for (uint64_t i = 0; i < 10; ++i) monitor.onSuccess(1'000, kT0 + i);
  EXPECT_EQ(monitor.state(), LinkHealth::kHealthy);
  EXPECT_EQ(monitor.transitions(), 0u);
}

TEST(LinkHealthTest, OneFailureDegradesThreePartition) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onFailure(kT0 + 1);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onFailure(kT0 + 2);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onFailure(kT0 + 3);
  EXPECT_EQ(monitor.state(), LinkHealth::kPartitioned);
  EXPECT_EQ(monitor.stateSinceMs(), kT0 + 3);
  EXPECT_EQ(monitor.consecutiveFailures(), 3u);
}

TEST(LinkHealthTest, SlowSuccessDegrades) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onSuccess(50'001, kT0 + 1);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onSuccess(50'000, kT0 + 2);  // exactly the threshold is fast
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onSuccess(10, kT0 + 3);
  EXPECT_EQ(monitor.state(), LinkHealth::kHealthy);
}

TEST(LinkHealthTest, TimeWithoutSuccessPartitionsAFailingLink) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onSuccess(10, kT0);
  monitor.onFailure(kT0 + 100);
  monitor.tick(kT0 + 2'099);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.tick(kT0 + 2'100);
  EXPECT_EQ(monitor.state(), LinkHealth::kPartitioned);
}

// An idle agent's last success may be long ago (its only traffic a periodic policy fetch): one
// timeout then degrades it; only a streak of failures lasting partition_after_ms partitions it.
TEST(LinkHealthTest, OneFailureAfterALongIdleDoesNotPartition) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onSuccess(10, kT0);
  monitor.onFailure(kT0 + 60'000);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.tick(kT0 + 61'999);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onSuccess(10, kT0 + 62'500);  // the streak ends; a later failure starts a new one
  monitor.onFailure(kT0 + 63'000);
  monitor.tick(kT0 + 64'999);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.tick(kT0 + 65'000);
  EXPECT_EQ(monitor.state(), LinkHealth::kPartitioned);
}

TEST(LinkHealthTest, TimeAloneDoesNotPartitionAnIdleLink) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.tick(kT0 + 1'000'000);
  EXPECT_EQ(monitor.state(), LinkHealth::kHealthy);
}

TEST(LinkHealthTest, RecoveryGoesThroughDegraded) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  for (int i = 0; i < 3; ++i) monitor.onFailure(kT0 + i);
  ASSERT_EQ(monitor.state(), LinkHealth::kPartitioned);
  monitor.onSuccess(10, kT0 + 10);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onSuccess(10, kT0 + 11);
  EXPECT_EQ(monitor.state(), LinkHealth::kHealthy);
  EXPECT_EQ(monitor.transitions(), 4u);  // H→D, D→P, P→D, D→H
  EXPECT_EQ(monitor.lastSuccessMs(), kT0 + 11);
}

TEST(LinkHealthTest, AFailureBetweenSuccessesRestartsRecovery) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onFailure(kT0);
  monitor.onSuccess(10, kT0 + 1);
  monitor.onFailure(kT0 + 2);
  monitor.onSuccess(10, kT0 + 3);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onSuccess(10, kT0 + 4);
  EXPECT_EQ(monitor.state(), LinkHealth::kHealthy);
}

// A busy ledger: requests time out, but answers (to other requests, or late ones) keep arriving.
// That is slowness: DEGRADED, however many timeouts and however long, never PARTITIONED.
TEST(LinkHealthTest, TimeoutsWhileAnswersArriveAreSlownessNotAPartition) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  for (uint64_t i = 0; i < 100; ++i) {
    const uint64_t now_ms = kT0 + 100 * i;
    monitor.onSuccess(10, now_ms);           // something answered just now…
    monitor.onTimeout(now_ms - 50, now_ms);  // …while this one, sent before it, waited
    monitor.onLateAnswer(now_ms + 10);       // and an earlier timed-out one answers late
    monitor.tick(now_ms + 20);
    EXPECT_NE(monitor.state(), LinkHealth::kPartitioned) << "round " << i;
  }
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  EXPECT_EQ(monitor.consecutiveFailures(), 0u);
}

// Late answers alone (every request times out, yet the ledger answers each of them later) are
// still answers: no partition.
TEST(LinkHealthTest, LateAnswersKeepALinkOutOfPartition) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onSuccess(10, kT0);
  for (uint64_t i = 1; i <= 50; ++i) {
    const uint64_t now_ms = kT0 + 1'000 * i;
    monitor.onLateAnswer(now_ms - 10);
    monitor.onTimeout(now_ms - 500, now_ms);
    monitor.tick(now_ms);
  }
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
}

// Silence: timeouts of requests sent after the last answer are failures and partition as before,
// by count and by time.
TEST(LinkHealthTest, TimeoutsInSilencePartition) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  monitor.onSuccess(10, kT0);
  monitor.onTimeout(kT0 + 1, kT0 + 500);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  monitor.onTimeout(kT0 + 2, kT0 + 501);
  monitor.onTimeout(kT0 + 3, kT0 + 502);
  EXPECT_EQ(monitor.state(), LinkHealth::kPartitioned);

  LinkHealthMonitor by_time(thresholds(), kT0);
  by_time.onTimeout(kT0 + 1, kT0 + 500);  // no answer ever: silence
  EXPECT_EQ(by_time.state(), LinkHealth::kDegraded);
  by_time.tick(kT0 + 2'500);
  EXPECT_EQ(by_time.state(), LinkHealth::kPartitioned);
}

// A late answer ends a partition the way a slow success does: through DEGRADED.
TEST(LinkHealthTest, ALateAnswerEndsSilence) {
  LinkHealthMonitor monitor(thresholds(), kT0);
  for (uint64_t i = 1; i <= 3; ++i) monitor.onFailure(kT0 + i);
  ASSERT_EQ(monitor.state(), LinkHealth::kPartitioned);
  monitor.onLateAnswer(kT0 + 10);
  EXPECT_EQ(monitor.state(), LinkHealth::kDegraded);
  EXPECT_EQ(monitor.lastAnswerMs(), kT0 + 10);
}

TEST(LinkHealthTest, Names) {
  EXPECT_STREQ(linkHealthName(LinkHealth::kHealthy), "HEALTHY");
  EXPECT_STREQ(linkHealthName(LinkHealth::kDegraded), "DEGRADED");
  EXPECT_STREQ(linkHealthName(LinkHealth::kPartitioned), "PARTITIONED");
}

}  // namespace
}  // namespace tally
