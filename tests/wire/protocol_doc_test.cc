// docs/protocol.md is tested against the contract: every request and reply kind, every field of
// the gateway-facing messages and every enumerant of their codes is named in it (read from the
// generated code's schema reflection, so the list cannot drift from schemas/), and its wire
// examples are exactly the bytes today's encoder produces.

#include <gtest/gtest.h>

#include <capnp/schema.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "schemas/limit_reservation.capnp.h"
#include "schemas/protocol.capnp.h"
#include "wire/codec.h"
#include "wire/digest.h"
#include "wire/frame.h"

#ifndef TALLY_SOURCE_DIR
#error "TALLY_SOURCE_DIR must be defined (tests/wire/CMakeLists.txt)"
#endif

namespace tally::wire {
namespace {

std::string readDoc() {
  std::ifstream in(std::string(TALLY_SOURCE_DIR) + "/docs/protocol.md");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text under the first heading that names `title` in backticks, up to the next heading of
// the same or a higher level. Empty if there is no such heading.
std::string section(const std::string& doc, const std::string& title) {
  std::istringstream lines(doc);
  std::string line;
  std::string out;
  size_t level = 0;
  while (std::getline(lines, line)) {
    const size_t hashes = line.find_first_not_of('#');
    const bool heading = hashes != std::string::npos && hashes > 0 && line[hashes] == ' ';
    if (level == 0) {
      if (heading && line.find("`" + title + "`") != std::string::npos) level = hashes;
      continue;
    }
    if (heading && hashes <= level) break;
    out += line + "\n";
  }
  return out;
}

// The names of `schema`'s enumerants that `text` does not mention in backticks.
std::vector<std::string> missingEnumerants(const std::string& text, capnp::EnumSchema schema) {
  std::vector<std::string> missing;
  for (capnp::EnumSchema::Enumerant enumerant : schema.getEnumerants()) {
    const std::string name = enumerant.getProto().getName().cStr();
    if (text.find("`" + name + "`") == std::string::npos) missing.push_back(name);
  }
  return missing;
}

template <typename Fields>
std::vector<std::string> missingFields(const std::string& text, Fields list) {
  std::vector<std::string> missing;
  for (capnp::StructSchema::Field field : list) {
    const std::string name = field.getProto().getName().cStr();
    if (text.find("`" + name + "`") == std::string::npos) missing.push_back(name);
  }
  return missing;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

TEST(ProtocolDocTest, DocumentsEveryEnumerantOfEveryCodeInItsOwnSection) {
  const std::string doc = readDoc();
  ASSERT_FALSE(doc.empty()) << "docs/protocol.md not found under " << TALLY_SOURCE_DIR;
  const std::pair<const char*, capnp::EnumSchema> enums[] = {
      {"ReplyCode", capnp::Schema::from<schema::ReplyCode>()},
      {"ErrorCode", capnp::Schema::from<schema::ErrorCode>()},
      {"ReservationState", capnp::Schema::from<schema::ReservationState>()},
      {"LimitingDimension", capnp::Schema::from<schema::LimitingDimension>()},
  };
  for (const auto& [title, schema] : enums) {
    const std::string text = section(doc, title);
    ASSERT_FALSE(text.empty()) << "no section headed `" << title << "`";
    EXPECT_EQ(joined(missingEnumerants(text, schema)), "")
        << "enumerants of " << title << " not documented in its section";
  }
}

TEST(ProtocolDocTest, DocumentsEveryRequestAndReplyKind) {
  const std::string doc = readDoc();
  const std::string requests = section(doc, "Request");
  const std::string replies = section(doc, "Response");
  ASSERT_FALSE(requests.empty()) << "no section headed `Request`";
  ASSERT_FALSE(replies.empty()) << "no section headed `Response`";
  EXPECT_EQ(
      joined(missingFields(requests, capnp::Schema::from<schema::Request>().getUnionFields())), "")
      << "Request union members not documented under `Request`";
  EXPECT_EQ(
      joined(missingFields(replies, capnp::Schema::from<schema::Response>().getUnionFields())), "")
      << "Response union members not documented under `Response`";
}

TEST(ProtocolDocTest, DocumentsEveryFieldOfTheGatewayMessages) {
  const std::string doc = readDoc();
  const std::pair<const char*, capnp::StructSchema> structs[] = {
      {"Request", capnp::Schema::from<schema::Request>()},
      {"Response", capnp::Schema::from<schema::Response>()},
      {"ReserveRequest", capnp::Schema::from<schema::ReserveRequest>()},
      {"StartRequest", capnp::Schema::from<schema::StartRequest>()},
      {"SettleRequest", capnp::Schema::from<schema::SettleRequest>()},
      {"ReleaseRequest", capnp::Schema::from<schema::ReleaseRequest>()},
      {"MarkUnknownRequest", capnp::Schema::from<schema::MarkUnknownRequest>()},
      {"ReportOperationRequest", capnp::Schema::from<schema::ReportOperationRequest>()},
      {"QueryRequest", capnp::Schema::from<schema::QueryRequest>()},
      {"ExtendRequest", capnp::Schema::from<schema::ExtendRequest>()},
      {"ReservationReply", capnp::Schema::from<schema::ReservationReply>()},
      {"LimitReservationV1", capnp::Schema::from<schema::LimitReservationV1>()},
      {"ErrorReply", capnp::Schema::from<schema::ErrorReply>()},
      {"HealthReply", capnp::Schema::from<schema::HealthReply>()},
  };
  for (const auto& [title, schema] : structs) {
    EXPECT_EQ(joined(missingFields(doc, schema.getNonUnionFields())), "")
        << "fields of " << title << " not documented";
  }
}

// --- The wire examples ---------------------------------------------------------------------

// 16 bytes a line: offset (4 hex digits), two spaces, the bytes separated by spaces.
std::string hexDump(const std::vector<uint8_t>& bytes) {
  std::string out;
  char buffer[24];
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i % 16 == 0) {
      std::snprintf(buffer, sizeof(buffer), "%04zx ", i);
      out += buffer;
    }
    std::snprintf(buffer, sizeof(buffer), " %02x", bytes[i]);
    out += buffer;
    if (i % 16 == 15 || i + 1 == bytes.size()) out += "\n";
  }
  return out;
}

// The fenced block after the marker `<!-- wire-example: NAME -->`.
std::string exampleBlock(const std::string& doc, const std::string& name) {
  const size_t marker = doc.find("<!-- wire-example: " + name + " -->");
  if (marker == std::string::npos) return "";
  const std::string fence = "```text\n";
  const size_t begin = doc.find(fence, marker);
  if (begin == std::string::npos) return "";
  const size_t end = doc.find("```", begin + fence.size());
  if (end == std::string::npos) return "";
  return doc.substr(begin + fence.size(), end - begin - fence.size());
}

constexpr uint64_t kNowMs = 1'764'547'200'000;  // 2025-12-01T00:00:00Z

// The example's request: what a gateway sends for a first reserve.
Request exampleReserve() {
  ReserveRequest reserve{
      .reservation_id = "req-42", .subject = "tenant-7", .route = "chat", .units = 1200};
  reserve.request_digest = canonicalRequestDigest(reserve);
  return Request{.request_id = 7, .body = reserve};
}

TEST(ProtocolDocTest, WireExamplesAreWhatTheCodecAndTheLedgerProduceToday) {
  const std::string doc = readDoc();
  const Request request = exampleReserve();
  Result<std::vector<uint8_t>> request_frame = encodeRequestFrame(request);
  ASSERT_TRUE(request_frame.isOk());

  // The reply is the real ledger's answer to it, under the policy the doc describes.
  Ledger ledger;
  const Budget budget{.subject_pattern = "tenant-*",
                      .route = "chat",
                      .unit = "tokens",
                      .refill_per_second = 100,
                      .burst = 10'000,
                      .max_single_reservation = 4'000,
                      .hold_ttl_ms = 30'000,
                      .hard_execution_limit_ms = 600'000};
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kNowMs).code, ReplyCode::kOk);
  const ReservationReply reply = ledger.reserve(std::get<ReserveRequest>(request.body), kNowMs);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  Result<std::vector<uint8_t>> reply_frame =
      encodeResponseFrame(Response{.request_id = request.request_id, .body = reply});
  ASSERT_TRUE(reply_frame.isOk());

  EXPECT_EQ(exampleBlock(doc, "reserve-request"), hexDump(request_frame.value()))
      << "docs/protocol.md's reserve-request example is not what encodeRequestFrame produces";
  EXPECT_EQ(exampleBlock(doc, "reserve-reply"), hexDump(reply_frame.value()))
      << "docs/protocol.md's reserve-reply example is not what encodeResponseFrame produces";

  // And the bytes decode back to the request (the example is a valid frame, prefix included).
  const std::vector<uint8_t>& bytes = request_frame.value();
  ASSERT_GT(bytes.size(), kFrameHeaderBytes);
  const uint32_t length = uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 |
                          uint32_t{bytes[3]} << 24;
  EXPECT_EQ(length, bytes.size() - kFrameHeaderBytes);
  DecodedRequest decoded =
      decodeRequest(std::span<const uint8_t>(bytes).subspan(kFrameHeaderBytes));
  ASSERT_TRUE(decoded.body.isOk());
  EXPECT_EQ(decoded.request_id, 7u);
}

}  // namespace
}  // namespace tally::wire
