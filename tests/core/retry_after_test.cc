#include "core/retry_after.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace tally {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(RetryAfterTest, ExactDivisionNeedsNoRounding) {
  // 600 asked, 400 available: 200 short at 10/s = 20 s.
  EXPECT_EQ(
      retryAfterMs(
          {.units = 600, .available = 400, .debt = 0, .refill_per_second = 10, .burst = 1000}),
      20'000);
  // 1 short at 1000/s = 1 ms.
  EXPECT_EQ(retryAfterMs(
                {.units = 1, .available = 0, .debt = 0, .refill_per_second = 1000, .burst = 1000}),
            1);
}

TEST(RetryAfterTest, RoundsUpToTheNextMillisecond) {
  // 1 unit at 3/s = 333.33 ms → 334.
  EXPECT_EQ(
      retryAfterMs({.units = 1, .available = 0, .debt = 0, .refill_per_second = 3, .burst = 10}),
      334);
  // 2 units at 3/s = 666.67 ms → 667.
  EXPECT_EQ(
      retryAfterMs({.units = 5, .available = 3, .debt = 0, .refill_per_second = 3, .burst = 10}),
      667);
  // 3 units at 3/s = exactly 1000 ms.
  EXPECT_EQ(
      retryAfterMs({.units = 3, .available = 0, .debt = 0, .refill_per_second = 3, .burst = 10}),
      1000);
  // 1 unit at 7000/s = 0.142 ms → 1 (never 0 while short).
  EXPECT_EQ(
      retryAfterMs({.units = 1, .available = 0, .debt = 0, .refill_per_second = 7000, .burst = 10}),
      1);
}

TEST(RetryAfterTest, DebtIsRepaidBeforeAnythingBecomesAvailable) {
  // 100 short + 200 debt = 300 at 10/s = 30 s.
  EXPECT_EQ(
      retryAfterMs(
          {.units = 100, .available = 0, .debt = 200, .refill_per_second = 10, .burst = 1000}),
      30'000);
  // Enough available, but 50 debt still blocks: 5 s.
  EXPECT_EQ(
      retryAfterMs(
          {.units = 100, .available = 100, .debt = 50, .refill_per_second = 10, .burst = 1000}),
      5'000);
  // Available above the units does not offset debt.
  EXPECT_EQ(retryAfterMs(
                {.units = 100, .available = 900, .debt = 1, .refill_per_second = 3, .burst = 1000}),
            334);
}

TEST(RetryAfterTest, EnoughAvailableAndNoDebtIsZero) {
  EXPECT_EQ(
      retryAfterMs(
          {.units = 400, .available = 400, .debt = 0, .refill_per_second = 10, .burst = 1000}),
      0);
  EXPECT_EQ(retryAfterMs(
                {.units = 1, .available = 1000, .debt = 0, .refill_per_second = 10, .burst = 1000}),
            0);
}

TEST(RetryAfterTest, AboveBurstIsNever) {
  EXPECT_EQ(retryAfterMs(
                {.units = 1001, .available = 0, .debt = 0, .refill_per_second = 10, .burst = 1000}),
            kRetryNever);
  // Even with plenty available: it can never be admitted under this policy.
  EXPECT_EQ(
      retryAfterMs(
          {.units = 1001, .available = 5000, .debt = 0, .refill_per_second = 10, .burst = 1000}),
      kRetryNever);
  // Exactly burst is possible.
  EXPECT_EQ(retryAfterMs(
                {.units = 1000, .available = 0, .debt = 0, .refill_per_second = 10, .burst = 1000}),
            100'000);
}

TEST(RetryAfterTest, RateZeroIsNever) {
  EXPECT_EQ(
      retryAfterMs({.units = 1, .available = 0, .debt = 0, .refill_per_second = 0, .burst = 1000}),
      kRetryNever);
  // Rate 0 is "never" even when nothing is missing: the function makes no promise without refill.
  EXPECT_EQ(
      retryAfterMs({.units = 1, .available = 10, .debt = 0, .refill_per_second = 0, .burst = 1000}),
      kRetryNever);
  EXPECT_EQ(kRetryNever, -1);
}

TEST(RetryAfterTest, SaturatesAtInt64Max) {
  constexpr uint64_t kMax = UINT64_MAX;
  EXPECT_EQ(
      retryAfterMs(
          {.units = kMax, .available = 0, .debt = kMax, .refill_per_second = 1, .burst = kMax}),
      kInt64Max);
  EXPECT_EQ(retryAfterMs(
                {.units = kMax, .available = 0, .debt = 0, .refill_per_second = 1, .burst = kMax}),
            kInt64Max);
  // Just below the limit: 9'223'372'036'854'775 units at 1/s = 9'223'372'036'854'775'000 ms.
  EXPECT_EQ(retryAfterMs({.units = 9'223'372'036'854'775ull,
                          .available = 0,
                          .debt = 0,
                          .refill_per_second = 1,
                          .burst = kMax}),
            int64_t{9'223'372'036'854'775'000});
  // One more unit crosses INT64_MAX (9'223'372'036'854'775'807).
  EXPECT_EQ(retryAfterMs({.units = 9'223'372'036'854'776ull,
                          .available = 0,
                          .debt = 0,
                          .refill_per_second = 1,
                          .burst = kMax}),
            kInt64Max);
}

}  // namespace
}  // namespace tally
