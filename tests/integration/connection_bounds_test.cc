// Connection bounds of both daemons (docs/security.md "Connections and limits"), on the real
// binaries:
//  * 50 connections that pipeline requests and never read are paused once each is owed its
//    write queue's worth of replies: the daemon's resident set grows by no more than the
//    documented per-connection bound times 50, a normal client's reserve still answers in under
//    100 ms, and past connection_stall_timeout_ms every stalled connection is closed with a
//    logged reason (event=connection_stalled).
//  * A flood of 2,000 connections against connections_max = 100: exactly the connections past the
//    bound are refused, each with one ErrorReply UNAVAILABLE naming connections_max and an end of
//    stream, while the existing client and the admitted connections are served.
// The same for tally-ledger (TCP) and tally-agent (its gateway Unix socket). Every wait polls
// descriptors with a deadline; nothing sleeps to synchronise. Labelled release_only (ctest): the
// resident-set bound means nothing under ASan's allocator, and the flood is slow there.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/fd_limit.h"
#include "tests/integration/agent_harness.h"
#include "tests/integration/ledger_fixture.h"
#include "wire/codec.h"

namespace tally::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kHogs = 50;
// The per-connection limits the tests configure (small, so that 50 connections reach them fast).
constexpr uint64_t kWriteQueueBytesMax = 256 * 1024;  // connection_write_queue_bytes_max
constexpr uint64_t kFrameBytesMax = 64 * 1024;        // frame_bytes_max
constexpr uint64_t kStallTimeoutMs = 4'000;           // connection_stall_timeout_ms
// What one paused connection may hold, from the documented bounds (net/framed_stream.h): the
// replies owed (write_queue_bytes_max, which a last reply may overshoot by one frame), one read
// of requests not yet served (64 KiB), one incomplete frame (frame_bytes_max), and 64 KiB for
// the connection's own state (its stream, its buffers' spare capacity, a batch's reply buffer).
constexpr uint64_t kReadBytes = 64 * 1024;
constexpr uint64_t kStateBytes = 64 * 1024;
constexpr uint64_t kBytesPerPausedConnectionMax =
    kWriteQueueBytesMax + kFrameBytesMax + kReadBytes + kFrameBytesMax + kStateBytes;
// The healthy client's reserve, while the hogs are paused.
constexpr uint64_t kReserveAnswerMsMax = 100;
constexpr int kReserves = 20;

constexpr int kFloodConnections = 2'000;
constexpr uint64_t kConnectionsMax = 100;

std::string boundsToml() {
  return "frame_bytes_max = " + std::to_string(kFrameBytesMax) +
         "\nconnection_write_queue_bytes_max = " + std::to_string(kWriteQueueBytesMax) +
         "\nconnection_stall_timeout_ms = " + std::to_string(kStallTimeoutMs) +
         "\nconnections_max = " + std::to_string(kConnectionsMax) + "\n";
}

// The resident set of process `pid` in bytes (VmRSS in /proc), or 0 if unreadable.
uint64_t residentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

uint64_t msSince(Clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

std::vector<uint8_t> requestFrame(uint64_t request_id, const wire::RequestBody& body) {
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = body});
  EXPECT_TRUE(frame.isOk());
  return frame.isOk() ? frame.value() : std::vector<uint8_t>{};
}

// `count` frames of `body` back to back.
std::vector<uint8_t> burstOf(const wire::RequestBody& body, int count) {
  std::vector<uint8_t> burst;
  for (int i = 1; i <= count; ++i) {
    const std::vector<uint8_t> frame = requestFrame(static_cast<uint64_t>(i), body);
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  return burst;
}

// A connected socket, non-blocking from now on (-1 on failure). TCP: to 127.0.0.1:port, with
// small kernel buffers so that replies the peer does not read back up in the daemon quickly.
int connectTcp(uint16_t port, bool small_buffers) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (small_buffers) {
    const int bytes = 16 * 1024;
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  const timeval timeout{.tv_sec = 10, .tv_usec = 0};  // bounds a connect into a full backlog
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

int connectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval timeout{.tv_sec = 10, .tv_usec = 0};
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), std::min(path.size(), sizeof(address.sun_path) - 1));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

class Fds {
 public:
  ~Fds() { closeAll(); }
  void add(int fd) { fds_.push_back(fd); }
  void closeAll() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
};

// Sends `burst` over and over on every hog (whole bursts, so frames stay whole) until the daemon
// has paused every one of them: `paused()` counts its log's event=connection_paused lines, one
// per connection whose replies back up unread. A daemon that kept reading would never say so,
// and the deadline fails the test. Records the bytes each hog sent.
template <typename Paused>
void sendUntilPaused(const std::vector<int>& hogs, const std::vector<uint8_t>& burst,
                     const Paused& paused, std::vector<uint64_t>* sent) {
  sent->assign(hogs.size(), 0);
  std::vector<size_t> offset(hogs.size(), 0);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  Clock::time_point looked = Clock::now();
  std::vector<pollfd> polled(hogs.size());
  for (;;) {
    for (size_t i = 0; i < hogs.size(); ++i) {
      for (;;) {
        const ssize_t n = ::send(hogs[i], burst.data() + offset[i], burst.size() - offset[i],
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
          ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
              << "hog " << i
              << ": the daemon dropped a client that never reads: " << std::strerror(errno);
          break;
        }
        (*sent)[i] += static_cast<uint64_t>(n);
        offset[i] = (offset[i] + static_cast<size_t>(n)) % burst.size();
      }
    }
    if (msSince(looked) >= 100) {
      if (paused() >= hogs.size()) return;
      looked = Clock::now();
    }
    ASSERT_LT(Clock::now(), deadline) << "the daemon kept reading clients that never read ("
                                      << paused() << " of " << hogs.size() << " paused)";
    for (size_t i = 0; i < hogs.size(); ++i) polled[i] = {.fd = hogs[i], .events = POLLOUT};
    (void)::poll(polled.data(), polled.size(), 50);  // wakes as soon as one can take more
  }
}

// Waits until every descriptor has been closed by the peer (POLLHUP or POLLERR: a reset or an
// end of stream in both directions), without reading (a read would be progress for the stall
// watch). False after `timeout_ms`.
bool waitAllHungUp(const std::vector<int>& fds, uint64_t timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<bool> done(fds.size(), false);
  size_t left = fds.size();
  while (left > 0) {
    std::vector<pollfd> polled;
    std::vector<size_t> index;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (done[i]) continue;
      polled.push_back({.fd = fds[i], .events = 0});
      index.push_back(i);
    }
    const auto remaining =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (remaining.count() <= 0) return false;
    if (::poll(polled.data(), polled.size(), static_cast<int>(remaining.count())) < 0) {
      return false;
    }
    for (size_t j = 0; j < polled.size(); ++j) {
      if ((polled[j].revents & (POLLHUP | POLLERR)) != 0) {
        done[index[j]] = true;
        --left;
      }
    }
  }
  return true;
}

// What a flood connection received: refused (one ErrorReply UNAVAILABLE naming connections_max,
// then end of stream) or nothing at all (admitted) by the time every refusal has arrived.
struct FloodCount {
  int refused = 0;
  int other = 0;  // anything else: a wrong frame, a reset without the refusal
  std::string first_message;
};

void expectRefusalFrame(const std::string& bytes, FloodCount* counts) {
  if (bytes.size() < 4) {
    ++counts->other;
    return;
  }
  const std::vector<uint8_t> payload(bytes.begin() + 4, bytes.end());
  Result<wire::Response> response = wire::decodeResponse(payload);
  const auto* error =
      response.isOk() ? std::get_if<wire::ErrorReply>(&response.value().body) : nullptr;
  if (error == nullptr || error->code != wire::ErrorCode::kUnavailable ||
      response.value().request_id != 0 ||
      error->message.find("connections_max") == std::string::npos) {
    ++counts->other;
    return;
  }
  if (counts->first_message.empty()) counts->first_message = error->message;
  ++counts->refused;
}

// Reads every flood connection until `refusals` of them have ended (or the deadline): the ended
// ones are classified; the rest are the admitted ones and must have received nothing.
FloodCount readRefusals(const std::vector<int>& fds, int refusals, std::vector<int>* admitted) {
  FloodCount counts;
  std::vector<std::string> received(fds.size());
  std::vector<bool> ended(fds.size(), false);
  int ended_count = 0;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(20);
  std::vector<pollfd> polled(fds.size());
  while (ended_count < refusals && Clock::now() < deadline) {
    for (size_t i = 0; i < fds.size(); ++i) {
      polled[i] = {.fd = ended[i] ? -1 : fds[i], .events = POLLIN};
    }
    if (::poll(polled.data(), polled.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (ended[i] || polled[i].revents == 0) continue;
      char buffer[4096];
      for (;;) {
        const ssize_t n = ::read(fds[i], buffer, sizeof(buffer));
        if (n > 0) {
          received[i].append(buffer, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        ended[i] = true;  // end of stream, or a reset
        ++ended_count;
        expectRefusalFrame(received[i], &counts);
        break;
      }
    }
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (ended[i]) continue;
    if (!received[i].empty()) ++counts.other;
    admitted->push_back(fds[i]);
  }
  return counts;
}

// The log, once it has `n` lines of `event` (the daemon writes the line after it closed the
// connection the test saw close), or as it is after `timeout_ms`.
template <typename ReadLog>
std::string logWith(const ReadLog& read_log, const std::string& event, size_t n,
                    uint64_t timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string log = read_log();
  while (countOf(log, event) < n && Clock::now() < deadline) {
    pollfd none{.fd = -1, .events = 0};
    (void)::poll(&none, 1, 20);  // between reads of the log file
    log = read_log();
  }
  return log;
}

// How many of `fds` the peer has closed by now.
size_t hungUp(const std::vector<int>& fds) {
  std::vector<pollfd> polled;
  for (int fd : fds) polled.push_back({.fd = fd, .events = 0});
  (void)::poll(polled.data(), polled.size(), 0);
  return static_cast<size_t>(std::count_if(polled.begin(), polled.end(), [](const pollfd& p) {
    return (p.revents & (POLLHUP | POLLERR)) != 0;
  }));
}

// One health request on a raw connection, answered within the timeout.
void expectHealthAnswered(int fd) {
  const std::vector<uint8_t> request = requestFrame(77, wire::HealthRequest{});
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string bytes;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    if (bytes.size() >= 4) {
      const uint32_t length = static_cast<uint8_t>(bytes[0]) |
                              static_cast<uint32_t>(static_cast<uint8_t>(bytes[1])) << 8 |
                              static_cast<uint32_t>(static_cast<uint8_t>(bytes[2])) << 16 |
                              static_cast<uint32_t>(static_cast<uint8_t>(bytes[3])) << 24;
      if (bytes.size() >= 4 + length) break;
    }
    ASSERT_LT(Clock::now(), deadline) << "no answer on an admitted connection";
    pollfd polled{.fd = fd, .events = POLLIN};
    (void)::poll(&polled, 1, 100);
    char buffer[4096];
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    ASSERT_NE(n, 0) << "an admitted connection was closed";
    if (n > 0) bytes.append(buffer, static_cast<size_t>(n));
  }
  const std::vector<uint8_t> payload(bytes.begin() + 4, bytes.end());
  TALLY_ASSIGN_OR_FAIL(wire::Response response, wire::decodeResponse(payload));
  EXPECT_EQ(response.request_id, 77u);
  EXPECT_NE(std::get_if<wire::HealthReply>(&response.body), nullptr)
      << wire::describe(response.body);
}

bool isOk(const AgentAnswer& answer) {
  return !answer.is_error && answer.reply.code == ReplyCode::kOk;
}

// The test process needs a descriptor per flood connection.
bool enoughDescriptors(uint64_t needed) {
  const FdLimit limit = raiseFdLimit();
  return limit.soft >= needed;
}

// --- tally-ledger ------------------------------------------------------------------------------

class LedgerConnectionBoundsTest : public LedgerServiceTest {
 protected:
  void SetUp() override {
    std::ofstream config(dir_.file("data") + ".toml");
    config << boundsToml();
    config.close();
    ASSERT_NO_FATAL_FAILURE(startLedger());
    ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  }

  // kReserves reserves by client_, each timed; the slowest, in ms.
  uint64_t slowestReserveMs(const std::string& prefix) {
    uint64_t slowest = 0;
    for (int i = 0; i < kReserves; ++i) {
      const Clock::time_point started = Clock::now();
      Result<ReservationReply> reply =
          callReservation(*client_, makeReserve({.id = prefix + std::to_string(i), .units = 1}));
      slowest = std::max(slowest, msSince(started));
      EXPECT_TRUE(reply.isOk() && reply.value().code == ReplyCode::kOk)
          << (reply.isOk() ? describe(reply.value()) : reply.status().toString());
    }
    return slowest;
  }
};

TEST_F(LedgerConnectionBoundsTest, FiftyClientsThatNeverReadCostBoundedMemoryAndAreClosed) {
  const uint64_t before_ms = slowestReserveMs("before-");
  const uint64_t resident_before = residentBytes(ledger_.pid());
  ASSERT_GT(resident_before, 0u);
  Fds hogs;
  for (int i = 0; i < kHogs; ++i) {
    const int fd = connectTcp(ledger_.port(), /*small_buffers=*/true);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    hogs.add(fd);
  }
  // Health requests: cheap to answer, and the answer is larger than the request.
  std::vector<uint64_t> sent;
  ASSERT_NO_FATAL_FAILURE(sendUntilPaused(
      hogs.fds(), burstOf(wire::HealthRequest{}, 256),
      [this] { return countOf(ledger_.log(), "event=connection_paused"); }, &sent));
  const uint64_t resident_after = residentBytes(ledger_.pid());
  const uint64_t grown = resident_after > resident_before ? resident_after - resident_before : 0;
  const uint64_t bound = kHogs * kBytesPerPausedConnectionMax;
  std::cout << "[ bounds   ] each hog sent " << *std::min_element(sent.begin(), sent.end()) / 1024
            << ".." << *std::max_element(sent.begin(), sent.end()) / 1024
            << " KiB before the ledger paused it; resident " << resident_before / 1024 << " KiB -> "
            << resident_after / 1024 << " KiB (+" << grown / 1024 << " KiB, bound " << bound / 1024
            << " KiB)" << std::endl;
  EXPECT_LE(grown, bound);
  EXPECT_EQ(hungUp(hogs.fds()), 0u) << "measured after the stall deadline closed some";

  // A normal client is served at once meanwhile.
  const uint64_t during_ms = slowestReserveMs("during-");
  std::cout << "[ bounds   ] slowest of " << kReserves << " reserves: " << before_ms
            << " ms before, " << during_ms << " ms with " << kHogs << " paused clients"
            << std::endl;
  EXPECT_LT(during_ms, kReserveAnswerMsMax);

  // Past the stall deadline every hog is closed, each with a logged reason.
  EXPECT_TRUE(waitAllHungUp(hogs.fds(), kStallTimeoutMs * 2 + 10'000));
  const std::string log =
      logWith([this] { return ledger_.log(); }, "event=connection_stalled", kHogs, 5'000);
  EXPECT_EQ(countOf(log, "event=connection_stalled"), static_cast<size_t>(kHogs)) << log;
  EXPECT_NE(log.find("stall_timeout_ms"), std::string::npos);
  TALLY_ASSIGN_OR_FAIL(wire::HealthReply reply, health(*client_));
  EXPECT_EQ(reply.status, "ok");
}

TEST_F(LedgerConnectionBoundsTest, AFloodOfConnectionsIsRefusedPastTheBoundWhileOthersAreServed) {
  if (!enoughDescriptors(kFloodConnections + 64)) {
    GTEST_SKIP() << "the test needs " << kFloodConnections + 64 << " descriptors (RLIMIT_NOFILE)";
  }
  // client_ holds one connection: the flood gets the rest.
  const int admitted_expected = static_cast<int>(kConnectionsMax) - 1;
  Fds flood;
  for (int i = 0; i < kFloodConnections; ++i) {
    const int fd = connectTcp(ledger_.port(), /*small_buffers=*/false);
    ASSERT_GE(fd, 0) << "connect #" << i << ": " << std::strerror(errno);
    flood.add(fd);
  }
  std::vector<int> admitted;
  const FloodCount counts =
      readRefusals(flood.fds(), kFloodConnections - admitted_expected, &admitted);
  std::cout << "[ flood    ] " << counts.refused << " refused (\"" << counts.first_message
            << "\"), " << admitted.size() << " admitted" << std::endl;
  EXPECT_EQ(counts.refused, kFloodConnections - admitted_expected);
  EXPECT_EQ(counts.other, 0);
  EXPECT_EQ(static_cast<int>(admitted.size()), admitted_expected);
  // The existing client and the admitted connections are served.
  TALLY_ASSIGN_OR_FAIL(ReservationReply reserved,
                       callReservation(*client_, makeReserve({.id = "after-flood"})));
  EXPECT_EQ(reserved.code, ReplyCode::kOk) << describe(reserved);
  ASSERT_FALSE(admitted.empty());
  ASSERT_NO_FATAL_FAILURE(expectHealthAnswered(admitted.front()));
  ASSERT_NO_FATAL_FAILURE(expectHealthAnswered(admitted.back()));
  const std::string log = ledger_.log();
  const size_t lines = countOf(log, "event=connection_refused");
  EXPECT_GE(lines, 1u);
  EXPECT_LT(lines, 100u) << "refusals are logged at most once a second";
  EXPECT_NE(log.find("reason=connections_max"), std::string::npos);

  // Once the flood leaves, new clients are admitted again.
  flood.closeAll();
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    Result<std::unique_ptr<client::BlockingClient>> late = ledger_.connect();
    if (late.isOk()) {
      Result<wire::HealthReply> reply = health(*late.value());
      if (reply.isOk()) break;
    }
    ASSERT_LT(Clock::now(), deadline) << "no connection admitted after the flood left";
    pollfd none{.fd = -1, .events = 0};
    (void)::poll(&none, 1, 20);  // between attempts: the closes reach the ledger meanwhile
  }
}

// --- tally-agent -------------------------------------------------------------------------------

class AgentConnectionBoundsTest : public AgentFleetTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(startLedger());
    ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
    AgentSettings settings;
    settings.extra_toml = boundsToml();
    ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), settings));
    gateway_ = gateway(0);
    ASSERT_NE(gateway_, nullptr);
  }

  // The agent's pid, from the credentials of a connection to its socket.
  pid_t agentPid() {
    const int fd = connectUnix(agents_[0]->socketPath());
    if (fd < 0) return -1;
    ucred credentials{};
    socklen_t length = sizeof(credentials);
    const int rc = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length);
    ::close(fd);
    return rc == 0 ? credentials.pid : -1;
  }

  uint64_t slowestReserveMs(const std::string& prefix) {
    uint64_t slowest = 0;
    for (int i = 0; i < kReserves; ++i) {
      const Clock::time_point started = Clock::now();
      Result<AgentAnswer> answer =
          callAgent(*gateway_, makeReserve({.id = prefix + std::to_string(i), .units = 1}));
      slowest = std::max(slowest, msSince(started));
      EXPECT_TRUE(answer.isOk() && isOk(answer.value()))
          << (answer.isOk() ? describe(answer.value()) : answer.status().toString());
    }
    return slowest;
  }

  std::unique_ptr<client::BlockingClient> gateway_;
};

TEST_F(AgentConnectionBoundsTest, FiftyGatewaysThatNeverReadCostBoundedMemoryAndAreClosed) {
  const pid_t pid = agentPid();
  ASSERT_GT(pid, 0);
  const uint64_t before_ms = slowestReserveMs("before-");
  const uint64_t resident_before = residentBytes(pid);
  ASSERT_GT(resident_before, 0u);
  Fds hogs;
  for (int i = 0; i < kHogs; ++i) {
    const int fd = connectUnix(agents_[0]->socketPath());
    ASSERT_GE(fd, 0) << std::strerror(errno);
    hogs.add(fd);
  }
  // Health requests: answered by the agent itself, a small request and a larger answer.
  std::vector<uint64_t> sent;
  ASSERT_NO_FATAL_FAILURE(sendUntilPaused(
      hogs.fds(), burstOf(wire::HealthRequest{}, 256),
      [this] { return countOf(agents_[0]->log(), "event=connection_paused"); }, &sent));
  const uint64_t resident_after = residentBytes(pid);
  const uint64_t grown = resident_after > resident_before ? resident_after - resident_before : 0;
  const uint64_t bound = kHogs * kBytesPerPausedConnectionMax;
  std::cout << "[ bounds   ] each hog sent " << *std::min_element(sent.begin(), sent.end()) / 1024
            << ".." << *std::max_element(sent.begin(), sent.end()) / 1024
            << " KiB before the agent paused it; resident " << resident_before / 1024 << " KiB -> "
            << resident_after / 1024 << " KiB (+" << grown / 1024 << " KiB, bound " << bound / 1024
            << " KiB)" << std::endl;
  EXPECT_LE(grown, bound);
  EXPECT_EQ(hungUp(hogs.fds()), 0u) << "measured after the stall deadline closed some";
  const uint64_t during_ms = slowestReserveMs("during-");
  std::cout << "[ bounds   ] slowest of " << kReserves
            << " reserves through the agent: " << before_ms << " ms before, " << during_ms
            << " ms with " << kHogs << " paused gateways" << std::endl;
  EXPECT_LT(during_ms, kReserveAnswerMsMax);

  EXPECT_TRUE(waitAllHungUp(hogs.fds(), kStallTimeoutMs * 2 + 10'000));
  const std::string log =
      logWith([this] { return agents_[0]->log(); }, "event=connection_stalled", kHogs, 5'000);
  EXPECT_EQ(countOf(log, "event=connection_stalled"), static_cast<size_t>(kHogs)) << log;
  TALLY_ASSIGN_OR_FAIL(AgentAnswer answer,
                       callAgent(*gateway_, makeReserve({.id = "after-stall", .units = 1})));
  EXPECT_TRUE(isOk(answer)) << describe(answer);
}

TEST_F(AgentConnectionBoundsTest, AFloodOfConnectionsIsRefusedPastTheBoundWhileOthersAreServed) {
  if (!enoughDescriptors(kFloodConnections + 64)) {
    GTEST_SKIP() << "the test needs " << kFloodConnections + 64 << " descriptors (RLIMIT_NOFILE)";
  }
  const int admitted_expected = static_cast<int>(kConnectionsMax) - 1;  // gateway_ holds one
  Fds flood;
  for (int i = 0; i < kFloodConnections; ++i) {
    const int fd = connectUnix(agents_[0]->socketPath());
    ASSERT_GE(fd, 0) << "connect #" << i << ": " << std::strerror(errno);
    flood.add(fd);
  }
  std::vector<int> admitted;
  const FloodCount counts =
      readRefusals(flood.fds(), kFloodConnections - admitted_expected, &admitted);
  std::cout << "[ flood    ] " << counts.refused << " refused (\"" << counts.first_message
            << "\"), " << admitted.size() << " admitted" << std::endl;
  EXPECT_EQ(counts.refused, kFloodConnections - admitted_expected);
  EXPECT_EQ(counts.other, 0);
  EXPECT_EQ(static_cast<int>(admitted.size()), admitted_expected);
  TALLY_ASSIGN_OR_FAIL(AgentAnswer answer,
                       callAgent(*gateway_, makeReserve({.id = "after-flood", .units = 1})));
  EXPECT_TRUE(isOk(answer)) << describe(answer);
  ASSERT_FALSE(admitted.empty());
  ASSERT_NO_FATAL_FAILURE(expectHealthAnswered(admitted.front()));
  ASSERT_NO_FATAL_FAILURE(expectHealthAnswered(admitted.back()));
  const std::string log = agents_[0]->log();
  EXPECT_GE(countOf(log, "event=connection_refused"), 1u);
  EXPECT_LT(countOf(log, "event=connection_refused"), 100u);
  EXPECT_NE(log.find("reason=connections_max"), std::string::npos);
}

}  // namespace
}  // namespace tally::testing
