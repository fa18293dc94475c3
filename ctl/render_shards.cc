#include "ctl/render_shards.h"

#include "ctl/render.h"
#include "shard/identity.h"

namespace tally::ctl {
namespace {

std::string centralEquation(const ShardLedgerView& v) {
  return "allocated " + std::to_string(v.grant.allocated_units) + " = spent " +
         std::to_string(v.spent_units) + " + reminted " + std::to_string(v.reminted_units) +
         " + retired " + std::to_string(v.retired_units) + "  debt " +
         std::to_string(v.debt_units) + (v.written_off ? "  written off" : "") +
         (v.conserved ? "" : "  NOT CONSERVED");
}

std::string localEquation(const ShardLedgerView& v) {
  const ShardBalances& b = v.last_reported;
  return "agent: allocated " + std::to_string(v.grant.allocated_units) + " = available " +
         std::to_string(b.local_available) + " + reserved " + std::to_string(b.local_reserved) +
         " + spent " + std::to_string(b.local_spent) + " + retired " +
         std::to_string(b.local_retired) + "  overspent " + std::to_string(b.overspent);
}

}  // namespace

void shardJson(JsonWriter& w, const ShardLedgerView& v, bool with_grant) {
  const ShardGrant& g = v.grant;
  w.beginObject();
  w.field("shardId", g.shard_id);
  w.field("gatewayId", g.gateway_name);
  if (with_grant) w.field("publicKey", identity::encodePublicKey(g.gateway_id));
  w.field("subject", g.subject);
  w.field("route", g.route);
  w.field("policyGeneration", g.policy_generation);
  w.field("state", shardStateName(v.state));
  w.field("allocatedUnits", g.allocated_units);
  w.field("spentUnits", v.spent_units);
  w.field("remintedUnits", v.reminted_units);
  w.field("retiredUnits", v.retired_units);
  w.field("debtUnits", v.debt_units);
  w.field("writtenOff", v.written_off);
  w.field("conserved", v.conserved);
  if (with_grant) {
    w.field("fence", g.fence);
    w.field("currentFence", v.current_fence);
    w.field("gatewayBootEpoch", g.gateway_boot_epoch);
    timeField(w, "issuedAt", g.issued_at_ms);
    timeField(w, "expiresAt", g.expires_at_ms);
    w.field("ledgerKeyId", g.ledger_key_id);
  }
  w.field("reported", v.reported);
  if (v.reported) {
    const ShardBalances& b = v.last_reported;
    w.key("local").beginObject();
    w.field("available", b.local_available);
    w.field("reserved", b.local_reserved);
    w.field("spent", b.local_spent);
    w.field("retired", b.local_retired);
    w.field("overspent", b.overspent);
    w.endObject();
  }
  w.endObject();
}

std::string shardHuman(const ShardLedgerView& v, bool with_grant) {
  const ShardGrant& g = v.grant;
  std::string out = g.shard_id + "  " + shardStateName(v.state) + "  gateway " + g.gateway_name +
                    "  " + g.subject + " / " + g.route + "  generation " +
                    std::to_string(g.policy_generation) + "\n  " + centralEquation(v) + "\n";
  if (with_grant) {
    out += "  fence " + std::to_string(g.fence) + " (current " + std::to_string(v.current_fence) +
           ")  boot epoch " + std::to_string(g.gateway_boot_epoch) + "  issued " +
           timeText(g.issued_at_ms) + "  expires " + timeText(g.expires_at_ms) + "\n";
  }
  out += "  " + (v.reported ? localEquation(v) : std::string("agent: not reported")) + "\n";
  return out;
}

std::string renderGateways(const GatewayReply& reply, bool json) {
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("code", replyCodeName(reply.code));
    w.field("duplicate", reply.duplicate);
    if (!reply.message.empty()) w.field("message", reply.message);
    w.key("gateways").beginArray();
    for (const GatewayRecord& g : reply.gateways) {
      w.beginObject();
      w.field("gatewayId", g.gateway_name);
      w.field("publicKey", identity::encodePublicKey(g.public_key));
      w.field("enabled", g.enabled);
      timeField(w, "enrolledAt", g.enrolled_at_ms);
      if (g.previous_public_key != PublicKey{}) {  // a rotation's old key and its window
        w.field("previousPublicKey", identity::encodePublicKey(g.previous_public_key));
        timeField(w, "previousKeyUntil", g.previous_key_until_ms);
      }
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
  for (const GatewayRecord& g : reply.gateways) {
    out += g.gateway_name + "  " + identity::encodePublicKey(g.public_key) + "  " +
           (g.enabled ? "enabled" : "DISABLED") + "  enrolled " + timeText(g.enrolled_at_ms) +
           (g.previous_public_key == PublicKey{}
                ? std::string()
                : "  previous key " + identity::encodePublicKey(g.previous_public_key) + " until " +
                      timeText(g.previous_key_until_ms)) +
           "\n";
  }
  if (out.empty()) out = "no gateways\n";
  return out;
}

std::string renderShards(const ShardReply& reply, bool json) {
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("code", replyCodeName(reply.code));
    w.field("duplicate", reply.duplicate);
    w.field("permissionDenied", reply.permission_denied);
    if (!reply.message.empty()) w.field("message", reply.message);
    w.field("remintedUnits", reply.reminted_units);
    w.field("spentUnits", reply.spent_units);
    w.field("debtUnits", reply.debt_units);
    if (reply.limiting_dimension != LimitingDimension::kNone) {
      w.field("limitingDimension", limitingDimensionName(reply.limiting_dimension));
    }
    w.key("shards").beginArray();
    for (const ShardLedgerView& view : reply.shards) shardJson(w, view, true);
    w.endArray();
    w.endObject();
    return w.take() + "\n";
  }
  std::string out;
  if (reply.permission_denied) out += "permission denied\n";
  if (reply.code != ReplyCode::kOk || !reply.message.empty()) {
    out += std::string(replyCodeName(reply.code)) +
           (reply.message.empty() ? std::string() : ": " + reply.message) + "\n";
  }
  if (reply.duplicate) out += "duplicate: nothing changed\n";
  for (const ShardLedgerView& view : reply.shards) out += shardHuman(view, true);
  if (out.empty()) out = "no shards\n";
  return out;
}

}  // namespace tally::ctl
