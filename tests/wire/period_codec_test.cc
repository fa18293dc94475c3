// The audit's accounting-period fields (wire/period_codec.h) through the whole framed path.
#include <gtest/gtest.h>

#include <capnp/message.h>

#include "core/limits.h"
#include "wire/codec.h"
#include "wire/frame.h"
#include "wire/period_codec.h"

namespace tally::wire {
namespace {

Response decodeResponseOf(const Frame& frame) {
  Result<Response> response = decodeResponse(frame);
  EXPECT_TRUE(response.isOk()) << response.status().toString();
  return std::move(response).value();
}

PeriodSnapshot sampleSnapshot() {
  return PeriodSnapshot{
      .key = {.subject = "tenant-7", .route = "/v1/chat", .generation = 4},
      .epoch_period = EpochPeriod::kDay,
      .epoch_first = 20650,
      .epoch_last = 20652,
      .opened_at_ms = 1'784'000'000'001,
      .closed_at_ms = 1'784'200'000'002,
      .opening = {1, 2, 3, 4, 5, 6, 7, 8, 9},
      .closing = {11, 12, 13, 14, 15, 16, 17, 18, 19},
      .conserved = false,
  };
}

TEST(PeriodCodecTest, AuditRequestCarriesThePeriodAndTheListFlag) {
  for (const AuditRequest& sent :
       {AuditRequest{.subject = "s", .route = "r", .period = 0},
        AuditRequest{.period = 495687, .list_periods = true}, AuditRequest{}}) {
    Result<std::vector<uint8_t>> bytes = encodeRequestFrame({.request_id = 3, .body = sent});
    ASSERT_TRUE(bytes.isOk());
    FrameDecoder decoder;
    std::vector<Frame> frames;
    ASSERT_TRUE(decoder.feed(bytes.value(), &frames).isOk());
    DecodedRequest decoded = decodeRequest(frames.at(0));
    ASSERT_TRUE(decoded.body.isOk()) << decoded.body.status().toString();
    const auto& got = std::get<AuditRequest>(decoded.body.value());
    EXPECT_EQ(got.subject, sent.subject);
    EXPECT_EQ(got.period, sent.period);  // 0 is a period, not "none"
    EXPECT_EQ(got.list_periods, sent.list_periods);
  }
}

TEST(PeriodCodecTest, AuditReplyCarriesSnapshotsAndClosedPeriods) {
  AuditReport sent{.as_of_ms = 99, .conserved = false};
  sent.period_epoch = 20651;
  sent.period_snapshots = {sampleSnapshot()};
  sent.closed_periods = {{.epoch_period = EpochPeriod::kDay,
                          .epoch_first = 20650,
                          .epoch_last = 20652,
                          .accounts = 1,
                          .conserved = false}};
  Result<std::vector<uint8_t>> bytes = encodeResponseFrame({.request_id = 5, .body = sent});
  ASSERT_TRUE(bytes.isOk());
  FrameDecoder decoder;
  std::vector<Frame> frames;
  ASSERT_TRUE(decoder.feed(bytes.value(), &frames).isOk());
  const Response got = decodeResponseOf(frames.at(0));
  const auto& report = std::get<AuditReport>(got.body);
  EXPECT_EQ(report.period_epoch, sent.period_epoch);
  EXPECT_EQ(report.period_snapshots, sent.period_snapshots);
  EXPECT_EQ(report.closed_periods, sent.closed_periods);
  // The audit of current balances carries none of it.
  bytes = encodeResponseFrame({.request_id = 6, .body = AuditReport{}});
  ASSERT_TRUE(bytes.isOk());
  frames.clear();
  ASSERT_TRUE(decoder.feed(bytes.value(), &frames).isOk());
  const Response plain_response = decodeResponseOf(frames.at(0));
  const auto& plain = std::get<AuditReport>(plain_response.body);
  EXPECT_FALSE(plain.period_epoch);
  EXPECT_TRUE(plain.period_snapshots.empty());
}

TEST(PeriodCodecTest, NotFoundErrorRoundTrips) {
  Result<std::vector<uint8_t>> bytes = encodeResponseFrame(
      {.request_id = 7, .body = ErrorReply{.code = ErrorCode::kNotFound, .message = "m"}});
  ASSERT_TRUE(bytes.isOk());
  FrameDecoder decoder;
  std::vector<Frame> frames;
  ASSERT_TRUE(decoder.feed(bytes.value(), &frames).isOk());
  const Response response = decodeResponseOf(frames.at(0));
  const auto& error = std::get<ErrorReply>(response.body);
  EXPECT_EQ(error.code, ErrorCode::kNotFound);
  EXPECT_STREQ(errorCodeName(ErrorCode::kNotFound), "notFound");
}

TEST(PeriodCodecTest, ReaderRefusesBadSnapshots) {
  capnp::MallocMessageBuilder message;
  auto builder = message.initRoot<schema::PeriodSnapshotV1>();
  PeriodSnapshot snapshot = sampleSnapshot();
  fromCore(snapshot, builder);
  PeriodSnapshot out;
  ASSERT_TRUE(readPeriodSnapshot(builder.asReader(), &out).isOk());
  EXPECT_EQ(out, snapshot);
  builder.setEpochFirst(snapshot.epoch_last + 1);
  Status status = readPeriodSnapshot(builder.asReader(), &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("epochFirst"), std::string::npos) << status.toString();
  fromCore(snapshot, builder);
  builder.getClosing().setSpent(limits::kBalanceUnitsMax + 1);
  status = readPeriodSnapshot(builder.asReader(), &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("closing.spent"), std::string::npos) << status.toString();
}

}  // namespace
}  // namespace tally::wire
