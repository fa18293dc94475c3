#include "tests/support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace tally::testing {
uint64_t monotonicNowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1'000'000;
}

std::string binaryPath(const std::string& name) {
  // TALLY_BIN_DIR in the environment runs the same tests against another build (e.g. asan).
  const char* override_dir = std::getenv("TALLY_BIN_DIR");
  const std::string dir =
      override_dir != nullptr && *override_dir != '\0' ? override_dir : TALLY_BIN_DIR;
  return dir + "/" + name;
}

namespace {

bool speaksTheLink(const std::string& binary) {
  const std::string name = binary.substr(binary.find_last_of('/') + 1);
  return name == "tally-ledger" || name == "tally-agent";
}

}  // namespace

Process::Process(std::string binary, std::vector<std::string> args, std::string log_path,
                 bool ready_fd, Link link)
    : log_path_(std::move(log_path)) {
  if (link == Link::kPlaintext && speaksTheLink(binary) &&
      std::find(args.begin(), args.end(), "--insecure") == args.end()) {
    args.push_back("--insecure");
  }
  int ready[2] = {-1, -1};
  if (ready_fd && ::pipe2(ready, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot open " + log_path_);
  // Everything the child needs is built before fork(): tests run threads, and after fork() in a
  // threaded process only async-signal-safe calls are allowed (no malloc, no std::string).
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  for (auto& arg : args) argv_storage.push_back(arg);
  if (ready_fd) {
    argv_storage.push_back("--ready-fd");
    argv_storage.push_back(std::to_string(ready[1]));
  }
  std::vector<char*> argv;
  for (auto& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Child: stderr and stdout to the log; the ready pipe's write end survives exec (its
    // O_CLOEXEC is cleared here only, so concurrently spawned children never inherit it).
    ::dup2(log_fd, STDERR_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    if (ready_fd) ::fcntl(ready[1], F_SETFD, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (ready_fd) {
    ::close(ready[1]);
    ready_read_fd_ = ready[0];
  }
}

Process::~Process() {
  if (pid_ > 0) kill9();
  if (ready_read_fd_ >= 0) ::close(ready_read_fd_);
}

int Process::waitReady(uint64_t timeout_ms) {
  if (ready_read_fd_ < 0) return -1;
  const uint64_t deadline = monotonicNowMs() + timeout_ms;
  std::string line;
  while (line.find('\n') == std::string::npos) {
    const uint64_t now = monotonicNowMs();
    if (now >= deadline) return -1;
    pollfd pfd{.fd = ready_read_fd_, .events = POLLIN, .revents = 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(deadline - now));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return -1;
    char buffer[64];
    const ssize_t n = ::read(ready_read_fd_, buffer, sizeof(buffer));
    if (n <= 0) return -1;  // closed without a line: the child died or failed to start
    line.append(buffer, static_cast<size_t>(n));
  }
  ready_line_ = line.substr(0, line.find('\n'));
  if (line.rfind("ready ", 0) != 0) return -1;
  return std::atoi(line.c_str() + 6);
}

bool Process::signal(int signal_number) {
  if (pid_ <= 0) return false;
  return ::kill(pid_, signal_number) == 0;
}

int Process::waitExit(uint64_t timeout_ms) {
  if (pid_ <= 0) return -1;
  // A pidfd becomes readable when the process exits: wait for that event with the deadline.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd < 0) return -1;
  const uint64_t deadline = monotonicNowMs() + timeout_ms;
  int result = -1;
  while (true) {
    const uint64_t now = monotonicNowMs();
    if (now >= deadline) break;
    pollfd pfd{.fd = pidfd, .events = POLLIN, .revents = 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(deadline - now));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    int status = 0;
    pid_t reaped = -1;
    while ((reaped = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
    if (reaped == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) result = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) result = 128 + WTERMSIG(status);
    }
    break;
  }
  ::close(pidfd);
  return result;
}

void Process::kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

bool Process::exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  return true;
}

std::string Process::log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace tally::testing
