#include "shard/crypto.h"

#include <capnp/message.h>

#include "core/assert.h"
#include "wire/codec.h"
#include "wire/scratch_message.h"

namespace tally::wire {
namespace {

template <typename Schema, typename Core, typename Clear>
std::string signedBytes(std::string_view prefix, const Core& value, Clear clear_signature) {
  ScratchMessage message;
  auto root = message.builder().initRoot<Schema>();
  fromCore(value, root);
  clear_signature(root);
  kj::Array<capnp::word> words = capnp::canonicalize(root.asReader());
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  std::string out;
  out.reserve(prefix.size() + 1 + bytes.size());
  out.append(prefix);
  out.push_back('\0');
  out.append(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  return out;
}

}  // namespace

std::string grantSignedBytes(const ShardGrant& grant) {
  return signedBytes<schema::EmergencyShardV1>(
      kGrantSignaturePrefix, grant,
      [](schema::EmergencyShardV1::Builder builder) { (void)builder.disownSignature(); });
}

std::string issueRequestSignedBytes(const ShardIssueRequest& request) {
  return signedBytes<schema::ShardIssueRequestV1>(
      kIssueSignaturePrefix, request,
      [](schema::ShardIssueRequestV1::Builder builder) { (void)builder.disownSignature(); });
}

std::string reportSignedBytes(const ShardReport& report) {
  return signedBytes<schema::ShardReportV1>(
      kReportSignaturePrefix, report,
      [](schema::ShardReportV1::Builder builder) { (void)builder.disownSignature(); });
}

void signGrant(const identity::KeyPair& ledger_key, ShardGrant* grant) {
  grant->ledger_key_id = identity::keyIdOf(ledger_key.public_key);
  grant->signature = identity::signDetached(ledger_key, grantSignedBytes(*grant));
}

void signIssueRequest(const identity::KeyPair& gateway_key, ShardIssueRequest* request) {
  request->signature = identity::signDetached(gateway_key, issueRequestSignedBytes(*request));
}

void signReport(const identity::KeyPair& gateway_key, ShardReport* report) {
  report->signature = identity::signDetached(gateway_key, reportSignedBytes(*report));
}

bool verifyIssueRequestSignature(const ShardIssueRequest& request) {
  return identity::verifyDetached(request.gateway_id, request.signature,
                                  issueRequestSignedBytes(request));
}

bool verifyReportSignature(const ShardReport& report) {
  return identity::verifyDetached(report.shard.gateway_id, report.signature,
                                  reportSignedBytes(report));
}

WireShardCrypto::WireShardCrypto(std::optional<identity::KeyPair> ledger_key,
                                 const std::vector<PublicKey>& trusted_ledger_keys)
    : ledger_key_(std::move(ledger_key)) {
  for (const PublicKey& key : trusted_ledger_keys) {
    trusted_by_key_id_[identity::keyIdOf(key)] = key;
  }
  if (ledger_key_) {
    trusted_by_key_id_[identity::keyIdOf(ledger_key_->public_key)] = ledger_key_->public_key;
  }
}

void WireShardCrypto::signGrant(ShardGrant* grant) const {
  TALLY_ASSERT(ledger_key_.has_value());  // only the ledger signs grants, and it has a key
  wire::signGrant(*ledger_key_, grant);
}

bool WireShardCrypto::verifyGrant(const ShardGrant& grant) const {
  const auto trusted = trusted_by_key_id_.find(grant.ledger_key_id);
  if (trusted == trusted_by_key_id_.end()) return false;
  return identity::verifyDetached(trusted->second, grant.signature, grantSignedBytes(grant));
}

bool WireShardCrypto::verifyIssueRequest(const ShardIssueRequest& request) const {
  return verifyIssueRequestSignature(request);
}

bool WireShardCrypto::verifyReport(const ShardReport& report) const {
  return verifyReportSignature(report);
}

}  // namespace tally::wire
