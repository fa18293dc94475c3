#include "tests/integration/agent_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <variant>

namespace tally::testing {
namespace {

uint64_t monotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
}

}  // namespace

AgentInstance::AgentInstance(std::string name, std::string data_dir, std::string socket_path,
                             std::string config_path, std::string log_path)
    : name_(std::move(name)),
      data_dir_(std::move(data_dir)),
      socket_path_(std::move(socket_path)),
      config_path_(std::move(config_path)),
      log_path_(std::move(log_path)) {}

Status AgentInstance::start(const std::string& ledger_address, const AgentSettings& settings) {
  if (process_ != nullptr && process_->running() && !process_->exited()) {
    return Status::failedPrecondition(name_ + " already running");
  }
  {
    std::ofstream config(config_path_, std::ios::trunc);
    config << "request_timeout_ms = " << settings.request_timeout_ms << "\n"
           << "policy_refresh_ms = " << settings.policy_refresh_ms << "\n"
           << "drain_timeout_ms = " << settings.drain_timeout_ms << "\n"
           << "log_level = \"info\"\n"
           << settings.extra_toml << "\n"
           << "[health]\n"
           << "failures_to_partition = " << settings.failures_to_partition << "\n"
           << "partition_after_ms = " << settings.partition_after_ms << "\n";
    if (!config) return Status::ioError("cannot write " + config_path_);
  }
  ++starts_;
  const bool partitioned = !settings.partitions.empty();
  std::vector<std::string> args{"--data-dir",
                                data_dir_,
                                partitioned ? "--partitions" : "--ledger",
                                partitioned ? settings.partitions : ledger_address,
                                "--socket",
                                socket_path_,
                                "--config",
                                config_path_,
                                "--metrics",
                                "127.0.0.1:0"};
  args.insert(args.end(), settings.extra_args.begin(), settings.extra_args.end());
  process_ = std::make_unique<Process>(binaryPath("tally-agent"), std::move(args), log_path_);
  const int port = process_->waitReady(kReadyTimeoutMs);
  if (port <= 0) {
    process_->kill9();
    return Status::unavailable(name_ + " start #" + std::to_string(starts_) +
                               " did not become ready within " + std::to_string(kReadyTimeoutMs) +
                               " ms");
  }
  metrics_port_ = static_cast<uint16_t>(port);
  return Status::ok();
}

void AgentInstance::kill9() {
  if (process_ != nullptr) process_->kill9();
}

int AgentInstance::terminate(uint64_t timeout_ms) {
  if (process_ == nullptr || !process_->signal(SIGTERM)) return -1;
  return process_->waitExit(timeout_ms);
}

int AgentInstance::waitExit(uint64_t timeout_ms) {
  return process_ == nullptr ? -1 : process_->waitExit(timeout_ms);
}

bool AgentInstance::running() { return process_ != nullptr && !process_->exited(); }

bool AgentInstance::signal(int signal_number) {
  return process_ != nullptr && process_->signal(signal_number);
}

client::Endpoint AgentInstance::endpoint() const {
  return client::Endpoint{.kind = client::Endpoint::Kind::kUnix, .path = socket_path_};
}

Result<std::unique_ptr<client::BlockingClient>> AgentInstance::connect() const {
  return client::BlockingClient::connect(endpoint(), kCallTimeoutMs);
}

std::string AgentInstance::log() const {
  return process_ == nullptr ? std::string("(never started)") : process_->log();
}

Result<std::string> runForOutput(const std::string& binary, const std::vector<std::string>& args,
                                 const std::string& log_path, uint64_t timeout_ms) {
  Process process(binary, args, log_path, /*ready_fd=*/false);
  const int code = process.waitExit(timeout_ms);
  if (code != 0) {
    return Status::unavailable(binary + " exited " + std::to_string(code) + ": " + process.log());
  }
  return process.log();
}

std::string jsonString(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":\"";
  const size_t at = json.find(needle);
  if (at == std::string::npos) return {};
  const size_t begin = at + needle.size();
  const size_t end = json.find('"', begin);
  return end == std::string::npos ? std::string() : json.substr(begin, end - begin);
}

std::string describe(const AgentAnswer& answer) {
  if (answer.is_error) {
    return std::string("error ") + wire::errorCodeName(answer.error.code) + ": " +
           answer.error.message;
  }
  return tally::describe(answer.reply);
}

Result<AgentAnswer> agentAnswerOf(Result<wire::Response> response) {
  if (!response.isOk()) return response.status();
  AgentAnswer answer;
  if (auto* reply = std::get_if<ReservationReply>(&response.value().body)) {
    answer.reply = std::move(*reply);
    return answer;
  }
  if (auto* error = std::get_if<wire::ErrorReply>(&response.value().body)) {
    answer.is_error = true;
    answer.error = std::move(*error);
    return answer;
  }
  return Status::corruption("unexpected response: " + wire::describe(response.value().body));
}

Result<AgentAnswer> callAgent(client::BlockingClient& client, const wire::RequestBody& body,
                              uint64_t timeout_ms) {
  return agentAnswerOf(client.call(body, timeout_ms));
}

std::vector<Result<AgentAnswer>> callAgentPipelined(client::BlockingClient& client,
                                                    const std::vector<wire::RequestBody>& bodies,
                                                    uint64_t timeout_ms) {
  std::unordered_map<uint64_t, size_t> index_of;
  std::vector<std::optional<Result<AgentAnswer>>> slots(bodies.size());
  for (size_t i = 0; i < bodies.size(); ++i) {
    Result<uint64_t> id = client.send(bodies[i], timeout_ms);
    if (!id.isOk()) {
      slots[i] = id.status();
      continue;
    }
    index_of.emplace(id.value(), i);
  }
  for (size_t received = 0; received < index_of.size(); ++received) {
    Result<wire::Response> response = client.receive(timeout_ms);
    if (!response.isOk()) {
      for (auto& slot : slots) {
        if (!slot.has_value()) slot = response.status();
      }
      break;
    }
    auto it = index_of.find(response.value().request_id);
    if (it == index_of.end()) continue;
    slots[it->second] = agentAnswerOf(std::move(response));
  }
  std::vector<Result<AgentAnswer>> answers;
  for (auto& slot : slots) {
    answers.push_back(slot.has_value() ? std::move(*slot)
                                       : Result<AgentAnswer>(Status::unavailable("lost")));
  }
  return answers;
}

Result<std::string> httpGet(uint16_t port, const std::string& path, uint64_t timeout_ms) {
  const uint64_t deadline = monotonicMs() + timeout_ms;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::unavailable("socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const timeval tv{.tv_sec = static_cast<time_t>(timeout_ms / 1000),
                   .tv_usec = static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return Status::unavailable("connect to metrics port " + std::to_string(port) + " failed");
  }
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return Status::unavailable("send failed");
  }
  std::string response;
  char buffer[16384];
  for (;;) {
    if (monotonicMs() >= deadline) {
      ::close(fd);
      return Status::unavailable("metrics response timed out");
    }
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      response.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return Status::unavailable("metrics response timed out or failed");
    }
    break;  // EOF: HTTP/1.0 ends the body by closing
  }
  ::close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || header_end == std::string::npos) {
    return Status::corruption("not an HTTP response: " + response.substr(0, 200));
  }
  const size_t status_at = response.find(' ');
  if (response.compare(status_at + 1, 3, "200") != 0) {
    return Status::corruption("HTTP status: " + response.substr(0, response.find("\r\n")));
  }
  return response.substr(header_end + 4);
}

double metricSum(const std::string& exposition, const std::string& name,
                 const std::map<std::string, std::string>& labels) {
  double sum = 0;
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;  // another metric sharing the prefix
    std::string label_text;
    size_t value_at = name.size();
    if (next == '{') {
      const size_t close = line.find('}', name.size());
      if (close == std::string::npos) continue;
      label_text = line.substr(name.size() + 1, close - name.size() - 1);
      value_at = close + 1;
    }
    bool match = true;
    for (const auto& [key, value] : labels) {
      if (label_text.find(key + "=\"" + value + "\"") == std::string::npos) match = false;
    }
    if (!match) continue;
    sum += std::strtod(line.c_str() + value_at, nullptr);
  }
  return sum;
}

void AgentFleetTest::TearDown() {
  if (HasFailure()) {
    for (const auto& agent : agents_) {
      if (agent == nullptr) continue;
      std::cout << "---- " << agent->name() << " log ----\n"
                << agent->log() << "---- end of " << agent->name() << " log ----" << std::endl;
    }
    for (size_t i = 0; i < proxies_.size(); ++i) {
      const FaultProxyCounters c = proxies_[i]->counters();
      std::cout << "proxy " << i << ": accepted " << c.connections_accepted << " open "
                << c.connections_open << " requests " << c.requests_forwarded << "/"
                << c.requests_dropped << " dropped, replies " << c.replies_forwarded << "/"
                << c.replies_dropped << " dropped, upstream connect failures "
                << c.upstream_connect_failures << std::endl;
    }
  }
  for (auto& agent : agents_) {
    if (agent != nullptr) agent->kill9();
  }
  for (auto& proxy : proxies_) proxy->stop();
  LedgerServiceTest::TearDown();
}

void AgentFleetTest::startAgent(size_t index, const std::string& ledger_address,
                                const AgentSettings& settings) {
  if (agents_.size() <= index) agents_.resize(index + 1);
  if (agents_[index] == nullptr) {
    const std::string name = "agent" + std::to_string(index);
    agents_[index] =
        std::make_unique<AgentInstance>(name, dir_.file(name), dir_.file(name + ".sock"),
                                        dir_.file(name + ".toml"), dir_.file(name + ".log"));
  }
  const Status started = agents_[index]->start(ledger_address, settings);
  ASSERT_TRUE(started.isOk()) << started.toString() << "\n" << agents_[index]->log();
}

std::unique_ptr<client::BlockingClient> AgentFleetTest::gateway(size_t agent_index) {
  Result<std::unique_ptr<client::BlockingClient>> connected = agents_.at(agent_index)->connect();
  EXPECT_TRUE(connected.isOk()) << connected.status().toString();
  return connected.isOk() ? std::move(connected).value() : nullptr;
}

FaultProxy& AgentFleetTest::addProxy() {
  proxies_.push_back(std::make_unique<FaultProxy>(ledger_.port()));
  return *proxies_.back();
}

ReservationReply AgentFleetTest::waitForLedger(
    const std::string& id, const std::function<bool(const ReservationReply&)>& done,
    uint64_t timeout_ms) {
  const uint64_t deadline = monotonicMs() + timeout_ms;
  ReservationReply last;
  for (;;) {
    Result<ReservationReply> reply = callReservation(*client_, QueryRequest{.reservation_id = id});
    if (reply.isOk()) {
      last = reply.value();
      if (done(last)) return last;
    }
    if (monotonicMs() >= deadline) return last;
    pauseMs(50);
  }
}

}  // namespace tally::testing
