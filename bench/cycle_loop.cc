#include "bench/cycle_loop.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <variant>

#include "bench/bench_limits.h"
#include "core/assert.h"
#include "wire/digest.h"

namespace tally::bench {
namespace {

ReservationState expectedState(Stage stage, const CycleParams& params) {
  switch (stage) {
    case kReserveStage: return ReservationState::kReserved;
    case kStartStage: return ReservationState::kStarted;
    case kSettleStage:
      return params.overuse() ? ReservationState::kSettledWithDebt : ReservationState::kSettled;
    case kCycleSeries: break;
  }
  TALLY_UNREACHABLE();
}

double processCpuSeconds() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

const char* seriesName(int series) {
  static constexpr const char* kNames[kSeriesCount] = {"reserve", "start", "settle", "cycle"};
  TALLY_ASSERT(series >= 0 && series < kSeriesCount);
  return kNames[series];
}

uint64_t CycleLoopResult::errorCount() const {
  uint64_t total = 0;
  for (const auto& [key, count] : errors) total += count;
  return total;
}

CycleLoop::CycleLoop(uv_loop_t* loop, std::vector<Connection*> connections, Timers timers,
                     CycleLoopOptions options)
    : loop_(loop),
      connections_(std::move(connections)),
      timers_(timers),
      options_(std::move(options)),
      workload_(options_.seed, options_.subjects),
      cycles_(options_.cycles_in_flight) {
  TALLY_ASSERT(!connections_.empty());
  subject_names_.reserve(options_.subjects);
  for (uint32_t i = 0; i < options_.subjects; ++i) {
    subject_names_.push_back(subjectName(options_.prefix, i));
  }
  result_.settled_actual.assign(options_.subjects, 0);
  for (uint64_t slot = 0; slot < cycles_.size(); ++slot) {
    cycles_[slot].connection = connections_[slot % connections_.size()];
  }
}

Status CycleLoop::run() {
  for (Connection* connection : connections_) connection->setListener(this);
  if (options_.warmup_ms == 0) {
    openWindow();
  } else if (Status s = timers_.warmup->start(options_.warmup_ms, [this] { openWindow(); });
             !s.isOk()) {
    return s;
  }
  if (Status s =
          timers_.end->start(options_.warmup_ms + options_.duration_ms, [this] { closeWindow(); });
      !s.isOk()) {
    return s;
  }
  run_start_ns_ = uv_hrtime();
  if (openLoop()) {
    for (uint64_t slot = cycles_.size(); slot > 0; --slot) free_slots_.push_back(slot - 1);
    startDueCycles(run_start_ns_);
    if (Status s = armPacer(); !s.isOk()) return s;
  } else {
    for (uint64_t slot = 0; slot < cycles_.size(); ++slot) {
      ++in_flight_;
      beginCycle(slot, run_start_ns_);
    }
  }
  const uint64_t bound_ms = options_.warmup_ms + options_.duration_ms + options_.drain_timeout_ms;
  const bool drained = runUntil(loop_, timers_.deadline, bound_ms, [this] {
    return stopping_ && in_flight_ == 0 && (!openLoop() || arrivalsOver());
  });
  timers_.warmup->stop();
  timers_.end->stop();
  if (timers_.pacer != nullptr) timers_.pacer->stop();
  if (!stopping_) closeWindow();
  if (!drained) {
    // Every cycle still in flight, or due in the window and never sent, is an error; one
    // detail line says why.
    uint64_t never_sent = 0;
    while (openLoop() && dueNs(cycles_begun_ + never_sent) < window_end_ns_) ++never_sent;
    result_.errors["drain:timeout"] += in_flight_ + never_sent;
    if (result_.error_details.size() < limits::kErrorsShownMax) {
      result_.error_details.push_back(std::to_string(in_flight_) + " cycles still in flight and " +
                                      std::to_string(never_sent) + " due but never sent " +
                                      std::to_string(options_.drain_timeout_ms) +
                                      " ms after the window closed");
    }
  }
  result_.cycles_created = workload_.drawn();
  return Status::ok();
}

void CycleLoop::openWindow() {
  measuring_ = true;
  window_start_ns_ = uv_hrtime();
  cpu_at_window_start_s_ = processCpuSeconds();
}

void CycleLoop::closeWindow() {
  if (stopping_) return;
  stopping_ = true;
  window_end_ns_ = uv_hrtime();
  if (!measuring_) window_start_ns_ = window_end_ns_;
  result_.measured_s = static_cast<double>(window_end_ns_ - window_start_ns_) / 1e9;
  result_.driver_cpu_s = measuring_ ? processCpuSeconds() - cpu_at_window_start_s_ : 0;
}

void CycleLoop::beginCycle(uint64_t slot, uint64_t now_ns) {
  Cycle& cycle = cycles_[slot];
  cycle.params = workload_.next();
  cycle.id = reservationId(options_.prefix, cycle.params.seq);
  cycle.operation = operationId(cycle.params.seq);
  cycle.stage = kReserveStage;
  cycle.cycle_start_ns = now_ns;
  cycle.due_in_window = measuring_ && now_ns >= window_start_ns_;
  if (openLoop() && cycle.due_in_window) ++result_.cycles_due_in_window;
  ++cycles_begun_;
  sendStage(slot, now_ns);
}

bool CycleLoop::measured(const Cycle& cycle) const {
  return openLoop() ? cycle.due_in_window : measuring_ && !stopping_;
}

uint64_t CycleLoop::dueNs(uint64_t n) const {
  return run_start_ns_ + static_cast<uint64_t>(std::llround(static_cast<double>(n) * 1e9 /
                                                            options_.arrival_rate_per_s));
}

// A closed window admits no cycle due after it; a run stopped by a failed send (stopping_
// without a window end) admits none at all.
bool CycleLoop::arrivalsOver() const { return stopping_ && dueNs(cycles_begun_) >= window_end_ns_; }

void CycleLoop::startDueCycles(uint64_t now_ns) {
  while (!free_slots_.empty() && dueNs(cycles_begun_) <= now_ns && !arrivalsOver()) {
    const uint64_t slot = free_slots_.back();
    free_slots_.pop_back();
    ++in_flight_;
    // Sent now, measured from when it was due.
    beginCycle(slot, dueNs(cycles_begun_));
  }
  if (stopping_ || now_ns < run_start_ns_) return;
  const auto due_by_now = static_cast<uint64_t>(static_cast<double>(now_ns - run_start_ns_) *
                                                options_.arrival_rate_per_s / 1e9) +
                          1;
  if (due_by_now > cycles_begun_) {
    result_.due_waiting_max = std::max(result_.due_waiting_max, due_by_now - cycles_begun_);
  }
}

// Every millisecond (libuv's timer resolution), the cycles that fell due start; replies start
// them too, as soon as they free a slot.
Status CycleLoop::armPacer() {
  TALLY_ASSERT(timers_.pacer != nullptr);
  return timers_.pacer->start(1, [this] {
    startDueCycles(uv_hrtime());
    if (arrivalsOver()) return;
    if (Status s = armPacer(); !s.isOk()) {
      recordError("pacer:timer", s.toString());
      closeWindow();
    }
  });
}

void CycleLoop::sendStage(uint64_t slot, uint64_t now_ns) {
  Cycle& cycle = cycles_[slot];
  wire::RequestBody body;
  switch (cycle.stage) {
    case kReserveStage: {
      ReserveRequest request{.reservation_id = cycle.id,
                             .subject = subject_names_[cycle.params.subject],
                             .route = kBenchRoute,
                             .units = cycle.params.units};
      request.request_digest = wire::canonicalRequestDigest(request);
      body = std::move(request);
      break;
    }
    case kStartStage:
      body = StartRequest{.reservation_id = cycle.id, .operation_id = cycle.operation};
      break;
    case kSettleStage:
      body = SettleRequest{.reservation_id = cycle.id,
                           .operation_id = cycle.operation,
                           .actual_units = cycle.params.actual};
      break;
    case kCycleSeries: TALLY_UNREACHABLE();
  }
  cycle.op_sent_ns = now_ns;
  if (Status s = cycle.connection->send(std::move(body), slot); !s.isOk()) {
    // The connection cannot carry more: wind the run down.
    recordError(std::string(seriesName(cycle.stage)) + ":send", s.toString());
    stopping_ = true;
    --in_flight_;
  }
}

std::string CycleLoop::checkReply(const Cycle& cycle, const wire::Response& response,
                                  std::string* detail) const {
  // Built only for a reply that fails a check: most replies pass every one.
  const auto where = [&] { return cycle.id + " " + seriesName(cycle.stage) + ": "; };
  if (const auto* error = std::get_if<wire::ErrorReply>(&response.body)) {
    *detail = where() + wire::errorCodeName(error->code) + " " + error->message;
    return std::string("ERROR_") + wire::errorCodeName(error->code);
  }
  const auto* reply = std::get_if<ReservationReply>(&response.body);
  if (reply == nullptr) {
    *detail = where() + "not a reservation reply";
    return "UNEXPECTED_REPLY";
  }
  if (reply->code != ReplyCode::kOk) {
    *detail = where() + replyCodeName(reply->code) +
              " limiting=" + limitingDimensionName(reply->receipt.limiting_dimension) + " " +
              reply->message;
    return replyCodeName(reply->code);
  }
  if (reply->duplicate) {
    *detail = where() + "answered as a duplicate";
    return "DUPLICATE";
  }
  if (reply->receipt.state != expectedState(cycle.stage, cycle.params)) {
    *detail = where() + "state " + reservationStateName(reply->receipt.state);
    return reservationStateName(reply->receipt.state);
  }
  if (cycle.stage == kSettleStage && reply->receipt.debt_units != 0) {
    // Over-use is taken from a bucket that never runs low: debt would freeze admission.
    *detail = where() + "recorded debt " + std::to_string(reply->receipt.debt_units);
    return "DEBT";
  }
  if (cycle.stage == kSettleStage && reply->refunded_units != cycle.params.refund()) {
    *detail = where() + "refunded " + std::to_string(reply->refunded_units) + ", expected " +
              std::to_string(cycle.params.refund());
    return "REFUND_MISMATCH";
  }
  return {};
}

void CycleLoop::onResponse(Connection*, uint64_t tag, const wire::Response& response) {
  TALLY_ASSERT(tag < cycles_.size());
  const uint64_t now = uv_hrtime();
  Cycle& cycle = cycles_[tag];
  const bool in_window = measured(cycle);
  if (in_window) result_.latency[cycle.stage].add(now - cycle.op_sent_ns);
  std::string detail;
  const std::string error = checkReply(cycle, response, &detail);
  if (error.empty() && cycle.stage < kSettleStage) {
    cycle.stage = static_cast<Stage>(cycle.stage + 1);
    sendStage(tag, now);
    return;
  }
  if (!error.empty()) {
    recordError(std::string(seriesName(cycle.stage)) + ":" + error, detail);
  } else {
    result_.settled_actual[cycle.params.subject] += cycle.params.actual;
    ++result_.cycles_settled;
    if (in_window) {
      ++result_.cycles_measured;
      result_.latency[kCycleSeries].add(now - cycle.cycle_start_ns);
    }
  }
  endCycle(tag, now);
}

void CycleLoop::endCycle(uint64_t slot, uint64_t now_ns) {
  if (openLoop()) {
    --in_flight_;
    free_slots_.push_back(slot);
    startDueCycles(now_ns);
    return;
  }
  if (stopping_) {
    --in_flight_;
    return;
  }
  beginCycle(slot, now_ns);
}

void CycleLoop::onFailed(Connection* connection, const Status& status,
                         const std::vector<uint64_t>& lost_tags) {
  recordError("transport:failed", "connection " + std::to_string(connection->index()) + ": " +
                                      status.toString() + " (" + std::to_string(lost_tags.size()) +
                                      " cycles lost)");
  result_.errors["transport:lost_cycles"] += lost_tags.size();
  if (!stopping_) closeWindow();
  in_flight_ -= lost_tags.size();
}

void CycleLoop::recordError(const std::string& key, const std::string& detail) {
  ++result_.errors[key];
  if (result_.error_details.size() < limits::kErrorsShownMax) {
    result_.error_details.push_back(detail);
  }
}

}  // namespace tally::bench
