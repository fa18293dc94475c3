#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "wire/frame.h"

// Frames a FramedStream decoded and may not deliver yet (back-pressure), packed back to back in
// one buffer as [uint32 length][payload]: a paused connection holds exactly the bytes it read,
// not one allocation (and a deque slot) per frame, which for small requests cost several times
// their size (50 paused connections measured 200 KiB each for a 64 KiB read of health requests).
// Frames come out in the order they went in. Not thread-safe.

namespace tally::net {

class HeldFrames {
 public:
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  // Bytes held: payloads plus 4 bytes of length each.
  uint64_t bytes() const { return buffer_.size() - front_; }

  void push(const wire::Frame& frame) {
    const auto length = static_cast<uint32_t>(frame.size());
    const size_t at = buffer_.size();
    buffer_.resize(at + sizeof(length) + frame.size());
    std::memcpy(buffer_.data() + at, &length, sizeof(length));
    if (!frame.empty()) {
      std::memcpy(buffer_.data() + at + sizeof(length), frame.data(), frame.size());
    }
    ++count_;
  }

  // The oldest frame. Precondition: !empty().
  wire::Frame pop() {
    uint32_t length = 0;
    std::memcpy(&length, buffer_.data() + front_, sizeof(length));
    const auto begin = buffer_.begin() + static_cast<std::ptrdiff_t>(front_ + sizeof(length));
    wire::Frame frame(begin, begin + length);
    front_ += sizeof(length) + length;
    if (--count_ == 0) clear();
    return frame;
  }

  // Drops everything; a large buffer is given back rather than kept for an idle connection.
  void clear() {
    if (buffer_.capacity() > kKeptCapacityBytes) {
      std::vector<uint8_t>().swap(buffer_);
    } else {
      buffer_.clear();
    }
    front_ = 0;
    count_ = 0;
  }

 private:
  static constexpr size_t kKeptCapacityBytes = 4096;

  std::vector<uint8_t> buffer_;
  size_t front_ = 0;  // where the oldest frame starts
  size_t count_ = 0;
};

}  // namespace tally::net
