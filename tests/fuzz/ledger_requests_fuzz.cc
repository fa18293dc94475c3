// Every request handler of tally-ledger: bytes in → decodeRequest → LedgerRequests::apply (the
// core the server calls, core/ledger_requests.h) → the reply's bytes out, over a Ledger that
// starts with a published policy and one enrolled gateway, and lives for the whole input so that
// sequences (reserve → start → settle, shard issue → report, publish → rollback) are reached.
//
// Input: records of [flags u8][length u16][request frame payload]. flags bits 0-3 advance the
// clock (15: an hour, so accounting periods close); bit 4 re-signs a shard issue request or report
// with the enrolled gateway's key (the fuzzer cannot forge Ed25519); bit 5 replaces a report's
// grant with the last grant the ledger issued (re-signed reports then reach reconciliation);
// bit 6 runs the tick after the request.
//
// Checks: every reply encodes and decodes back (fuzz::encodeAnswer); nothing asserts (TALLY_ASSERT
// aborts); the ledger's audit conserves after every request.

#include <optional>
#include <string>
#include <variant>

#include "core/ledger.h"
#include "core/ledger_requests.h"
#include "shard/crypto.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/codec.h"

using namespace tally;

namespace {

wire::ResponseBody responseBodyOf(LedgerReply&& reply) {
  return std::visit([](auto&& body) -> wire::ResponseBody { return std::move(body); },
                    std::move(reply));
}

void resign(wire::RequestBody* body, uint8_t flags, const std::optional<ShardGrant>& last_grant) {
  static const wire::WireShardCrypto crypto(fuzz::ledgerKey(), {});
  if (auto* issue = std::get_if<ShardIssueRequest>(body)) {
    issue->gateway_id = fuzz::gatewayKey().public_key;
    wire::signIssueRequest(fuzz::gatewayKey(), issue);
  } else if (auto* report = std::get_if<ShardReport>(body)) {
    if ((flags & 0x20) != 0 && last_grant.has_value()) report->shard = *last_grant;
    report->shard.gateway_id = fuzz::gatewayKey().public_key;
    if ((flags & 0x20) == 0) crypto.signGrant(&report->shard);
    wire::signReport(fuzz::gatewayKey(), report);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const wire::WireShardCrypto crypto(fuzz::ledgerKey(), {});
  Ledger ledger(LedgerOptions{.retention_ms = 60'000});
  ledger.setShardCrypto(&crypto);
  uint64_t now_ms = fuzz::kT0Ms;
  if (ledger.publishPolicy(fuzz::fuzzPolicy(), now_ms).code != ReplyCode::kOk) {
    fuzz::fail("the fuzz policy does not publish");
  }
  if (ledger.enrollGateway(std::string(fuzz::kGatewayName), fuzz::gatewayKey().public_key, now_ms)
          .code != ReplyCode::kOk) {
    fuzz::fail("the fuzz gateway does not enroll");
  }
  (void)ledger.takeChangedRows();
  LedgerRequests requests(&ledger, "fuzz");
  std::optional<ShardGrant> last_grant;

  fuzz::FuzzBytes in(data, size);
  while (!in.empty()) {
    const uint8_t flags = in.u8();
    const std::span<const uint8_t> frame = in.bytes(in.u16());
    const uint64_t step = flags & 0x0f;
    now_ms += step == 15 ? 3'600'000 : step * 500;

    wire::DecodedRequest decoded = wire::decodeRequest(frame);
    wire::Response response{.request_id = decoded.request_id.value_or(0)};
    if (!decoded.body.isOk()) {
      response.body = wire::errorReplyFor(decoded.body.status());
    } else {
      wire::RequestBody body = std::move(decoded.body).value();
      if ((flags & 0x10) != 0) resign(&body, flags, last_grant);
      LedgerOutcome outcome = requests.apply(body, now_ms);
      if (const auto* shards = std::get_if<ShardReply>(&outcome.reply)) {
        if (std::holds_alternative<ShardIssueRequest>(body) && shards->code == ReplyCode::kOk &&
            !shards->shards.empty()) {
          last_grant = shards->shards.front().grant;
        }
      }
      response.body = responseBodyOf(std::move(outcome.reply));
    }
    (void)fuzz::encodeAnswer(response);
    (void)ledger.takeChangedRows();
    if ((flags & 0x40) != 0) {
      (void)ledger.tick(now_ms);
      (void)ledger.takeChangedRows();
    }
    const AuditReport audit = ledger.audit(now_ms);
    if (!audit.conserved) fuzz::fail("the ledger's audit does not conserve");
  }
  return 0;
}
