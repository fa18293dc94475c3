#pragma once

#include <uv.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "bench/connection.h"
#include "bench/loop.h"
#include "core/status.h"
#include "wire/codec.h"

// Request/response calls on a Connection for the untimed phases (setup and verification): the
// loop runs until the answers are in, bounded by a deadline.

namespace tally::bench {

// Rpc borrows the loop, the connection and the deadline timer, which must outlive it. While a
// call runs it is the connection's listener; it hands the connection back to `previous` after.
class Rpc : public ConnectionListener {
 public:
  Rpc(uv_loop_t* loop, Connection* connection, Timer* deadline)
      : loop_(loop), connection_(connection), deadline_(deadline) {}
  Rpc(const Rpc&) = delete;
  Rpc& operator=(const Rpc&) = delete;

  // One request; kUnavailable on timeout or a failed connection.
  Result<wire::Response> call(wire::RequestBody body, uint64_t timeout_ms);
  // Many requests, pipelined at most `window` at a time; responses in request order. The whole
  // batch shares one deadline.
  Result<std::vector<wire::Response>> callAll(std::vector<wire::RequestBody> bodies,
                                              uint64_t window, uint64_t timeout_ms);

  void onResponse(Connection* connection, uint64_t tag, const wire::Response& response) override;
  void onFailed(Connection* connection, const Status& status,
                const std::vector<uint64_t>& lost_tags) override;

 private:
  uv_loop_t* loop_;
  Connection* connection_;
  Timer* deadline_;
  std::vector<std::optional<wire::Response>> answers_;
  uint64_t answered_ = 0;
};

}  // namespace tally::bench
