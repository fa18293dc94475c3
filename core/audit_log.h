#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "core/operator_types.h"
#include "core/status.h"

// The append-only log of privileged actions (docs/security.md "Audit log"): every policy
// publish and rollback, gateway and operator enroll, rotate, enable and disable, shard revoke
// and write-off, whether served or refused, with who asked, when, and the digest of what was
// asked. Pure; owned by the Ledger, which persists each entry in the batch of the action itself.
// Keeps the newest limits::kAuditLogEntriesKept entries; older ones are dropped.

namespace tally {

class AuditLog {
 public:
  // Writes `entry` with the next sequence; returns that sequence.
  uint64_t append(AuditLogEntry entry);

  // The entries after `after_sequence`, at most `entries_max` (clamped to
  // limits::kAuditLogEntriesPerReplyMax; 0: that maximum).
  AuditLogReply page(uint64_t after_sequence, uint64_t entries_max) const;
  uint64_t lastSequence() const { return last_sequence_; }
  size_t size() const { return entries_.size(); }

  // Rebuilding: entries in ascending sequence, then finishRestore.
  Status restore(AuditLogEntry entry);

  struct Changes {
    std::vector<const AuditLogEntry*> appended;  // ascending sequence
    uint64_t kept_from = 0;  // entries below it are dropped (0: nothing dropped)
    bool empty() const { return appended.empty() && kept_from == 0; }
  };
  // Valid until the next append.
  Changes takeChanges();
  bool changed() const { return appended_ > 0 || dropped_; }

 private:
  std::deque<AuditLogEntry> entries_;
  uint64_t last_sequence_ = 0;
  size_t appended_ = 0;  // the newest entries not yet taken
  bool dropped_ = false;
};

}  // namespace tally
