#pragma once

#include <cstddef>

#include <capnp/serialize-packed.h>
#include <kj/io.h>

// The one check that a packed Cap'n Proto blob holds exactly one message.
//
// capnp::PackedMessageReader reads a message's first segment when it is constructed and the
// others only when they are first used, so right after construction the input's unread bytes
// include every later segment: a large message (one that outgrew its first segment, e.g. a big
// store batch) looks like a message followed by garbage. packedTrailingBytes reads the rest of
// the message first, then counts what follows it. May throw kj::Exception on malformed input,
// like the reader itself: call it inside the caller's decode boundary.

namespace tally::wire {

size_t packedTrailingBytes(capnp::MessageReader& message, kj::ArrayInputStream& input);

}  // namespace tally::wire
