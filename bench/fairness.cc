// tally-fairness-bench: tenants of different weights compete for one route's limited execution
// slots through a real tally-agent with fair scheduling on (docs/AGENT.md "Fair scheduling").
// Each tenant runs --clients closed-loop gateways: reserve -> start (waits in the agent for a
// slot) -> hold the slot --service-ms (the executor's work) -> settle. After --warmup-s, for
// --duration-s, it measures each tenant's admitted share against its weighted fair share with
// core/fairness_meter.h — the definition the agent's tally_agent_fairness_error uses — fed from
// what the gateways see (a start sent and not answered: waiting; its answer: admitted).
//
//   tally-fairness-bench --ledger 127.0.0.1:7411 --agent /tmp/agent.sock
//       --tenants a:1,b:2,c:4,d:8 --clients 6 --service-ms 5 --warmup-s 2 --duration-s 20
//
// Publishes its own policy first (one budget per tenant on --route, weight as given). Prints a
// table and one `RESULT {json}` line. bench/fairness.sh runs it against fresh daemons.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "central-client/blocking_client.h"
#include "core/fair_scheduler.h"
#include "core/fairness_meter.h"
#include "core/limits.h"
#include "wire/codec.h"
#include "wire/digest.h"

namespace tally::bench {
namespace {

constexpr uint64_t kCallTimeoutMs = 60'000;

struct Options {
  std::string ledger;
  std::string agent;
  std::string route = "chat";
  std::vector<std::pair<std::string, uint32_t>> tenants;  // (name, weight)
  uint64_t clients = 6;
  uint64_t service_ms = 5;
  uint64_t warmup_s = 2;
  uint64_t duration_s = 20;
  std::string prefix = "fair";
  bool publish_only = false;  // publish the policy and exit (bench/fairness.sh, before the agent)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "tally-fairness-bench: %s\nusage: tally-fairness-bench --ledger HOST:PORT --agent "
               "SOCKET --tenants NAME:WEIGHT,... [--route R] [--clients N] [--service-ms MS] "
               "[--warmup-s S] [--duration-s S] [--prefix P] [--publish-only 1]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value for " + flag);
    const std::string value = argv[++i];
    if (flag == "--ledger") {
      o.ledger = value;
    } else if (flag == "--agent") {
      o.agent = value;
    } else if (flag == "--route") {
      o.route = value;
    } else if (flag == "--prefix") {
      o.prefix = value;
    } else if (flag == "--tenants") {
      size_t begin = 0;
      while (begin <= value.size()) {
        const size_t end = std::min(value.find(',', begin), value.size());
        const std::string item = value.substr(begin, end - begin);
        const size_t colon = item.find(':');
        if (colon == std::string::npos || colon == 0) usage("bad tenant '" + item + "'");
        const long weight = std::strtol(item.c_str() + colon + 1, nullptr, 10);
        if (weight < 1 || weight > 1'000'000) usage("bad weight in '" + item + "'");
        o.tenants.emplace_back(item.substr(0, colon), static_cast<uint32_t>(weight));
        begin = end + 1;
      }
    } else {
      const long long number = std::strtoll(value.c_str(), nullptr, 10);
      if (number < 0) usage("negative " + flag);
      const auto n = static_cast<uint64_t>(number);
      if (flag == "--clients") {
        o.clients = n;
      } else if (flag == "--service-ms") {
        o.service_ms = n;
      } else if (flag == "--warmup-s") {
        o.warmup_s = n;
      } else if (flag == "--duration-s") {
        o.duration_s = n;
      } else if (flag == "--publish-only") {
        o.publish_only = n != 0;
      } else {
        usage("unknown flag " + flag);
      }
    }
  }
  if (o.ledger.empty() || o.agent.empty() || o.tenants.size() < 2 || o.clients == 0) {
    usage("--ledger, --agent, two tenants or more and --clients >= 1 are required");
  }
  return o;
}

template <typename T>
std::optional<T> bodyOf(const Result<wire::Response>& response) {
  if (!response.isOk()) return std::nullopt;
  const T* body = std::get_if<T>(&response.value().body);
  return body == nullptr ? std::nullopt : std::optional<T>(*body);
}

void publish(const Options& o) {
  Result<client::Endpoint> endpoint = client::parseTcpEndpoint(o.ledger);
  if (!endpoint.isOk()) usage(endpoint.status().toString());
  auto ledger = client::BlockingClient::connect(endpoint.value(), kCallTimeoutMs);
  if (!ledger.isOk()) usage("ledger: " + ledger.status().toString());
  wire::PublishPolicyRequest request;
  for (const auto& [name, weight] : o.tenants) {
    Budget b;
    b.subject_pattern = name;
    b.route = o.route;
    b.unit = "requests";
    b.burst = limits::kBurstUnitsMax;
    b.refill_per_second = limits::kRefillPerSecondMax;
    b.max_single_reservation = 1;
    b.hold_ttl_ms = 600'000;
    b.hard_execution_limit_ms = 600'000;
    b.weight = weight;
    request.budgets.push_back(b);
  }
  const Result<wire::Response> answer = ledger.value()->call(request, kCallTimeoutMs);
  const auto policy = bodyOf<wire::PolicyAnswer>(answer);
  if (!policy.has_value() || policy->reply.code != ReplyCode::kOk) usage("publish failed");
}

// What the gateways see, in one place: the meter and each client's waiting start.
struct Shared {
  std::mutex mutex;
  FairnessMeter meter{limits::kFairnessWindowAdmissionsMax};
  bool recording = false;
  std::vector<int> waiting_tenant;  // by client: the tenant index of its waiting start, or -1
  std::vector<bool> registered;     // by client: that start was given to the meter
  std::vector<uint64_t> admitted;   // by tenant, while recording
  std::vector<double> wait_ms;      // by tenant, summed, while recording
};

void client(const Options& o, size_t tenant, size_t index, Shared* shared,
            const std::atomic<bool>* stop, std::atomic<uint64_t>* failures) {
  Result<client::Endpoint> endpoint = client::unixEndpoint(o.agent);
  auto agent = client::BlockingClient::connect(endpoint.value(), kCallTimeoutMs);
  if (!agent.isOk()) {
    failures->fetch_add(1);
    return;
  }
  const std::string& name = o.tenants[tenant].first;
  const uint32_t weight = o.tenants[tenant].second;
  for (uint64_t seq = 0; !stop->load(); ++seq) {
    const std::string id =
        o.prefix + "-" + name + "-" + std::to_string(index) + "-" + std::to_string(seq);
    ReserveRequest reserve{.reservation_id = id, .subject = name, .route = o.route, .units = 1};
    reserve.request_digest = wire::canonicalRequestDigest(reserve);
    const auto reserved = bodyOf<ReservationReply>(agent.value()->call(reserve, kCallTimeoutMs));
    if (!reserved.has_value() || reserved->code != ReplyCode::kOk) {
      failures->fetch_add(1);
      continue;
    }
    {
      std::lock_guard lock(shared->mutex);
      shared->waiting_tenant[index] = static_cast<int>(tenant);
      shared->registered[index] = shared->recording;
      if (shared->recording) shared->meter.waiting(name, 0, weight);
    }
    const auto asked = std::chrono::steady_clock::now();
    const auto started = bodyOf<ReservationReply>(agent.value()->call(
        StartRequest{.reservation_id = id, .operation_id = "op-" + id}, kCallTimeoutMs));
    const double waited_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked).count();
    const bool ok = started.has_value() && started->code == ReplyCode::kOk;
    {
      std::lock_guard lock(shared->mutex);
      if (shared->registered[index]) {
        shared->meter.leaves(name, 0, ok);
        if (ok) {
          ++shared->admitted[tenant];
          shared->wait_ms[tenant] += waited_ms;
        }
      }
      shared->waiting_tenant[index] = -1;
      shared->registered[index] = false;
    }
    if (!ok) {
      failures->fetch_add(1);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(o.service_ms));  // the executor's work
    const auto settled = bodyOf<ReservationReply>(agent.value()->call(
        SettleRequest{.reservation_id = id, .operation_id = "op-" + id, .actual_units = 1},
        kCallTimeoutMs));
    if (!settled.has_value() || settled->code != ReplyCode::kOk) failures->fetch_add(1);
  }
}

int run(const Options& o) {
  publish(o);
  if (o.publish_only) return 0;
  const size_t clients = o.tenants.size() * o.clients;
  Shared shared;
  shared.waiting_tenant.assign(clients, -1);
  shared.registered.assign(clients, false);
  shared.admitted.assign(o.tenants.size(), 0);
  shared.wait_ms.assign(o.tenants.size(), 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failures{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < o.tenants.size(); ++t) {
    for (size_t c = 0; c < o.clients; ++c) {
      threads.emplace_back(client, std::cref(o), t, t * o.clients + c, &shared, &stop, &failures);
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(o.warmup_s));
  {  // the measured interval begins: the starts waiting now count from now
    std::lock_guard lock(shared.mutex);
    shared.recording = true;
    for (size_t c = 0; c < clients; ++c) {
      const int t = shared.waiting_tenant[c];
      if (t < 0) continue;
      shared.registered[c] = true;
      shared.meter.waiting(o.tenants[static_cast<size_t>(t)].first, 0,
                           o.tenants[static_cast<size_t>(t)].second);
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(o.duration_s));
  FairnessWindow window;
  std::vector<uint64_t> admitted;
  std::vector<double> wait_ms;
  {
    std::lock_guard lock(shared.mutex);
    window = shared.meter.current();
    admitted = shared.admitted;
    wait_ms = shared.wait_ms;
    shared.recording = false;
    std::fill(shared.registered.begin(), shared.registered.end(), false);
  }
  stop = true;
  for (std::thread& thread : threads) thread.join();

  uint64_t weight_sum = 0;
  for (const auto& tenant : o.tenants) weight_sum += tenant.second;
  std::printf("%-10s %6s %10s %10s %14s %10s %12s\n", "tenant", "weight", "admitted", "share",
              "fair share", "error", "mean wait ms");
  std::string json = "{\"admissions\":" + std::to_string(window.admissions) +
                     ",\"durationS\":" + std::to_string(o.duration_s) +
                     ",\"failures\":" + std::to_string(failures.load()) + ",\"tenants\":[";
  for (size_t t = 0; t < o.tenants.size(); ++t) {
    const std::string& name = o.tenants[t].first;
    FairnessShare share{.tenant = name};
    for (const FairnessShare& s : window.tenants) {
      if (s.tenant == name) share = s;
    }
    const double mean_wait = admitted[t] > 0 ? wait_ms[t] / static_cast<double>(admitted[t]) : 0;
    std::printf("%-10s %6u %10llu %10.4f %14.4f %10.4f %12.2f\n", name.c_str(), o.tenants[t].second,
                static_cast<unsigned long long>(admitted[t]), share.admitted_share,
                share.fair_share, share.error, mean_wait);
    char item[256];
    std::snprintf(item, sizeof(item),
                  "%s{\"tenant\":\"%s\",\"weight\":%u,\"admitted\":%llu,\"share\":%.5f,"
                  "\"fairShare\":%.5f,\"weightShare\":%.5f,\"error\":%.5f,\"meanWaitMs\":%.2f}",
                  t == 0 ? "" : ",", name.c_str(), o.tenants[t].second,
                  static_cast<unsigned long long>(admitted[t]), share.admitted_share,
                  share.fair_share,
                  static_cast<double>(o.tenants[t].second) / static_cast<double>(weight_sum),
                  share.error, mean_wait);
    json += item;
  }
  char tail[128];
  std::snprintf(tail, sizeof(tail), "],\"fairnessError\":%.5f,\"admissionsPerS\":%.1f}",
                window.error,
                static_cast<double>(window.admissions) / static_cast<double>(o.duration_s));
  json += tail;
  std::printf("fairness error %.4f over %llu admissions (%.1f/s), %llu failed calls\nRESULT %s\n",
              window.error, static_cast<unsigned long long>(window.admissions),
              static_cast<double>(window.admissions) / static_cast<double>(o.duration_s),
              static_cast<unsigned long long>(failures.load()), json.c_str());
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tally::bench

int main(int argc, char** argv) { return tally::bench::run(tally::bench::parse(argc, argv)); }
