// Group commit in the Server (docs/LEDGER.md "Durability and group commit"), with the commit on a
// worker thread and on the loop (ServerOptions::commit_on_loop): a request is answered only after
// the commit of its own batch has returned, and a request that arrives while a commit is under
// way goes into the next batch, whichever thread runs the commit. In process: a real Server on a
// loop thread, a store that holds a commit open until the test lets it go, BlockingClients.

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/ledger_protocol.h"
#include "ledger/server.h"
#include "ledger/store.h"
#include "tests/integration/ledger_harness.h"
#include "tests/ledger/running_server.h"

namespace tally::ledger {
namespace {

using tally::testing::kServerTimeoutMs;
using tally::testing::RunningServer;

// Records the reservation ids of every commit; once hold() is called, the next commit waits
// (on the committing thread) until release().
class HoldingStore final : public Store {
 public:
  Status commit(const StoreBatch& batch) override {
    std::unique_lock lock(mu_);
    std::vector<std::string> ids;
    for (const Reservation& reservation : batch.reservations)
      ids.push_back(reservation.reservation_id);
    committed_.push_back(std::move(ids));
    if (hold_) {
      holding_ = true;
      changed_.notify_all();
      changed_.wait(lock, [this] { return !hold_; });
      holding_ = false;
    }
    return Status::ok();
  }
  Result<StoreContents> load() override { return StoreContents{}; }

  void hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  // Waits (bounded) until a commit is held open; false on timeout.
  bool waitHolding() {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::milliseconds(kServerTimeoutMs),
                             [this] { return holding_; });
  }
  void release() {
    std::lock_guard lock(mu_);
    hold_ = false;
    changed_.notify_all();
  }
  std::vector<std::vector<std::string>> committed() {
    std::lock_guard lock(mu_);
    return committed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool hold_ = false;
  bool holding_ = false;
  std::vector<std::vector<std::string>> committed_;
};

class ServerCommitTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(CommitOn, ServerCommitTest, ::testing::Bool(),
                         tally::testing::commitOnName);

void expectReserved(const Result<wire::Response>& answer, uint64_t request_id) {
  ASSERT_TRUE(answer.isOk()) << answer.status().toString();
  EXPECT_EQ(answer.value().request_id, request_id);
  const auto* reply = std::get_if<ReservationReply>(&answer.value().body);
  ASSERT_NE(reply, nullptr) << wire::describe(answer.value().body);
  EXPECT_EQ(reply->code, ReplyCode::kOk) << reply->message;
}

TEST_P(ServerCommitTest, ARequestArrivingDuringACommitIsAnsweredAfterTheNextOne) {
  HoldingStore store;
  RunningServer running(&store, ServerOptions{.commit_on_loop = GetParam()});
  std::unique_ptr<client::BlockingClient> first = running.connect();
  std::unique_ptr<client::BlockingClient> second = running.connect();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  Result<wire::Response> published =
      first->call(wire::PublishPolicyRequest{.budgets = {testing::makeBudget({.burst = 1000})}},
                  kServerTimeoutMs);
  ASSERT_TRUE(published.isOk()) << published.status().toString();

  store.hold();
  Result<uint64_t> held = first->send(testing::makeReserve({.id = "r-held"}), kServerTimeoutMs);
  ASSERT_TRUE(held.isOk()) << held.status().toString();
  ASSERT_TRUE(store.waitHolding()) << "the reserve's commit never started";
  Result<uint64_t> behind =
      second->send(testing::makeReserve({.id = "r-behind"}), kServerTimeoutMs);
  ASSERT_TRUE(behind.isOk()) << behind.status().toString();
  // Neither is answered while the first one's commit is held open.
  EXPECT_FALSE(first->receive(200).isOk());
  EXPECT_FALSE(second->receive(200).isOk());

  store.release();
  expectReserved(first->receive(kServerTimeoutMs), held.value());
  expectReserved(second->receive(kServerTimeoutMs), behind.value());
  const std::vector<std::vector<std::string>> committed = store.committed();
  ASSERT_EQ(committed.size(), 3u);  // the publish, then one batch each
  EXPECT_EQ(committed[1], std::vector<std::string>{"r-held"});
  EXPECT_EQ(committed[2], std::vector<std::string>{"r-behind"});
  running.stopFromTest();
  running.join();
  EXPECT_FALSE(running.server->fatal());
}

}  // namespace
}  // namespace tally::ledger
