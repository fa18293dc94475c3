#include "common/data_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tally {

namespace {

constexpr mode_t kDataDirMode = 0750;
constexpr mode_t kLockFileMode = 0640;

std::string errnoText(int error) { return std::strerror(error); }

}  // namespace

Status syncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::ioError("open directory " + dir + ": " + errnoText(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) return Status::ioError("fsync directory " + dir + ": " + errnoText(error));
  return Status::ok();
}

Status syncParentDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  return syncDirectory(slash == std::string::npos ? "."
                                                  : (slash == 0 ? "/" : path.substr(0, slash)));
}

Status writeAllAndSync(int fd, const std::string& path, std::string_view content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::ioError("write " + path + ": " + errnoText(errno));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return Status::ioError("fsync " + path + ": " + errnoText(errno));
  return Status::ok();
}

Status makeDataDir(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), kDataDirMode) == 0) {
      const size_t slash = prefix.find_last_of('/');
      const std::string parent = slash == std::string::npos ? "." : prefix.substr(0, slash + 1);
      if (Status synced = syncDirectory(parent); !synced.isOk()) return synced;
      continue;
    }
    if (errno != EEXIST) {
      return Status::ioError("create data dir " + prefix + ": " + errnoText(errno));
    }
  }
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) {
    return Status::ioError("data dir " + dir + ": " + errnoText(errno));
  }
  if (!S_ISDIR(info.st_mode)) {
    return Status::failedPrecondition("data dir " + dir + " exists and is not a directory");
  }
  return Status::ok();
}

Result<int> lockDataDir(const std::string& dir, std::string_view lock_file_name,
                        std::string_view holder) {
  const std::string path = dir + "/" + std::string(lock_file_name);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, kLockFileMode);
  if (fd < 0) return Status::ioError("open " + path + ": " + errnoText(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return Status::failedPrecondition("data dir " + dir + " is in use: another " +
                                        std::string(holder) + " holds " + path);
    }
    return Status::ioError("lock " + path + ": " + errnoText(error));
  }
  return fd;
}

}  // namespace tally
