#include "bench/rpc.h"

#include <utility>

#include "core/assert.h"

namespace tally::bench {

Result<wire::Response> Rpc::call(wire::RequestBody body, uint64_t timeout_ms) {
  std::vector<wire::RequestBody> bodies;
  bodies.push_back(std::move(body));
  Result<std::vector<wire::Response>> answers = callAll(std::move(bodies), 1, timeout_ms);
  if (!answers.isOk()) return answers.status();
  return std::move(answers.value().front());
}

Result<std::vector<wire::Response>> Rpc::callAll(std::vector<wire::RequestBody> bodies,
                                                 uint64_t window, uint64_t timeout_ms) {
  TALLY_ASSERT(window > 0);
  if (connection_->failed()) return connection_->failure();
  answers_.assign(bodies.size(), std::nullopt);
  answered_ = 0;
  connection_->setListener(this);
  uint64_t sent = 0;
  Status send_error = Status::ok();
  auto done = [&] {
    // Keep `window` requests in flight; stop early when the connection fails.
    while (send_error.isOk() && sent < bodies.size() && sent - answered_ < window) {
      send_error = connection_->send(std::move(bodies[sent]), sent);
      if (send_error.isOk()) ++sent;
    }
    return !send_error.isOk() || connection_->failed() || answered_ == bodies.size();
  };
  const bool finished = runUntil(loop_, deadline_, timeout_ms, done);
  if (!send_error.isOk()) return send_error;
  if (connection_->failed()) return connection_->failure();
  if (!finished) {
    return Status::unavailable("no answer within " + std::to_string(timeout_ms) + " ms (" +
                               std::to_string(answered_) + " of " + std::to_string(bodies.size()) +
                               " answered)");
  }
  std::vector<wire::Response> out;
  out.reserve(answers_.size());
  for (std::optional<wire::Response>& answer : answers_) out.push_back(std::move(*answer));
  answers_.clear();
  return out;
}

void Rpc::onResponse(Connection*, uint64_t tag, const wire::Response& response) {
  if (tag >= answers_.size() || answers_[tag].has_value()) return;  // a late answer: ignore
  answers_[tag] = response;
  ++answered_;
}

void Rpc::onFailed(Connection*, const Status&, const std::vector<uint64_t>&) {
  // callAll() sees connection_->failed() on its next check.
}

}  // namespace tally::bench
