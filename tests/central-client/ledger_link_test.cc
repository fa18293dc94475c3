#include "central-client/ledger_link.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/log.h"
#include "common/wall_clock.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "wire/codec.h"
#include "wire/frame.h"

namespace tally::central {
namespace {

// A scripted ledger on 127.0.0.1, on the test's own loop: it records every request and answers
// only when (and how) the test says, or at once in auto-answer mode. Each answer is a HealthReply
// whose `status` echoes the request's QueryRequest reservation id, so a test can check pairing.
class FakeLedger {
 public:
  struct Received {
    uint64_t connection = 0;
    uint64_t request_id = 0;
    std::string tag;  // the QueryRequest reservation id
  };

  explicit FakeLedger(uv_loop_t* loop) : loop_(loop) {}
  ~FakeLedger() { EXPECT_EQ(open_handles_, 0) << "FakeLedger::close() and a loop run first"; }
  FakeLedger(const FakeLedger&) = delete;
  FakeLedger& operator=(const FakeLedger&) = delete;

  bool listen(uint16_t port) {
    listener_ = std::make_unique<uv_tcp_t>();
    listener_->data = this;
    if (uv_tcp_init(loop_, listener_.get()) != 0) return false;
    ++open_handles_;
    sockaddr_in address{};
    if (uv_ip4_addr("127.0.0.1", port, &address) != 0) return false;
    if (uv_tcp_bind(listener_.get(), reinterpret_cast<const sockaddr*>(&address), 0) != 0) {
      return false;
    }
    if (uv_listen(reinterpret_cast<uv_stream_t*>(listener_.get()), 16, onConnection) != 0) {
      return false;
    }
    sockaddr_in bound{};
    int length = sizeof(bound);
    if (uv_tcp_getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      return false;
    }
    port_ = ntohs(bound.sin_port);
    return true;
  }

  void closeListener() {
    if (listener_ == nullptr) return;
    uv_tcp_t* raw = listener_.release();
    uv_close(reinterpret_cast<uv_handle_t*>(raw), [](uv_handle_t* handle) {
      auto* fake = static_cast<FakeLedger*>(handle->data);
      delete reinterpret_cast<uv_tcp_t*>(handle);
      --fake->open_handles_;
    });
  }

  // Abrupt close of every accepted connection.
  void closeConnections() {
    for (auto& connection : connections_) {
      if (connection->closing) continue;
      connection->closing = true;
      uv_close(reinterpret_cast<uv_handle_t*>(&connection->tcp), [](uv_handle_t* handle) {
        auto* conn = static_cast<Conn*>(handle->data);
        --conn->fake->open_handles_;
        conn->closed = true;
      });
    }
  }

  void close() {
    closeListener();
    closeConnections();
  }

  void answer(const Received& request) {
    answerWith(request.request_id,
               wire::HealthReply{.status = request.tag, .version = "fake", .now_ms = 1});
  }
  void answerWith(uint64_t request_id, wire::ResponseBody body) {
    Result<std::vector<uint8_t>> frame = wire::encodeResponseFrame(
        wire::Response{.request_id = request_id, .body = std::move(body)});
    ASSERT_TRUE(frame.isOk());
    sendRaw(std::move(frame).value());
  }
  // Writes `bytes` on the newest open connection.
  void sendRaw(std::vector<uint8_t> bytes) {
    Conn* connection = newest();
    ASSERT_NE(connection, nullptr);
    auto* write = new WriteReq{.bytes = std::move(bytes)};
    write->req.data = write;
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(write->bytes.data()),
                               static_cast<unsigned>(write->bytes.size()));
    const int rc = uv_write(&write->req, reinterpret_cast<uv_stream_t*>(&connection->tcp), &buf, 1,
                            [](uv_write_t* req, int) { delete static_cast<WriteReq*>(req->data); });
    if (rc != 0) delete write;
    ASSERT_EQ(rc, 0);
  }

  uint16_t port() const { return port_; }
  bool idle() const { return open_handles_ == 0; }
  size_t accepted() const { return connections_.size(); }
  std::vector<Received>& requests() { return requests_; }
  bool auto_answer = false;
  std::string not_primary;  // when set: a standby, answering every request NOT_PRIMARY with it

 private:
  struct Conn {
    FakeLedger* fake = nullptr;
    uint64_t id = 0;
    uv_tcp_t tcp{};
    wire::FrameDecoder decoder;
    bool closing = false;
    bool closed = false;
  };
  struct WriteReq {
    uv_write_t req{};
    std::vector<uint8_t> bytes;
  };

  Conn* newest() {
    for (auto it = connections_.rbegin(); it != connections_.rend(); ++it) {
      if (!(*it)->closing) return it->get();
    }
    return nullptr;
  }

  static void onConnection(uv_stream_t* listener, int status) {
    auto* fake = static_cast<FakeLedger*>(listener->data);
    if (status != 0) return;
    auto conn = std::make_unique<Conn>();
    conn->fake = fake;
    conn->id = fake->connections_.size() + 1;
    conn->tcp.data = conn.get();
    ASSERT_EQ(uv_tcp_init(fake->loop_, &conn->tcp), 0);
    ++fake->open_handles_;
    Conn* raw = conn.get();
    fake->connections_.push_back(std::move(conn));
    ASSERT_EQ(uv_accept(listener, reinterpret_cast<uv_stream_t*>(&raw->tcp)), 0);
    auto on_alloc = [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
      auto* c = static_cast<Conn*>(handle->data);
      *buf = uv_buf_init(c->fake->read_buffer_, sizeof(c->fake->read_buffer_));
    };
    auto on_read = [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
      auto* c = static_cast<Conn*>(stream->data);
      if (nread < 0) {
        if (!c->closing) {
          c->closing = true;
          uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), [](uv_handle_t* handle) {
            auto* closed = static_cast<Conn*>(handle->data);
            --closed->fake->open_handles_;
            closed->closed = true;
          });
        }
        return;
      }
      std::vector<wire::Frame> frames;
      ASSERT_TRUE(c->decoder
                      .feed(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf->base),
                                                     static_cast<size_t>(nread)),
                            &frames)
                      .isOk());
      for (const wire::Frame& frame : frames) {
        wire::DecodedRequest decoded = wire::decodeRequest(frame);
        ASSERT_TRUE(decoded.body.isOk());
        Received received{.connection = c->id, .request_id = decoded.request_id.value_or(0)};
        if (const auto* query = std::get_if<QueryRequest>(&decoded.body.value())) {
          received.tag = query->reservation_id;
        }
        c->fake->requests_.push_back(received);
        if (!c->fake->not_primary.empty()) {
          c->fake->answerWith(received.request_id,
                              wire::ErrorReply{.code = wire::ErrorCode::kNotPrimary,
                                               .message = c->fake->not_primary});
        } else if (c->fake->auto_answer) {
          c->fake->answer(received);
        }
      }
    };
    ASSERT_EQ(uv_read_start(reinterpret_cast<uv_stream_t*>(&raw->tcp), on_alloc, on_read), 0);
  }

  uv_loop_t* loop_;
  std::unique_ptr<uv_tcp_t> listener_;
  std::vector<std::unique_ptr<Conn>> connections_;  // kept (closed) until destruction
  std::vector<Received> requests_;
  int open_handles_ = 0;
  uint16_t port_ = 0;
  char read_buffer_[64 * 1024];
};

wire::RequestBody query(const std::string& tag) { return QueryRequest{.reservation_id = tag}; }

std::string echoed(const LinkResult& result) {
  if (!result.status.isOk()) return "error: " + result.status.toString();
  const auto* reply = std::get_if<wire::HealthReply>(&result.response.body);
  return reply != nullptr ? reply->status : "not a health reply";
}

class LedgerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }

  void TearDown() override {
    bool closed = link_ == nullptr;
    if (link_ != nullptr) link_->stop([&] { closed = true; });
    if (fake_ != nullptr) fake_->close();
    if (primary_ != nullptr) primary_->close();
    EXPECT_TRUE(runUntil([&] { return closed; }));
    // Whatever is left (fake connections closing) runs dry.
    for (int i = 0; i < 100 && uv_run(&loop_, UV_RUN_NOWAIT) != 0; ++i) {
    }
    link_.reset();
    fake_.reset();
    primary_.reset();
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "a handle was left open";
  }

  // Drives the loop until `condition` holds or `timeout_ms` passes. The link's health tick
  // (every 100 ms at most) bounds each blocking iteration.
  bool runUntil(const std::function<bool()>& condition, uint64_t timeout_ms = 10'000) {
    const uint64_t deadline = monotonicClockMs() + timeout_ms;
    while (!condition()) {
      if (monotonicClockMs() >= deadline) return false;
      uv_run(&loop_, UV_RUN_ONCE);
    }
    return true;
  }

  void startFake(uint16_t port = 0) {
    fake_ = std::make_unique<FakeLedger>(&loop_);
    ASSERT_TRUE(fake_->listen(port));
  }

  LedgerLinkOptions options(uint16_t port) {
    LedgerLinkOptions o;
    o.port = port;
    o.request_timeout_ms = 5'000;
    o.connect_timeout_ms = 1'000;
    o.reconnect_backoff_initial_ms = 10;
    o.reconnect_backoff_max_ms = 100;
    o.seed = 42;
    o.health_tick_ms = 20;
    return o;
  }

  void startLink(LedgerLinkOptions o) {
    link_ = std::make_unique<LedgerLink>(&loop_, std::move(o), &logger_);
    link_->setOnConnected([this] { ++connects_; });
    link_->setOnHealthChange(
        [this](LinkHealth previous, LinkHealth now) { transitions_.emplace_back(previous, now); });
    ASSERT_TRUE(link_->start().isOk());
  }

  void startConnected() {
    startFake();
    startLink(options(fake_->port()));
    ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  }

  // Calls and records the result in results_[index].
  size_t callTagged(const std::string& tag) {
    const size_t index = results_.size();
    results_.emplace_back();
    link_->call(query(tag), [this, index](LinkResult result) {
      ASSERT_FALSE(results_[index].has_value()) << "done called twice";
      results_[index] = std::move(result);
    });
    return index;
  }
  bool allDone() const {
    for (const auto& result : results_) {
      if (!result.has_value()) return false;
    }
    return true;
  }

  uv_loop_t loop_{};
  Logger logger_{"ledger_link_test", LogLevel::kDebug};
  std::unique_ptr<FakeLedger> fake_;
  std::unique_ptr<FakeLedger> primary_;  // a second fake: the primary, when fake_ is a standby
  std::unique_ptr<LedgerLink> link_;
  int connects_ = 0;
  std::vector<std::pair<LinkHealth, LinkHealth>> transitions_;
  std::vector<std::optional<LinkResult>> results_;
};

TEST_F(LedgerLinkTest, PipelinedCallsAnsweredOutOfOrderReachTheirCallers) {
  startConnected();
  EXPECT_EQ(connects_, 1);
  constexpr int kCalls = 50;
  for (int i = 0; i < kCalls; ++i) callTagged("q-" + std::to_string(i));
  ASSERT_TRUE(runUntil([&] { return fake_->requests().size() == kCalls; }));
  EXPECT_EQ(link_->inFlight(), static_cast<size_t>(kCalls));
  // All on one connection, ids distinct.
  std::set<uint64_t> ids;
  for (const auto& request : fake_->requests()) {
    EXPECT_EQ(request.connection, 1u);
    ids.insert(request.request_id);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kCalls));
  // Answer in reverse order, in two bursts.
  for (int i = kCalls - 1; i >= kCalls / 2; --i) fake_->answer(fake_->requests()[i]);
  ASSERT_TRUE(runUntil([&] { return results_[kCalls / 2].has_value(); }));
  EXPECT_FALSE(results_[0].has_value());
  for (int i = kCalls / 2 - 1; i >= 0; --i) fake_->answer(fake_->requests()[i]);
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(results_[i]->status.isOk()) << results_[i]->status.toString();
    EXPECT_EQ(echoed(*results_[i]), "q-" + std::to_string(i));
    EXPECT_EQ(results_[i]->response.request_id, fake_->requests()[i].request_id);
  }
  EXPECT_EQ(link_->health(), LinkHealth::kHealthy);
  EXPECT_EQ(link_->stats().answered, static_cast<uint64_t>(kCalls));
  EXPECT_EQ(link_->inFlight(), 0u);
  EXPECT_TRUE(transitions_.empty());
}

TEST_F(LedgerLinkTest, BurstLargerThanTheSocketBufferArrivesWholeAndInOrder) {
  // One loop iteration queues ~8 MB: the direct write takes what the socket accepts, the rest
  // goes out through a queued write, and every request still arrives once, in order. The
  // request timeout is the wait's bound: under ASan on a loaded machine the fake needs more than
  // the usual 5 s to answer 40,000 requests, and a timeout is not what this test is about.
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.request_timeout_ms = 60'000;
  startLink(std::move(o));
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  fake_->auto_answer = true;
  constexpr int kCalls = 40'000;
  const std::string padding(100, 'x');
  for (int i = 0; i < kCalls; ++i) callTagged(std::to_string(i) + "-" + padding);
  ASSERT_TRUE(runUntil([&] { return allDone(); }, 60'000));
  ASSERT_EQ(fake_->requests().size(), static_cast<size_t>(kCalls));
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_EQ(fake_->requests()[i].tag, std::to_string(i) + "-" + padding);
    ASSERT_TRUE(results_[i]->status.isOk()) << results_[i]->status.toString();
    ASSERT_EQ(echoed(*results_[i]), std::to_string(i) + "-" + padding);
  }
  EXPECT_EQ(link_->stats().connections_lost, 0u);
}

TEST_F(LedgerLinkTest, CallWhileDisconnectedFailsAtOnceButAsynchronously) {
  // A port nobody listens on: bind one, then give it back.
  startFake();
  const uint16_t port = fake_->port();
  fake_->close();
  startLink(options(port));
  EXPECT_FALSE(link_->connected());
  const size_t index = callTagged("early");
  EXPECT_FALSE(results_[index].has_value()) << "done ran inside call()";
  const uint64_t started_ms = monotonicClockMs();
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_LT(monotonicClockMs() - started_ms, 1'000u);  // no waiting for a deadline
  EXPECT_EQ(results_[index]->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(results_[index]->status.message().find("not connected"), std::string::npos);
  // Connect attempts keep failing (refused) and count as failures.
  ASSERT_TRUE(runUntil([&] { return link_->stats().connect_failures >= 2; }));
  EXPECT_NE(link_->health(), LinkHealth::kHealthy);
}

TEST_F(LedgerLinkTest, RequestTimeoutFailsUnavailableAndCountsAsAFailure) {
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.request_timeout_ms = 150;
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  const uint64_t started_ms = monotonicClockMs();
  callTagged("slow");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_GE(monotonicClockMs() - started_ms, 140u);
  EXPECT_EQ(results_[0]->status.code(), StatusCode::kUnavailable);
  EXPECT_NE(results_[0]->status.message().find("no answer"), std::string::npos);
  EXPECT_EQ(link_->stats().timeouts, 1u);
  EXPECT_EQ(link_->monitor().consecutiveFailures(), 1u);
  EXPECT_EQ(link_->health(), LinkHealth::kDegraded);
  ASSERT_EQ(transitions_.size(), 1u);
  EXPECT_EQ(transitions_[0], std::make_pair(LinkHealth::kHealthy, LinkHealth::kDegraded));
  // The late answer is dropped; the connection stays and serves the next call.
  ASSERT_EQ(fake_->requests().size(), 1u);
  fake_->answer(fake_->requests()[0]);
  ASSERT_TRUE(runUntil([&] { return link_->stats().late_answers == 1; }));
  EXPECT_TRUE(link_->connected());
  fake_->auto_answer = true;
  callTagged("next");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(echoed(*results_[1]), "next");
  EXPECT_EQ(connects_, 1);
}

TEST_F(LedgerLinkTest, ServerClosingFailsEveryPendingCall) {
  startConnected();
  for (int i = 0; i < 3; ++i) callTagged("p-" + std::to_string(i));
  ASSERT_TRUE(runUntil([&] { return fake_->requests().size() == 3; }));
  fake_->closeConnections();
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  for (const auto& result : results_) {
    EXPECT_EQ(result->status.code(), StatusCode::kUnavailable);
    EXPECT_NE(result->status.message().find("connection to the ledger lost"), std::string::npos)
        << result->status.toString();
  }
  EXPECT_EQ(link_->stats().connections_lost, 1u);
  EXPECT_EQ(link_->health(), LinkHealth::kDegraded);
  EXPECT_EQ(link_->inFlight(), 0u);
}

TEST_F(LedgerLinkTest, ReconnectsWithBackoffOnceTheServerComesBack) {
  startConnected();
  const uint16_t port = fake_->port();
  fake_->close();  // the ledger goes away entirely
  ASSERT_TRUE(runUntil([&] { return !link_->connected(); }));
  ASSERT_TRUE(runUntil([&] { return link_->stats().connect_failures >= 3; }));
  EXPECT_EQ(link_->health(), LinkHealth::kPartitioned);  // 1 loss + 3 refused connects
  callTagged("while-down");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(results_[0]->status.code(), StatusCode::kUnavailable);

  ASSERT_TRUE(runUntil([&] { return fake_->idle(); }));
  fake_ = std::make_unique<FakeLedger>(&loop_);
  ASSERT_TRUE(fake_->listen(port));
  fake_->auto_answer = true;
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }));
  EXPECT_TRUE(link_->connected());
  callTagged("after");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(echoed(*results_[1]), "after");
  EXPECT_EQ(link_->health(), LinkHealth::kDegraded);  // one success ends a partition only so far
}

TEST_F(LedgerLinkTest, HealthPartitionsAfterNFailuresAndRecoversThroughDegraded) {
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.request_timeout_ms = 60;
  o.health = {.failures_to_degrade = 1,
              .failures_to_partition = 3,
              .slow_request_us = 1'000'000,
              .partition_after_ms = 60'000,
              .successes_to_recover = 2};
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  for (int i = 0; i < 3; ++i) {
    callTagged("lost-" + std::to_string(i));
    ASSERT_TRUE(runUntil([&] { return allDone(); }));
    EXPECT_EQ(results_.back()->status.code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(link_->health(), LinkHealth::kPartitioned);
  fake_->auto_answer = true;
  callTagged("ok-1");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(link_->health(), LinkHealth::kDegraded);
  callTagged("ok-2");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(link_->health(), LinkHealth::kHealthy);
  using H = LinkHealth;
  const std::vector<std::pair<H, H>> expected = {{H::kHealthy, H::kDegraded},
                                                 {H::kDegraded, H::kPartitioned},
                                                 {H::kPartitioned, H::kDegraded},
                                                 {H::kDegraded, H::kHealthy}};
  EXPECT_EQ(transitions_, expected);
}

TEST_F(LedgerLinkTest, TimeAlonePartitionsAFailingLink) {
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.request_timeout_ms = 50;
  o.health = {.failures_to_degrade = 1,
              .failures_to_partition = 1'000,
              .slow_request_us = 1'000'000,
              .partition_after_ms = 300,
              .successes_to_recover = 1};
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  callTagged("lost");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(link_->health(), LinkHealth::kDegraded);
  // No further request: the periodic tick alone moves it.
  ASSERT_TRUE(runUntil([&] { return link_->health() == LinkHealth::kPartitioned; }, 5'000));
  EXPECT_EQ(link_->monitor().consecutiveFailures(), 1u);
}

TEST_F(LedgerLinkTest, MalformedAnswerClosesTheConnectionAndReconnects) {
  startConnected();
  callTagged("victim");
  ASSERT_TRUE(runUntil([&] { return fake_->requests().size() == 1; }));
  // A well-framed payload that is not a Cap'n Proto message.
  fake_->sendRaw({8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4});
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(results_[0]->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(link_->stats().protocol_errors, 1u);
  ASSERT_TRUE(runUntil([&] { return connects_ == 2; }));

  // An answer under an id the link never sent is a protocol error too.
  callTagged("second");
  ASSERT_TRUE(runUntil([&] { return fake_->requests().size() == 2; }));
  fake_->answerWith(999'999, wire::HealthReply{.status = "bogus"});
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(results_[1]->status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(link_->stats().protocol_errors, 2u);
  ASSERT_TRUE(runUntil([&] { return connects_ == 3; }));
  fake_->auto_answer = true;
  callTagged("third");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(echoed(*results_[2]), "third");
}

TEST_F(LedgerLinkTest, TooManyInFlightFailsFastWithResourceExhausted) {
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.requests_in_flight_max = 2;
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  callTagged("a");
  callTagged("b");
  callTagged("c");
  EXPECT_FALSE(results_[2].has_value());
  ASSERT_TRUE(runUntil([&] { return results_[2].has_value(); }));
  EXPECT_EQ(results_[2]->status.code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(results_[0].has_value());
}

TEST_F(LedgerLinkTest, StopFailsPendingCallsThenCloses) {
  startConnected();
  for (int i = 0; i < 3; ++i) callTagged("s-" + std::to_string(i));
  ASSERT_TRUE(runUntil([&] { return fake_->requests().size() == 3; }));
  // A caller that retries from its callback while the link stops gets a clean failure too.
  std::optional<LinkResult> retried;
  bool closed = false;
  link_->call(query("s-3"), [&](LinkResult result) {
    EXPECT_EQ(result.status.code(), StatusCode::kUnavailable);
    link_->call(query("retry"), [&](LinkResult again) { retried = std::move(again); });
  });
  link_->stop([&] { closed = true; });
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results_[i].has_value()) << "pending call " << i << " not failed by stop()";
    EXPECT_EQ(results_[i]->status.code(), StatusCode::kUnavailable);
    EXPECT_NE(results_[i]->status.message().find("stopping"), std::string::npos);
  }
  EXPECT_FALSE(closed);
  ASSERT_TRUE(runUntil([&] { return closed; }));
  ASSERT_TRUE(retried.has_value());
  EXPECT_EQ(retried->status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(link_->connected());
  bool closed_again = false;
  link_->stop([&] { closed_again = true; });  // already stopped: at once
  EXPECT_TRUE(closed_again);
}

TEST_F(LedgerLinkTest, StopBeforeStartClosesAtOnce) {
  link_ = std::make_unique<LedgerLink>(&loop_, options(7411), &logger_);
  bool closed = false;
  link_->stop([&] { closed = true; });
  EXPECT_TRUE(closed);
}

TEST_F(LedgerLinkTest, HostNamesAreResolved) {
  startFake();
  LedgerLinkOptions o = options(fake_->port());
  o.host = "localhost";
  startLink(o);
  fake_->auto_answer = true;
  // localhost may resolve to ::1 first, where nobody listens: the link keeps trying.
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  callTagged("named");
  ASSERT_TRUE(runUntil([&] { return allDone(); }));
  EXPECT_EQ(echoed(*results_[0]), "named");
}

// --- Against a real tally-ledger ----------------------------------------------------------------

// Several addresses (central-client/ledger_addresses.h): the first is a standby answering
// NOT_PRIMARY and naming the primary. The call it answered fails as an unknown outcome (never
// a decision), the link is not healthy through it, and it moves to the primary it names.
TEST_F(LedgerLinkTest, NotPrimaryIsNeverAnAnswerAndTheLinkMovesToTheNamedPrimary) {
  startFake();
  primary_ = std::make_unique<FakeLedger>(&loop_);
  ASSERT_TRUE(primary_->listen(0));
  primary_->auto_answer = true;
  fake_->not_primary = notPrimaryMessage("127.0.0.1:" + std::to_string(primary_->port()));
  LedgerLinkOptions o = options(fake_->port());
  // The primary is not in the list: the standby's answer is the only way to it.
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  const size_t first = callTagged("q-1");
  ASSERT_TRUE(runUntil([&] { return results_[first].has_value(); }));
  EXPECT_EQ(results_[first]->status.code(), StatusCode::kUnavailable) << echoed(*results_[first]);
  EXPECT_NE(results_[first]->status.message().find("not the primary"), std::string::npos)
      << echoed(*results_[first]);
  EXPECT_NE(results_[first]->status.message().find("outcome is unknown"), std::string::npos);
  EXPECT_EQ(link_->stats().not_primary_answers, 1u);
  EXPECT_EQ(link_->stats().answered, 0u) << "a NOT_PRIMARY answer is no answer";
  EXPECT_EQ(link_->monitor().consecutiveFailures(), 1u);
  EXPECT_EQ(link_->currentAddress(), "127.0.0.1:" + std::to_string(primary_->port()));
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  const size_t second = callTagged("q-1");  // the agent's retry: the same id
  ASSERT_TRUE(runUntil([&] { return results_[second].has_value(); }));
  EXPECT_EQ(echoed(*results_[second]), "q-1");
  EXPECT_EQ(fake_->requests().size(), 1u);
  EXPECT_EQ(primary_->requests().size(), 1u);
}

// A refused connect moves to the next address of the list.
TEST_F(LedgerLinkTest, ARefusedAddressMovesToTheNextOfTheList) {
  // A port nobody listens on: bound but not listening (a connect is refused), and held for the
  // whole test so that no other test's server can take it meanwhile.
  const int held = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(held, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const uint16_t refused_port = ntohs(address.sin_port);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{held};
  primary_ = std::make_unique<FakeLedger>(&loop_);
  ASSERT_TRUE(primary_->listen(0));
  primary_->auto_answer = true;
  LedgerLinkOptions o = options(refused_port);
  o.also = {client::Endpoint{.host = "127.0.0.1", .port = primary_->port()}};
  startLink(o);
  ASSERT_TRUE(runUntil([&] { return link_->connected(); }));
  EXPECT_GE(link_->stats().connect_failures, 1u);
  EXPECT_EQ(link_->currentAddress(), "127.0.0.1:" + std::to_string(primary_->port()));
  const size_t call = callTagged("q-2");
  ASSERT_TRUE(runUntil([&] { return results_[call].has_value(); }));
  EXPECT_EQ(echoed(*results_[call]), "q-2");
}

class RealLedger {
 public:
  explicit RealLedger(testing::TempDir* dir) : dir_(dir) {}
  bool start(uint16_t port) {
    process_ = std::make_unique<testing::Process>(
        testing::binaryPath("tally-ledger"),
        std::vector<std::string>{"--data-dir", dir_->file("ledger"), "--listen",
                                 "127.0.0.1:" + std::to_string(port), "--metrics", "",
                                 "--log-level", "info"},
        dir_->file("ledger.log"));
    const int ready = process_->waitReady(10'000);
    if (ready <= 0) return false;
    port_ = static_cast<uint16_t>(ready);
    return true;
  }
  void kill9() { process_->kill9(); }
  uint16_t port() const { return port_; }
  std::string log() const { return process_ ? process_->log() : ""; }

 private:
  testing::TempDir* dir_;
  std::unique_ptr<testing::Process> process_;
  uint16_t port_ = 0;
};

TEST_F(LedgerLinkTest, TalksToARealLedgerAcrossAKillAndRestart) {
  testing::TempDir dir;
  RealLedger ledger(&dir);
  ASSERT_TRUE(ledger.start(0)) << ledger.log();
  startLink(options(ledger.port()));
  ASSERT_TRUE(runUntil([&] { return link_->connected(); })) << ledger.log();

  // Many pipelined requests over the one connection.
  constexpr int kCalls = 500;
  std::vector<std::optional<LinkResult>> answers(kCalls + 1);
  for (int i = 0; i < kCalls; ++i) {
    link_->call(wire::HealthRequest{},
                [&answers, i](LinkResult result) { answers[i] = std::move(result); });
  }
  link_->call(QueryRequest{.reservation_id = "never-reserved"},
              [&answers](LinkResult result) { answers[kCalls] = std::move(result); });
  ASSERT_TRUE(runUntil([&] {
    for (const auto& answer : answers) {
      if (!answer.has_value()) return false;
    }
    return true;
  })) << ledger.log();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(answers[i]->status.isOk()) << answers[i]->status.toString();
    const auto* health = std::get_if<wire::HealthReply>(&answers[i]->response.body);
    ASSERT_NE(health, nullptr);
    EXPECT_EQ(health->status, "ok");
  }
  ASSERT_TRUE(answers[kCalls]->status.isOk());
  const auto* reply = std::get_if<ReservationReply>(&answers[kCalls]->response.body);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->code, ReplyCode::kNotFound);
  EXPECT_EQ(link_->stats().connects, 1u);

  // kill -9: the connection drops, calls fail with an unknown outcome, reconnects fail.
  const uint16_t port = ledger.port();
  ledger.kill9();
  ASSERT_TRUE(runUntil([&] { return !link_->connected(); }));
  ASSERT_TRUE(runUntil([&] { return link_->stats().connect_failures >= 1; }));
  std::optional<LinkResult> down;
  link_->call(wire::HealthRequest{}, [&](LinkResult result) { down = std::move(result); });
  ASSERT_TRUE(runUntil([&] { return down.has_value(); }));
  EXPECT_EQ(down->status.code(), StatusCode::kUnavailable);

  // Restarted on the same port and data dir: the link finds it again by itself.
  ASSERT_TRUE(ledger.start(port)) << ledger.log();
  ASSERT_TRUE(runUntil([&] { return link_->connected(); })) << ledger.log();
  std::optional<LinkResult> up;
  link_->call(wire::HealthRequest{}, [&](LinkResult result) { up = std::move(result); });
  ASSERT_TRUE(runUntil([&] { return up.has_value(); }));
  ASSERT_TRUE(up->status.isOk()) << up->status.toString();
  EXPECT_EQ(link_->stats().connects, 2u);
}

}  // namespace
}  // namespace tally::central
