#pragma once

#include <optional>
#include <string>

#include "core/ledger_protocol.h"
#include "core/link_authority.h"
#include "core/operator_types.h"

// What the audit log records of one privileged action (isPrivilegedAction): who asked (the
// connection's LinkPeer), what it asked and named, and how it ended — refused (`refusal` set:
// linkRefusal's message) or answered (`reply`). Pure: the shell adds the digest of the request
// bytes and appends the entry to the Ledger in the batch of the action.

namespace tally {

AuditLogEntry auditLogEntryOf(const LinkPeer& peer, const LedgerRequest& request,
                              const std::optional<std::string>& refusal, const LedgerReply* reply,
                              const RequestDigest& digest);

}  // namespace tally
