// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/README.md):
//
//   fuzz_make_corpus SOURCE_DIR OUT_DIR
//
// The seeds are real traffic: request frames made by the production encoders (wire/codec.h) for
// every request kind the gateway, the agent and tallyctl send; the ledger's answers computed by a
// real Ledger through LedgerRequests (as tally-ledger answers them); shard issue requests, grants
// and reports signed with the fuzz targets' fixed keys; the repository's own policy and config
// files. Deterministic: the same tree writes the same bytes.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/ledger.h"
#include "core/ledger_requests.h"
#include "ctl/policy_toml.h"
#include "net/tls_session.h"
#include "shard/crypto.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/codec.h"
#include "wire/digest.h"
#include "wire/frame.h"

using namespace tally;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

fs::path g_out;

void write(const std::string& target, const std::string& name, const Bytes& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream file(dir / name, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  if (!file) fuzz::fail("cannot write", (dir / name).string());
}

Bytes readFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fuzz::fail("cannot read", path.string());
  return Bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }

// A request frame's payload (without the length header).
Bytes requestPayload(uint64_t id, wire::RequestBody body) {
  const Bytes frame = fuzz::encodeCall(wire::Request{.request_id = id, .body = std::move(body)});
  return Bytes(frame.begin() + wire::kFrameHeaderBytes, frame.end());
}
Bytes responsePayload(uint64_t id, wire::ResponseBody body) {
  const Bytes frame = fuzz::encodeAnswer(wire::Response{.request_id = id, .body = std::move(body)});
  return Bytes(frame.begin() + wire::kFrameHeaderBytes, frame.end());
}

void append(Bytes* out, const Bytes& more) { out->insert(out->end(), more.begin(), more.end()); }
void appendU16(Bytes* out, size_t value) {
  if (value > 0xffff) fuzz::fail("seed record too long");
  out->push_back(static_cast<uint8_t>(value));
  out->push_back(static_cast<uint8_t>(value >> 8));
}
// One [flags][u16 length][payload] record of the ledger and agent targets.
void appendRecord(Bytes* out, uint8_t op, const Bytes& payload) {
  out->push_back(op);
  appendU16(out, payload.size());
  append(out, payload);
}

ReserveRequest reserve(const std::string& id, const std::string& subject, const std::string& route,
                       Units units) {
  ReserveRequest request{.reservation_id = id, .subject = subject, .route = route, .units = units};
  request.request_digest = wire::canonicalRequestDigest(request);
  return request;
}

// --- the ledger's traffic --------------------------------------------------------------------

// Flows a gateway, an agent and tallyctl send, as ledger request sequences.
std::vector<std::pair<std::string, std::vector<wire::RequestBody>>> ledgerFlows() {
  const Policy policy = fuzz::fuzzPolicy();
  ShardIssueRequest issue{.request_id = "issue-1",
                          .gateway_name = std::string(fuzz::kGatewayName),
                          .gateway_id = fuzz::gatewayKey().public_key,
                          .gateway_boot_epoch = 1,
                          .subject = "tenant-a",
                          .route = "chat"};
  wire::signIssueRequest(fuzz::gatewayKey(), &issue);
  return {
      {"reserve_start_settle",
       {reserve("r-1", "tenant-a", "chat", 10), StartRequest{"r-1", "op-1"},
        SettleRequest{"r-1", "op-1", 7}, QueryRequest{"r-1"}}},
      {"reserve_release_repeat",
       {reserve("r-2", "tenant-b", "embed", 2), ReleaseRequest{"r-2"}, ReleaseRequest{"r-2"},
        reserve("r-2", "tenant-b", "embed", 2)}},
      {"unknown_then_receipt",
       {reserve("r-3", "tenant-a", "chat", 50), StartRequest{"r-3", "op-3"},
        MarkUnknownRequest{"r-3", "op-3"}, ReportOperationRequest{"r-3", "op-3", 80},
        QueryRequest{"r-3"}}},
      {"rejected_and_overdraft",
       {reserve("r-4", "tenant-a", "chat", 600), reserve("r-5", "tenant-a", "chat", 500),
        StartRequest{"r-5", "op-5"}, SettleRequest{"r-5", "op-5", 540}}},
      {"policy_admin",
       {wire::PublishPolicyRequest{.budgets = policy.budgets}, wire::ShowPolicyRequest{},
        wire::RollbackPolicyRequest{}, wire::ShowPolicyRequest{.generation = 1},
        wire::AuditRequest{}, wire::AuditRequest{.subject = "tenant-a", .route = "chat"},
        wire::AuditRequest{.list_periods = true}, wire::HealthRequest{}}},
      {"gateway_admin",
       {wire::EnrollGatewayRequest{.gateway_name = "gw-2",
                                   .public_key = fuzz::ledgerKey().public_key},
        wire::ListGatewaysRequest{},
        wire::SetGatewayEnabledRequest{.gateway_name = "gw-2", .enabled = false},
        wire::SetGatewayEnabledRequest{.gateway_name = "gw-2", .enabled = true}}},
      {"operator_admin",
       {EnrollOperatorRequest{.operator_name = "ro",
                              .public_key = fuzz::gatewayKey().public_key,
                              .role = OperatorRole::kAudit},
        EnrollOperatorRequest{
            .operator_name = "ops", .public_key = {7}, .role = OperatorRole::kShards},
        ListOperatorsRequest{}, SetOperatorEnabledRequest{.operator_name = "ops", .enabled = false},
        AuditLogRequest{}, AuditLogRequest{.after_sequence = 1, .entries_max = 1}}},
      {"shards",
       {issue, wire::ShardStatusRequest{.gateway_name = std::string(fuzz::kGatewayName)},
        wire::ListShardsRequest{}, wire::RevokeShardsRequest{.gateway_name = "gw-2"},
        wire::WriteOffShardRequest{.shard_id = "shard-1"}}},
  };
}

// Runs `flow` through a real ledger (as the ledger target builds it) and returns the replies.
std::vector<wire::ResponseBody> answersOf(const std::vector<wire::RequestBody>& flow,
                                          std::optional<ShardGrant>* grant) {
  static const wire::WireShardCrypto crypto(fuzz::ledgerKey(), {});
  Ledger ledger(LedgerOptions{.retention_ms = 60'000});
  ledger.setShardCrypto(&crypto);
  (void)ledger.publishPolicy(fuzz::fuzzPolicy(), fuzz::kT0Ms);
  (void)ledger.enrollGateway(std::string(fuzz::kGatewayName), fuzz::gatewayKey().public_key,
                             fuzz::kT0Ms);
  LedgerRequests requests(&ledger, "fuzz");
  std::vector<wire::ResponseBody> answers;
  for (const wire::RequestBody& body : flow) {
    LedgerOutcome outcome = requests.apply(body, fuzz::kT0Ms);
    if (const auto* shards = std::get_if<ShardReply>(&outcome.reply)) {
      if (!shards->shards.empty() && grant != nullptr && !grant->has_value()) {
        *grant = shards->shards.front().grant;
      }
    }
    answers.push_back(
        std::visit([](auto&& reply) -> wire::ResponseBody { return std::move(reply); },
                   std::move(outcome.reply)));
  }
  return answers;
}

ShardReport reportOf(const ShardGrant& grant) {
  Reservation settled{.reservation_id = "s-1",
                      .subject = grant.subject,
                      .route = grant.route,
                      .policy_generation = grant.policy_generation,
                      .reserved_units = 10,
                      .actual_units = 6,
                      .refunded_units = 4,
                      .operation_id = "op-s-1",
                      .created_at_ms = grant.issued_at_ms,
                      .expires_at_ms = grant.issued_at_ms + 30'000,
                      .started_at_ms = grant.issued_at_ms + 1,
                      .closed_at_ms = grant.issued_at_ms + 2,
                      .state = ReservationState::kSettled,
                      .origin = grant.shard_id};
  ShardReport report{.shard = grant,
                     .balances = {.allocated = grant.allocated_units,
                                  .local_available = grant.allocated_units - 6,
                                  .local_spent = 6},
                     .receipts = {settled},
                     .gateway_boot_epoch = grant.gateway_boot_epoch,
                     .reported_at_ms = grant.issued_at_ms + 10};
  wire::signReport(fuzz::gatewayKey(), &report);
  return report;
}

void ledgerAndFrameSeeds() {
  std::optional<ShardGrant> grant;
  Bytes all_frames = {16, 0};  // frame_decoder: frame_bytes_max 1025, cut pattern 0
  for (const auto& [name, flow] : ledgerFlows()) {
    Bytes ledger_seed;
    Bytes frames = {255, static_cast<uint8_t>(name.size())};
    uint64_t id = 1;
    for (const wire::RequestBody& body : flow) {
      const Bytes payload = requestPayload(id++, body);
      appendRecord(&ledger_seed, 0x41, payload);  // 500 ms later, tick after
      const Bytes frame = fuzz::encodeCall(wire::Request{.request_id = id, .body = body});
      append(&frames, frame);
      append(&all_frames, frame);
    }
    write("ledger_requests", name, ledger_seed);
    write("frame_decoder", name, frames);
    (void)answersOf(flow, &grant);
  }
  write("frame_decoder", "all_flows_small_limit", all_frames);
  Bytes partial = {255, 3};
  const Bytes frame =
      fuzz::encodeCall(wire::Request{.request_id = 9, .body = wire::HealthRequest{}});
  append(&partial, frame);
  partial.insert(partial.end(), frame.begin(), frame.begin() + 6);
  write("frame_decoder", "trailing_partial_frame", partial);
  write("frame_decoder", "zero_length", {255, 0, 0, 0, 0, 0});
  write("frame_decoder", "oversized_length", {0, 0, 0xff, 0xff, 0xff, 0x7f});

  if (!grant.has_value()) fuzz::fail("the shards flow issued no shard");
  // Issue, then report the shard the ledger issued (flags: re-sign, use the last grant).
  const ShardReport report = reportOf(*grant);
  Bytes shard_seed;
  appendRecord(&shard_seed, 0x10, requestPayload(1, ledgerFlows().back().second.front()));
  appendRecord(&shard_seed, 0x0f, requestPayload(2, wire::ListShardsRequest{}));
  appendRecord(&shard_seed, 0x30, requestPayload(3, report));
  appendRecord(&shard_seed, 0x40, requestPayload(4, wire::AuditRequest{}));
  write("ledger_requests", "shard_issue_report", shard_seed);

  // shard_verify: [mode][payload]: as received, and to be re-signed.
  for (uint8_t mode : {0, 2}) {
    Bytes issue_seed = {mode};
    append(&issue_seed, requestPayload(1, ledgerFlows().back().second.front()));
    write("shard_verify", "issue_request_mode" + std::to_string(mode), issue_seed);
    Bytes report_seed = {mode};
    append(&report_seed, requestPayload(2, report));
    write("shard_verify", "report_mode" + std::to_string(mode), report_seed);
  }
  Bytes reply_seed = {1};
  ShardReply reply{.shards = {ShardLedgerView{.grant = *grant}}};
  append(&reply_seed, responsePayload(1, reply));
  write("shard_verify", "issue_reply", reply_seed);
}

// --- the agent's traffic: gateway requests and the ledger's real answers ---------------------

void agentSeeds() {
  for (const auto& [name, flow] : ledgerFlows()) {
    const std::vector<wire::ResponseBody> answers = answersOf(flow, nullptr);
    Bytes seed;
    uint64_t id = 1;
    for (size_t i = 0; i < flow.size(); ++i) {
      appendRecord(&seed, 0, requestPayload(id, flow[i]));  // a gateway request
      seed.push_back(5);                                    // end of the loop iteration
      seed.push_back(1);                                    // answer the oldest call …
      seed.push_back(0);
      const Bytes answer = responsePayload(id, answers[i]);
      appendU16(&seed, answer.size());
      append(&seed, answer);  // … with the ledger's answer
      ++id;
    }
    write("agent_core", name, seed);
  }
  // The link goes down mid-flow: queued follow-ups, then it comes back and delivers.
  const std::vector<wire::RequestBody> flow = ledgerFlows().front().second;
  const std::vector<wire::ResponseBody> answers = answersOf(flow, nullptr);
  Bytes seed;
  appendRecord(&seed, 0, requestPayload(1, flow[0]));
  seed.insert(seed.end(), {5, 1, 0});
  const Bytes answer = responsePayload(1, answers[0]);
  appendU16(&seed, answer.size());
  append(&seed, answer);
  seed.insert(seed.end(), {6, 4});  // disconnected, partitioned
  appendRecord(&seed, 0, requestPayload(2, flow[1]));
  appendRecord(&seed, 0, requestPayload(3, flow[2]));
  seed.insert(seed.end(), {5, 4, 20, 6, 1, 5, 4, 20, 2, 0, 4, 100});
  write("agent_core", "partition_outbox", seed);
}

// --- files -----------------------------------------------------------------------------------

void fileSeeds(const fs::path& source) {
  write("policy_toml", "example", readFile(source / "examples/policy.toml"));
  write("policy_toml", "written", text(ctl::policyToToml(fuzz::fuzzPolicy())));
  write("ledger_config", "packaged", readFile(source / "packaging/config/ledger.toml"));
  write("ledger_config", "every_key",
        text("listen = \"127.0.0.1:0\"\nframe_bytes_max = 1048576\nretention_ms = 86400000\n"
             "tick_interval_ms = 10\ncheckpoint_log_rows = 1024\nlog_level = \"debug\"\n"
             "metrics = \"\"\nsigning_key_file = \"/tmp/k\"\n"));
  write("agent_config", "packaged", readFile(source / "packaging/config/agent.toml"));
  write("agent_config", "every_table",
        text("socket = \"/tmp/a.sock\"\nsocket_mode = 0o660\nallowed_uids = [1000]\n"
             "allowed_gids = [1000]\nmetrics_listen = \"127.0.0.1:0\"\n"
             "request_timeout_ms = 2000\noutbox_entries_max = 1000\npolicy_refresh_ms = 5000\n"
             "drain_timeout_ms = 5000\nlog_level = \"info\"\ngateway_name = \"gw-1\"\n"
             "ledger_public_keys = [\"" +
             std::string(44, 'A') +
             "\"]\n[emergency]\naccounts = [\"tenant-a chat\"]\nshards_on_hand = 1\n"
             "refresh_before_expiry_ms = 30000\nhold_ttl_ms = 30000\naccounts_max = 10\n"
             "[health]\nfailures_to_degrade = 1\nfailures_to_partition = 3\n"
             "slow_request_us = 100000\npartition_after_ms = 3000\nsuccesses_to_recover = 3\n"));
}

// --- the TLS boundary: real flights of a handshake (random per run: TLS draws fresh randoms) --

void tlsSeeds() {
  auto make = [](net::TlsRole role, const identity::KeyPair& key, const PublicKey& pinned) {
    Result<std::unique_ptr<net::TlsSession>> created = net::TlsSession::create(
        net::TlsOptions{.role = role, .key = key, .accept_peer = [pinned](const PublicKey& k) {
                          return k == pinned;
                        }});
    if (!created.isOk() || !created.value()->start().isOk()) fuzz::fail("TLS session");
    return std::move(created).value();
  };
  auto client = make(net::TlsRole::kClient, fuzz::gatewayKey(), fuzz::ledgerKey().public_key);
  auto server = make(net::TlsRole::kServer, fuzz::ledgerKey(), fuzz::gatewayKey().public_key);
  // One piece per feed: the length byte 255 makes pieces of 1 + 255 * 4 bytes.
  auto seed = [](uint8_t mode, const Bytes& bytes) {
    Bytes out = {mode};
    for (size_t at = 0; at < bytes.size(); at += 1021) {
      out.push_back(255);
      out.insert(out.end(), bytes.begin() + static_cast<ptrdiff_t>(at),
                 bytes.begin() + static_cast<ptrdiff_t>(std::min(bytes.size(), at + 1021)));
    }
    return out;
  };
  const Bytes hello = client->takeCiphertext();
  write("tls_session", "client_hello", seed(0, hello));
  if (!server->feed(hello).isOk()) fuzz::fail("server refused the ClientHello");
  const Bytes server_flight = server->takeCiphertext();
  write("tls_session", "server_flight", seed(1, server_flight));
  if (!client->feed(server_flight).isOk()) fuzz::fail("client refused the server's flight");
  const Bytes client_finished = client->takeCiphertext();
  Bytes both = hello;
  append(&both, client_finished);
  write("tls_session", "client_flights", seed(0, both));
  if (!server->feed(client_finished).isOk() || !server->handshakeDone()) fuzz::fail("handshake");
  if (!client->write(requestPayload(1, wire::HealthRequest{})).isOk()) fuzz::fail("TLS write");
  // An application record of another session: mode 2 must refuse it.
  write("tls_session", "foreign_record", seed(2, client->takeCiphertext()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_make_corpus SOURCE_DIR OUT_DIR\n");
    return 2;
  }
  g_out = argv[2];
  ledgerAndFrameSeeds();
  agentSeeds();
  fileSeeds(argv[1]);
  tlsSeeds();
  std::printf("fuzz_make_corpus: wrote %s\n", g_out.c_str());
  return 0;
}
