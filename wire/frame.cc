#include "wire/frame.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <capnp/serialize.h>

#include "core/assert.h"

namespace tally::wire {
namespace {

// A frame length travels in 32 bits, whatever frame_bytes_max says.
uint64_t effectiveFrameBytesMax(uint64_t frame_bytes_max) {
  return std::min<uint64_t>(frame_bytes_max, UINT32_MAX);
}

}  // namespace

Result<std::vector<uint8_t>> encodeFrame(capnp::MessageBuilder& message, uint64_t frame_bytes_max) {
  std::vector<uint8_t> frame;
  if (Status status = appendFrame(message, frame_bytes_max, &frame); !status.isOk()) return status;
  return frame;
}

Status appendFrame(capnp::MessageBuilder& message, uint64_t frame_bytes_max,
                   std::vector<uint8_t>* out) {
  // The standard serialization (as capnp::messageToFlatArray writes it): a segment table of
  // uint32 (count - 1) and each segment's size in words, padded to a whole word, then the
  // segments.
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments = message.getSegmentsForOutput();
  const size_t table_words = (segments.size() + 2) / 2;
  size_t message_bytes = table_words * sizeof(capnp::word);
  for (const kj::ArrayPtr<const capnp::word>& segment : segments) {
    message_bytes += segment.size() * sizeof(capnp::word);
  }
  const uint64_t max_bytes = effectiveFrameBytesMax(frame_bytes_max);
  if (message_bytes > max_bytes) {
    return Status::resourceExhausted("frame of " + std::to_string(message_bytes) +
                                     " bytes exceeds frame_bytes_max " + std::to_string(max_bytes));
  }
  const size_t start = out->size();
  out->resize(start + kFrameHeaderBytes + message_bytes);
  uint8_t* at = out->data() + start;
  auto put32 = [&at](uint32_t value) {
    for (size_t i = 0; i < 4; ++i) *at++ = static_cast<uint8_t>(value >> (8 * i));
  };
  put32(static_cast<uint32_t>(message_bytes));
  put32(static_cast<uint32_t>(segments.size() - 1));
  for (const kj::ArrayPtr<const capnp::word>& segment : segments) {
    put32(static_cast<uint32_t>(segment.size()));
  }
  if (segments.size() % 2 == 0) put32(0);  // padding to a whole word
  for (const kj::ArrayPtr<const capnp::word>& segment : segments) {
    std::memcpy(at, segment.begin(), segment.size() * sizeof(capnp::word));
    at += segment.size() * sizeof(capnp::word);
  }
  TALLY_ASSERT(at == out->data() + out->size());
  return Status::ok();
}

FrameDecoder::FrameDecoder(FrameDecoderOptions options)
    : frame_bytes_max_(effectiveFrameBytesMax(options.frame_bytes_max)) {}

Status FrameDecoder::feed(std::span<const uint8_t> chunk, std::vector<Frame>* frames) {
  if (failed()) return error_;
  while (!chunk.empty()) {
    if (header_filled_ < kFrameHeaderBytes) {
      const size_t take = std::min(kFrameHeaderBytes - header_filled_, chunk.size());
      std::memcpy(header_ + header_filled_, chunk.data(), take);
      header_filled_ += take;
      chunk = chunk.subspan(take);
      if (header_filled_ < kFrameHeaderBytes) break;
      // Checked before a single body byte is buffered: a hostile length costs nothing.
      if (Status status = startBody(); !status.isOk()) return status;
    }
    const size_t take = std::min<size_t>(body_bytes_ - body_.size(), chunk.size());
    body_.insert(body_.end(), chunk.begin(), chunk.begin() + static_cast<ptrdiff_t>(take));
    chunk = chunk.subspan(take);
    if (body_.size() == body_bytes_) {
      frames->push_back(std::move(body_));
      body_ = Frame();
      header_filled_ = 0;
      body_bytes_ = 0;
    }
  }
  return Status::ok();
}

Status FrameDecoder::startBody() {
  uint32_t length = 0;
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    length |= static_cast<uint32_t>(header_[i]) << (8 * i);
  }
  if (length == 0) {
    error_ = Status::corruption("zero-length frame");
  } else if (length > frame_bytes_max_) {
    error_ = Status::resourceExhausted("frame of " + std::to_string(length) +
                                       " bytes exceeds frame_bytes_max " +
                                       std::to_string(frame_bytes_max_));
  }
  if (failed()) {
    header_filled_ = 0;  // nothing of a refused frame stays buffered
    return error_;
  }
  body_bytes_ = length;
  // Reserve at most one typical socket read ahead; the rest grows as bytes actually arrive.
  body_.reserve(std::min<size_t>(length, 64 * 1024));
  return Status::ok();
}

}  // namespace tally::wire
