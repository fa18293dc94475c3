#include "wire/frame.h"

#include <gtest/gtest.h>

#include <capnp/message.h>

#include "schemas/protocol.capnp.h"

namespace tally::wire {
namespace {

std::vector<uint8_t> reserveFrame(const std::string& reservation_id) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::Request>();
  request.setRequestId(7);
  auto reserve = request.initReserve();
  reserve.setReservationId(reservation_id);
  reserve.setSubject("tenant-7");
  reserve.setRoute("/v1/chat");
  reserve.setUnits(600);
  Result<std::vector<uint8_t>> frame = encodeFrame(message);
  EXPECT_TRUE(frame.isOk());
  return std::move(frame).value();
}

Frame payloadOf(const std::vector<uint8_t>& frame) {
  return Frame(frame.begin() + kFrameHeaderBytes, frame.end());
}

std::vector<uint8_t> header(uint32_t length) {
  return {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
          static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
}

std::span<const uint8_t> span(const std::vector<uint8_t>& bytes, size_t begin, size_t end) {
  return std::span<const uint8_t>(bytes).subspan(begin, end - begin);
}

TEST(EncodeFrame, PrefixesLittleEndianLength) {
  std::vector<uint8_t> frame = reserveFrame("r-1");
  const size_t payload_bytes = frame.size() - kFrameHeaderBytes;
  ASSERT_GT(payload_bytes, 0u);
  EXPECT_EQ(payload_bytes % 8, 0u);
  EXPECT_EQ(std::vector<uint8_t>(frame.begin(), frame.begin() + 4),
            header(static_cast<uint32_t>(payload_bytes)));
}

TEST(EncodeFrame, RefusesMessageAboveFrameBytesMax) {
  capnp::MallocMessageBuilder message;
  message.initRoot<schema::Request>().initReserve().setSubject(std::string(200, 's'));
  Result<std::vector<uint8_t>> frame = encodeFrame(message, 64);
  ASSERT_FALSE(frame.isOk());
  EXPECT_EQ(frame.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(frame.status().message().find("exceeds frame_bytes_max 64"), std::string::npos);
}

TEST(FrameDecoder, ReassemblesFrameSplitAtEveryByteBoundary) {
  const std::vector<uint8_t> frame = reserveFrame("r-split");
  for (size_t cut = 0; cut <= frame.size(); ++cut) {
    FrameDecoder decoder;
    std::vector<Frame> frames;
    ASSERT_TRUE(decoder.feed(span(frame, 0, cut), &frames).isOk());
    if (cut < frame.size()) {
      EXPECT_TRUE(frames.empty()) << "cut " << cut;
      EXPECT_EQ(decoder.bufferedBytes(), cut);
    }
    ASSERT_TRUE(decoder.feed(span(frame, cut, frame.size()), &frames).isOk());
    ASSERT_EQ(frames.size(), 1u) << "cut " << cut;
    EXPECT_EQ(frames[0], payloadOf(frame)) << "cut " << cut;
    EXPECT_EQ(decoder.bufferedBytes(), 0u);
  }
}

TEST(FrameDecoder, ReassemblesOneByteAtATime) {
  const std::vector<uint8_t> frame = reserveFrame("r-bytewise");
  FrameDecoder decoder;
  std::vector<Frame> frames;
  for (size_t i = 0; i < frame.size(); ++i) {
    ASSERT_TRUE(decoder.feed(span(frame, i, i + 1), &frames).isOk());
  }
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], payloadOf(frame));
}

TEST(FrameDecoder, YieldsTwoFramesFromOneChunkAndKeepsTheTail) {
  const std::vector<uint8_t> first = reserveFrame("r-first");
  const std::vector<uint8_t> second = reserveFrame("r-second");
  const std::vector<uint8_t> third = reserveFrame("r-third");
  std::vector<uint8_t> chunk = first;
  chunk.insert(chunk.end(), second.begin(), second.end());
  const size_t third_head = 9;  // the header and part of the body
  chunk.insert(chunk.end(), third.begin(), third.begin() + third_head);

  FrameDecoder decoder;
  std::vector<Frame> frames;
  ASSERT_TRUE(decoder.feed(chunk, &frames).isOk());
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0], payloadOf(first));
  EXPECT_EQ(frames[1], payloadOf(second));
  EXPECT_EQ(decoder.bufferedBytes(), third_head);

  ASSERT_TRUE(decoder.feed(span(third, third_head, third.size()), &frames).isOk());
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[2], payloadOf(third));
}

TEST(FrameDecoder, AcceptsFrameOfExactlyFrameBytesMax) {
  std::vector<uint8_t> bytes = header(16);
  bytes.resize(bytes.size() + 16, 0xab);
  FrameDecoder decoder({.frame_bytes_max = 16});
  std::vector<Frame> frames;
  ASSERT_TRUE(decoder.feed(bytes, &frames).isOk());
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], Frame(16, 0xab));
}

TEST(FrameDecoder, RejectsOversizedLengthBeforeBufferingTheBody) {
  FrameDecoder decoder({.frame_bytes_max = 64});
  std::vector<Frame> frames;
  // The header alone is enough to refuse: no body byte has been sent yet.
  Status status = decoder.feed(header(65), &frames);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "frame of 65 bytes exceeds frame_bytes_max 64");
  EXPECT_TRUE(decoder.failed());
  EXPECT_EQ(decoder.bufferedBytes(), 0u);
  EXPECT_TRUE(frames.empty());

  // The decoder stays failed; later bytes are neither buffered nor framed.
  std::vector<uint8_t> more(1000, 0);
  Status again = decoder.feed(more, &frames);
  EXPECT_EQ(again.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(decoder.bufferedBytes(), 0u);
  EXPECT_TRUE(frames.empty());
}

TEST(FrameDecoder, RejectsHugeLengthWithDefaultMaximum) {
  FrameDecoder decoder;
  std::vector<Frame> frames;
  Status status = decoder.feed(header(0xffffffffu), &frames);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "frame of 4294967295 bytes exceeds frame_bytes_max " +
                                  std::to_string(limits::kFrameBytesMaxDefault));
}

TEST(FrameDecoder, RejectsZeroLength) {
  FrameDecoder decoder;
  std::vector<Frame> frames;
  Status status = decoder.feed(header(0), &frames);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_TRUE(decoder.failed());
}

TEST(FrameDecoder, DeliversFramesThatPrecedeABadHeader) {
  const std::vector<uint8_t> good = reserveFrame("r-good");
  std::vector<uint8_t> chunk = good;
  const std::vector<uint8_t> bad = header(0);
  chunk.insert(chunk.end(), bad.begin(), bad.end());
  FrameDecoder decoder;
  std::vector<Frame> frames;
  EXPECT_EQ(decoder.feed(chunk, &frames).code(), StatusCode::kCorruption);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], payloadOf(good));
}

TEST(FrameDecoder, EmptyChunkIsANoOp) {
  FrameDecoder decoder;
  std::vector<Frame> frames;
  EXPECT_TRUE(decoder.feed({}, &frames).isOk());
  EXPECT_TRUE(frames.empty());
  EXPECT_EQ(decoder.bufferedBytes(), 0u);
}

}  // namespace
}  // namespace tally::wire
