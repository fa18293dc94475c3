// The commit pipeline (ledger/commit_pipeline.h) with two batches in flight: commits never
// overlap and run in submission order, batch N+1's commit starts only once N's returned, a
// completion is reported only after its commit returned and after every earlier one, and after
// a failed commit nothing later is committed. A real libuv loop and threadpool; the store is a
// fake that can hold a commit open.

#include "ledger/commit_pipeline.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ledger/store.h"

namespace tally::ledger {
namespace {

constexpr auto kEventTimeout = std::chrono::seconds(10);
// How long a commit is held open while the test checks that nothing after it starts. Not a
// synchronisation: the test expects the wait to time out (a broken order shows up within it).
constexpr auto kHeldWindow = std::chrono::milliseconds(300);

// Batches are named by their ledger_clock_ms. Commits of `held` wait for release(); the
// commit of `failing` fails.
class HoldingStore final : public Store {
 public:
  Status commit(const StoreBatch& batch) override {
    const uint64_t id = batch.ledger_clock_ms;
    std::unique_lock lock(mu_);
    if (active_ > 0) overlapped_ = true;
    ++active_;
    events_.push_back("begin " + std::to_string(id));
    changed_.notify_all();
    if (id == held) changed_.wait(lock, [&] { return released_; });
    events_.push_back("end " + std::to_string(id));
    --active_;
    changed_.notify_all();
    return id == failing ? Status::ioError("disk full (test)") : Status::ok();
  }
  Result<StoreContents> load() override { return StoreContents{}; }

  // True once `event` happened, false if it did not within `timeout`.
  bool waitFor(const std::string& event, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] {
      for (const std::string& seen : events_) {
        if (seen == event) return true;
      }
      return false;
    });
  }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    changed_.notify_all();
  }
  std::vector<std::string> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  bool overlapped() {
    std::lock_guard lock(mu_);
    return overlapped_;
  }

  uint64_t held = 0;     // set before the first submit
  uint64_t failing = 0;  // set before the first submit

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
  int active_ = 0;
  bool overlapped_ = false;
  bool released_ = false;
};

struct Report {
  uint64_t ticket;
  Status result;
};

class CommitPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    uv_run(&loop_, UV_RUN_DEFAULT);  // whatever is left reports
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  StoreBatch batchNamed(uint64_t id) { return StoreBatch{.ledger_clock_ms = id}; }

  uv_loop_t loop_{};
  HoldingStore store_;
  std::vector<Report> reports_;
};

TEST_F(CommitPipelineTest, BatchTwoWaitsForBatchOneAndIsReportedAfterIt) {
  store_.held = 1;
  CommitPipeline pipeline(&loop_, &store_, 2, [&](uint64_t ticket, const Status& result, uint64_t) {
    reports_.push_back({ticket, result});
  });
  Result<uint64_t> first = pipeline.submit(batchNamed(1));
  Result<uint64_t> second = pipeline.submit(batchNamed(2));
  ASSERT_TRUE(first.isOk() && second.isOk());
  EXPECT_TRUE(pipeline.full());
  ASSERT_TRUE(store_.waitFor("begin 1", kEventTimeout));
  // Held open: batch 2 is queued on the threadpool, but its commit must not start.
  EXPECT_FALSE(store_.waitFor("begin 2", kHeldWindow)) << "batch 2 committed while 1 was open";
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_TRUE(reports_.empty()) << "a completion was reported before its commit returned";
  store_.release();
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_TRUE(pipeline.idle());
  EXPECT_EQ(store_.events(), (std::vector<std::string>{"begin 1", "end 1", "begin 2", "end 2"}));
  EXPECT_FALSE(store_.overlapped());
  ASSERT_EQ(reports_.size(), 2u);
  EXPECT_EQ(reports_[0].ticket, first.value());
  EXPECT_EQ(reports_[1].ticket, second.value());
  EXPECT_TRUE(reports_[0].result.isOk());
  EXPECT_TRUE(reports_[1].result.isOk());
}

TEST_F(CommitPipelineTest, AfterAFailedCommitNothingLaterIsCommitted) {
  store_.held = 1;
  store_.failing = 1;
  CommitPipeline pipeline(&loop_, &store_, 2, [&](uint64_t ticket, const Status& result, uint64_t) {
    reports_.push_back({ticket, result});
  });
  ASSERT_TRUE(pipeline.submit(batchNamed(1)).isOk());
  ASSERT_TRUE(pipeline.submit(batchNamed(2)).isOk());
  ASSERT_TRUE(store_.waitFor("begin 1", kEventTimeout));
  store_.release();
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_TRUE(pipeline.submit(batchNamed(3)).isOk());  // and none after it either
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(store_.events(), (std::vector<std::string>{"begin 1", "end 1"}));
  ASSERT_EQ(reports_.size(), 3u);
  EXPECT_EQ(reports_[0].result.code(), StatusCode::kIoError);
  for (size_t i = 1; i < reports_.size(); ++i) {
    EXPECT_EQ(reports_[i].result.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(reports_[i].result.message().find("disk full (test)"), std::string::npos)
        << reports_[i].result.toString();
  }
}

TEST_F(CommitPipelineTest, ManyBatchesCommitAndReportInSubmissionOrder) {
  std::vector<uint64_t> tickets;
  CommitPipeline pipeline(&loop_, &store_, 2, [&](uint64_t ticket, const Status& result, uint64_t) {
    EXPECT_TRUE(result.isOk());
    reports_.push_back({ticket, result});
  });
  for (uint64_t id = 1; id <= 50; ++id) {
    while (pipeline.full()) uv_run(&loop_, UV_RUN_ONCE);
    Result<uint64_t> ticket = pipeline.submit(batchNamed(id));
    ASSERT_TRUE(ticket.isOk());
    tickets.push_back(ticket.value());
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_EQ(reports_.size(), tickets.size());
  std::vector<std::string> expected;
  for (size_t i = 0; i < tickets.size(); ++i) {
    EXPECT_EQ(reports_[i].ticket, tickets[i]);
    expected.push_back("begin " + std::to_string(i + 1));
    expected.push_back("end " + std::to_string(i + 1));
  }
  EXPECT_EQ(store_.events(), expected);
  EXPECT_FALSE(store_.overlapped());
}

}  // namespace
}  // namespace tally::ledger
