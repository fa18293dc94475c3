// tallyctl's rendering of operators and the audit log (ctl/render.h).

#include "ctl/json.h"
#include "ctl/render.h"
#include "shard/identity.h"
#include "wire/digest.h"

namespace tally::ctl {

std::string renderOperators(const OperatorReply& reply, bool json) {
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("code", replyCodeName(reply.code));
    w.field("duplicate", reply.duplicate);
    if (!reply.message.empty()) w.field("message", reply.message);
    w.key("operators").beginArray();
    for (const OperatorRecord& o : reply.operators) {
      w.beginObject();
      w.field("operatorId", o.name);
      w.field("publicKey", identity::encodePublicKey(o.public_key));
      w.field("role", operatorRoleName(o.role));
      w.field("enabled", o.enabled);
      timeField(w, "enrolledAt", o.enrolled_at_ms);
      w.endObject();
    }
    w.endArray();
    w.endObject();
    return w.take() + "\n";
  }
  std::string out;
  if (reply.code != ReplyCode::kOk || !reply.message.empty()) {
    out += std::string(replyCodeName(reply.code)) +
           (reply.message.empty() ? std::string() : ": " + reply.message) + "\n";
  }
  if (reply.duplicate) out += "duplicate: nothing changed\n";
  for (const OperatorRecord& o : reply.operators) {
    out += o.name + "  " + operatorRoleName(o.role) + "  " +
           identity::encodePublicKey(o.public_key) + "  " + (o.enabled ? "enabled" : "DISABLED") +
           (o.enrolled_at_ms == 0 ? std::string("  the ledger's operator key")
                                  : "  enrolled " + timeText(o.enrolled_at_ms)) +
           "\n";
  }
  if (out.empty()) out = "no operators\n";
  return out;
}

std::string renderAuditLog(const AuditLogReply& reply, bool json) {
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("more", reply.more);
    w.field("firstKeptSequence", reply.first_kept_sequence);
    w.field("lastSequence", reply.last_sequence);
    w.key("entries").beginArray();
    for (const AuditLogEntry& e : reply.entries) {
      w.beginObject();
      w.field("sequence", e.sequence);
      timeField(w, "at", e.at_ms);
      w.field("actor", e.actor);
      w.field("actorKind", e.actor_kind);
      w.field("actorRole", e.actor_role);
      w.field("action", e.action);
      w.field("target", e.target);
      w.field("outcome", e.outcome);
      w.field("detail", e.detail);
      w.field("requestDigest", wire::digestHex(e.request_digest));
      w.endObject();
    }
    w.endArray();
    w.endObject();
    return w.take() + "\n";
  }
  std::string out;
  for (const AuditLogEntry& e : reply.entries) {
    const std::string who = e.actor.empty() ? e.actor_kind : e.actor_kind + " '" + e.actor + "'";
    out += std::to_string(e.sequence) + "  " + timeText(e.at_ms) + "  " + who +
           (e.actor_role.empty() ? std::string() : " (" + e.actor_role + ")") + "  " + e.action +
           (e.target.empty() ? std::string() : " " + e.target) + "  " + e.outcome +
           (e.detail.empty() ? std::string() : ": " + e.detail) + "  sha256 " +
           wire::digestHex(e.request_digest).substr(0, 16) + "\n";
  }
  if (reply.entries.empty()) out = "no entries\n";
  if (reply.more) {
    out += "more: tallyctl audit-log --after " +
           std::to_string(reply.entries.empty() ? 0 : reply.entries.back().sequence) + "\n";
  }
  return out;
}

}  // namespace tally::ctl
