#include "tests/sim/agent_client.h"

#include <algorithm>
#include <variant>

#include "core/limits.h"
#include "tests/sim/describe.h"

namespace tally::sim {
namespace {

constexpr uint64_t kReserveAttemptsMax = 8;

}  // namespace

AgentClient::AgentClient(uint32_t index, Rng rng, const Workload* workload, Trace* trace)
    : index_(index), rng_(rng), workload_(workload), trace_(trace) {}

bool AgentClient::idle() const {
  if (fairAtEndPending()) return false;
  return std::all_of(jobs_.begin(), jobs_.end(),
                     [](const Job& job) { return job.phase == Phase::kDone; });
}

bool AgentClient::fairAtEndPending() const {
  return workload_->fair.has_value() && settling_ && fair_jobs_made_ < fair_jobs_max_;
}

std::optional<uint64_t> AgentClient::nextWakeMs() const {
  std::optional<uint64_t> earliest;
  if (fairAtEndPending() && !fair_resumed_) earliest = fair_resume_at_ms_;
  for (const Job& job : jobs_) {
    if (job.phase == Phase::kDone || job.waiting) continue;
    const uint64_t at = job.fair ? std::max(job.next_at_ms, fair_resume_at_ms_) : job.next_at_ms;
    earliest = std::min(earliest.value_or(at), at);
  }
  return earliest;
}

std::vector<AgentClient::Request> AgentClient::act(uint64_t now_ms) {
  std::vector<Request> out;
  std::vector<size_t> due;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (job.phase != Phase::kDone && !job.waiting && job.next_at_ms <= now_ms) due.push_back(i);
  }
  if (due.empty() || rng_.chance(400)) {
    newJob(now_ms, &out);
  } else {
    sendStep(due[rng_.below(due.size())], now_ms, &out);
  }
  if (workload_->fair.has_value()) fairWork(now_ms, &out);
  return out;
}

void AgentClient::fairWork(uint64_t now_ms, std::vector<Request>* out) {
  const FairWorkload& fair = *workload_->fair;
  std::erase_if(fair_jobs_, [&](size_t i) { return jobs_[i].phase == Phase::kDone; });
  std::vector<uint64_t> pending(fair.tenants.size(), 0);
  std::vector<size_t> starts;
  std::vector<size_t> rest;  // settles, and retries of reserves
  for (const size_t i : fair_jobs_) {
    const Job& job = jobs_[i];
    if (job.phase == Phase::kReserve || job.phase == Phase::kStart) {
      const auto t = std::find(fair.tenants.begin(), fair.tenants.end(), job.reserve.subject);
      ++pending[static_cast<size_t>(t - fair.tenants.begin())];
    }
    if (job.waiting || job.next_at_ms > now_ms) continue;
    (job.phase == Phase::kStart ? starts : rest).push_back(i);
  }
  // Starts first, so that the slots the settles free find them waiting.
  for (const size_t i : starts) sendStep(i, now_ms, out);
  for (const size_t i : rest) sendStep(i, now_ms, out);
  const size_t first = rng_.below(fair.tenants.size());
  for (size_t k = 0; k < fair.tenants.size(); ++k) {
    const size_t t = (first + k) % fair.tenants.size();
    for (; pending[t] < kFairPendingPerTenant && fair_jobs_made_ < fair_jobs_max_; ++pending[t]) {
      newFairJob(fair.tenants[t], true, now_ms, out);
    }
  }
  if (!settling_ && fair_jobs_made_ < fair_jobs_max_ && rng_.chance(20)) {
    newFairJob(fair.tenants[first], false, now_ms, out);
  }
}

// `reserved` false: a start of an id never reserved (its reserve is never sent).
void AgentClient::newFairJob(const std::string& tenant, bool reserved, uint64_t now_ms,
                             std::vector<Request>* out) {
  Job job;
  ReserveRequest& r = job.reserve;
  r.reservation_id = "a" + std::to_string(index_) + "-f" + std::to_string(jobs_.size());
  r.subject = tenant;
  r.route = workload_->fair->route;
  r.units = 1;
  r.request_digest = requestDigest(r);
  job.operation_id = "aop-" + std::to_string(index_) + "-" + std::to_string(jobs_.size());
  job.plan = Plan::kSettle;
  job.actual_units = 1;
  job.phase = reserved ? Phase::kReserve : Phase::kStart;
  job.next_at_ms = now_ms;
  job.fair = true;
  ++fair_jobs_made_;
  jobs_.push_back(std::move(job));
  fair_jobs_.push_back(jobs_.size() - 1);
  sendStep(jobs_.size() - 1, now_ms, out);
}

std::vector<AgentClient::Request> AgentClient::settleDown(uint64_t now_ms) {
  std::vector<Request> out;
  if (workload_->fair.has_value() && !settling_) {
    fair_jobs_max_ = fair_jobs_made_ + kFairJobsAtEnd;
    fair_resume_at_ms_ = now_ms + kFairResumeAfterMs;
  }
  settling_ = true;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const Job& job = jobs_[i];
    if (job.fair && now_ms < fair_resume_at_ms_) continue;
    if (job.phase != Phase::kDone && !job.waiting && job.next_at_ms <= now_ms) {
      sendStep(i, now_ms, &out);
    }
  }
  fair_resumed_ = settling_ && now_ms >= fair_resume_at_ms_;
  if (fairAtEndPending() && fair_resumed_) fairWork(now_ms, &out);
  return out;
}

void AgentClient::newJob(uint64_t now_ms, std::vector<Request>* out) {
  Job job;
  ReserveRequest& r = job.reserve;
  r.reservation_id = "a" + std::to_string(index_) + "-j" + std::to_string(jobs_.size());
  // Mostly the routes with emergency mode on: those are the ones shards serve.
  std::vector<const Budget*> emergency;
  for (const Budget& b : workload_->budgets) {
    if (b.emergency.enabled && b.subject_pattern.find('*') == std::string::npos) {
      emergency.push_back(&b);
    }
  }
  const Budget* budget = !emergency.empty() && !rng_.chance(200)
                             ? emergency[rng_.below(emergency.size())]
                             : &workload_->budgets[rng_.below(workload_->budgets.size())];
  r.subject = budget->subject_pattern.find('*') != std::string::npos
                  ? "wide-" + std::string(limits::kSubjectBytesMax - 5, 'w')
                  : budget->subject_pattern;
  r.route = budget->route;
  r.units = rng_.range(1, std::max<Units>(1, std::min<Units>(budget->max_single_reservation, 50)));
  r.request_digest = requestDigest(r);
  job.operation_id = "aop-" + std::to_string(index_) + "-" + std::to_string(jobs_.size());
  const uint64_t pick = rng_.below(100);
  job.plan = pick < 40   ? Plan::kSettle
             : pick < 52 ? Plan::kSettleAbove
             : pick < 67 ? Plan::kRelease
             : pick < 80 ? Plan::kAbandon
                         : Plan::kUnknownReport;
  job.actual_units = rng_.range(0, r.units);
  if (job.plan == Plan::kSettleAbove) job.actual_units = r.units + rng_.range(1, r.units * 2);
  if (job.plan == Plan::kUnknownReport) job.actual_units = rng_.range(0, r.units * 2);
  job.next_at_ms = now_ms;
  jobs_.push_back(std::move(job));
  sendStep(jobs_.size() - 1, now_ms, out);
}

void AgentClient::sendStep(size_t index, uint64_t now_ms, std::vector<Request>* out) {
  Job& job = jobs_[index];
  const std::string& id = job.reserve.reservation_id;
  wire::RequestBody body;
  switch (job.phase) {
    case Phase::kReserve: body = job.reserve; break;
    case Phase::kStart:
      body = StartRequest{.reservation_id = id, .operation_id = job.operation_id};
      break;
    case Phase::kSettle:
      body = SettleRequest{
          .reservation_id = id, .operation_id = job.operation_id, .actual_units = job.actual_units};
      break;
    case Phase::kRelease: body = ReleaseRequest{.reservation_id = id}; break;
    case Phase::kUnknown:
      body = MarkUnknownRequest{.reservation_id = id, .operation_id = job.operation_id};
      break;
    case Phase::kReport:
      body = ReportOperationRequest{
          .reservation_id = id, .operation_id = job.operation_id, .actual_units = job.actual_units};
      break;
    case Phase::kDone: return;
  }
  job.waiting = true;
  ++job.attempts;
  const uint64_t tag = next_tag_++;
  outstanding_.emplace(tag, index);
  out->emplace_back(tag, std::move(body));
  (void)now_ms;
}

void AgentClient::next(Job* job, Phase phase, uint64_t now_ms) {
  job->phase = phase;
  job->attempts = 0;
  job->next_at_ms = now_ms + rng_.range(0, 400);
}

void AgentClient::retry(Job* job, uint64_t now_ms) {
  if (job->phase == Phase::kReserve && job->attempts >= kReserveAttemptsMax) {
    job->phase = Phase::kDone;  // the client gave up; a reservation it made expires
    return;
  }
  job->next_at_ms = now_ms + rng_.range(50, 1'000);
}

void AgentClient::onReply(uint64_t tag, const wire::ResponseBody& body, uint64_t now_ms) {
  auto it = outstanding_.find(tag);
  if (it == outstanding_.end()) return;
  Job& job = jobs_[it->second];
  outstanding_.erase(it);
  if (trace_->on()) {
    trace_->add(now_ms, "client " + std::to_string(index_) + " " + job.reserve.reservation_id +
                            " hears " + describe(body));
  }
  job.waiting = false;
  const auto* reply = std::get_if<ReservationReply>(&body);
  if (reply == nullptr) {  // UNAVAILABLE, a closed connection, …: the same request again
    retry(&job, now_ms);
    return;
  }
  const ReplyCode code = reply->code;
  const ReservationState state = reply->receipt.state;
  switch (job.phase) {
    case Phase::kReserve:
      if (code == ReplyCode::kOk && state == ReservationState::kReserved) {
        next(&job,
             job.plan == Plan::kAbandon   ? Phase::kDone
             : job.plan == Plan::kRelease ? Phase::kRelease
                                          : Phase::kStart,
             now_ms);
        if (job.fair) job.next_at_ms = now_ms;  // started at once: it waits in the scheduler
      } else if (code == ReplyCode::kOk || code == ReplyCode::kRejected ||
                 code == ReplyCode::kIdempotencyConflict || code == ReplyCode::kInvalidArgument) {
        job.phase = Phase::kDone;
      } else {
        retry(&job, now_ms);
      }
      break;
    case Phase::kStart:
      if (code == ReplyCode::kOk) {
        next(&job, job.plan == Plan::kUnknownReport ? Phase::kUnknown : Phase::kSettle, now_ms);
        if (job.fair) job.next_at_ms = now_ms + rng_.range(50, 600);  // the work runs
      } else if (code == ReplyCode::kExpired || code == ReplyCode::kInvalidState ||
                 code == ReplyCode::kNotFound || code == ReplyCode::kOperationConflict) {
        job.phase = Phase::kDone;
      } else {
        retry(&job, now_ms);
      }
      break;
    case Phase::kUnknown:
      if (code == ReplyCode::kOk || code == ReplyCode::kQueued) {
        next(&job, Phase::kReport, now_ms + rng_.range(0, 3'000));
      } else if (code == ReplyCode::kInvalidState || code == ReplyCode::kNotFound) {
        job.phase = Phase::kDone;
      } else {
        retry(&job, now_ms);
      }
      break;
    case Phase::kSettle:
    case Phase::kRelease:
    case Phase::kReport:
      if (code == ReplyCode::kOk || code == ReplyCode::kQueued ||
          code == ReplyCode::kInvalidState || code == ReplyCode::kNotFound ||
          code == ReplyCode::kExpired || code == ReplyCode::kOperationConflict) {
        job.phase = Phase::kDone;
      } else {
        retry(&job, now_ms);
      }
      break;
    case Phase::kDone: break;
  }
}

}  // namespace tally::sim
