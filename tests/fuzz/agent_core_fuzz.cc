// Every request handler of tally-agent: gateway request bytes in → decodeRequest → AgentCore (the
// agent's pure core, driven as docs/ARCHITECTURE.md "Driving the agent without its shell" says
// and as agent/agent_service.cc does) → reply bytes out to the gateway and request bytes out to
// the ledger; and the ledger's answers, also bytes (decodeResponse), fed back in any order, lost
// or refused, with the link going up, down and unhealthy, the outbox's commits failing, and
// requesters going away.
//
// Input: records, each an operation byte and its arguments:
//   0 gateway request [length u16][frame payload]      1 answer a call [index u8][length
//   u16][payload] 2 a call's answer is lost [index u8]               3 a call was not sent [index
//   u8] 4 pump tick [ms/50 u8]     5 end of loop iteration 6 link state [connected bit, health] 7
//   outbox commits [ok bit]  8 the oldest waiting requester goes away
// At the end the agent shuts down with a zero timeout.
//
// Checks: every effect names a token or call the shell holds (a reply for a requester that is
// not waiting, a send of nothing held, is a finding); nothing asserts; every reply and every
// request the agent sends encodes and decodes back; after the shutdown every requester has been
// answered exactly once.

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>

#include "core/agent_core.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/codec.h"

using namespace tally;

namespace {

// What agent/agent_service.cc does with the core's effects, with the network and the store
// replaced by the fuzzer's choices.
class Shell {
 public:
  Shell()
      : core_(
            AgentCoreOptions{.outbox_entries_max = 64,
                             .local_reservations_max = 64,
                             .unknown_max = 64,
                             .resolve_batch_max = 4,
                             .central_ids_max = 64,
                             .ledger_window_max = 4,
                             .waiting_max = 16},
            [this](uint64_t token) { return !gone_.contains(token); }, nullptr) {
    core_.start({}, now_ms_);
    perform(nullptr);
  }

  void request(std::span<const uint8_t> frame) {
    wire::DecodedRequest decoded = wire::decodeRequest(frame);
    if (!decoded.body.isOk()) {
      answer(wire::errorReplyFor(decoded.body.status()));
      return;
    }
    wire::RequestBody body = std::move(decoded.body).value();
    std::optional<AgentRequest> request;
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, ReserveRequest> || std::is_same_v<T, StartRequest> ||
                        std::is_same_v<T, SettleRequest> || std::is_same_v<T, ReleaseRequest> ||
                        std::is_same_v<T, MarkUnknownRequest> ||
                        std::is_same_v<T, ReportOperationRequest> ||
                        std::is_same_v<T, QueryRequest>) {
            request = value;
          } else if constexpr (std::is_same_v<T, wire::HealthRequest>) {
            answer(wire::HealthReply{.status = "HEALTHY", .version = "fuzz", .now_ms = now_ms_});
          } else if constexpr (std::is_same_v<T, wire::UnknownMessage>) {
            answer(wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage});
          } else if constexpr (std::is_same_v<T, wire::PublishPolicyRequest> ||
                               std::is_same_v<T, wire::RollbackPolicyRequest> ||
                               std::is_same_v<T, wire::ShowPolicyRequest> ||
                               std::is_same_v<T, wire::AuditRequest>) {
            request =
                AgentOtherRequest{.changes_policy = !std::is_same_v<T, wire::ShowPolicyRequest> &&
                                                    !std::is_same_v<T, wire::AuditRequest>};
          } else {  // operator and agent-to-ledger messages: never forwarded
            answer(wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage});
          }
        },
        body);
    if (!request.has_value()) return;
    const uint64_t token = core_.newToken();
    waiting_.insert(token);
    held_.emplace(token, std::move(body));
    core_.onRequest(token, *request, link_, now_ms_);
    perform(nullptr);
  }

  void answerCall(size_t index, std::span<const uint8_t> frame) {
    if (calls_.empty()) return;
    const uint64_t call = takeCall(index);
    Result<wire::Response> response = wire::decodeResponse(frame);
    AgentLedgerAnswer answer;
    if (!response.isOk()) {  // the link drops a connection whose answer does not decode
      lost(call, LinkOutcome::kLost, response.status());
      return;
    }
    wire::ResponseBody body = std::move(response.value().body);
    answer.outcome = LinkOutcome::kAnswered;
    answer.label = "answered";
    if (const auto* reply = std::get_if<ReservationReply>(&body)) {
      answer.reservation = *reply;
    } else if (const auto* policy = std::get_if<wire::PolicyAnswer>(&body)) {
      answer.policy_reply = policy->reply;
      answer.policy = policy->policy;
    }
    core_.onAnswer(call, answer, link_, now_ms_, 500);
    perform(&body);
    perform(nullptr);  // what the link refused meanwhile
  }

  void loseCall(size_t index, LinkOutcome outcome) {
    if (calls_.empty()) return;
    lost(takeCall(index), outcome, Status::unavailable("fuzz: no answer"));
  }

  void tick(uint64_t advance_ms) {
    now_ms_ += advance_ms;
    core_.onTick(link_, now_ms_);
    perform(nullptr);
  }

  void iterationEnd() {
    core_.onIterationEnd(now_ms_);
    perform(nullptr);
  }

  void setLink(uint8_t state) {
    const bool was_connected = link_.connected;
    link_.connected = (state & 1) != 0;
    link_.health = static_cast<LinkHealth>((state >> 1) % 3);
    if (!was_connected && link_.connected) {
      core_.onConnected(link_, now_ms_);
      perform(nullptr);
    }
  }

  void setPersistOk(bool ok) { persist_ok_ = ok; }

  void requesterGone() {
    if (!waiting_.empty()) gone_.insert(*waiting_.begin());
  }

  void advance() { ++now_ms_; }

  void shutdown() {
    core_.beginShutdown(0, now_ms_);
    perform(nullptr);
    core_.onTick(link_, now_ms_);
    perform(nullptr);
    for (uint64_t token : waiting_) {
      if (!gone_.contains(token)) fuzz::fail("a requester was never answered");
    }
  }

 private:
  uint64_t takeCall(size_t index) {
    const auto it = calls_.begin() + static_cast<ptrdiff_t>(index % calls_.size());
    const uint64_t call = *it;
    calls_.erase(it);
    return call;
  }

  void lost(uint64_t call, LinkOutcome outcome, const Status& status) {
    AgentLedgerAnswer answer{
        .outcome = outcome, .error = status.message(), .error_detail = status.toString()};
    core_.onAnswer(call, answer, link_, now_ms_, 500);
    perform(nullptr);
  }

  void answer(wire::ResponseBody body) {
    (void)fuzz::encodeAnswer(wire::Response{.request_id = 0, .body = std::move(body)});
  }

  void reply(uint64_t token, wire::ResponseBody body) {
    if (waiting_.erase(token) == 0) fuzz::fail("a reply for a requester that is not waiting");
    held_.erase(token);
    (void)fuzz::encodeAnswer(wire::Response{.request_id = token, .body = std::move(body)});
  }

  void send(uint64_t call, wire::RequestBody body) {
    if (std::find(calls_.begin(), calls_.end(), call) != calls_.end()) {
      fuzz::fail("a call id sent twice while in flight");
    }
    bool too_large = false;
    (void)fuzz::encodeCall(wire::Request{.request_id = call, .body = std::move(body)}, &too_large);
    if (too_large) {
      // The link refuses it before sending and answers kNotSent, after the current callback.
      not_sent_.push_back(call);
      return;
    }
    calls_.push_back(call);
  }

  void perform(const wire::ResponseBody* answer) {
    for (AgentCoreEffects effects = core_.takeEffects(); !effects.empty();
         effects = core_.takeEffects()) {
      for (AgentCoreEffect& effect : effects) {
        std::visit([&](auto& value) { apply(value, answer); }, effect);
      }
    }
    if (answer != nullptr || not_sent_.empty()) return;
    const uint64_t call = not_sent_.front();
    not_sent_.pop_front();
    lost(call, LinkOutcome::kNotSent, Status::resourceExhausted("request too large for a frame"));
  }

  void apply(AgentSend& value, const wire::ResponseBody*) {
    auto it = held_.find(value.token);
    if (it == held_.end()) fuzz::fail("AgentSend of a token the shell does not hold");
    wire::RequestBody body = std::move(it->second);
    held_.erase(it);
    send(value.token, std::move(body));
  }
  void apply(AgentDrop& value, const wire::ResponseBody*) {
    if (!gone_.contains(value.token)) fuzz::fail("AgentDrop of a requester still there");
    reply(value.token, wire::ErrorReply{.code = wire::ErrorCode::kUnavailable});
  }
  void apply(AgentReplyUnavailable& value, const wire::ResponseBody*) {
    reply(value.token, wire::ErrorReply{.code = wire::ErrorCode::kUnavailable,
                                        .message = std::move(value.message)});
  }
  void apply(AgentReplyQueued& value, const wire::ResponseBody*) {
    reply(value.token, ReservationReply{.code = ReplyCode::kQueued});
  }
  void apply(AgentReplyReservation& value, const wire::ResponseBody*) {
    reply(value.token, std::move(value.reply));
  }
  void apply(AgentReplyLedgerAnswer& value, const wire::ResponseBody* answer) {
    if (answer == nullptr) fuzz::fail("AgentReplyLedgerAnswer outside of an answer");
    reply(value.token, *answer);
  }
  void apply(AgentPersist& value, const wire::ResponseBody*) {
    if (value.entries.empty()) fuzz::fail("an empty AgentPersist");
    core_.persisted(persist_ok_, persist_ok_ ? "" : "fuzz: disk full", now_ms_);
  }
  void apply(AgentCall& value, const wire::ResponseBody*) {
    send(value.call, callRequest(std::move(value.body)));
  }
  void apply(AgentToShards&, const wire::ResponseBody*) {
    fuzz::fail("AgentToShards without a ShardKeeping");
  }
  void apply(AgentRemoveDelivered&, const wire::ResponseBody*) {}
  void apply(AgentCountShadow&, const wire::ResponseBody*) {}
  void apply(ShardNote&, const wire::ResponseBody*) {}
  void apply(AgentShutdownAnswering&, const wire::ResponseBody*) {}
  void apply(AgentShutdownAnswered&, const wire::ResponseBody*) {}
  void apply(AgentDrainDone&, const wire::ResponseBody*) {}

  uint64_t now_ms_ = fuzz::kT0Ms;
  AgentLinkState link_{.connected = true, .health = LinkHealth::kHealthy};
  bool persist_ok_ = true;
  std::set<uint64_t> waiting_;                  // requesters not answered yet
  std::set<uint64_t> gone_;                     // requesters that went away
  std::map<uint64_t, wire::RequestBody> held_;  // requests not sent yet, by token
  std::deque<uint64_t> calls_;                  // sent, not answered
  std::deque<uint64_t> not_sent_;               // refused by the link: too large for a frame
  AgentCore core_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzBytes in(data, size);
  Shell shell;
  while (!in.empty()) {
    shell.advance();
    switch (in.u8() % 9) {
      case 0: shell.request(in.bytes(in.u16())); break;
      case 1: {
        const uint8_t index = in.u8();
        shell.answerCall(index, in.bytes(in.u16()));
        break;
      }
      case 2: shell.loseCall(in.u8(), LinkOutcome::kLost); break;
      case 3: shell.loseCall(in.u8(), LinkOutcome::kNotSent); break;
      case 4: shell.tick(in.u8() * 50ULL); break;
      case 5: shell.iterationEnd(); break;
      case 6: shell.setLink(in.u8()); break;
      case 7: shell.setPersistOk((in.u8() & 1) != 0); break;
      default: shell.requesterGone(); break;
    }
  }
  shell.shutdown();
  return 0;
}
