// The frame decoder (wire/frame.h), the first thing every connection's bytes meet.
//
// Input: one byte choosing frame_bytes_max (small, so the limit is reached), one byte choosing
// how the rest is cut into chunks, then the connection's bytes. Checks: however the bytes are cut,
// the decoder yields the same frames and the same verdict as when they come in one piece; it
// never buffers more than one incomplete frame; once failed it stays failed; and every frame
// reassembled is exactly the bytes its header announced, which decodeRequest then reads without
// crashing.

#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_support.h"
#include "wire/codec.h"
#include "wire/frame.h"

using namespace tally;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzBytes in(data, size);
  const uint64_t frame_bytes_max = 1 + in.u8() * 64ULL;  // 1 .. 16321 bytes
  const uint8_t cut = in.u8();
  const std::span<const uint8_t> stream = in.rest();

  wire::FrameDecoderOptions options{.frame_bytes_max = frame_bytes_max};
  wire::FrameDecoder whole(options);
  std::vector<wire::Frame> whole_frames;
  const Status whole_status = whole.feed(stream, &whole_frames);

  wire::FrameDecoder chunked(options);
  std::vector<wire::Frame> chunked_frames;
  Status chunked_status;
  size_t at = 0;
  size_t step = 0;
  while (at < stream.size()) {
    // Chunk lengths 1..16 in a pattern the cut byte picks, as a socket might cut them.
    const size_t length =
        std::min<size_t>(1 + ((cut >> (step % 4)) + step) % 16, stream.size() - at);
    ++step;
    chunked_status = chunked.feed(stream.subspan(at, length), &chunked_frames);
    if (chunked.bufferedBytes() >= wire::kFrameHeaderBytes + frame_bytes_max) {
      fuzz::fail("decoder buffers more than one incomplete frame");
    }
    at += length;
    if (!chunked_status.isOk()) break;
  }
  if (!chunked_status.isOk()) {
    const size_t frames_before = chunked_frames.size();
    const uint8_t more[1] = {1};
    if (chunked.feed(more, &chunked_frames).isOk() || chunked_frames.size() != frames_before) {
      fuzz::fail("a failed decoder accepted bytes again");
    }
  }
  if (whole_status.isOk() != chunked_status.isOk()) {
    fuzz::fail("verdict depends on how the bytes were cut", whole_status.toString());
  }
  if (whole_frames != chunked_frames) {
    fuzz::fail("frames depend on how the bytes were cut");
  }
  if (whole_status.isOk() && whole.bufferedBytes() != chunked.bufferedBytes()) {
    fuzz::fail("buffered bytes depend on how the bytes were cut");
  }

  // Every frame is exactly what its header announced, in order.
  size_t offset = 0;
  for (const wire::Frame& frame : whole_frames) {
    if (frame.empty() || frame.size() > frame_bytes_max) fuzz::fail("frame size out of bounds");
    uint32_t announced = 0;
    std::memcpy(&announced, stream.data() + offset, sizeof(announced));  // little-endian host
    if (announced != frame.size() ||
        std::memcmp(frame.data(), stream.data() + offset + wire::kFrameHeaderBytes, frame.size()) !=
            0) {
      fuzz::fail("frame differs from the bytes its header announced");
    }
    offset += wire::kFrameHeaderBytes + frame.size();
    (void)wire::decodeRequest(frame);  // must not crash whatever the bytes
  }
  return 0;
}
