#include "net/connection_set.h"

#include <sys/resource.h>

#include <algorithm>
#include <utility>

#include "wire/codec.h"

namespace tally::net {
namespace {

// At most one connection_refused line per this interval (a flood would otherwise write one per
// connection); each line counts the refusals since the one before.
constexpr uint64_t kRefusalLogIntervalMs = 1'000;

constexpr const char* kReasonStopping = "stopping";
constexpr const char* kReasonConnections = "connections_max";
constexpr const char* kReasonBuffered = "buffered_bytes_max";

}  // namespace

uint64_t connectionsMaxFor(uint64_t configured, uint64_t fd_soft_limit) {
  if (fd_soft_limit <= kDescriptorsReserved) return 1;
  return std::max<uint64_t>(1, std::min(configured, fd_soft_limit - kDescriptorsReserved));
}

uint64_t connectionsMaxForThisProcess(uint64_t configured, Logger* logger) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return configured;
  const uint64_t soft = limit.rlim_cur;
  const uint64_t allowed = connectionsMaxFor(configured, soft);
  if (allowed < configured) {
    logger->warn("connections_max_lowered", {{"connections_max", configured},
                                             {"fd_soft_limit", soft},
                                             {"descriptors_reserved", kDescriptorsReserved},
                                             {"now", allowed}});
  }
  return allowed;
}

ConnectionSet::ConnectionSet(uv_loop_t* loop, Logger* logger, StreamLimits stream,
                             ConnectionBounds bounds)
    : loop_(loop), logger_(logger), stream_(stream), bounds_(bounds) {}

ConnectionSet::~ConnectionSet() = default;

std::string ConnectionSet::refusalReason(bool stopping) const {
  if (stopping) return kReasonStopping;
  if (served() >= bounds_.connections_max) return kReasonConnections;
  if (bufferedBytes() >= bounds_.buffered_bytes_max) return kReasonBuffered;
  return "";
}

FramedStream* ConnectionSet::accept(uv_stream_t* listener, const Make& make, bool stopping) {
  const std::string reason = refusalReason(stopping);
  const uint64_t id = next_id_++;
  StreamLimits limits = stream_;
  if (!reason.empty()) limits.linger_ms = std::min(limits.linger_ms, kRefusedLingerMs);
  std::unique_ptr<FramedStream> owned = make(id, limits);
  if (Status s = owned->init(); !s.isOk()) {
    logger_->error("accept_failed", {{"error", s.toString()}});
    return nullptr;
  }
  FramedStream* stream = owned.get();
  Entry& entry = connections_.emplace(id, Entry{.stream = std::move(owned)}).first->second;
  if (Status s = stream->accept(listener); !s.isOk()) {
    logger_->warn("accept_failed", {{"error", s.toString()}});
    entry.refused = true;  // counts against no bound while it closes
    ++refused_open_;
    stream->close();
    return nullptr;
  }
  if (reason.empty()) return stream;
  entry.refused = true;
  ++refused_open_;
  refuse(stream, reason);
  return nullptr;
}

void ConnectionSet::refuse(FramedStream* stream, const std::string& reason) {
  ++refused_total_;
  ++refused_unlogged_;
  const uint64_t now_ms = uv_now(loop_);
  if (!refusal_ever_logged_ || now_ms - refusal_logged_ms_ >= kRefusalLogIntervalMs) {
    logger_->warn("connection_refused", {{"reason", reason},
                                         {"connections", served()},
                                         {"connections_max", bounds_.connections_max},
                                         {"buffered_bytes", bufferedBytes()},
                                         {"buffered_bytes_max", bounds_.buffered_bytes_max},
                                         {"refused", refused_unlogged_},
                                         {"refused_total", refused_total_}});
    refusal_ever_logged_ = true;
    refusal_logged_ms_ = now_ms;
    refused_unlogged_ = 0;
  }
  if (bounds_.refusal_frame) {
    std::string message;
    if (reason == kReasonStopping) {
      message = "the server is stopping; retry later";
    } else if (reason == kReasonConnections) {
      message = "too many connections: the server serves its maximum of " +
                std::to_string(bounds_.connections_max) + " (connections_max); retry later";
    } else {
      message = "too many buffered bytes: the server's connections hold its maximum of " +
                std::to_string(bounds_.buffered_bytes_max) +
                " bytes (buffered_bytes_max); retry later";
    }
    const wire::Response refusal{
        .request_id = 0,
        .body = wire::ErrorReply{.code = wire::ErrorCode::kUnavailable, .message = message}};
    // A few dozen bytes: always within a frame (on failure the close says it alone).
    (void)wire::encodeResponseFrameInto(refusal, stream->output());
  }
  stream->shutdownThenClose();  // the refusal, end of stream, then a short linger
}

FramedStream* ConnectionSet::find(uint64_t id) const {
  auto it = connections_.find(id);
  return it == connections_.end() ? nullptr : it->second.stream.get();
}

void ConnectionSet::erase(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (it->second.refused) --refused_open_;
  connections_.erase(it);
}

std::vector<FramedStream*> ConnectionSet::all() const {
  std::vector<FramedStream*> out;
  out.reserve(connections_.size());
  for (const auto& [id, entry] : connections_) out.push_back(entry.stream.get());
  return out;
}

uint64_t ConnectionSet::bufferedBytes() const {
  uint64_t total = 0;
  for (const auto& [id, entry] : connections_) total += entry.stream->bufferedBytes();
  return total;
}

}  // namespace tally::net
