#include "wire/packed_message.h"

namespace tally::wire {
namespace {

// capnp refuses a message of this many segments or more (InputStreamMessageReader).
constexpr unsigned kSegmentsMax = 512;

}  // namespace

size_t packedTrailingBytes(capnp::MessageReader& message, kj::ArrayInputStream& input) {
  if (size_t unread = input.tryGetReadBuffer().size(); unread == 0) return 0;
  // Asking for a segment reads the message up to its end (an id past the last one returns
  // null and reads nothing); the arena asks again later and gets the same words.
  for (unsigned id = 1; id < kSegmentsMax; ++id) (void)message.getSegment(id);
  return input.tryGetReadBuffer().size();
}

}  // namespace tally::wire
