#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

// A bare TCP connection for integration tests that must speak out of turn: oversized, truncated
// or garbage frames, half headers, silence. Unlike central-client's BlockingClient it validates
// nothing it sends, and reads frames only as "4-byte little-endian length, then that many
// bytes", so a test sees exactly what a server answered and when it hung up.
//
// Owns one socket (CLOEXEC, closed in the destructor). Every call waits at most the timeout
// it is given. Not thread-safe.

namespace tally::testing {

struct RawSocketOptions {
  // SO_RCVBUF before connecting; 0 keeps the kernel's autotuning (which on loopback may absorb
  // tens of MiB). A small value makes a peer's writes back up quickly when we do not read.
  int receive_buffer_bytes = 0;
};

class RawSocket {
 public:
  // Connects to an IPv4 literal; nullptr (with `*error` set) on failure or timeout.
  static std::unique_ptr<RawSocket> connect(const std::string& host, uint16_t port,
                                            uint64_t timeout_ms, std::string* error,
                                            RawSocketOptions options = {});
  // Connects to a Unix stream socket (an agent's); nullptr (with `*error` set) on failure.
  static std::unique_ptr<RawSocket> connectUnix(const std::string& path, uint64_t timeout_ms,
                                                std::string* error);
  ~RawSocket();
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  // Writes every byte; false on timeout or a peer that reset/closed.
  bool sendAll(std::span<const uint8_t> bytes, uint64_t timeout_ms);
  enum class Send : uint8_t { kAll, kTimeout, kError };
  // Writes from the front of `*bytes`, advancing it past what was written: on kTimeout the rest
  // is still in `*bytes`, so a caller that sends it later keeps its frames whole.
  Send send(std::span<const uint8_t>* bytes, uint64_t timeout_ms);
  // True once the socket can take more bytes (the peer is reading), false after `timeout_ms`.
  bool waitWritable(uint64_t timeout_ms);
  // Half-closes: the peer reads EOF, we can still read its answers.
  void shutdownWrite();

  enum class Read : uint8_t {
    kFrame,    // one whole frame; its payload (without the length) is in *payload
    kClosed,   // orderly EOF before any byte of a next frame
    kReset,    // ECONNRESET or another socket error
    kTimeout,  // nothing complete within the timeout (bytes read so far stay buffered)
    kTorn,     // EOF in the middle of a frame
  };
  static const char* readName(Read read);

  // Reads the next frame. Frames announcing more than `frame_bytes_max` count as kTorn.
  Read readFrame(std::vector<uint8_t>* payload, uint64_t timeout_ms,
                 uint64_t frame_bytes_max = 16u << 20);

 private:
  explicit RawSocket(int fd) : fd_(fd) {}
  // Appends what one recv() returns; 0 on EOF, -1 on error, -2 on timeout.
  int64_t fill(uint64_t deadline_ms);

  int fd_;
  std::vector<uint8_t> buffer_;
};

}  // namespace tally::testing
