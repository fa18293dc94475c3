#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace tally {

Status sdNotify(const std::string& state) {
  const char* name = std::getenv("NOTIFY_SOCKET");
  if (name == nullptr || name[0] == '\0') return Status::ok();
  const size_t name_bytes = std::strlen(name);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (name[0] != '/' && name[0] != '@') {
    return Status::invalidArgument(std::string("NOTIFY_SOCKET '") + name + "' is not a path");
  }
  if (name_bytes >= sizeof(address.sun_path)) {
    return Status::invalidArgument("NOTIFY_SOCKET is too long");
  }
  std::memcpy(address.sun_path, name, name_bytes);
  if (name[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_bytes);

  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::ioError(std::string("sd_notify socket: ") + std::strerror(errno));
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&address), length);
  const int saved = errno;
  ::close(fd);
  if (sent < 0) return Status::ioError(std::string("sd_notify sendto: ") + std::strerror(saved));
  return Status::ok();
}

int sdListenFds() {
  const char* pid_text = std::getenv("LISTEN_PID");
  const char* fds_text = std::getenv("LISTEN_FDS");
  int count = 0;
  if (pid_text != nullptr && fds_text != nullptr &&
      std::strtol(pid_text, nullptr, 10) == static_cast<long>(::getpid())) {
    count = static_cast<int>(std::strtol(fds_text, nullptr, 10));
    if (count < 0) count = 0;
  }
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  return count;
}

namespace {

// A positive decimal without sign, spaces or trailing bytes; 0 for anything else.
uint64_t parsePositive(const char* text) {
  if (text == nullptr) return 0;
  const std::string_view view(text);
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (view.empty() || error != std::errc() || end != view.data() + view.size()) return 0;
  return value;
}

}  // namespace

uint64_t watchdogIntervalMs(const char* watchdog_usec, const char* watchdog_pid, pid_t self) {
  const uint64_t usec = parsePositive(watchdog_usec);
  if (usec == 0) return 0;
  if (watchdog_pid != nullptr && watchdog_pid[0] != '\0' &&
      parsePositive(watchdog_pid) != static_cast<uint64_t>(self)) {
    return 0;
  }
  const uint64_t half_ms = usec / 2 / 1000;
  return half_ms == 0 ? 1 : half_ms;
}

uint64_t sdWatchdogIntervalMs() {
  const uint64_t interval_ms =
      watchdogIntervalMs(std::getenv("WATCHDOG_USEC"), std::getenv("WATCHDOG_PID"), ::getpid());
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  return interval_ms;
}

}  // namespace tally
