// Who may talk to the agent's Unix socket, tried by processes of a second uid (docs/security.md
// "Connections and limits"): the real tallyctl, forked and setuid() to `nobody` (65534) before it
// is exec'ed, so the kernel sees another user.
//  * A socket file the user may not write (mode 0): connect() fails with EACCES, and tallyctl
//    says permission denied (exit 11), not unavailable (exit 6).
//  * The SO_PEERCRED allowlist: a uid not in allowed_uids/allowed_gids is refused with
//    PERMISSION_DENIED (exit 11) and logged; listed, it is served; the agent's own uid, no longer
//    listed, is refused.
// Switching uid needs root: without it the tests skip, saying so.

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "ctl/exit_codes.h"
#include "tests/integration/agent_harness.h"

namespace tally::testing {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
constexpr uint64_t kRunTimeoutMs = 20'000;

struct PeerRun {
  int exit_code = -1;  // -1: did not exit within the timeout (killed)
  std::string out;     // stdout and stderr
};

// Runs `tallyctl args…` as `uid`/`gid` (no supplementary groups) and waits, bounded, for it.
PeerRun tallyctlAs(uid_t uid, gid_t gid, const std::vector<std::string>& args) {
  PeerRun run;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return run;
  const std::string binary = binaryPath("tallyctl");
  std::vector<std::string> argv_strings{binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(120);
    ::execv(argv[0], argv.data());
    ::_exit(121);
  }
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    return run;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRunTimeoutMs);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd polled{.fd = pipe_fds[0], .events = POLLIN};
    if (::poll(&polled, 1, static_cast<int>(left.count())) <= 0) break;
    char buffer[4096];
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;  // end of output: the child exited (or closed its stdout)
    run.out.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      (void)::waitpid(pid, &status, 0);
      return run;
    }
    pollfd none{.fd = -1, .events = 0};
    (void)::poll(&none, 1, 10);  // between checks of the child's exit
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The directories on the way to `path` must let `nobody` through (TempDir makes its own 0700).
void openToOthers(const std::string& dir) { ASSERT_EQ(::chmod(dir.c_str(), 0755), 0); }

// A listening Unix socket at `path` that never answers (only the connect matters here).
int listenAt(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), std::min(path.size(), sizeof(address.sun_path) - 1));
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 8) != 0) {
    return -1;
  }
  return fd;
}

TEST(AgentSocketPermissionTest, TallyctlReportsARefusedConnectAsPermissionDenied) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to run tallyctl as a second uid (root connects to any socket "
                    "file whatever its mode)";
  }
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(openToOthers(dir.path()));
  const std::string path = dir.file("agent.sock");
  const int listener = listenAt(path);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  // Mode 0: nobody may write the socket file, so its connect() fails with EACCES.
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  const PeerRun refused =
      tallyctlAs(kNobody, kNogroup, {"--agent", path, "--json", "--timeout-ms", "2000", "health"});
  EXPECT_EQ(refused.exit_code, ctl::kExitPermissionDenied) << refused.out;
  EXPECT_NE(refused.out.find("PERMISSION_DENIED"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("permission denied"), std::string::npos) << refused.out;

  // The same socket writable by everyone: the connect succeeds, nobody answers, and the timeout
  // is what tallyctl reports (unavailable): exit 11 above is the refused connect, nothing else.
  ASSERT_EQ(::chmod(path.c_str(), 0777), 0);
  const PeerRun unanswered =
      tallyctlAs(kNobody, kNogroup, {"--agent", path, "--json", "--timeout-ms", "300", "health"});
  EXPECT_EQ(unanswered.exit_code, ctl::kExitUnavailable) << unanswered.out;
  ::close(listener);
}

class AgentPeerUidTest : public AgentFleetTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "needs root to connect from a second uid (fork, setuid(65534))";
    }
    ASSERT_NO_FATAL_FAILURE(openToOthers(dir_.path()));
    ASSERT_NO_FATAL_FAILURE(startLedger());
    ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  }

  // tallyctl health through agent `index`, as nobody.
  PeerRun healthAsNobody(size_t index) {
    return tallyctlAs(kNobody, kNogroup,
                      {"--agent", agents_.at(index)->socketPath(), "--json", "health"});
  }
};

TEST_F(AgentPeerUidTest, APeerOfAnUnlistedUidIsRefusedAndAListedOneIsServed) {
  // The default allowlist: the agent's own uid and gid (root here). The socket is opened to
  // everyone so that only SO_PEERCRED decides.
  AgentSettings defaults;
  defaults.extra_toml = "socket_mode = \"0666\"\n";
  ASSERT_NO_FATAL_FAILURE(startAgent(0, ledgerAddress(), defaults));
  const PeerRun refused = healthAsNobody(0);
  EXPECT_EQ(refused.exit_code, ctl::kExitPermissionDenied) << refused.out;
  EXPECT_NE(refused.out.find("PERMISSION_DENIED"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("uid 65534"), std::string::npos) << refused.out;
  const std::string log = agents_[0]->log();
  EXPECT_NE(log.find("event=peer_refused"), std::string::npos) << log;
  EXPECT_NE(log.find("uid=65534"), std::string::npos) << log;
  // The agent's own uid is still served.
  std::unique_ptr<client::BlockingClient> own = gateway(0);
  ASSERT_NE(own, nullptr);
  TALLY_ASSIGN_OR_FAIL(wire::HealthReply reply, health(*own));
  EXPECT_FALSE(reply.status.empty());

  // nobody listed (and only nobody): served; root, no longer listed, is refused.
  AgentSettings nobody_only;
  nobody_only.extra_toml = "socket_mode = \"0666\"\nallowed_uids = [65534]\nallowed_gids = []\n";
  ASSERT_NO_FATAL_FAILURE(startAgent(1, ledgerAddress(), nobody_only));
  const PeerRun served = healthAsNobody(1);
  EXPECT_EQ(served.exit_code, ctl::kExitOk) << served.out;
  Result<std::unique_ptr<client::BlockingClient>> root = agents_[1]->connect();
  ASSERT_TRUE(root.isOk()) << root.status().toString();
  Result<wire::Response> answer = root.value()->call(wire::HealthRequest{}, kCallTimeoutMs);
  ASSERT_TRUE(answer.isOk()) << answer.status().toString();
  const auto* error = std::get_if<wire::ErrorReply>(&answer.value().body);
  ASSERT_NE(error, nullptr) << wire::describe(answer.value().body);
  EXPECT_EQ(error->code, wire::ErrorCode::kPermissionDenied) << error->message;
}

}  // namespace
}  // namespace tally::testing
