// ShardRegistry: enrolled gateways (docs/SHARDS.md "Gateways"). The rest of the registry is in
// shard_registry.cc.

#include <optional>
#include <string>
#include <utility>

#include "core/limits.h"
#include "core/shard_registry.h"

namespace tally {
namespace {

// 1..kGatewayNameBytesMax bytes of [A-Za-z0-9._-], as shard/identity.h creates them.
bool validGatewayName(const std::string& name) {
  return isIdentityName(name, limits::kGatewayNameBytesMax);
}

GatewayReply gatewayError(ReplyCode code, std::string message) {
  return {.code = code, .message = std::move(message)};
}

}  // namespace

const GatewayRecord* ShardRegistry::gatewayWithKey(const PublicKey& key) const {
  if (key == PublicKey{})
    return nullptr;  // no key, and the previous key of a gateway never rotated
  for (const auto& [name, gateway] : gateways_) {
    if (gateway.public_key == key || gateway.previous_public_key == key) return &gateway;
  }
  return nullptr;
}

GatewayReply ShardRegistry::enrollGateway(const std::string& gateway_name,
                                          const PublicKey& public_key, uint64_t now_ms) {
  if (!validGatewayName(gateway_name)) {
    return gatewayError(ReplyCode::kInvalidArgument,
                        "gateway name must be 1.." + std::to_string(limits::kGatewayNameBytesMax) +
                            " bytes of [A-Za-z0-9._-]");
  }
  if (public_key == PublicKey{}) {
    return gatewayError(ReplyCode::kInvalidArgument, "public key must be set");
  }
  if (auto it = gateways_.find(gateway_name); it != gateways_.end()) {
    if (it->second.public_key != public_key) {
      return gatewayError(ReplyCode::kIdempotencyConflict,
                          "gateway '" + gateway_name + "' is enrolled with another key");
    }
    return {.code = ReplyCode::kOk, .gateways = {it->second}, .duplicate = true};
  }
  if (gateways_.size() >= limits::kGatewaysMax) {
    return gatewayError(ReplyCode::kResourceExhausted, "gateway table is full");
  }
  const GatewayRecord& record =
      gateways_
          .emplace(gateway_name, GatewayRecord{.gateway_name = gateway_name,
                                               .public_key = public_key,
                                               .enabled = true,
                                               .enrolled_at_ms = now_ms})
          .first->second;
  touchedGateway(gateway_name);
  return {.code = ReplyCode::kOk, .gateways = {record}};
}

GatewayReply ShardRegistry::listGateways() const {
  GatewayReply reply;
  reply.gateways.reserve(gateways_.size());
  for (const auto& [name, record] : gateways_) reply.gateways.push_back(record);
  return reply;
}

GatewayReply ShardRegistry::setGatewayEnabled(const std::string& gateway_name, bool enabled) {
  auto it = gateways_.find(gateway_name);
  if (it == gateways_.end()) {
    return gatewayError(ReplyCode::kNotFound, "no gateway '" + gateway_name + "'");
  }
  GatewayRecord& record = it->second;
  if (record.enabled == enabled) {
    return {.code = ReplyCode::kOk, .gateways = {record}, .duplicate = true};
  }
  record.enabled = enabled;
  touchedGateway(gateway_name);
  return {.code = ReplyCode::kOk, .gateways = {record}};
}

GatewayReply ShardRegistry::rotateGatewayKey(const std::string& gateway_name,
                                             const PublicKey& new_key, uint64_t overlap_ms,
                                             uint64_t now_ms) {
  auto it = gateways_.find(gateway_name);
  if (it == gateways_.end()) {
    return gatewayError(ReplyCode::kNotFound, "no gateway '" + gateway_name + "'");
  }
  if (new_key == PublicKey{}) {
    return gatewayError(ReplyCode::kInvalidArgument, "public key must be set");
  }
  if (overlap_ms > limits::kGatewayKeyOverlapMsMax) {
    return gatewayError(
        ReplyCode::kInvalidArgument,
        "overlap must be at most " + std::to_string(limits::kGatewayKeyOverlapMsMax) + " ms");
  }
  GatewayRecord& record = it->second;
  if (record.public_key == new_key) {  // a repeat (or a rotation to the key it has)
    return {.code = ReplyCode::kOk, .gateways = {record}, .duplicate = true};
  }
  if (const GatewayRecord* other = gatewayWithKey(new_key);
      other != nullptr && other->gateway_name != gateway_name) {
    return gatewayError(ReplyCode::kInvalidArgument, "the key is gateway '" + other->gateway_name +
                                                         "'s; a key is one gateway's");
  }
  // The previous key is the one the gateway has been using: kept if a rotation is under way.
  const bool rotating = record.previous_public_key != PublicKey{} &&
                        now_ms < record.previous_key_until_ms &&
                        record.previous_public_key != new_key;
  if (!rotating) record.previous_public_key = record.public_key;
  record.public_key = new_key;
  record.previous_key_until_ms = now_ms + overlap_ms;  // overlap_ms is bounded: no overflow
  if (overlap_ms == 0) {
    record.previous_public_key = PublicKey{};
    record.previous_key_until_ms = 0;
  }
  touchedGateway(gateway_name);
  return {.code = ReplyCode::kOk, .gateways = {record}};
}

std::optional<PublicKey> ShardRegistry::endKeyOverlap(const std::string& gateway_name,
                                                      uint64_t now_ms) {
  auto it = gateways_.find(gateway_name);
  if (it == gateways_.end() || it->second.previous_public_key == PublicKey{}) return std::nullopt;
  GatewayRecord& record = it->second;
  const PublicKey previous = record.previous_public_key;
  const bool admitted = now_ms < record.previous_key_until_ms;
  record.previous_public_key = PublicKey{};
  record.previous_key_until_ms = 0;
  touchedGateway(gateway_name);
  if (!admitted) return std::nullopt;
  return previous;
}

const GatewayRecord* ShardRegistry::findGateway(const std::string& gateway_name) const {
  auto it = gateways_.find(gateway_name);
  return it == gateways_.end() ? nullptr : &it->second;
}

}  // namespace tally
