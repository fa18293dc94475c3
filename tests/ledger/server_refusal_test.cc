// The Server's answer to a commit the store refuses (ledger/server.h, refused_answer and
// refuse()): when the owner says none of the batch can be durable (a deposed primary), every
// request held is answered with the owner's error under its own id, instead of being dropped,
// and the server stops; without refused_answer a failed commit stays fatal and nothing is said.
// In process: a real Server on a loop thread, a store whose every commit fails, a BlockingClient;
// each test runs with the commit on a worker thread and on the loop (commit_on_loop).

#include <gtest/gtest.h>

#include <memory>
#include <optional>
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

// Every commit is refused, as a deposed primary's fence refuses it.
class RefusingStore final : public Store {
 public:
  Status commit(const StoreBatch&) override {
    ++commits;
    return Status::failedPrecondition("postgres: deposed: committing a batch (test)");
  }
  Result<StoreContents> load() override { return StoreContents{}; }
  int commits = 0;
};

// A publish (a change: committed, refused), a health and a reserve behind it, pipelined.
// `later_sends_may_fail`: a server that goes fatal on the first batch closes the connection, and
// with commits on the loop that batch may hold the publish alone: the later sends may then meet
// the closed socket (EPIPE). The first send must always get through.
std::vector<uint64_t> sendThree(client::BlockingClient& client, bool later_sends_may_fail = false) {
  std::vector<uint64_t> ids;
  for (const wire::RequestBody& body : {wire::RequestBody{wire::PublishPolicyRequest{
                                            .budgets = {testing::makeBudget({.burst = 1000})}}},
                                        wire::RequestBody{wire::HealthRequest{}},
                                        wire::RequestBody{testing::makeReserve({.id = "r-1"})}}) {
    Result<uint64_t> sent = client.send(body, kServerTimeoutMs);
    if (ids.empty() || !later_sends_may_fail) {
      EXPECT_TRUE(sent.isOk()) << sent.status().toString();
    }
    ids.push_back(sent.isOk() ? sent.value() : 0);
  }
  return ids;
}

class ServerRefusalTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(CommitOn, ServerRefusalTest, ::testing::Bool(),
                         tally::testing::commitOnName);

TEST_P(ServerRefusalTest, ARefusedBatchIsAnsweredWithTheOwnersErrorUnderEachIdAndTheServerStops) {
  const std::string message = notPrimaryMessage("10.0.0.9:7411");
  std::vector<Status> failures;
  // A long tick: the three requests are read well within the interval the refusing server
  // keeps reading before it stops.
  RefusingStore store;
  // The loop thread calls refused_answer; `failures` is read after join().
  RunningServer running(
      &store, ServerOptions{.tick_interval_ms = 500,
                            .commit_on_loop = GetParam(),
                            .refused_answer = [&](const Status& failure) {
                              failures.push_back(failure);
                              return std::optional<wire::ErrorReply>(wire::ErrorReply{
                                  .code = wire::ErrorCode::kNotPrimary, .message = message});
                            }});
  std::unique_ptr<client::BlockingClient> client = running.connect();
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = sendThree(*client);
  for (uint64_t id : ids) {
    Result<wire::Response> answer = client->receive(kServerTimeoutMs);
    ASSERT_TRUE(answer.isOk()) << answer.status().toString();
    EXPECT_EQ(answer.value().request_id, id);
    const auto* error = std::get_if<wire::ErrorReply>(&answer.value().body);
    ASSERT_NE(error, nullptr) << wire::describe(answer.value().body);
    EXPECT_EQ(error->code, wire::ErrorCode::kNotPrimary);
    EXPECT_EQ(error->message, message);
  }
  // A request sent while the refusing server still reads is answered the same.
  Result<wire::Response> later = client->call(wire::HealthRequest{}, kServerTimeoutMs);
  ASSERT_TRUE(later.isOk()) << later.status().toString();
  const auto* error = std::get_if<wire::ErrorReply>(&later.value().body);
  ASSERT_NE(error, nullptr) << wire::describe(later.value().body);
  EXPECT_EQ(error->code, wire::ErrorCode::kNotPrimary);
  // Then it stops at its tick and closes the connection: nothing else is said.
  running.join();
  EXPECT_FALSE(client->call(wire::HealthRequest{}, kServerTimeoutMs).isOk());
  EXPECT_TRUE(running.server->refusing());
  EXPECT_FALSE(running.server->fatal());
  EXPECT_EQ(store.commits, 1);  // nothing after the refusal is even tried
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code(), StatusCode::kFailedPrecondition);
}

TEST_P(ServerRefusalTest, WithoutRefusedAnswerAFailedCommitIsFatalAndNothingIsSaid) {
  RefusingStore store;
  RunningServer running(&store,
                        ServerOptions{.tick_interval_ms = 500, .commit_on_loop = GetParam()});
  std::unique_ptr<client::BlockingClient> client = running.connect();
  ASSERT_NE(client, nullptr);
  (void)sendThree(*client, /*later_sends_may_fail=*/true);
  Result<wire::Response> answer = client->receive(kServerTimeoutMs);
  EXPECT_FALSE(answer.isOk()) << wire::describe(answer.value().body);
  client.reset();
  running.join();
  EXPECT_TRUE(running.server->fatal());
  EXPECT_FALSE(running.server->refusing());
}

}  // namespace
}  // namespace tally::ledger
