#pragma once

#include <cstdint>

// The defaults of the connection bounds the servers of the length-framed protocol keep
// (net/framed_stream.h per connection, net/connection_set.h globally), and of the daemons'
// config keys that set them (docs/configuration.md, docs/security.md "Connections and limits").
// Constants only, so that config readers need no libuv.

namespace tally::net {

// How long a server waits for a paused peer that takes none of its replies before it closes it
// (StreamLimits::stall_timeout_ms; config key connection_stall_timeout_ms).
inline constexpr uint64_t kStallTimeoutMsDefault = 30'000;
// The bytes all connections of a server may hold before new ones are refused: 1 GiB
// (ConnectionBounds::buffered_bytes_max; config key buffered_bytes_max).
inline constexpr uint64_t kBufferedBytesMaxDefault = uint64_t{1} << 30;

}  // namespace tally::net
