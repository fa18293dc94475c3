// The sd_notify protocol as both daemons speak it (Type=notify, WatchdogSec=), proven against a
// datagram socket the test owns in place of systemd's $NOTIFY_SOCKET: READY=1 once serving,
// WATCHDOG=1 at half $WATCHDOG_USEC while serving, STOPPING=1 at SIGTERM, then exit 0.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/sd_notify.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

uint64_t monotonicMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
}

TEST(WatchdogInterval, HalfOfWatchdogUsecInMs) {
  EXPECT_EQ(watchdogIntervalMs("30000000", nullptr, 42), 15'000u);
  EXPECT_EQ(watchdogIntervalMs("200000", "42", 42), 100u);
  EXPECT_EQ(watchdogIntervalMs("1", nullptr, 42), 1u);  // never 0 (0 means "off")
}

TEST(WatchdogInterval, OffWhenUnsetMalformedOrForAnotherProcess) {
  EXPECT_EQ(watchdogIntervalMs(nullptr, nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("", nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("0", nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("-5", nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("10s", nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("99999999999999999999999", nullptr, 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("200000", "43", 42), 0u);
  EXPECT_EQ(watchdogIntervalMs("200000", "x", 42), 0u);
}

TEST(SdNotify, SendsTheStateToNotifySocketAndNothingWithoutIt) {
  TempDir dir;
  const std::string path = dir.file("notify");
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(sdNotify("READY=1").isOk());
  ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
  EXPECT_TRUE(sdNotify("WATCHDOG=1").isOk());
  ::setenv("NOTIFY_SOCKET", "relative", 1);
  EXPECT_FALSE(sdNotify("READY=1").isOk());
  ::unsetenv("NOTIFY_SOCKET");
  char buffer[64] = {};
  const ssize_t got = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  EXPECT_EQ(std::string(buffer, got > 0 ? static_cast<size_t>(got) : 0), "WATCHDOG=1");
  EXPECT_LT(::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT), 0);  // only the one datagram
  ::close(fd);
}

struct Message {
  uint64_t at_ms;
  std::string state;
};

// Plays systemd's side: a datagram socket at DIR/notify, $NOTIFY_SOCKET (and $WATCHDOG_USEC)
// set only while a daemon is spawned.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool bound() const { return bound_; }

  std::unique_ptr<Process> spawn(const std::string& binary, std::vector<std::string> args,
                                 const std::string& log, const char* watchdog_usec) {
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    if (watchdog_usec != nullptr) ::setenv("WATCHDOG_USEC", watchdog_usec, 1);
    auto process = std::make_unique<Process>(binaryPath(binary), std::move(args), log, false);
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    return process;
  }

  // The next datagram within `timeout_ms`; state "" on timeout.
  Message next(uint64_t timeout_ms) {
    pollfd entry{.fd = fd_, .events = POLLIN, .revents = 0};
    if (::poll(&entry, 1, static_cast<int>(timeout_ms)) != 1) return {monotonicMs(), ""};
    char buffer[256] = {};
    const ssize_t got = ::recv(fd_, buffer, sizeof(buffer), 0);
    return {monotonicMs(), std::string(buffer, got > 0 ? static_cast<size_t>(got) : 0)};
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

constexpr uint64_t kWatchdogUsec = 200'000;  // pings every 100 ms
constexpr uint64_t kIntervalMs = kWatchdogUsec / 2 / 1000;
constexpr uint64_t kTimeoutMs = 10'000;

// READY=1, then `pings` WATCHDOG=1 no closer than the interval (allowing libuv's 1 ms clock
// granularity), then after SIGTERM STOPPING=1 and exit 0.
void expectNotifyLifecycle(NotifySocket& notify, Process& daemon, int pings) {
  Message ready = notify.next(kTimeoutMs);
  ASSERT_EQ(ready.state, "READY=1") << daemon.log();
  std::vector<Message> watchdog;
  while (static_cast<int>(watchdog.size()) < pings) {
    Message message = notify.next(kTimeoutMs);
    ASSERT_EQ(message.state, "WATCHDOG=1") << daemon.log();
    watchdog.push_back(message);
  }
  // The first ping is sent at once; the rest come one interval apart, never in a burst.
  const uint64_t span_ms = watchdog.back().at_ms - watchdog.front().at_ms;
  EXPECT_GE(span_ms + 2 * static_cast<uint64_t>(pings), kIntervalMs * (pings - 1));
  ASSERT_TRUE(daemon.signal(SIGTERM));
  Message stopping = notify.next(kTimeoutMs);
  while (stopping.state == "WATCHDOG=1") stopping = notify.next(kTimeoutMs);
  EXPECT_EQ(stopping.state, "STOPPING=1") << daemon.log();
  EXPECT_EQ(daemon.waitExit(kTimeoutMs), 0) << daemon.log();
}

TEST(LedgerNotify, ReadyWatchdogStoppingThenExitZero) {
  TempDir dir;
  NotifySocket notify(dir.file("notify"));
  ASSERT_TRUE(notify.bound());
  auto ledger =
      notify.spawn("tally-ledger",
                   {"--data-dir", dir.file("ledger"), "--listen", "127.0.0.1:0", "--metrics", ""},
                   dir.file("ledger.log"), "200000");
  expectNotifyLifecycle(notify, *ledger, 4);
}

TEST(AgentNotify, ReadyWatchdogStoppingThenExitZero) {
  TempDir dir;
  NotifySocket notify(dir.file("notify"));
  ASSERT_TRUE(notify.bound());
  // No ledger: the agent serves (partitioned) all the same.
  auto agent = notify.spawn("tally-agent",
                            {"--data-dir", dir.file("agent"), "--ledger", "127.0.0.1:1", "--socket",
                             dir.file("agent.sock"), "--metrics", ""},
                            dir.file("agent.log"), "200000");
  expectNotifyLifecycle(notify, *agent, 4);
}

TEST(LedgerNotify, NoWatchdogPingsWithoutWatchdogUsec) {
  TempDir dir;
  NotifySocket notify(dir.file("notify"));
  ASSERT_TRUE(notify.bound());
  auto ledger =
      notify.spawn("tally-ledger",
                   {"--data-dir", dir.file("ledger"), "--listen", "127.0.0.1:0", "--metrics", ""},
                   dir.file("ledger.log"), nullptr);
  ASSERT_EQ(notify.next(kTimeoutMs).state, "READY=1") << ledger->log();
  // Five intervals of the watchdog the other tests ask for pass without a ping.
  EXPECT_EQ(notify.next(5 * kIntervalMs).state, "");
  ASSERT_TRUE(ledger->signal(SIGTERM));
  EXPECT_EQ(notify.next(kTimeoutMs).state, "STOPPING=1");
  EXPECT_EQ(ledger->waitExit(kTimeoutMs), 0) << ledger->log();
}

}  // namespace
}  // namespace tally::testing
