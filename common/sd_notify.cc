#include "common/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

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

}  // namespace tally
