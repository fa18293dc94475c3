#include "tests/sim/gateway.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <variant>

#include "core/limits.h"
#include "tests/sim/describe.h"
#include "tests/sim/ledger_node.h"
#include "wire/frame.h"

namespace tally::sim {
namespace {

using S = ReservationState;

constexpr uint64_t kErrorsMax = 20;  // error replies before a client gives a job up

// A copy: matchBudget points into the Policy it is given, and this one is a temporary.
std::optional<Budget> budgetFor(const Workload& w, const std::string& subject,
                                const std::string& route) {
  const Policy policy{.budgets = w.budgets};
  const Budget* budget = matchBudget(policy, subject, route);
  if (budget == nullptr) return std::nullopt;
  return *budget;
}

}  // namespace

Gateway::Gateway(NodeId id, Rng rng, const Workload* workload, Network* network, Checker* checker,
                 Trace* trace)
    : id_(id),
      rng_(rng),
      workload_(workload),
      network_(network),
      checker_(checker),
      trace_(trace) {}

void Gateway::trace(uint64_t now_ms, const std::string& line) {
  if (trace_->on()) trace_->add(now_ms, "gateway " + std::to_string(id_) + ": " + line);
}

bool Gateway::idle() const {
  return std::all_of(jobs_.begin(), jobs_.end(),
                     [](const Job& job) { return job.phase == Phase::kDone; });
}

std::optional<uint64_t> Gateway::nextWakeMs() const {
  std::optional<uint64_t> earliest;
  for (const Job& job : jobs_) {
    if (job.phase != Phase::kDone) {
      earliest = std::min(earliest.value_or(job.next_at_ms), job.next_at_ms);
    }
  }
  return earliest;
}

void Gateway::newJob(uint64_t now_ms) {
  Job job;
  job.name = "g" + std::to_string(id_) + "-j" + std::to_string(next_job_++);
  ReserveRequest& r = job.reserve;
  r.reservation_id = job.name;
  r.subject = workload_->subjects[rng_.below(workload_->subjects.size())];
  r.route = rng_.chance(300) ? workload_->routes.front()
                             : workload_->routes[rng_.below(workload_->routes.size())];
  r.units = rng_.range(1, rng_.chance(100) ? 2'000 : 120);
  if (r.subject == "max" && rng_.chance(300)) r.units = limits::kUnitsPerRequestMax;
  r.priority = static_cast<uint32_t>(rng_.below(4));
  r.policy_generation = rng_.chance(80) ? rng_.range(1, generation_hint_ + 1) : 0;
  // Values at the limits of every field, and beyond them (beyond: the ledger must refuse).
  switch (rng_.below(40)) {
    case 0:
      r.units = 0;
      job.beyond_limits = true;
      break;
    case 1:
      r.units = limits::kUnitsPerRequestMax + 1;
      job.beyond_limits = true;
      break;
    case 2:
      r.reservation_id.resize(limits::kReservationIdBytesMax + 1, 'x');
      job.beyond_limits = true;
      break;
    case 3: r.reservation_id.resize(limits::kReservationIdBytesMax, 'x'); break;
    case 4:
      r.subject = "wide-";
      r.subject.resize(limits::kSubjectBytesMax + 1, 'w');
      job.beyond_limits = true;
      break;
    case 5:
      r.subject.clear();
      job.beyond_limits = true;
      break;
    default: break;
  }
  job.name = r.reservation_id;
  r.request_digest = requestDigest(r);
  job.operation_id = "op-" + std::to_string(id_) + "-" + std::to_string(next_job_);
  const uint64_t pick = rng_.below(100);
  job.plan = pick < 35   ? Plan::kSettle
             : pick < 47 ? Plan::kSettleAbove
             : pick < 62 ? Plan::kRelease
             : pick < 74 ? Plan::kAbandon
             : pick < 87 ? Plan::kUnknown
                         : Plan::kUnknownReport;
  job.actual_units = rng_.range(0, r.units);
  if (job.plan == Plan::kSettleAbove || job.plan == Plan::kUnknownReport) {
    job.actual_units = std::min<Units>(limits::kUnitsPerRequestMax,
                                       r.units + rng_.range(1, std::max<Units>(r.units, 2) * 2));
    if (rng_.chance(50)) job.actual_units = limits::kUnitsPerRequestMax;
  }
  job.timeout_ms = rng_.range(50, 1'500);
  job.next_at_ms = now_ms;
  jobs_.push_back(std::move(job));
  send(jobs_.size() - 1, now_ms);
}

uint64_t Gateway::transmit(wire::RequestBody body, uint64_t now_ms) {
  const uint64_t request_id = next_request_id_++;
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = std::move(body)});
  if (frame.isOk()) network_->send(id_, kLedgerNode, std::move(frame).value(), now_ms);
  return request_id;
}

void Gateway::send(size_t index, uint64_t now_ms) {
  Job& job = jobs_[index];
  const bool retry = job.sent;
#ifdef TALLY_TEST_FAULTS
  if (retry && job.phase == Phase::kReserve && faults_.retry_reserve_under_new_id) {
    job.reserve.reservation_id = job.name + "-r" + std::to_string(next_request_id_);
    job.reserve.request_digest = requestDigest(job.reserve);
  }
#endif
  const std::string& id = job.reserve.reservation_id;
  wire::RequestBody body;
  switch (job.phase) {
    case Phase::kReserve: body = job.reserve; break;
    case Phase::kStart: body = StartRequest{id, job.operation_id}; break;
    case Phase::kSettle: body = SettleRequest{id, job.operation_id, job.actual_units}; break;
    case Phase::kRelease: body = ReleaseRequest{id}; break;
    case Phase::kUnknown: body = MarkUnknownRequest{id, job.operation_id}; break;
    case Phase::kReport:
      body = ReportOperationRequest{id, job.operation_id, job.actual_units};
      break;
    case Phase::kDone: return;
  }
  if (trace_->on()) trace(now_ms, (retry ? "retries " : "sends ") + describe(body));
  const uint64_t request_id = transmit(std::move(body), now_ms);
  pending_[request_id] = Pending{.job = index, .phase = job.phase, .known = job.acknowledged};
  job.sent = true;
  job.next_at_ms = now_ms + job.timeout_ms;
}

void Gateway::sendQuery(size_t index, uint64_t now_ms) {
  const Job& job = jobs_[index];
  trace(now_ms, "queries " + job.reserve.reservation_id);
  const uint64_t request_id = transmit(QueryRequest{job.reserve.reservation_id}, now_ms);
  pending_[request_id] = Pending{.job = index, .phase = Phase::kDone, .known = job.acknowledged};
}

void Gateway::sendConflict(size_t index, uint64_t now_ms) {
  // The same id with a different request: the ledger must refuse it (idempotency conflict).
  ReserveRequest other = jobs_[index].reserve;
  other.units += 1;
  other.request_digest = requestDigest(other);
  trace(now_ms, "reuses an id for another request: " + describe(wire::RequestBody(other)));
  const uint64_t request_id = transmit(other, now_ms);
  pending_[request_id] = Pending{.job = index, .phase = Phase::kReserve, .known = S::kReserved};
  conflicts_.insert(request_id);
}

void Gateway::act(uint64_t now_ms) {
  std::vector<size_t> due;
  std::vector<size_t> known;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (job.phase != Phase::kDone && job.next_at_ms <= now_ms) due.push_back(i);
    if (job.acknowledged != S::kRequested && job.phase != Phase::kDone) known.push_back(i);
  }
  const uint64_t pick = rng_.below(100);
  if (pick < 30 || (due.empty() && pick < 70)) {
    newJob(now_ms);
  } else if (!due.empty() && pick < 85) {
    send(due[rng_.below(due.size())], now_ms);
  } else if (!known.empty() && pick < 95) {
    sendQuery(known[rng_.below(known.size())], now_ms);
  } else if (!known.empty()) {
    const size_t index = known[rng_.below(known.size())];
    if (jobs_[index].acknowledged == S::kReserved && !jobs_[index].beyond_limits) {
      sendConflict(index, now_ms);
    }
  }
}

void Gateway::settleDown(uint64_t now_ms) {
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (jobs_[i].phase != Phase::kDone && jobs_[i].next_at_ms <= now_ms) send(i, now_ms);
  }
}

void Gateway::onFrame(const std::vector<uint8_t>& bytes, uint64_t now_ms) {
  wire::FrameDecoder decoder;
  std::vector<wire::Frame> frames;
  if (Status s = decoder.feed(bytes, &frames); !s.isOk()) {
    checker_->fail(Check::kLostAcknowledged, "a reply frame is unreadable: " + s.toString(),
                   now_ms);
    return;
  }
  for (const wire::Frame& frame : frames) {
    Result<wire::Response> response = wire::decodeResponse(frame);
    if (!response.isOk()) {
      checker_->fail(Check::kLostAcknowledged,
                     "a reply does not decode: " + response.status().toString(), now_ms);
      continue;
    }
    auto it = pending_.find(response.value().request_id);
    if (it == pending_.end()) continue;  // a duplicate delivery: answered already
    const Pending pending = it->second;
    pending_.erase(it);
    const bool conflict = conflicts_.erase(response.value().request_id) > 0;
    if (conflict) {
      const auto* reply = std::get_if<ReservationReply>(&response.value().body);
      if (reply != nullptr && reply->code == ReplyCode::kOk &&
          !checker_->compacted(reply->receipt.reservation_id)) {
        checker_->fail(Check::kSecondReservation,
                       "a different request under " + reply->receipt.reservation_id +
                           " was answered " + describe(response.value().body),
                       now_ms);
      }
      continue;
    }
    onReply(pending, response.value(), now_ms);
  }
}

void Gateway::finish(Job* job, const std::string& why, uint64_t now_ms) {
  job->phase = Phase::kDone;
  trace(now_ms, job->name + " done: " + why);
}

void Gateway::onReply(const Pending& pending, const wire::Response& response, uint64_t now_ms) {
  Job& job = jobs_[pending.job];
  const auto* reply = std::get_if<ReservationReply>(&response.body);
  if (pending.phase == Phase::kDone) {  // a query
    if (reply != nullptr) {
      checker_->onQueried(job.reserve.reservation_id, *reply, pending.known, now_ms);
    }
    return;
  }
  if (pending.phase != job.phase) return;  // a late answer to an earlier step
  if (reply == nullptr) {
    const auto* error = std::get_if<wire::ErrorReply>(&response.body);
    if (job.beyond_limits && error != nullptr && error->code == wire::ErrorCode::kInvalidArgument) {
      finish(&job, "refused at the wire", now_ms);
    } else if (++job.errors >= kErrorsMax) {
      finish(&job, "gives up after " + std::to_string(job.errors) + " errors", now_ms);
    } else {
      job.next_at_ms = now_ms + rng_.range(1, job.timeout_ms);  // retry
    }
    return;
  }
  if (job.beyond_limits) {
    if (reply->code == ReplyCode::kOk) {
      checker_->fail(Check::kOverspend,
                     "a request beyond the limits was admitted: " + describe(response.body),
                     now_ms);
    }
    finish(&job, std::string("refused: ") + replyCodeName(reply->code), now_ms);
    return;
  }
  advance(&job, *reply, now_ms);
}

void Gateway::advance(Job* job, const ReservationReply& reply, uint64_t now_ms) {
  const bool has_receipt = !reply.receipt.reservation_id.empty() &&
                           (reply.code == ReplyCode::kOk || reply.code == ReplyCode::kExpired ||
                            reply.code == ReplyCode::kInvalidState);
  if (has_receipt && reply.receipt.state != S::kRejected) {
    const bool actual_known = job->phase == Phase::kSettle && reply.code == ReplyCode::kOk &&
                              !reply.receipt.closed_by_hard_limit;
    checker_->onAcknowledged(reply.receipt.reservation_id, reply, actual_known, now_ms);
    job->acknowledged = reply.receipt.state;
  }
  if (reply.code == ReplyCode::kIdempotencyConflict) {
    checker_->fail(Check::kLostAcknowledged,
                   job->reserve.reservation_id + ": the ledger holds another request under it",
                   now_ms);
    return finish(job, "conflict", now_ms);
  }
  if (reply.code != ReplyCode::kOk) {
    return finish(job, std::string(replyCodeName(reply.code)), now_ms);
  }
  const std::optional<Budget> budget =
      budgetFor(*workload_, job->reserve.subject, job->reserve.route);
  const uint64_t hold_ttl_ms = budget ? budget->hold_ttl_ms : 1'000;
  const uint64_t hard_limit_ms = budget ? budget->hard_execution_limit_ms : 1'000;
  job->sent = false;
  switch (job->phase) {
    case Phase::kReserve:
      if (reply.receipt.state != S::kReserved) {
        return finish(job, reservationStateName(reply.receipt.state), now_ms);
      }
      if (job->plan == Plan::kAbandon) return finish(job, "abandoned to expiry", now_ms);
      job->phase = job->plan == Plan::kRelease ? Phase::kRelease : Phase::kStart;
      // Sometimes close to the hold TTL: a start that races the expiry.
      job->next_at_ms = now_ms + rng_.below(std::min<uint64_t>(hold_ttl_ms * 6 / 5, 10'000));
      break;
    case Phase::kStart:
      job->phase = (job->plan == Plan::kUnknown || job->plan == Plan::kUnknownReport)
                       ? Phase::kUnknown
                       : Phase::kSettle;
      job->next_at_ms = now_ms + rng_.below(std::min<uint64_t>(hard_limit_ms, 5'000));
      break;
    case Phase::kUnknown:
      if (job->plan != Plan::kUnknownReport) return finish(job, "executor never reports", now_ms);
      job->phase = Phase::kReport;
      // Before or after the hard-limit close.
      job->next_at_ms = now_ms + rng_.below(hard_limit_ms * 2);
      break;
    default: return finish(job, reservationStateName(reply.receipt.state), now_ms);
  }
}

}  // namespace tally::sim
