#include "ledger/check_commands.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "common/data_dir.h"
#include "core/ledger.h"
#include "ledger/restore.h"
#include "ledger/restore_check.h"
#include "ledger/sqlite_store.h"

namespace tally::ledger {
namespace {

Result<StoreContents> loadStore(const std::string& data_dir, std::unique_ptr<SqliteStore>* out) {
  Result<std::unique_ptr<SqliteStore>> opened = SqliteStore::open(data_dir);
  if (!opened.isOk()) return opened.status();
  *out = std::move(opened).value();
  return (*out)->load();
}

// A restore of `contents` into a scratch ledger: what the next start would do.
Status trialRestore(StoreContents contents, uint64_t wall_now_ms) {
  Ledger scratch;
  Result<RestoreSummary> restored = restoreLedger(std::move(contents), &scratch, wall_now_ms);
  return restored.isOk() ? Status::ok() : restored.status();
}

// Appends `text` to `path` (created if absent) and makes it and its directory entry durable.
Status appendDurably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return Status::ioError("open " + path + ": " + std::strerror(errno));
  const Status written = writeAllAndSync(fd, path, text);
  if (::close(fd) != 0 && written.isOk()) {
    return Status::ioError("close " + path + ": " + std::strerror(errno));
  }
  if (!written.isOk()) return written;
  return syncParentDirectory(path);
}

}  // namespace

int runCheck(const std::string& data_dir, uint64_t wall_now_ms) {
  std::unique_ptr<SqliteStore> store;
  Result<StoreContents> contents = loadStore(data_dir, &store);
  if (!contents.isOk()) {
    std::fprintf(stderr, "tally-ledger: %s: %s\n", data_dir.c_str(),
                 contents.status().toString().c_str());
    return kExitCheckStartup;
  }
  const std::vector<BadRecord> bad = findBadRecords(contents.value());
  for (const BadRecord& record : bad) std::printf("bad record: %s\n", describe(record).c_str());
  if (!bad.empty()) {
    std::printf(
        "%zu bad record%s; `tally-ledger --data-dir %s repair` quarantines them "
        "(docs/RUNBOOK.md)\n",
        bad.size(), bad.size() == 1 ? "" : "s", data_dir.c_str());
    return kExitCheckBadRecords;
  }
  if (Status status = trialRestore(std::move(contents).value(), wall_now_ms); !status.isOk()) {
    std::printf("restore fails: %s\n", status.toString().c_str());
    return kExitCheckBadRecords;
  }
  std::printf("ok: every stored record can be applied\n");
  return kExitCheckClean;
}

int runRepair(const std::string& data_dir, uint64_t wall_now_ms) {
  std::unique_ptr<SqliteStore> store;
  Result<StoreContents> contents = loadStore(data_dir, &store);
  if (!contents.isOk()) {
    std::fprintf(stderr, "tally-ledger: %s: %s\n", data_dir.c_str(),
                 contents.status().toString().c_str());
    return kExitCheckStartup;
  }
  const RepairPlan plan = planRepair(contents.value());
  if (!plan.unrepairable.empty()) {
    for (const BadRecord& record : plan.unrepairable) {
      std::printf("cannot repair: %s\n", describe(record).c_str());
    }
    std::printf("nothing written\n");
    return kExitCheckBadRecords;
  }
  if (plan.corrections.empty()) {
    std::printf("nothing to repair\n");
    return trialRestore(std::move(contents).value(), wall_now_ms).isOk() ? kExitCheckClean
                                                                         : kExitCheckBadRecords;
  }
  if (Status status = trialRestore(applied(std::move(contents).value(), plan.batch), wall_now_ms);
      !status.isOk()) {
    std::printf("the repaired store would still not restore: %s\nnothing written\n",
                status.toString().c_str());
    return kExitCheckBadRecords;
  }
  // The quarantine log first: a crash before the commit leaves the records bad, and a second
  // repair logs them again (the log may then name one twice, never a change it lacks).
  std::string lines;
  for (const Correction& correction : plan.corrections) {
    lines += quarantineLine(correction, wall_now_ms);
  }
  const std::string log_path = data_dir + "/quarantine.jsonl";
  if (Status status = appendDurably(log_path, lines); !status.isOk()) {
    std::fprintf(stderr, "tally-ledger: %s\n", status.toString().c_str());
    return kExitCheckStartup;
  }
  if (Status status = store->commit(plan.batch); !status.isOk()) {
    std::fprintf(stderr, "tally-ledger: commit: %s\n", status.toString().c_str());
    return kExitCheckStartup;
  }
  for (const Correction& correction : plan.corrections) {
    std::printf("%s: %s\n", correction.action.c_str(), describe(correction.record).c_str());
  }
  std::printf("%zu correction%s appended to %s; the ledger can start\n", plan.corrections.size(),
              plan.corrections.size() == 1 ? "" : "s", log_path.c_str());
  return kExitCheckClean;
}

}  // namespace tally::ledger
