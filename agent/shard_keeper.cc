#include "agent/shard_keeper.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "common/wall_clock.h"
#include "core/agent_decisions.h"
#include "core/assert.h"

namespace tally::agent {
namespace {

wire::ErrorReply unavailable(std::string message) {
  return {.code = wire::ErrorCode::kUnavailable, .message = std::move(message)};
}

// Random per process start, so issue request ids never repeat across restarts.
uint64_t requestNonce(uint64_t seed, uint64_t boot_epoch) {
  std::mt19937_64 rng(seed != 0 ? seed : monotonicClockUs() ^ (boot_epoch << 32));
  return rng();
}

LogLevel logLevel(ShardNoteLevel level) {
  switch (level) {
    case ShardNoteLevel::kDebug: return LogLevel::kDebug;
    case ShardNoteLevel::kInfo: return LogLevel::kInfo;
    case ShardNoteLevel::kWarn: return LogLevel::kWarn;
    case ShardNoteLevel::kError: return LogLevel::kError;
  }
  return LogLevel::kInfo;
}

}  // namespace

ShardKeeper::ShardKeeper(uv_loop_t* loop, central::LedgerLink* link, ShardStore* store,
                         const ShardCrypto* crypto, GatewaySigner signer, AgentMetrics* metrics,
                         Logger* logger, EmergencyOptions options, uint64_t boot_epoch,
                         uint64_t seed)
    : loop_(loop),
      link_(link),
      shard_store_(store),
      store_(store),
      signer_(std::move(signer)),
      metrics_(metrics),
      logger_(logger),
      options_(std::move(options)),
      keeping_(ShardBookOptions{.gateway_id = signer_.public_key,
                                .boot_epoch = boot_epoch,
                                .crypto = crypto,
                                .retention_ms = options_.retention_ms,
                                .hold_ttl_ms = options_.hold_ttl_ms},
               ShardKeepingOptions{.accounts = options_.accounts,
                                   .shards_on_hand = options_.shards_on_hand,
                                   .refresh_before_expiry_ms = options_.refresh_before_expiry_ms,
                                   .accounts_max = options_.accounts_max,
                                   .account_idle_ms = options_.account_idle_ms,
                                   .status_poll_ms = options_.status_poll_ms,
                                   .issue_retry_ms = options_.issue_retry_ms,
                                   .emergency_off_retry_ms = options_.emergency_off_retry_ms,
                                   .gateway_name = signer_.gateway_name,
                                   .gateway_id = signer_.public_key,
                                   .boot_epoch = boot_epoch,
                                   .request_nonce = requestNonce(seed, boot_epoch)},
               &store_) {
  timer_.data = this;
  check_.data = this;
}

ShardKeeper::~ShardKeeper() {
  TALLY_ASSERT(open_handles_ == 0);
  TALLY_ASSERT(responders_.empty());
}

Status ShardKeeper::start(uint64_t now_ms) {
  Result<ShardRestoreReport> report = shard_store_->restore(keeping_.bookForRestore(), now_ms);
  if (!report.isOk()) return report.status();
  keeping_.restored(report.value());
  perform();
  if (int rc = uv_timer_init(loop_, &timer_); rc != 0) {
    return Status::ioError(std::string("uv_timer_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  if (int rc = uv_check_init(loop_, &check_); rc != 0) {
    return Status::ioError(std::string("uv_check_init: ") + uv_strerror(rc));
  }
  ++open_handles_;
  if (int rc = uv_timer_start(&timer_, onTimer, options_.maintain_interval_ms,
                              options_.maintain_interval_ms);
      rc != 0) {
    return Status::ioError(std::string("uv_timer_start: ") + uv_strerror(rc));
  }
  if (int rc = uv_check_start(&check_, onCheck); rc != 0) {
    return Status::ioError(std::string("uv_check_start: ") + uv_strerror(rc));
  }
  return Status::ok();
}

void ShardKeeper::stop() {
  keeping_.commit();  // every accepted request gets its answer
  perform();
  auto closed = [](uv_handle_t* handle) {
    --static_cast<ShardKeeper*>(handle->data)->open_handles_;
  };
  for (uv_handle_t* handle :
       {reinterpret_cast<uv_handle_t*>(&timer_), reinterpret_cast<uv_handle_t*>(&check_)}) {
    if (handle->loop != nullptr && !uv_is_closing(handle)) uv_close(handle, closed);
  }
}

bool ShardKeeper::linkUsable() const {
  return tally::linkUsable(link_->connected(), link_->health());
}

// --- gateway operations --------------------------------------------------------------------------

void ShardKeeper::expect(uint64_t token, Respond respond) {
  const bool fresh = responders_.emplace(token, std::move(respond)).second;
  TALLY_ASSERT(fresh);
}

void ShardKeeper::onCheck(uv_check_t* check) {
  auto* keeper = static_cast<ShardKeeper*>(check->data);
  if (!keeper->keeping_.waitingForCommit()) return;
  keeper->keeping_.commit();  // one transaction for this loop iteration, then the answers
  keeper->perform();
}

void ShardKeeper::onTimer(uv_timer_t* timer) {
  auto* keeper = static_cast<ShardKeeper*>(timer->data);
  keeper->keeping_.maintain(wallClockMs(), keeper->linkUsable());
  keeper->perform();
}

// --- effects -------------------------------------------------------------------------------------

void ShardKeeper::perform() {
  for (ShardKeepingEffect& effect : keeping_.takeEffects()) {
    std::visit(
        [this](auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, ShardNote>) {
            note(value);
          } else if constexpr (std::is_same_v<T, ShardGatewayAnswer>) {
            answer(std::move(value));
          } else {
            send(std::move(value));
          }
        },
        effect);
  }
}

ShardCallResult ShardKeeper::callResult(central::LinkResult result) {
  if (!result.status.isOk()) return {.error = result.status.toString()};
  ShardCallResult call{.answered = true, .label = outcomeLabel(result.response.body)};
  if (auto* reply = std::get_if<ShardReply>(&result.response.body)) call.reply = std::move(*reply);
  return call;
}

void ShardKeeper::send(ShardSendIssue issue) {
  signer_.sign_issue(&issue.request);
  link_->call(std::move(issue.request),
              [this, account = std::move(issue.account)](central::LinkResult result) {
                keeping_.onIssueAnswer(account, callResult(std::move(result)), wallClockMs());
                perform();
              });
}

void ShardKeeper::send(ShardSendReport report) {
  signer_.sign_report(&report.report);
  link_->call(std::move(report.report),
              [this, id = std::move(report.shard_id)](central::LinkResult result) {
                keeping_.onReportAnswer(id, callResult(std::move(result)), wallClockMs());
                perform();
              });
}

void ShardKeeper::send(ShardSendStatus status) {
  link_->call(wire::ShardStatusRequest{.gateway_name = signer_.gateway_name,
                                       .shard_ids = std::move(status.shard_ids)},
              [this](central::LinkResult result) {
                keeping_.onStatusAnswer(callResult(std::move(result)), wallClockMs());
                perform();
              });
}

void ShardKeeper::answer(ShardGatewayAnswer answer) {
  auto it = responders_.find(answer.token);
  TALLY_ASSERT(it != responders_.end());
  Respond respond = std::move(it->second);
  responders_.erase(it);
  if (answer.reply.has_value()) {
    respond(std::move(*answer.reply));
  } else {
    respond(unavailable(std::move(answer.unavailable)));
  }
}

void ShardKeeper::note(const ShardNote& note) {
  switch (note.counter) {
    case ShardCounter::kNone: break;
    case ShardCounter::kAdmission: metrics_->countShardAdmission(note.label); break;
    case ShardCounter::kReport: metrics_->countShardReport(note.label); break;
    case ShardCounter::kIssue: metrics_->countShardIssue(note.label); break;
    case ShardCounter::kEvent: metrics_->countShardEvent(note.label); break;
  }
  logNote(logger_, note);
}

void logNote(Logger* logger, const ShardNote& note) {
  if (note.event.empty()) return;
  std::vector<LogField> fields;
  fields.reserve(note.fields.size());
  for (const auto& [key, value] : note.fields) fields.emplace_back(key, value);
  logger->log(logLevel(note.level), note.event, fields);
}

}  // namespace tally::agent
