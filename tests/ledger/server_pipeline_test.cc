// The Server with two batches in flight (ServerOptions::commits_in_flight_max = 2): while the
// store holds batch N's commit open, no reply leaves, neither N's nor those of the batch
// sealed behind it (N+1) nor of a read behind them; once N returns, N+1 is committed after it
// and every reply goes out in order. In process: a real Server on a loop thread, a store that
// can hold a commit open, BlockingClients.

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "central-client/blocking_client.h"
#include "common/log.h"
#include "common/wall_clock.h"
#include "core/ledger.h"
#include "core/ledger_protocol.h"
#include "ledger/server.h"
#include "ledger/store.h"
#include "tests/integration/ledger_harness.h"

namespace tally::ledger {
namespace {

constexpr uint64_t kTimeoutMs = 10'000;
// How long the test waits for a reply that must not come while a commit is held open. Not a
// synchronisation: the wait is expected to time out (a reply sent early arrives within it).
constexpr uint64_t kHeldWindowMs = 300;

// Records the reservation ids of each commit; once hold() was called, the next commit waits
// for release().
class HoldingStore final : public Store {
 public:
  Status commit(const StoreBatch& batch) override {
    std::unique_lock lock(mu_);
    std::string ids;
    for (const Reservation& reservation : batch.reservations)
      ids += reservation.reservation_id + " ";
    events_.push_back("begin " + ids);
    if (hold_) {
      hold_ = false;
      holding_ = true;
      changed_.notify_all();
      changed_.wait(lock, [&] { return released_; });
      holding_ = false;
    }
    events_.push_back("end " + ids);
    return Status::ok();
  }
  Result<StoreContents> load() override { return StoreContents{}; }

  void hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  bool waitHolding() {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::milliseconds(kTimeoutMs), [&] { return holding_; });
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

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::string> events_;
  bool hold_ = false;
  bool holding_ = false;
  bool released_ = false;
};

struct Running {
  uv_loop_t loop{};
  uv_async_t stop_async{};
  Ledger ledger;
  LedgerClock clock{0};
  Logger logger{"ledger", LogLevel::kError};
  HoldingStore store;
  std::unique_ptr<Server> server;
  std::thread thread;

  explicit Running(ServerOptions options) {
    EXPECT_EQ(uv_loop_init(&loop), 0);
    options.listen_port = 0;
    options.on_stopped = [this] { uv_close(reinterpret_cast<uv_handle_t*>(&stop_async), nullptr); };
    server = std::make_unique<Server>(&loop, &ledger, &store, &clock, &logger, std::move(options));
    EXPECT_TRUE(server->start().isOk());
    stop_async.data = this;
    EXPECT_EQ(uv_async_init(
                  &loop, &stop_async,
                  [](uv_async_t* async) { static_cast<Running*>(async->data)->server->stop(); }),
              0);
    thread = std::thread([this] { uv_run(&loop, UV_RUN_DEFAULT); });
  }
  void stopAndJoin() {
    EXPECT_EQ(uv_async_send(&stop_async), 0);
    thread.join();
    EXPECT_EQ(uv_loop_close(&loop), 0);
  }
  std::unique_ptr<client::BlockingClient> connect() {
    Result<std::unique_ptr<client::BlockingClient>> connected = client::BlockingClient::connect(
        client::Endpoint{
            .kind = client::Endpoint::Kind::kTcp, .host = "127.0.0.1", .port = server->port()},
        kTimeoutMs);
    EXPECT_TRUE(connected.isOk()) << connected.status().toString();
    return connected.isOk() ? std::move(connected).value() : nullptr;
  }
};

void expectReserved(const Result<wire::Response>& answer, uint64_t id) {
  ASSERT_TRUE(answer.isOk()) << answer.status().toString();
  EXPECT_EQ(answer.value().request_id, id);
  EXPECT_FALSE(std::holds_alternative<wire::ErrorReply>(answer.value().body))
      << wire::describe(answer.value().body);
}

TEST(ServerPipelineTest, NoReplyLeavesWhileAnEarlierBatchIsStillSyncing) {
  Running running(ServerOptions{.commits_in_flight_max = 2});
  std::unique_ptr<client::BlockingClient> first = running.connect();
  std::unique_ptr<client::BlockingClient> second = running.connect();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  Result<wire::Response> published = first->call(
      wire::PublishPolicyRequest{.budgets = {testing::makeBudget({.burst = 1000})}}, kTimeoutMs);
  ASSERT_TRUE(published.isOk()) << published.status().toString();

  running.store.hold();
  Result<uint64_t> r1 = first->send(testing::makeReserve({.id = "r-1"}), kTimeoutMs);
  ASSERT_TRUE(r1.isOk());
  ASSERT_TRUE(running.store.waitHolding());  // batch N (r-1) is syncing, held open
  Result<uint64_t> r2 = second->send(testing::makeReserve({.id = "r-2"}), kTimeoutMs);
  Result<uint64_t> health = second->send(wire::HealthRequest{}, kTimeoutMs);
  ASSERT_TRUE(r2.isOk() && health.isOk());
  // r-2 is applied and sealed into batch N+1, queued behind N; the health read waits behind
  // both. Nothing may be answered while N is not durable.
  EXPECT_FALSE(second->receive(kHeldWindowMs).isOk()) << "a reply left before N was durable";
  EXPECT_FALSE(first->receive(kHeldWindowMs).isOk()) << "r-1 was answered before its commit";

  running.store.release();
  expectReserved(first->receive(kTimeoutMs), r1.value());
  expectReserved(second->receive(kTimeoutMs), r2.value());
  Result<wire::Response> healthy = second->receive(kTimeoutMs);
  ASSERT_TRUE(healthy.isOk()) << healthy.status().toString();
  EXPECT_EQ(healthy.value().request_id, health.value());

  running.stopAndJoin();
  // N+1 was its own commit, begun only once N's had returned.
  const std::vector<std::string> events = running.store.events();
  std::vector<std::string> tail;
  for (const std::string& event : events) {
    if (event.find("r-") != std::string::npos) tail.push_back(event);
  }
  EXPECT_EQ(tail, (std::vector<std::string>{"begin r-1 ", "end r-1 ", "begin r-2 ", "end r-2 "}));
}

}  // namespace
}  // namespace tally::ledger
