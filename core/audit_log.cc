#include "core/audit_log.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/limits.h"

namespace tally {

uint64_t AuditLog::append(AuditLogEntry entry) {
  entry.sequence = ++last_sequence_;
  entries_.push_back(std::move(entry));
  ++appended_;
  while (entries_.size() > limits::kAuditLogEntriesKept) {
    entries_.pop_front();
    dropped_ = true;
  }
  appended_ = std::min(appended_, entries_.size());
  return last_sequence_;
}

AuditLogReply AuditLog::page(uint64_t after_sequence, uint64_t entries_max) const {
  if (entries_max == 0 || entries_max > limits::kAuditLogEntriesPerReplyMax) {
    entries_max = limits::kAuditLogEntriesPerReplyMax;
  }
  AuditLogReply reply{.last_sequence = last_sequence_};
  if (entries_.empty()) return reply;
  reply.first_kept_sequence = entries_.front().sequence;
  // Sequences are contiguous: the first entry after `after_sequence` is found by arithmetic.
  const uint64_t first = std::max(after_sequence + 1, reply.first_kept_sequence);
  if (after_sequence >= last_sequence_) return reply;
  uint64_t bytes = 0;
  for (uint64_t i = first - reply.first_kept_sequence; i < entries_.size(); ++i) {
    const AuditLogEntry& entry = entries_[i];
    const uint64_t entry_bytes = 128 + entry.actor.size() + entry.actor_kind.size() +
                                 entry.actor_role.size() + entry.action.size() +
                                 entry.target.size() + entry.outcome.size() + entry.detail.size();
    // A page fits one frame however long the entries' texts are (a few KiB each at most).
    if (reply.entries.size() == entries_max ||
        (!reply.entries.empty() && bytes + entry_bytes > limits::kAuditLogReplyBytesMax)) {
      reply.more = true;
      break;
    }
    bytes += entry_bytes;
    reply.entries.push_back(entry);
  }
  return reply;
}

Status AuditLog::restore(AuditLogEntry entry) {
  if (entry.sequence == 0 || (!entries_.empty() && entry.sequence != last_sequence_ + 1)) {
    return Status::corruption("audit log entry " + std::to_string(entry.sequence) +
                              " is out of sequence after " + std::to_string(last_sequence_));
  }
  last_sequence_ = entry.sequence;
  entries_.push_back(std::move(entry));
  if (entries_.size() > limits::kAuditLogEntriesKept) entries_.pop_front();
  return Status::ok();
}

AuditLog::Changes AuditLog::takeChanges() {
  Changes changes;
  TALLY_ASSERT(appended_ <= entries_.size());
  for (size_t i = entries_.size() - appended_; i < entries_.size(); ++i) {
    changes.appended.push_back(&entries_[i]);
  }
  if (dropped_ && !entries_.empty()) changes.kept_from = entries_.front().sequence;
  appended_ = 0;
  dropped_ = false;
  return changes;
}

}  // namespace tally
