#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <capnp/message.h>

#include "core/limits.h"
#include "core/status.h"

// Length framing for every tally connection (agent socket, ledger link, tallyctl):
//
//   frame = uint32 little-endian length N, then N bytes of one Cap'n Proto message in the
//           standard (unpacked, segment-table) serialization.
//
// N is never 0 and never above the receiver's frame_bytes_max.

namespace tally::wire {

inline constexpr size_t kFrameHeaderBytes = 4;

// The payload of one frame: the serialized message, without the length prefix.
using Frame = std::vector<uint8_t>;

// Serializes `message` and prefixes its length. kResourceExhausted if the message is longer than
// `frame_bytes_max` (the peer would refuse it), so the caller can answer with an error instead.
Result<std::vector<uint8_t>> encodeFrame(capnp::MessageBuilder& message,
                                         uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault);
// The same frame, appended to `*out` with one copy of the message's segments. On error `*out`
// is unchanged.
Status appendFrame(capnp::MessageBuilder& message, uint64_t frame_bytes_max,
                   std::vector<uint8_t>* out);

struct FrameDecoderOptions {
  // Frames announcing more bytes than this are refused before any of their body is buffered.
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
};

// FrameDecoder reassembles frames from the byte chunks of one connection, cut wherever the
// socket cut them. It owns copies of the bytes it buffers and borrows nothing past a call.
// Not thread-safe: it belongs to the loop that reads the connection.
//
// Invariants: it buffers at most one incomplete frame (< kFrameHeaderBytes + frame_bytes_max
// bytes); once feed() has returned an error the decoder stays failed, every later feed()
// returns that error again, and the caller closes the connection.
class FrameDecoder {
 public:
  explicit FrameDecoder(FrameDecoderOptions options = {});

  // Consumes all of `chunk`, appending each frame it completes to `*frames` in order; keeps the
  // trailing incomplete frame. Errors: kResourceExhausted when a length exceeds frame_bytes_max,
  // kCorruption for a zero length. Frames completed before the bad header are still appended.
  Status feed(std::span<const uint8_t> chunk, std::vector<Frame>* frames);

  bool failed() const { return !error_.isOk(); }
  // Bytes held for the incomplete frame (header bytes included).
  size_t bufferedBytes() const { return header_filled_ + body_.size(); }

 private:
  // Validates the length in header_ and prepares body_; sets error_ on failure.
  Status startBody();

  uint64_t frame_bytes_max_;
  uint8_t header_[kFrameHeaderBytes] = {};
  size_t header_filled_ = 0;
  uint32_t body_bytes_ = 0;  // expected body length once the header is complete
  Frame body_;
  Status error_;
};

}  // namespace tally::wire
