#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/options.h"
#include "core/status.h"
#include "net/framed_stream.h"
#include "wire/codec.h"
#include "wire/frame.h"

// One pipelined client connection to a ledger (TCP) or an agent (Unix socket), on a libuv loop.

namespace tally::bench {

class Connection;

// Receives what a Connection reads. Called on the loop thread, from inside the read callback;
// it may send() on any connection, including this one.
class ConnectionListener {
 public:
  // The response to the request sent with `tag`. The connection decodes every response into the
  // same object (reservation replies in place): copy what must outlive the call.
  virtual void onResponse(Connection* connection, uint64_t tag, const wire::Response& response) = 0;
  // The connection failed (peer closed, bad bytes, write error): the requests sent with
  // `lost_tags` will never be answered. The connection is closing; send() refuses from now on.
  virtual void onFailed(Connection* connection, const Status& status,
                        const std::vector<uint64_t>& lost_tags) = 0;

 protected:
  ~ConnectionListener() = default;
};

// Connection owns one client stream (net::FramedStream over TCP or a Unix socket: reading,
// framing, writing) and the uv_prepare_t that flushes its output once per loop iteration.
// It borrows `loop` and the listener, which must outlive it. Belongs to one loop thread.
//
// send() encodes a request under a fresh request id (1, 2, …), appends it to the output buffer
// and remembers `tag` for the response; the prepare handle flushes everything queued once per
// loop iteration, just before the loop polls, so the requests a burst of replies triggers go out
// together, as a pipelining client's do, and requests queued outside any callback go out too.
//
// Lifetime: close() closes both handles; the object may be destroyed only once closed() (both
// close callbacks ran) or if connect() was never called. Non-copyable, non-movable: libuv
// holds pointers into it.
class Connection final : private net::StreamHandler {
 public:
  Connection(uv_loop_t* loop, ConnectionListener* listener, uint64_t index);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts connecting; connected() or failed() turns true later. Errors: name resolution,
  // handle initialization.
  [[nodiscard]] Status connect(const Endpoint& endpoint);

  // Queues one request. kUnavailable when not connected or failed; kResourceExhausted above
  // the in-flight or write-queue bounds (bench_limits.h).
  [[nodiscard]] Status send(wire::RequestBody body, uint64_t tag);

  void setListener(ConnectionListener* listener) { listener_ = listener; }
  void close();

  uint64_t index() const { return index_; }
  bool connected() const { return connected_; }
  bool failed() const { return !failure_.isOk(); }
  const Status& failure() const { return failure_; }
  bool closed() const { return open_handles_ == 0 && (closing_ || !initialized_); }
  size_t inFlight() const { return pending_.size(); }

 private:
  // net::StreamHandler.
  void onFrame(net::FramedStream* stream, wire::Frame&& frame) override;
  void onBadFrame(net::FramedStream* stream, const Status& status) override;
  void onLost(net::FramedStream* stream, const Status& status) override;
  void onConnected(net::FramedStream* stream, const Status& status) override;
  void onClosed(net::FramedStream* stream) override;

  static void onPrepare(uv_prepare_t* prepare);
  static void onClose(uv_handle_t* handle);

  Status openStream(net::StreamKind kind);
  Status connectTcp(const Endpoint& endpoint);
  void connectUnix(const Endpoint& endpoint);
  // Records the first failure, tells the listener which requests are lost, and closes.
  void fail(Status status);

  uv_loop_t* loop_;
  ConnectionListener* listener_;
  uint64_t index_;
  std::unique_ptr<net::FramedStream> stream_;  // from connect()
  uv_prepare_t prepare_{};
  int open_handles_ = 0;
  bool initialized_ = false;
  bool connected_ = false;
  bool closing_ = false;
  Status failure_;

  uint64_t next_request_id_ = 1;
  std::unordered_map<uint64_t, uint64_t> pending_;  // request id -> tag
  wire::Response response_;                         // the one each frame is decoded into
  wire::EncodeScratch scratch_;                     // each request's first segment
};

}  // namespace tally::bench
