// common/fd_limit: the soft RLIMIT_NOFILE is raised to the hard limit (both daemons do it at
// start; tests/integration/fd_limit_test.cc checks that they do and log it).

#include "common/fd_limit.h"

#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace tally {
namespace {

TEST(FdLimitTarget, IsTheHardLimit) {
  EXPECT_EQ(fdLimitTarget(1024, 524288, false, 1u << 20), 524288u);
  EXPECT_EQ(fdLimitTarget(4096, 4096, false, 1u << 20), 4096u);
}

TEST(FdLimitTarget, AnUnlimitedHardLimitIsCappedAtNrOpen) {
  EXPECT_EQ(fdLimitTarget(1024, 0, true, 1u << 20), 1u << 20);
}

TEST(FdLimitTarget, NeverLowersTheSoftLimit) {
  EXPECT_EQ(fdLimitTarget(8192, 4096, false, 1u << 20), 8192u);
  EXPECT_EQ(fdLimitTarget(2u << 20, 0, true, 1u << 20), 2u << 20);
}

class FdLimitTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0); }
  void TearDown() override { EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &saved_), 0); }
  rlimit saved_{};
};

TEST_F(FdLimitTest, RaisesALoweredSoftLimitToTheHardLimit) {
  if (saved_.rlim_max != RLIM_INFINITY && saved_.rlim_max <= 64) GTEST_SKIP() << "hard limit 64";
  rlimit lowered = saved_;
  lowered.rlim_cur = 64;  // as under `ulimit -Sn 64`
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);

  const FdLimit limit = raiseFdLimit();
  EXPECT_TRUE(limit.error.empty()) << limit.error;
  EXPECT_TRUE(limit.raised);
  EXPECT_EQ(limit.soft_before, 64u);
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, limit.soft);
  EXPECT_EQ(now.rlim_max, saved_.rlim_max);  // the hard limit is never touched
  if (saved_.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(limit.soft, saved_.rlim_max);
  }
  EXPECT_GT(limit.soft, 64u);
}

TEST_F(FdLimitTest, AtTheHardLimitAlreadyNothingChanges) {
  if (saved_.rlim_max == RLIM_INFINITY) GTEST_SKIP() << "unlimited hard limit";
  rlimit at_hard = saved_;
  at_hard.rlim_cur = saved_.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &at_hard), 0);

  const FdLimit limit = raiseFdLimit();
  EXPECT_TRUE(limit.error.empty()) << limit.error;
  EXPECT_FALSE(limit.raised);
  EXPECT_EQ(limit.soft, saved_.rlim_max);
  EXPECT_EQ(limit.soft_before, saved_.rlim_max);
}

}  // namespace
}  // namespace tally
