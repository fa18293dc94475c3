#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/limits.h"
#include "core/status.h"
#include "wire/codec.h"
#include "wire/frame.h"

// A synchronous client of the tally protocol (wire/frame.h framing, schemas/protocol.capnp
// messages) for tools and tests: tallyctl, integration tests, benchmarks. The agent's
// asynchronous link to the ledger is a different thing and lives beside this file.

namespace tally::client {

// Where a ledger or an agent listens.
struct Endpoint {
  enum class Kind : uint8_t { kTcp, kUnix };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: an IPv4/IPv6 literal or a host name resolved with getaddrinfo
  uint16_t port = 0;
  std::string path;  // kUnix: the socket path

  bool operator==(const Endpoint&) const = default;
};

// "HOST:PORT", "[IPV6]:PORT". kInvalidArgument for a missing host, a port outside 1..65535.
Result<Endpoint> parseTcpEndpoint(std::string_view host_port);
// kInvalidArgument for an empty path or one that does not fit sockaddr_un (107 bytes).
Result<Endpoint> unixEndpoint(std::string_view path);
// "HOST:PORT" or "unix:PATH", for messages.
std::string endpointName(const Endpoint& endpoint);

// A TLS session under the frames, as BlockingClient drives it: net::TlsSession's calls (tallyctl
// adapts one). Abstract so that the C++ client library, which talks to agents, links no OpenSSL.
class LinkSession {
 public:
  virtual ~LinkSession() = default;
  [[nodiscard]] virtual Status start() = 0;
  [[nodiscard]] virtual Status feed(std::span<const uint8_t> ciphertext) = 0;
  [[nodiscard]] virtual Status write(std::span<const uint8_t> plaintext) = 0;
  virtual std::vector<uint8_t> takeCiphertext() = 0;
  virtual std::vector<uint8_t> takePlaintext() = 0;
  virtual bool handshakeDone() const = 0;
  virtual bool peerRefused() const = 0;                      // we refused the peer's key
  virtual std::optional<std::string> peerAlert() const = 0;  // the peer's fatal alert
};

struct BlockingClientOptions {
  // Response frames announcing more bytes than this are refused (kCorruption).
  uint64_t frame_bytes_max = limits::kFrameBytesMaxDefault;
  // Requests sent with send() whose responses were not received yet.
  uint64_t requests_in_flight_max = limits::kRequestsInFlightPerConnectionMax;
  // Set: speak TLS through the session this makes (a client session with our key and the
  // peer's pinned key); the handshake is part of connect(). Unset: plaintext.
  std::function<Result<std::unique_ptr<LinkSession>>()> tls;
};

// BlockingClient owns one connected socket (closed in the destructor) and the frame decoder of
// its receiving side. Every blocking step polls with a deadline, so no call waits longer than
// the timeout it was given. Not thread-safe; one thread uses it at a time.
//
// Request ids are fresh per client (1, 2, 3 …). Two ways to talk:
//  * call(): one request, waits for the response with its id;
//  * send()/receive(): pipelining; receive() hands back responses in arrival order.
// They may be mixed: while call() waits, responses to earlier send()s are kept (bounded by
// requests_in_flight_max) for receive(). Late responses to a call() that timed out are dropped.
// An ErrorReply under request id 0 (the peer could not read a request's envelope) cannot be
// matched; call() and receive() return it as the answer they were waiting for.
//
// Errors: kUnavailable for connect failures, timeouts and a closed peer; kCorruption for bytes
// that are not valid frames or responses (after which the connection is unusable: every later
// call returns the same error); kResourceExhausted when too many requests are in flight or a
// request does not fit in one frame. With TLS, a failed handshake or session (the peer refused
// our key, we refused its key, a bad record) and a plaintext peer are kFailedPrecondition with a
// message starting "TLS: " (a TLS 1.3 client learns that the server refused its key only at its
// first read, so call() reports it); without TLS, a peer that answers with TLS is the same.
// A connect the socket file's permissions refuse (EACCES, EPERM: the mode or owner of an agent's
// Unix socket or of a directory on its path) is kFailedPrecondition with a message starting
// kPermissionDeniedPrefix, so that tools report it as permission denied, not as unavailable.
inline constexpr std::string_view kPermissionDeniedPrefix = "permission denied: ";

class BlockingClient {
 public:
  // Connects within `timeout_ms` (name resolution included, except that getaddrinfo itself is
  // not interruptible). TCP connections get TCP_NODELAY.
  static Result<std::unique_ptr<BlockingClient>> connect(const Endpoint& endpoint,
                                                         uint64_t timeout_ms,
                                                         BlockingClientOptions options = {});

  ~BlockingClient();
  BlockingClient(const BlockingClient&) = delete;
  BlockingClient& operator=(const BlockingClient&) = delete;

  // Sends `body` under a fresh request id and waits at most `timeout_ms` for its response.
  Result<wire::Response> call(const wire::RequestBody& body, uint64_t timeout_ms);

  // Sends one request without waiting for its response; returns its request id.
  Result<uint64_t> send(const wire::RequestBody& body, uint64_t timeout_ms);
  // The next response to a send(), in arrival order, waiting at most `timeout_ms`.
  Result<wire::Response> receive(uint64_t timeout_ms);

  // Requests sent with send() and not received yet.
  size_t inFlight() const { return in_flight_.size(); }
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  using Deadline = std::chrono::steady_clock::time_point;

  BlockingClient(int fd, Endpoint endpoint, BlockingClientOptions options);

  Status writeAll(const std::vector<uint8_t>& bytes, Deadline deadline);
  Status sendRaw(const std::vector<uint8_t>& bytes, Deadline deadline);
  // Hands what was received to the session (if any) and the frame decoder.
  Status received(std::span<const uint8_t> bytes, std::vector<wire::Frame>* frames);
  Status handshake(Deadline deadline);
  // Reads until at least one complete frame is buffered, or the deadline passes.
  Status fillFrames(Deadline deadline);
  // Decodes the next buffered frame, waiting for one if none is buffered.
  Result<wire::Response> nextResponse(Deadline deadline);
  Result<uint64_t> sendWithDeadline(const wire::RequestBody& body, Deadline deadline);
  Status fail(Status status);

  int fd_;
  Endpoint endpoint_;
  BlockingClientOptions options_;
  uint64_t next_request_id_ = 1;
  wire::FrameDecoder decoder_;
  std::deque<wire::Frame> frames_;       // complete frames not decoded yet
  std::deque<wire::Response> received_;  // responses to send()s that call() read first
  std::set<uint64_t> in_flight_;         // ids sent with send(), not yet received
  Status broken_;                        // set once the connection is unusable
  std::unique_ptr<LinkSession> tls_;
  bool first_bytes_ = true;  // nothing received yet
};

}  // namespace tally::client
