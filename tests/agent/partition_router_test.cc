#include "agent/partition_router.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "agent/outbox_store.h"
#include "core/agent_partitions.h"
#include "core/partition_map.h"
#include "tests/support/temp_dir.h"

namespace tally::agent {
namespace {

using testing::TempDir;

// A subject of `partition` among `count` (the first "tenant-N" that maps there).
std::string subjectOf(uint32_t partition, uint32_t count) {
  for (int i = 0;; ++i) {
    std::string subject = "tenant-" + std::to_string(i);
    if (partitionOf(subject, count) == partition) return subject;
  }
}

ReservationReply replyIn(ReservationState state, ReplyCode code = ReplyCode::kOk) {
  ReservationReply reply{.code = code};
  reply.receipt.state = state;
  return reply;
}

// One partition's service, scripted: it logs each request it is handed (with what the records
// said about its reservation at that moment) and answers with `answer`.
struct FakePartition {
  struct Seen {
    size_t kind = 0;  // the request's variant index
    std::string reservation_id;
    std::optional<uint32_t> recorded_when_handed;
  };
  std::vector<Seen> seen;
  std::function<wire::ResponseBody(const wire::RequestBody&)> answer =
      [](const wire::RequestBody&) -> wire::ResponseBody {
    return wire::ErrorReply{.code = wire::ErrorCode::kUnavailable, .message = "not scripted"};
  };
};

class PartitionRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<OutboxStore>> store = OutboxStore::open(dir_.path());
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    store_ = std::move(store).value();
    Result<std::unique_ptr<ReservationPartitions>> records =
        ReservationPartitions::open(store_->connection());
    ASSERT_TRUE(records.isOk()) << records.status().toString();
    records_ = std::move(records).value();
  }

  std::unique_ptr<PartitionRouter> router(uint32_t count, PartitionRouterOptions options = {}) {
    fakes_.resize(count);
    std::vector<RequestHandler> handlers;
    for (uint32_t i = 0; i < count; ++i) {
      handlers.push_back([this, i](wire::RequestBody body, Respond respond, Alive) {
        const std::string id(reservationIdOf(body));
        fakes_[i].seen.push_back(
            {.kind = body.index(), .reservation_id = id, .recorded_when_handed = recorded(id)});
        respond(fakes_[i].answer(body));
      });
    }
    return std::make_unique<PartitionRouter>(
        std::move(handlers), count > 1 ? records_.get() : nullptr, &logger_, options);
  }

  std::optional<uint32_t> recorded(const std::string& id) {
    if (id.empty()) return std::nullopt;
    Result<std::optional<uint32_t>> found = records_->find(id);
    EXPECT_TRUE(found.isOk());
    return found.isOk() ? found.value() : std::nullopt;
  }

  wire::ResponseBody call(PartitionRouter* router, wire::RequestBody body) {
    std::optional<wire::ResponseBody> answer;
    router->handle(
        std::move(body), [&answer](wire::ResponseBody a) { answer = std::move(a); }, nullptr);
    EXPECT_TRUE(answer.has_value());
    return answer.value_or(wire::ErrorReply{.message = "no answer"});
  }

  TempDir dir_;
  Logger logger_{"test", LogLevel::kError};
  std::unique_ptr<OutboxStore> store_;
  std::unique_ptr<ReservationPartitions> records_;
  std::vector<FakePartition> fakes_;
};

TEST_F(PartitionRouterTest, AReserveIsRecordedBeforeItsPartitionSeesItAndFollowUpsFollowIt) {
  auto routed = router(2);
  for (FakePartition& fake : fakes_) {
    fake.answer = [](const wire::RequestBody& body) -> wire::ResponseBody {
      if (std::holds_alternative<SettleRequest>(body)) return replyIn(ReservationState::kSettled);
      return replyIn(ReservationState::kReserved);
    };
  }
  for (uint32_t p : {0u, 1u}) {
    const std::string id = "r-" + std::to_string(p);
    call(routed.get(), ReserveRequest{.reservation_id = id, .subject = subjectOf(p, 2)});
    ASSERT_EQ(fakes_[p].seen.size(), 1u);
    EXPECT_EQ(fakes_[p].seen[0].recorded_when_handed, p);  // durable before it was handed over
    EXPECT_TRUE(fakes_[1 - p].seen.empty());
    EXPECT_EQ(recorded(id), p);  // RESERVED is not final: kept
    call(routed.get(), StartRequest{.reservation_id = id});
    ASSERT_EQ(fakes_[p].seen.size(), 2u);
    EXPECT_EQ(fakes_[p].seen[1].reservation_id, id);
    // SETTLED is final: forgotten.
    call(routed.get(), SettleRequest{.reservation_id = id});
    ASSERT_EQ(fakes_[p].seen.size(), 3u);
    EXPECT_TRUE(fakes_[1 - p].seen.empty());
    EXPECT_EQ(recorded(id), std::nullopt);
    fakes_[p].seen.clear();
  }
}

TEST_F(PartitionRouterTest, AQueuedSettleKeepsItsRecord) {
  auto routed = router(2);
  fakes_[1].answer = [](const wire::RequestBody& body) -> wire::ResponseBody {
    if (std::holds_alternative<SettleRequest>(body)) {
      return replyIn(ReservationState::kSettled, ReplyCode::kQueued);
    }
    return replyIn(ReservationState::kReserved);
  };
  call(routed.get(), ReserveRequest{.reservation_id = "q", .subject = subjectOf(1, 2)});
  call(routed.get(), SettleRequest{.reservation_id = "q"});
  EXPECT_EQ(recorded("q"), 1u);
  EXPECT_EQ(fakes_[1].seen.size(), 2u);
  EXPECT_TRUE(fakes_[0].seen.empty());
}

// Records of reservations never followed up are bounded: the oldest go, and a follow-up of
// one of them still reaches its partition (asked of every partition).
TEST_F(PartitionRouterTest, RecordsAreBoundedAndADroppedOneIsStillFound) {
  auto routed = router(2, {.records_max = 2, .trim_every = 1});
  for (FakePartition& fake : fakes_) {
    fake.answer = [](const wire::RequestBody& body) -> wire::ResponseBody {
      if (std::holds_alternative<QueryRequest>(body) ||
          std::holds_alternative<ReserveRequest>(body)) {
        return replyIn(ReservationState::kReserved);
      }
      return replyIn(ReservationState::kStarted);
    };
  }
  fakes_[0].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return ReservationReply{.code = ReplyCode::kNotFound};
  };
  for (int i = 0; i < 3; ++i) {
    call(routed.get(),
         ReserveRequest{.reservation_id = "b-" + std::to_string(i), .subject = subjectOf(1, 2)});
  }
  Result<uint64_t> size = records_->size();
  ASSERT_TRUE(size.isOk());
  EXPECT_EQ(size.value(), 2u);
  EXPECT_EQ(recorded("b-0"), std::nullopt);
  EXPECT_EQ(recorded("b-2"), 1u);
  const wire::ResponseBody started = call(routed.get(), StartRequest{.reservation_id = "b-0"});
  ASSERT_TRUE(std::holds_alternative<ReservationReply>(started));
  EXPECT_EQ(std::get<ReservationReply>(started).receipt.state, ReservationState::kStarted);
  EXPECT_EQ(fakes_[1].seen.back().kind, wire::RequestBody(StartRequest{}).index());
  EXPECT_EQ(fakes_[1].seen.back().reservation_id, "b-0");
}

TEST_F(PartitionRouterTest, AnUnrecordedFollowUpAsksEveryPartitionAndGoesToTheHolder) {
  auto routed = router(2);
  fakes_[0].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return ReservationReply{.code = ReplyCode::kNotFound};
  };
  fakes_[1].answer = [](const wire::RequestBody& body) -> wire::ResponseBody {
    if (std::holds_alternative<ReleaseRequest>(body)) return replyIn(ReservationState::kReleased);
    return replyIn(ReservationState::kReserved);
  };
  const wire::ResponseBody answer = call(routed.get(), ReleaseRequest{.reservation_id = "u"});
  ASSERT_TRUE(std::holds_alternative<ReservationReply>(answer));
  EXPECT_EQ(std::get<ReservationReply>(answer).receipt.state, ReservationState::kReleased);
  // Each was asked a query; the holder then got the release (recorded by then), nobody else.
  ASSERT_EQ(fakes_[0].seen.size(), 1u);
  EXPECT_EQ(fakes_[0].seen[0].kind, wire::RequestBody(QueryRequest{}).index());
  ASSERT_EQ(fakes_[1].seen.size(), 2u);
  EXPECT_EQ(fakes_[1].seen[0].kind, wire::RequestBody(QueryRequest{}).index());
  EXPECT_EQ(fakes_[1].seen[1].kind, wire::RequestBody(ReleaseRequest{}).index());
  EXPECT_EQ(fakes_[1].seen[1].recorded_when_handed, 1u);
  EXPECT_EQ(recorded("u"), std::nullopt);  // RELEASED: final, forgotten again

  // A partition that cannot answer may hold it: a typed, retryable error; nothing is sent.
  fakes_[1].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return wire::ErrorReply{.code = wire::ErrorCode::kUnavailable, .message = "partitioned"};
  };
  const wire::ResponseBody unknown = call(routed.get(), SettleRequest{.reservation_id = "v"});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorReply>(unknown));
  EXPECT_EQ(std::get<wire::ErrorReply>(unknown).code, wire::ErrorCode::kUnavailable);
  EXPECT_EQ(fakes_[1].seen.size(), 3u);  // only the query
}

TEST_F(PartitionRouterTest, FleetWideRequestsAreMergedOrAnsweredOnce) {
  auto routed = router(2);
  fakes_[0].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return wire::HealthReply{.status = "HEALTHY"};
  };
  fakes_[1].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return wire::HealthReply{.status = "PARTITIONED"};
  };
  const wire::ResponseBody health = call(routed.get(), wire::HealthRequest{});
  ASSERT_TRUE(std::holds_alternative<wire::HealthReply>(health));
  EXPECT_EQ(std::get<wire::HealthReply>(health).status, "PARTITIONED");
  EXPECT_EQ(fakes_[0].seen.size(), 1u);
  EXPECT_EQ(fakes_[1].seen.size(), 1u);
  // Answered by the agent itself (a refusal): partition 0 only.
  call(routed.get(), wire::ListGatewaysRequest{});
  EXPECT_EQ(fakes_[0].seen.size(), 2u);
  EXPECT_EQ(fakes_[1].seen.size(), 1u);
  // No merge defined: refused here, nobody asked.
  const wire::ResponseBody period = call(routed.get(), wire::AuditRequest{.period = 1});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorReply>(period));
  EXPECT_EQ(std::get<wire::ErrorReply>(period).code, wire::ErrorCode::kInvalidArgument);
  EXPECT_EQ(fakes_[0].seen.size() + fakes_[1].seen.size(), 3u);
}

TEST_F(PartitionRouterTest, OnePartitionGetsEverythingAndNothingIsRecorded) {
  auto routed = router(1);
  fakes_[0].answer = [](const wire::RequestBody&) -> wire::ResponseBody {
    return replyIn(ReservationState::kReserved);
  };
  call(routed.get(), ReserveRequest{.reservation_id = "one", .subject = "s"});
  call(routed.get(), SettleRequest{.reservation_id = "unseen"});
  call(routed.get(), wire::HealthRequest{});
  EXPECT_EQ(fakes_[0].seen.size(), 3u);
  EXPECT_EQ(fakes_[0].seen[0].recorded_when_handed, std::nullopt);
  Result<uint64_t> size = records_->size();
  ASSERT_TRUE(size.isOk());
  EXPECT_EQ(size.value(), 0u);
}

}  // namespace
}  // namespace tally::agent
