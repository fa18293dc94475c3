#include "core/fair_scheduler.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"

namespace tally {
namespace {

// A tenant's pass advances by kStrideScale / weight per admission. lcm(1..16) · 2^20: the
// strides of weights 1..16 (and of every other divisor) are exact, so equal shares meet exactly
// and ties go by arrival; any other weight up to 10^6 rounds down by less than 2 parts in 10^6.
constexpr uint64_t kStrideScale = uint64_t{720'720} << 20;

}  // namespace

uint32_t fairPriorityClass(uint32_t request_priority, uint32_t budget_priority) {
  if (request_priority == 0 || request_priority > budget_priority) return budget_priority;
  return request_priority;
}

const char* fairStartName(FairStart start) {
  switch (start) {
    case FairStart::kNotScheduled: return "not-scheduled";
    case FairStart::kAdmitted: return "admitted";
    case FairStart::kWaiting: return "waiting";
    case FairStart::kAlreadyWaiting: return "already-waiting";
    case FairStart::kHoldsSlot: return "holds-slot";
    case FairStart::kFull: return "full";
  }
  return "unknown";
}

FairScheduler::FairScheduler(FairSchedulerOptions options) : options_(std::move(options)) {
  const uint64_t window = std::max<uint64_t>(1, options_.fairness_window_admissions);
  for (const auto& [route, started_max] : options_.started_max) {
    routes_.emplace(route, Route{.started_max = std::max<uint64_t>(1, started_max),
                                 .meter = FairnessMeter(window)});
  }
#ifdef TALLY_TEST_FAULTS
  setFaultsForTesting(options_.faults);
#endif
}

#ifdef TALLY_TEST_FAULTS
void FairScheduler::setFaultsForTesting(FairSchedulerFaults faults) { faults_ = faults; }
#endif

bool FairScheduler::onReserved(const FairReserved& reserved) {
  if (!schedules(reserved.route)) return true;
  if (records_.contains(reserved.reservation_id)) return true;
  if (records_.size() >= options_.reservations_max) return false;
  Record& record = records_[reserved.reservation_id];
  record.reserved = reserved;
  setDeadline(record, reserved.expires_at_ms);
  return true;
}

const FairReserved* FairScheduler::reservation(const std::string& id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second.reserved;
}

std::optional<uint32_t> FairScheduler::waitingClass(const std::string& id) const {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.state != State::kWaiting) return std::nullopt;
  return it->second.priority;
}

FairStart FairScheduler::requestStart(uint64_t token, const std::string& id,
                                      const FairStartTerms& terms, uint64_t now_ms) {
  auto it = records_.find(id);
  if (it == records_.end()) return FairStart::kNotScheduled;
  Record& record = it->second;
  switch (record.state) {
    case State::kWaiting: return FairStart::kAlreadyWaiting;
    case State::kHoldsSlot: return FairStart::kHoldsSlot;
    case State::kReserved: break;
  }
  // Past its expiresAt the ledger answers (EXPIRED); tick() forgets it.
  if (now_ms >= record.reserved.expires_at_ms) return FairStart::kNotScheduled;
  if (waiting_ >= options_.waiting_max) return FairStart::kFull;
  Route& route = routes_.at(record.reserved.route);
  record.token = token;
  record.weight = std::max<uint32_t>(1, terms.weight);
  record.priority = terms.priority;
  record.slot_ttl_ms = terms.slot_ttl_ms;
  enqueue(route, record);
  const size_t admitted_before = admitted_.size();
  admitReady(route, now_ms);
  // A slot was free only if nothing waited before this one: at most this start is admitted.
  TALLY_ASSERT(admitted_.size() <= admitted_before + 1);
  if (record.state == State::kHoldsSlot) {
    TALLY_ASSERT(admitted_.size() == admitted_before + 1 && admitted_.back().reservation_id == id);
    admitted_.pop_back();
    return FairStart::kAdmitted;
  }
  return FairStart::kWaiting;
}

void FairScheduler::onStartAnswered(const std::string& id, bool started, uint64_t now_ms) {
  auto it = records_.find(id);
  if (it == records_.end() || it->second.state != State::kHoldsSlot || started) return;
  Route& route = routes_.at(it->second.reserved.route);
  TALLY_ASSERT(route.started > 0);
  --route.started;
  forget(id);
  admitReady(route, now_ms);
}

void FairScheduler::onStartedOutside(const FairReserved& reserved, uint64_t slot_ttl_ms,
                                     uint64_t now_ms) {
  if (!schedules(reserved.route)) return;
  auto it = records_.find(reserved.reservation_id);
  if (it == records_.end()) {
    if (records_.size() >= options_.reservations_max) return;
    it = records_.emplace(reserved.reservation_id, Record{.reserved = reserved}).first;
  } else if (it->second.state != State::kReserved) {
    return;  // waiting (not started by this agent) or holding its slot already
  }
  takeSlot(routes_.at(reserved.route), it->second, slot_ttl_ms, now_ms);
}

std::optional<uint64_t> FairScheduler::onFinished(const std::string& id, uint64_t now_ms) {
  auto it = records_.find(id);
  if (it == records_.end()) return std::nullopt;
  Record& record = it->second;
  Route& route = routes_.at(record.reserved.route);
  switch (record.state) {
    case State::kReserved: forget(id); return std::nullopt;
    case State::kWaiting: {
      const uint64_t token = record.token;
      dequeue(route, record, false);
      forget(id);
      return token;
    }
    case State::kHoldsSlot:
      TALLY_ASSERT(route.started > 0);
      --route.started;
      forget(id);
      admitReady(route, now_ms);
      return std::nullopt;
  }
  TALLY_UNREACHABLE();
}

uint64_t FairScheduler::tick(uint64_t now_ms) {
  uint64_t freed = 0;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now_ms) {
    const std::string id = deadlines_.begin()->second;
    Record& record = records_.at(id);
    Route& route = routes_.at(record.reserved.route);
    switch (record.state) {
      case State::kReserved: forget(id); break;
      case State::kWaiting: {
        // Expires like any other RESERVED reservation: handed out (over the limit) so that the
        // ledger answers EXPIRED; that answer frees the slot.
        const uint64_t token = record.token;
        dequeue(route, record, false);
        takeSlot(route, record, record.slot_ttl_ms, now_ms);
        admitted_.push_back(FairAdmission{.token = token, .reservation_id = id});
        break;
      }
      case State::kHoldsSlot:
        TALLY_ASSERT(route.started > 0);
        --route.started;
        forget(id);
        ++freed;
        break;
    }
  }
  if (freed > 0) {
    for (auto& [name, route] : routes_) admitReady(route, now_ms);
  }
  return freed;
}

std::vector<uint64_t> FairScheduler::takeAllWaiting() {
  std::vector<std::string> ids;
  for (const auto& [name, route] : routes_) {
    for (const auto& [priority, cls] : route.classes) {
      for (const auto& [tenant, state] : cls.tenants) {
        ids.insert(ids.end(), state.waiting.begin(), state.waiting.end());
      }
    }
  }
  std::vector<uint64_t> tokens;
  tokens.reserve(ids.size());
  for (const std::string& id : ids) {
    Record& record = records_.at(id);
    tokens.push_back(record.token);
    dequeue(routes_.at(record.reserved.route), record, false);
    forget(id);
  }
  TALLY_ASSERT(waiting_ == 0);
  return tokens;
}

std::vector<FairRouteView> FairScheduler::routes() const {
  std::vector<FairRouteView> views;
  for (const auto& [name, route] : routes_) {
    views.push_back(FairRouteView{.route = name,
                                  .started_max = route.started_max,
                                  .started = route.started,
                                  .waiting = route.waiting,
                                  .meter = &route.meter});
  }
  return views;
}

const FairnessMeter* FairScheduler::meter(const std::string& route) const {
  auto it = routes_.find(route);
  return it == routes_.end() ? nullptr : &it->second.meter;
}

// --- the queue -----------------------------------------------------------------------------------

void FairScheduler::enqueue(Route& route, Record& record) {
  TALLY_ASSERT(record.state == State::kReserved);
  const std::string& tenant_name = record.reserved.subject;
  Class& cls = route.classes[record.priority];
  auto [it, backlogged_now] = cls.tenants.try_emplace(tenant_name);
  Tenant& tenant = it->second;
  if (backlogged_now) {
    tenant.weight = record.weight;
    tenant.since = ++backlog_seq_;
    tenant.pass = cls.virtual_time;  // idling banks no credit …
    if (auto idle = cls.idle_pass.find(tenant_name); idle != cls.idle_pass.end()) {
      tenant.pass = std::max(tenant.pass, idle->second);  // … and leaving sheds no debt
      cls.idle_pass.erase(idle);
    }
    cls.ready.emplace(tenant.pass, tenant.since, tenant_name);
  }
  tenant.waiting.push_back(record.reserved.reservation_id);
  record.state = State::kWaiting;
  record.arrival = ++arrival_seq_;
  setDeadline(record, record.reserved.expires_at_ms);
  ++route.waiting;
  ++waiting_;
  route.meter.waiting(tenant_name, record.priority, tenant.weight);
}

void FairScheduler::dequeue(Route& route, Record& record, bool admitted) {
  TALLY_ASSERT(record.state == State::kWaiting);
  const std::string tenant_name = record.reserved.subject;
  const uint32_t priority = record.priority;
  auto cls_it = route.classes.find(priority);
  TALLY_ASSERT(cls_it != route.classes.end());
  Class& cls = cls_it->second;
  Tenant& tenant = cls.tenants.at(tenant_name);
  auto pos =
      std::find(tenant.waiting.begin(), tenant.waiting.end(), record.reserved.reservation_id);
  TALLY_ASSERT(pos != tenant.waiting.end());
#ifdef TALLY_TEST_FAULTS
  TALLY_ASSERT(!admitted || pos == tenant.waiting.begin() || faults_.newest_first);
#else
  TALLY_ASSERT(!admitted || pos == tenant.waiting.begin());  // a tenant's own order is kept
#endif
  tenant.waiting.erase(pos);
  record.state = State::kReserved;
  TALLY_ASSERT(route.waiting > 0 && waiting_ > 0);
  --route.waiting;
  --waiting_;
  route.meter.leaves(tenant_name, priority, admitted);
  if (!tenant.waiting.empty()) return;
  cls.ready.erase({tenant.pass, tenant.since, tenant_name});
  if (tenant.pass > cls.virtual_time) {
    if (cls.idle_pass.size() >= options_.waiting_max) cls.idle_pass.clear();  // bounded
    cls.idle_pass[tenant_name] = tenant.pass;
  }
  cls.tenants.erase(tenant_name);
  if (cls.tenants.empty()) route.classes.erase(cls_it);  // nobody waits: time restarts at 0
}

void FairScheduler::admitReady(Route& route, uint64_t now_ms) {
  while (route.started < route.started_max && route.waiting > 0) {
    TALLY_ASSERT(!route.classes.empty());
    Class& cls = route.classes.begin()->second;  // the highest class with waiting starts
    TALLY_ASSERT(!cls.ready.empty());
    auto chosen = cls.ready.begin();
#ifdef TALLY_TEST_FAULTS
    if (faults_.fifo_across_tenants) {  // the earliest waiting start, whatever the weights
      uint64_t earliest = ~uint64_t{0};
      for (auto it = cls.ready.begin(); it != cls.ready.end(); ++it) {
        const uint64_t arrival =
            records_.at(cls.tenants.at(std::get<2>(*it)).waiting.front()).arrival;
        if (arrival < earliest) {
          earliest = arrival;
          chosen = it;
        }
      }
    }
#endif
    auto [pass, since, tenant_name] = *chosen;
    Tenant& tenant = cls.tenants.at(tenant_name);
    cls.ready.erase(chosen);
    cls.virtual_time = pass;
    tenant.pass = pass + kStrideScale / tenant.weight;
    cls.ready.emplace(tenant.pass, since, tenant_name);
    if (cls.virtual_time > (uint64_t{1} << 62)) {  // rebase, centuries of admissions away
      const uint64_t base = cls.virtual_time;
      cls.ready.clear();
      for (auto& [name, state] : cls.tenants) {
        state.pass -= base;
        cls.ready.emplace(state.pass, state.since, name);
      }
      for (auto& [name, idle] : cls.idle_pass) idle = idle > base ? idle - base : 0;
      cls.virtual_time = 0;
    }
    std::string id = tenant.waiting.front();
#ifdef TALLY_TEST_FAULTS
    if (faults_.newest_first) id = tenant.waiting.back();
#endif
    Record& record = records_.at(id);
    const uint64_t token = record.token;
    dequeue(route, record, true);  // `cls` and `tenant` may be gone after this
    takeSlot(route, record, record.slot_ttl_ms, now_ms);
    admitted_.push_back(FairAdmission{.token = token, .reservation_id = id});
  }
  // Nothing waits while a slot is free.
  TALLY_ASSERT(route.waiting == 0 || route.started >= route.started_max);
}

void FairScheduler::takeSlot(Route& route, Record& record, uint64_t slot_ttl_ms, uint64_t now_ms) {
  TALLY_ASSERT(record.state == State::kReserved);
  const uint64_t ttl_ms = slot_ttl_ms == 0
                              ? limits::kHardExecutionLimitMsMax
                              : std::min(slot_ttl_ms, limits::kHardExecutionLimitMsMax);
  record.state = State::kHoldsSlot;
  ++route.started;
  setDeadline(record, now_ms + ttl_ms);
}

void FairScheduler::setDeadline(Record& record, uint64_t deadline_ms) {
  const std::string& id = record.reserved.reservation_id;
  deadlines_.erase({record.deadline_ms, id});
  record.deadline_ms = deadline_ms;
  deadlines_.emplace(deadline_ms, id);
}

void FairScheduler::forget(const std::string& id) {
  auto it = records_.find(id);
  TALLY_ASSERT(it != records_.end() && it->second.state != State::kWaiting);
  deadlines_.erase({it->second.deadline_ms, id});
  records_.erase(it);
}

}  // namespace tally
