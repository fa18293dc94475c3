#include "tests/integration/ledger_harness.h"

#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>

#include "tests/support/ledger_store_args.h"
#include "wire/digest.h"

namespace tally {

void PrintTo(ReplyCode code, std::ostream* os) { *os << replyCodeName(code); }
void PrintTo(ReservationState state, std::ostream* os) { *os << reservationStateName(state); }
void PrintTo(LimitingDimension dimension, std::ostream* os) {
  *os << limitingDimensionName(dimension);
}
void PrintTo(GenerationState state, std::ostream* os) { *os << generationStateName(state); }

void PrintTo(const Balances& b, std::ostream* os) {
  *os << "{opening=" << b.opening << " minted=" << b.minted
      << " overdraftIssued=" << b.overdraft_issued << " available=" << b.available
      << " reserved=" << b.reserved << " spent=" << b.spent
      << " retired=" << b.retired_for_emergency << " overdraftRepaid=" << b.overdraft_repaid
      << " transferredOut=" << b.transferred_out << "}";
}

void PrintTo(const AccountKey& key, std::ostream* os) {
  *os << key.subject << "/" << key.route << "@" << key.generation;
}

std::string describe(const Reservation& r) {
  std::ostringstream os;
  os << "'" << r.reservation_id << "' " << reservationStateName(r.state) << " gen "
     << r.policy_generation << " reserved " << r.reserved_units << " actual " << r.actual_units
     << " refunded " << r.refunded_units << " debt " << r.debt_units;
  if (!r.operation_id.empty()) os << " op '" << r.operation_id << "'";
  if (r.state == ReservationState::kRejected) {
    os << " limiting " << limitingDimensionName(r.limiting_dimension) << " retryAfterMs "
       << r.retry_after_ms;
  }
  return os.str();
}

std::string describe(const ReservationReply& reply) {
  std::ostringstream os;
  os << replyCodeName(reply.code) << (reply.duplicate ? " (duplicate)" : "") << " refunded "
     << reply.refunded_units << ": " << describe(reply.receipt);
  if (!reply.message.empty()) os << " [" << reply.message << "]";
  return os.str();
}

void PrintTo(ErrorCode code, std::ostream* os) { *os << errorCodeName(code); }

namespace wire {

std::string describe(const ResponseBody& body) {
  if (const auto* reply = std::get_if<ReservationReply>(&body)) {
    return "reservation " + tally::describe(*reply);
  }
  if (const auto* error = std::get_if<ErrorReply>(&body)) {
    return std::string("error ") + errorCodeName(error->code) + ": " + error->message;
  }
  if (const auto* policy = std::get_if<PolicyAnswer>(&body)) {
    return std::string("policy ") + replyCodeName(policy->reply.code) + " generation " +
           std::to_string(policy->reply.generation) + " " + policy->reply.message;
  }
  if (std::holds_alternative<AuditReport>(body)) return "audit";
  if (std::holds_alternative<HealthReply>(body)) return "health";
  return "unknown message " + std::to_string(std::get<UnknownMessage>(body).which);
}

}  // namespace wire

namespace testing {
namespace {

template <typename T>
Result<T> bodyAs(Result<wire::Response> response) {
  if (!response.isOk()) return response.status();
  if (auto* body = std::get_if<T>(&response.value().body)) return std::move(*body);
  return Status::corruption("unexpected response (request id " +
                            std::to_string(response.value().request_id) +
                            "): " + wire::describe(response.value().body));
}

}  // namespace

LedgerInstance::LedgerInstance(std::string data_dir, std::string log_path)
    : data_dir_(std::move(data_dir)), log_path_(std::move(log_path)) {}

Status LedgerInstance::start() {
  if (process_ != nullptr && process_->running()) {
    return Status::failedPrecondition("ledger already running");
  }
  ++starts_;
  std::vector<std::string> args{"--data-dir", data_dir_,     "--listen",    "127.0.0.1:0",
                                "--metrics",  "127.0.0.1:0", "--log-level", "info"};
  for (std::string& arg : ledgerStoreArgs(data_dir_)) args.push_back(std::move(arg));
  // A test that needs other settings writes them to DATA_DIR.toml before the start.
  if (const std::string config = data_dir_ + ".toml"; ::access(config.c_str(), R_OK) == 0) {
    args.insert(args.end(), {"--config", config});
  }
  process_ = std::make_unique<Process>(binaryPath("tally-ledger"), std::move(args), log_path_);
  const int port = process_->waitReady(kReadyTimeoutMs);
  if (port <= 0) {
    process_->kill9();
    return Status::unavailable("tally-ledger start #" + std::to_string(starts_) +
                               " did not become ready within " + std::to_string(kReadyTimeoutMs) +
                               " ms");
  }
  port_ = static_cast<uint16_t>(port);
  // "ready PORT METRICS_PORT": the metrics port follows the port.
  const std::string& line = process_->readyLine();
  const size_t metrics_at = line.find(' ', std::string_view("ready ").size());
  metrics_port_ = metrics_at == std::string::npos
                      ? 0
                      : static_cast<uint16_t>(std::atoi(line.c_str() + metrics_at + 1));
  return Status::ok();
}

void LedgerInstance::kill9() {
  if (process_ != nullptr) process_->kill9();
}

bool LedgerInstance::signal(int signal_number) {
  return process_ != nullptr && process_->signal(signal_number);
}

int LedgerInstance::terminate(uint64_t timeout_ms) {
  if (process_ == nullptr || !process_->signal(SIGTERM)) return -1;
  return process_->waitExit(timeout_ms);
}

int LedgerInstance::waitExit(uint64_t timeout_ms) {
  return process_ == nullptr ? -1 : process_->waitExit(timeout_ms);
}

bool LedgerInstance::running() { return process_ != nullptr && !process_->exited(); }

client::Endpoint LedgerInstance::endpoint() const {
  return client::Endpoint{.kind = client::Endpoint::Kind::kTcp, .host = "127.0.0.1", .port = port_};
}

Result<std::unique_ptr<client::BlockingClient>> LedgerInstance::connect() const {
  return client::BlockingClient::connect(endpoint(), kCallTimeoutMs);
}

std::string LedgerInstance::log() const {
  return process_ == nullptr ? std::string("(never started)") : process_->log();
}

Budget makeBudget(const BudgetSpec& spec) {
  return Budget{
      .subject_pattern = spec.subject,
      .route = spec.route,
      .region = "test",
      .unit = "tokens",
      .refill_per_second = spec.refill_per_second,
      .burst = spec.burst,
      .max_single_reservation =
          spec.max_single_reservation == 0 ? spec.burst : spec.max_single_reservation,
      .hold_ttl_ms = spec.hold_ttl_ms,
      .hard_execution_limit_ms = spec.hard_execution_limit_ms,
      .max_overdraft = spec.max_overdraft,
  };
}

ReserveRequest makeReserve(const ReserveSpec& spec) {
  ReserveRequest request{.reservation_id = spec.id,
                         .subject = spec.subject,
                         .route = spec.route,
                         .units = spec.units,
                         .policy_generation = spec.generation,
                         .region = spec.region};
  request.request_digest = wire::canonicalRequestDigest(request);
  return request;
}

Result<ReservationReply> callReservation(client::BlockingClient& client,
                                         const wire::RequestBody& body) {
  return bodyAs<ReservationReply>(client.call(body, kCallTimeoutMs));
}

Result<ReservationReply> reservationOf(Result<wire::Response> response) {
  return bodyAs<ReservationReply>(std::move(response));
}

namespace {

Result<PolicyReply> policyCall(client::BlockingClient& client, const wire::RequestBody& body) {
  Result<wire::PolicyAnswer> answer = bodyAs<wire::PolicyAnswer>(client.call(body, kCallTimeoutMs));
  if (!answer.isOk()) return answer.status();
  return answer.value().reply;
}

}  // namespace

Result<PolicyReply> publishPolicy(client::BlockingClient& client, std::vector<Budget> budgets) {
  return policyCall(client, wire::PublishPolicyRequest{.budgets = std::move(budgets)});
}

Result<PolicyReply> rollbackPolicy(client::BlockingClient& client) {
  return policyCall(client, wire::RollbackPolicyRequest{});
}

Result<AuditReport> auditLedger(client::BlockingClient& client, const wire::AuditRequest& request) {
  return bodyAs<AuditReport>(client.call(request, kCallTimeoutMs));
}

Result<wire::HealthReply> health(client::BlockingClient& client) {
  return bodyAs<wire::HealthReply>(client.call(wire::HealthRequest{}, kCallTimeoutMs));
}

std::vector<Result<ReservationReply>> callPipelined(client::BlockingClient& connection,
                                                    const std::vector<wire::RequestBody>& bodies) {
  constexpr size_t kChunk = 256;
  std::vector<Result<ReservationReply>> replies;
  replies.reserve(bodies.size());
  for (size_t begin = 0; begin < bodies.size(); begin += kChunk) {
    const size_t end = std::min(bodies.size(), begin + kChunk);
    std::unordered_map<uint64_t, size_t> index_of;
    std::vector<std::optional<Result<ReservationReply>>> chunk(end - begin);
    for (size_t i = begin; i < end; ++i) {
      Result<uint64_t> id = connection.send(bodies[i], kCallTimeoutMs);
      if (!id.isOk()) {
        chunk[i - begin] = id.status();
        continue;
      }
      index_of.emplace(id.value(), i - begin);
    }
    for (size_t received = 0; received < index_of.size(); ++received) {
      Result<wire::Response> response = connection.receive(kCallTimeoutMs);
      if (!response.isOk()) {
        for (auto& slot : chunk) {
          if (!slot.has_value()) slot = response.status();
        }
        break;
      }
      auto it = index_of.find(response.value().request_id);
      if (it == index_of.end()) continue;
      chunk[it->second] = reservationOf(std::move(response));
    }
    for (auto& slot : chunk) {
      replies.push_back(slot.has_value() ? std::move(*slot)
                                         : Result<ReservationReply>(Status::unavailable("lost")));
    }
  }
  return replies;
}

const AccountView* findAccount(const AuditReport& report, const AccountKey& key) {
  for (const AccountView& view : report.accounts) {
    if (view.key == key) return &view;
  }
  return nullptr;
}

Balances sumBalances(const AuditReport& report, const SubjectRoute& subject_route) {
  Balances sum;
  for (const AccountView& view : report.accounts) {
    if (view.key.subject != subject_route.subject || view.key.route != subject_route.route) {
      continue;
    }
    const Balances& b = view.balances;
    sum.opening += b.opening;
    sum.minted += b.minted;
    sum.overdraft_issued += b.overdraft_issued;
    sum.available += b.available;
    sum.reserved += b.reserved;
    sum.spent += b.spent;
    sum.retired_for_emergency += b.retired_for_emergency;
    sum.overdraft_repaid += b.overdraft_repaid;
    sum.transferred_out += b.transferred_out;
  }
  return sum;
}

std::string describe(const AuditReport& report) {
  std::ostringstream os;
  os << "audit conserved=" << report.conserved << "\n";
  for (const AccountView& view : report.accounts) {
    os << "  ";
    PrintTo(view.key, &os);
    os << " " << generationStateName(view.generation_state) << " debt " << view.debt << " ";
    PrintTo(view.balances, &os);
    os << (view.conserved ? "" : " NOT CONSERVED") << "\n";
  }
  for (const std::string& violation : report.violations) os << "  violation: " << violation << "\n";
  return os.str();
}

uint64_t wallNowMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
}

void waitUntilWallMs(uint64_t wall_ms) {
  const timespec target{.tv_sec = static_cast<time_t>(wall_ms / 1000),
                        .tv_nsec = static_cast<long>((wall_ms % 1000) * 1'000'000)};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &target, nullptr) == EINTR) {
  }
}

size_t countOf(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

bool pollUntil(const std::function<bool()>& done, uint64_t timeout_ms, uint64_t interval_ms) {
  const uint64_t deadline = wallNowMs() + timeout_ms;
  while (wallNowMs() < deadline) {
    if (done()) return true;
    pauseMs(interval_ms);
  }
  return done();
}

void pauseMs(uint64_t ms) {
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  const uint64_t start_ms =
      static_cast<uint64_t>(start.tv_sec) * 1000 + static_cast<uint64_t>(start.tv_nsec) / 1'000'000;
  for (;;) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const uint64_t now_ms =
        static_cast<uint64_t>(now.tv_sec) * 1000 + static_cast<uint64_t>(now.tv_nsec) / 1'000'000;
    if (now_ms >= start_ms + ms) return;
    (void)::poll(nullptr, 0, static_cast<int>(start_ms + ms - now_ms));
  }
}

uint64_t testSeed(const char* test_name) {
  uint64_t seed = 0;
  if (const char* text = std::getenv("TALLY_TEST_SEED"); text != nullptr && *text != '\0') {
    seed = std::strtoull(text, nullptr, 10);
  } else {
    std::random_device device;
    seed = (uint64_t{device()} << 32) | device();
  }
  std::cout << "[ seed     ] " << test_name << ": TALLY_TEST_SEED=" << seed << std::endl;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace testing
}  // namespace tally
