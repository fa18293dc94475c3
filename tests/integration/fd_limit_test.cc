// Both daemons raise their soft file-descriptor limit to the hard limit at start and log it
// (common/fd_limit.h): started under a soft limit of 256, as under `ulimit -Sn 256`, each logs
// event=fd_limit with soft_before=256 and soft = the hard limit.

#include <sys/resource.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/agent_harness.h"

namespace tally::testing {
namespace {

using ::testing::HasSubstr;

constexpr rlim_t kLoweredSoft = 256;

class FdLimitTest : public AgentFleetTest {
 protected:
  void SetUp() override {
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0);
    if (saved_.rlim_max == RLIM_INFINITY || saved_.rlim_max <= kLoweredSoft) {
      GTEST_SKIP() << "needs a finite hard limit above " << kLoweredSoft;
    }
    rlimit lowered = saved_;
    lowered.rlim_cur = kLoweredSoft;  // inherited by the daemons this test spawns
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  }
  void TearDown() override {
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &saved_), 0);
    AgentFleetTest::TearDown();
  }

  std::string expectedLine() const {
    return "event=fd_limit soft_before=" + std::to_string(kLoweredSoft) +
           " soft=" + std::to_string(saved_.rlim_max) + " hard=" + std::to_string(saved_.rlim_max) +
           " raised=true";
  }

  rlimit saved_{};
};

TEST_F(FdLimitTest, BothDaemonsRaiseTheSoftLimitToTheHardLimitAndLogIt) {
  startLedger();
  startAgent(0, ledgerAddress());
  EXPECT_THAT(ledger_.log(), HasSubstr(expectedLine()));
  ASSERT_FALSE(agents_.empty());
  EXPECT_THAT(agents_[0]->log(), HasSubstr(expectedLine()));
}

}  // namespace
}  // namespace tally::testing
