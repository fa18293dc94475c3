// Shard grant and reconciliation-report verification (shard/crypto.h, core/shard_report_check.h),
// as the ledger applies it to an agent's issue requests and reports and the agent to the grants
// in the ledger's answers.
//
// Input: [mode u8][frame payload]. Mode bit 0: the payload is a request (an issue request or a
// report, as the ledger receives them) or a response (a ShardReply, whose grants the agent
// verifies). Mode bit 1: the decoded message is first re-signed with the fixed keys, so the
// checks past the signature are reached.
//
// Checks: no crash or assertion; a signature verifies exactly when it was made over the decoded
// value (re-signed: it verifies; one bit of it flipped: it does not); the signed bytes are the
// same after an encode/decode round trip (signer and verifier hash the same bytes whatever the
// peer's encoder produced); a report's consistency and conflict checks answer without crashing
// against the record of its own grant, as reported and as just issued.

#include <string>
#include <variant>

#include "core/shard_record.h"
#include "core/shard_report_check.h"
#include "shard/crypto.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/codec.h"
#include "wire/frame.h"

using namespace tally;

namespace {

const wire::WireShardCrypto& ledgerCrypto() {
  static const wire::WireShardCrypto crypto(fuzz::ledgerKey(), {});
  return crypto;
}

const wire::WireShardCrypto& agentCrypto() {
  static const wire::WireShardCrypto crypto(std::nullopt, {fuzz::ledgerKey().public_key});
  return crypto;
}

template <typename T>
void expectFlippedFails(T value, bool (*verify)(const T&)) {
  value.signature[value.signature.size() - 1] ^= 1;
  if (verify(value)) fuzz::fail("a signature with a flipped bit verifies");
}

bool verifyGrantAsAgent(const ShardGrant& grant) { return agentCrypto().verifyGrant(grant); }
bool verifyIssue(const ShardIssueRequest& request) {
  return ledgerCrypto().verifyIssueRequest(request);
}
bool verifyReport(const ShardReport& report) { return ledgerCrypto().verifyReport(report); }

void checkGrant(ShardGrant grant, bool resign) {
  const bool verified = agentCrypto().verifyGrant(grant);
  if (resign || verified) {
    if (resign) ledgerCrypto().signGrant(&grant);
    if (!verifyGrantAsAgent(grant)) fuzz::fail("a grant the ledger signed does not verify");
    expectFlippedFails(grant, verifyGrantAsAgent);
  }
}

// The signed bytes of what we decode equal those of the same value after our encoder and decoder.
void checkSignedBytesStable(const wire::RequestBody& body) {
  const std::vector<uint8_t> frame = fuzz::encodeCall(wire::Request{.request_id = 1, .body = body});
  wire::DecodedRequest back =
      wire::decodeRequest(std::span<const uint8_t>(frame).subspan(wire::kFrameHeaderBytes));
  if (!back.body.isOk()) fuzz::fail("re-encoded request does not decode");
  if (const auto* issue = std::get_if<ShardIssueRequest>(&body)) {
    const auto* again = std::get_if<ShardIssueRequest>(&back.body.value());
    if (again == nullptr ||
        wire::issueRequestSignedBytes(*issue) != wire::issueRequestSignedBytes(*again)) {
      fuzz::fail("issue request signed bytes change across encode/decode");
    }
  } else if (const auto* report = std::get_if<ShardReport>(&body)) {
    const auto* again = std::get_if<ShardReport>(&back.body.value());
    if (again == nullptr || wire::reportSignedBytes(*report) != wire::reportSignedBytes(*again) ||
        wire::grantSignedBytes(report->shard) != wire::grantSignedBytes(again->shard)) {
      fuzz::fail("report signed bytes change across encode/decode");
    }
  }
}

void checkRequest(wire::RequestBody body, bool resign) {
  if (auto* issue = std::get_if<ShardIssueRequest>(&body)) {
    if (resign) {
      issue->gateway_id = fuzz::gatewayKey().public_key;
      wire::signIssueRequest(fuzz::gatewayKey(), issue);
    }
    if (verifyIssue(*issue))
      expectFlippedFails(*issue, verifyIssue);
    else if (resign)
      fuzz::fail("an issue request the gateway signed does not verify");
  } else if (auto* report = std::get_if<ShardReport>(&body)) {
    if (resign) {
      report->shard.gateway_id = fuzz::gatewayKey().public_key;
      ledgerCrypto().signGrant(&report->shard);
      wire::signReport(fuzz::gatewayKey(), report);
    }
    checkGrant(report->shard, false);
    if (verifyReport(*report))
      expectFlippedFails(*report, verifyReport);
    else if (resign)
      fuzz::fail("a report the gateway signed does not verify");
    (void)checkReportConsistency(*report, 10'000);
    ShardRecord issued{.grant = report->shard};
    (void)findReportConflict(issued, *report);
    ShardRecord reported{.grant = report->shard,
                         .state = ShardState::kReconciling,
                         .reported = true,
                         .last_reported = report->balances,
                         .receipts = sortedReceipts(report->receipts)};
    (void)findReportConflict(reported, *report);
    (void)unionReceipts(reported.receipts, report->receipts);
    (void)settledUsage(report->receipts);
  } else {
    return;
  }
  checkSignedBytesStable(body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzBytes in(data, size);
  const uint8_t mode = in.u8();
  const bool resign = (mode & 2) != 0;
  const std::span<const uint8_t> payload = in.rest();
  if ((mode & 1) == 0) {
    wire::DecodedRequest decoded = wire::decodeRequest(payload);
    if (decoded.body.isOk()) checkRequest(std::move(decoded.body).value(), resign);
  } else {
    Result<wire::Response> decoded = wire::decodeResponse(payload);
    if (!decoded.isOk()) return 0;
    if (const auto* reply = std::get_if<ShardReply>(&decoded.value().body)) {
      for (const ShardLedgerView& view : reply->shards) checkGrant(view.grant, resign);
    }
  }
  return 0;
}
