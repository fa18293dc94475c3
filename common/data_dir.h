#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

// A daemon's data directory on disk: creating it durably, syncing its entries, and the
// exclusive lock that keeps a second daemon off it.

namespace tally {

// Makes the entries of `dir` durable (fsync of the directory).
Status syncDirectory(const std::string& dir);
// Makes the entry of `path` in its directory durable (syncDirectory of its parent).
Status syncParentDirectory(const std::string& path);
// Writes all of `content` to `fd` (retrying short writes and EINTR), then fsyncs it. `path`
// only names the file in errors; the caller owns and closes `fd`.
Status writeAllAndSync(int fd, const std::string& path, std::string_view content);

// Creates `dir` and any missing parent with mode 0750, and makes each new entry durable by
// syncing its parent directory. kFailedPrecondition when `dir` exists and is not a directory.
Status makeDataDir(const std::string& dir);

// Takes the exclusive flock on DIR/`lock_file_name` (created with mode 0640); returns the locked
// fd. kFailedPrecondition "... is in use: another `holder` holds ..." when someone else has it.
Result<int> lockDataDir(const std::string& dir, std::string_view lock_file_name,
                        std::string_view holder);

}  // namespace tally
