// tally-ledger under hostile or broken clients (SPEC §8 "malformed, truncated and oversized
// messages"): each bad case gets an error reply or a closed connection, and a second, healthy
// client keeps getting answers after every one of them.

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "tests/integration/ledger_fixture.h"
#include "tests/support/raw_socket.h"
#include "wire/frame.h"

namespace tally::testing {
namespace {

constexpr uint64_t kReadTimeoutMs = 5'000;

// The resident set of process `pid` in KiB (VmRSS in /proc), or 0 if unreadable.
uint64_t residentKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

std::vector<uint8_t> frameHeader(uint32_t length) {
  return {static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
          static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
}

std::vector<uint8_t> frameOf(const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> frame = frameHeader(static_cast<uint32_t>(payload.size()));
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

std::vector<uint8_t> requestFrame(uint64_t request_id, const wire::RequestBody& body) {
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = request_id, .body = body});
  EXPECT_TRUE(frame.isOk());
  return frame.isOk() ? frame.value() : std::vector<uint8_t>{};
}

// A Request whose union discriminant names no member this schema has (as a newer peer would
// send): built as a health request, then the discriminant is overwritten in the data section.
std::vector<uint8_t> unknownKindFrame(uint64_t request_id, uint16_t which) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::Request>();
  request.setRequestId(request_id);
  request.initHealth();
  const uint32_t offset =
      capnp::Schema::from<schema::Request>().getProto().getStruct().getDiscriminantOffset();
  kj::ArrayPtr<kj::byte> data = message.getRoot<capnp::AnyStruct>().getDataSection();
  EXPECT_GE(data.size(), 2 * offset + 2);
  data[2 * offset] = static_cast<kj::byte>(which);
  data[2 * offset + 1] = static_cast<kj::byte>(which >> 8);
  EXPECT_EQ(static_cast<uint16_t>(message.getRoot<schema::Request>().which()), which);
  Result<std::vector<uint8_t>> frame = wire::encodeFrame(message);
  EXPECT_TRUE(frame.isOk());
  return frame.isOk() ? frame.value() : std::vector<uint8_t>{};
}

class LedgerBadInputTest : public LedgerServiceTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(startLedger());
    ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = 1'000'000})}));
  }

  std::unique_ptr<RawSocket> rawConnect(RawSocketOptions options = {}) {
    std::string error;
    std::unique_ptr<RawSocket> socket =
        RawSocket::connect("127.0.0.1", ledger_.port(), kCallTimeoutMs, &error, options);
    EXPECT_NE(socket, nullptr) << error;
    return socket;
  }

  // The healthy client (client_) is still served: a health check and a fresh reservation.
  void expectHealthy(const std::string& after) {
    SCOPED_TRACE("healthy client after " + after);
    ASSERT_TRUE(ledger_.running()) << "tally-ledger exited";
    TALLY_ASSIGN_OR_FAIL(wire::HealthReply reply, health(*client_));
    EXPECT_EQ(reply.status, "ok");
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply reserved,
        callReservation(*client_,
                        makeReserve({.id = "healthy-" + std::to_string(healthy_checks_++)})));
    EXPECT_EQ(reserved.code, ReplyCode::kOk) << describe(reserved);
  }

  // Reads one frame from `socket` and decodes it as a response.
  void readResponse(RawSocket& socket, wire::Response* response) {
    std::vector<uint8_t> payload;
    const RawSocket::Read read = socket.readFrame(&payload, kReadTimeoutMs);
    ASSERT_EQ(read, RawSocket::Read::kFrame) << RawSocket::readName(read);
    TALLY_ASSIGN_OR_FAIL(*response, wire::decodeResponse(payload));
  }

  void expectError(const wire::Response& response, wire::ErrorCode code) {
    const auto* error = std::get_if<wire::ErrorReply>(&response.body);
    ASSERT_NE(error, nullptr) << wire::describe(response.body);
    EXPECT_EQ(error->code, code) << error->message;
  }

  // The ledger closed the connection (an orderly close, or a reset), sending nothing more.
  void expectClosed(RawSocket& socket) {
    std::vector<uint8_t> payload;
    const RawSocket::Read read = socket.readFrame(&payload, kReadTimeoutMs);
    EXPECT_TRUE(read == RawSocket::Read::kClosed || read == RawSocket::Read::kReset)
        << RawSocket::readName(read);
  }

  // A valid request on `socket` is still answered under its own id.
  void expectStillServed(RawSocket& socket, uint64_t request_id) {
    ASSERT_TRUE(socket.sendAll(requestFrame(request_id, wire::HealthRequest{}), kCallTimeoutMs));
    wire::Response response;
    ASSERT_NO_FATAL_FAILURE(readResponse(socket, &response));
    EXPECT_EQ(response.request_id, request_id);
    EXPECT_TRUE(std::holds_alternative<wire::HealthReply>(response.body))
        << wire::describe(response.body);
  }

  int healthy_checks_ = 0;
};

TEST_F(LedgerBadInputTest, OversizedFrameGetsFrameTooLargeThenClose) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  // 2 MiB announced against the 1 MiB default; only the header is sent, so the ledger has read
  // everything we wrote when it closes (unread bytes would turn its close into a reset).
  ASSERT_TRUE(bad->sendAll(frameHeader(2u << 20), kCallTimeoutMs));
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kFrameTooLarge));
  EXPECT_EQ(response.request_id, 0u);
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("an oversized frame"));
}

TEST_F(LedgerBadInputTest, OversizedFrameWithBodyBytesGetsOneErrorThenClose) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  // A client that streams the body of its oversized frame: the ledger answers once and closes;
  // what it did not read may reset the connection, so the reply is checked only if it arrived.
  std::vector<uint8_t> bytes = frameHeader(2u << 20);
  bytes.resize(bytes.size() + 256 * 1024, 0x5a);
  (void)bad->sendAll(bytes, kCallTimeoutMs);
  std::vector<uint8_t> payload;
  RawSocket::Read read = bad->readFrame(&payload, kReadTimeoutMs);
  int frames = 0;
  while (read == RawSocket::Read::kFrame) {
    ++frames;
    TALLY_ASSIGN_OR_FAIL(wire::Response response, wire::decodeResponse(payload));
    ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kFrameTooLarge));
    read = bad->readFrame(&payload, kReadTimeoutMs);
  }
  EXPECT_LE(frames, 1) << "one bad frame, one error reply";
  EXPECT_TRUE(read == RawSocket::Read::kClosed || read == RawSocket::Read::kReset)
      << RawSocket::readName(read);
  ASSERT_NO_FATAL_FAILURE(expectHealthy("an oversized frame with its body"));
}

TEST_F(LedgerBadInputTest, GarbageInsideAWellFormedLengthGetsMalformedFrameAndStaysOpen) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  const std::vector<std::vector<uint8_t>> garbage = {
      std::vector<uint8_t>(24, 0xff),                      // segment table claiming 2^32 segments
      std::vector<uint8_t>(5, 0x00),                       // not a whole number of words
      {0, 0, 0, 0, 200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},  // one segment longer than the frame
  };
  uint64_t next_id = 1;
  for (const std::vector<uint8_t>& payload : garbage) {
    SCOPED_TRACE("garbage of " + std::to_string(payload.size()) + " bytes");
    ASSERT_TRUE(bad->sendAll(frameOf(payload), kCallTimeoutMs));
    wire::Response response;
    ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
    ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kMalformedFrame));
    // Framing is intact, so the ledger keeps the connection: the next request is served.
    ASSERT_NO_FATAL_FAILURE(expectStillServed(*bad, next_id++));
    ASSERT_NO_FATAL_FAILURE(expectHealthy("a garbage frame"));
  }
}

TEST_F(LedgerBadInputTest, TruncatedFrameThenCloseAffectsNoOne) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  std::vector<uint8_t> frame = requestFrame(7, makeReserve({.id = "truncated", .units = 5}));
  frame.resize(frame.size() / 2);
  ASSERT_TRUE(bad->sendAll(frame, kCallTimeoutMs));
  bad->shutdownWrite();
  // No reply for a request that never arrived whole; the ledger closes its side.
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a truncated frame"));
  TALLY_ASSIGN_OR_FAIL(ReservationReply query,
                       callReservation(*client_, QueryRequest{.reservation_id = "truncated"}));
  EXPECT_EQ(query.code, ReplyCode::kNotFound) << describe(query);
}

TEST_F(LedgerBadInputTest, ZeroLengthFrameGetsMalformedFrameThenClose) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  ASSERT_TRUE(bad->sendAll(frameHeader(0), kCallTimeoutMs));
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kMalformedFrame));
  ASSERT_NO_FATAL_FAILURE(expectClosed(*bad));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a zero-length frame"));
}

TEST_F(LedgerBadInputTest, UnknownRequestKindGetsUnknownMessageUnderItsId) {
  std::unique_ptr<RawSocket> bad = rawConnect();
  ASSERT_NE(bad, nullptr);
  ASSERT_TRUE(bad->sendAll(unknownKindFrame(41, 200), kCallTimeoutMs));
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
  EXPECT_EQ(response.request_id, 41u);
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kUnknownMessage));
  // An empty Request (the `unspecified` default) is no request either.
  capnp::MallocMessageBuilder empty;
  empty.initRoot<schema::Request>().setRequestId(42);
  Result<std::vector<uint8_t>> frame = wire::encodeFrame(empty);
  ASSERT_TRUE(frame.isOk());
  ASSERT_TRUE(bad->sendAll(frame.value(), kCallTimeoutMs));
  ASSERT_NO_FATAL_FAILURE(readResponse(*bad, &response));
  EXPECT_EQ(response.request_id, 42u);
  ASSERT_NO_FATAL_FAILURE(expectError(response, wire::ErrorCode::kUnknownMessage));
  ASSERT_NO_FATAL_FAILURE(expectStillServed(*bad, 43));
  ASSERT_NO_FATAL_FAILURE(expectHealthy("an unknown request kind"));
}

TEST_F(LedgerBadInputTest, ZeroUnitsAndOverlongIdsAreInvalidArgument) {
  std::unique_ptr<client::BlockingClient> bad = connect();
  ASSERT_NE(bad, nullptr);
  TALLY_ASSIGN_OR_FAIL(ReservationReply zero,
                       callReservation(*bad, makeReserve({.id = "zero", .units = 0})));
  EXPECT_EQ(zero.code, ReplyCode::kInvalidArgument) << describe(zero);
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a reserve of 0 units"));

  // 200 bytes is over the 128-byte id limit: refused where it is decoded, as INVALID_ARGUMENT,
  // under the request's own id.
  const std::string long_id(200, 'x');
  for (const wire::RequestBody& body :
       std::vector<wire::RequestBody>{makeReserve({.id = long_id, .units = 5}),
                                      StartRequest{.reservation_id = long_id, .operation_id = "op"},
                                      QueryRequest{.reservation_id = long_id}}) {
    Result<wire::Response> response = bad->call(body, kCallTimeoutMs);
    ASSERT_TRUE(response.isOk()) << response.status().toString();
    EXPECT_NE(response.value().request_id, 0u) << "not answered under its own id";
    if (const auto* reply = std::get_if<ReservationReply>(&response.value().body)) {
      EXPECT_EQ(reply->code, ReplyCode::kInvalidArgument) << describe(*reply);
    } else {
      ASSERT_NO_FATAL_FAILURE(expectError(response.value(), wire::ErrorCode::kInvalidArgument));
    }
    ASSERT_NO_FATAL_FAILURE(expectHealthy("an over-long id"));
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, static_cast<Units>(healthy_checks_)) << describe(audit);
}

TEST_F(LedgerBadInputTest, SilentClientsWithHalfAFrameBlockNoOne) {
  std::unique_ptr<RawSocket> half_header = rawConnect();
  std::unique_ptr<RawSocket> half_body = rawConnect();
  ASSERT_NE(half_header, nullptr);
  ASSERT_NE(half_body, nullptr);
  ASSERT_TRUE(half_header->sendAll(std::vector<uint8_t>{16, 0}, kCallTimeoutMs));
  std::vector<uint8_t> frame = requestFrame(9, wire::HealthRequest{});
  frame.resize(frame.size() - 3);
  ASSERT_TRUE(half_body->sendAll(frame, kCallTimeoutMs));
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(expectHealthy("half a frame, silence"));
  // Neither got an answer: there is no whole request to answer.
  std::vector<uint8_t> payload;
  EXPECT_EQ(half_header->readFrame(&payload, 50), RawSocket::Read::kTimeout);
  EXPECT_EQ(half_body->readFrame(&payload, 50), RawSocket::Read::kTimeout);
  // The rest of the body arrives late: then it is served.
  const std::vector<uint8_t> full = requestFrame(9, wire::HealthRequest{});
  ASSERT_TRUE(half_body->sendAll(std::vector<uint8_t>(full.end() - 3, full.end()), kCallTimeoutMs));
  wire::Response response;
  ASSERT_NO_FATAL_FAILURE(readResponse(*half_body, &response));
  EXPECT_EQ(response.request_id, 9u);
}

// A client that pipelines requests and never reads the answers: the ledger stops reading it
// once its replies back up (bounded write queue), everyone else is still served, and a graceful
// stop still ends within its deadline instead of waiting for a reader that never reads.
TEST_F(LedgerBadInputTest, ClientThatNeverReadsBlocksNeitherOthersNorShutdown) {
  // A small receive buffer: the kernel holds little of what the ledger writes, so its replies
  // back up in its own write queue.
  std::unique_ptr<RawSocket> hog = rawConnect({.receive_buffer_bytes = 16 * 1024});
  ASSERT_NE(hog, nullptr);
  std::vector<uint8_t> burst;
  for (uint64_t id = 1; id <= 1000; ++id) {
    const std::vector<uint8_t> frame = requestFrame(id, wire::AuditRequest{});
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  // Send until the ledger has stopped reading: nothing drains from our socket for a whole
  // second (a slow ledger still drains; one that stopped reading does not), within 30 s.
  // A burst the socket took only in part is finished later, so the frames stay whole (a cut
  // frame would be a framing error, and a stream closed for that reads and discards until it
  // closes: not the back-pressure this test is about).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  uint64_t bursts = 0;
  std::span<const uint8_t> pending;
  for (;;) {
    if (pending.empty()) pending = burst;
    const RawSocket::Send sent = hog->send(&pending, 200);
    ASSERT_NE(sent, RawSocket::Send::kError) << "the ledger dropped a client that never reads";
    if (sent == RawSocket::Send::kAll) {
      ++bursts;
    } else if (!hog->waitWritable(1000)) {
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the ledger kept reading a client that never reads (" << bursts << " bursts)";
  }
  std::cout << "[ hog      ] the ledger stopped reading after ~" << bursts * burst.size() / 1024
            << " KiB of requests" << std::endl;
  // What it holds for that client is bounded by write_queue_bytes_max (16 MiB of replies owed,
  // net/framed_stream.h) plus one read of requests: it neither reads nor applies past the
  // bound. (It used to apply everything it had read and hold ~100 MiB.)
  const uint64_t resident_kib = residentKiB(ledger_.pid());
  std::cout << "[ hog      ] ledger resident set: " << resident_kib / 1024 << " MiB" << std::endl;
  EXPECT_GT(resident_kib, 0u);
#if defined(TALLY_ASAN)
  // ASan's allocator keeps freed memory in a quarantine of up to 256 MiB, so the resident set
  // of a sanitizer build says nothing about what the ledger holds; the release run checks it.
  std::cout << "[ hog      ] resident-set bound not checked under AddressSanitizer" << std::endl;
#else
  EXPECT_LT(resident_kib, uint64_t{64} * 1024) << "the ledger holds far more than its bound";
#endif
  ASSERT_NO_FATAL_FAILURE(expectHealthy("a client that never reads"));
  {
    // A client that connects now is served too.
    std::unique_ptr<client::BlockingClient> late = connect();
    ASSERT_NE(late, nullptr);
    TALLY_ASSIGN_OR_FAIL(wire::HealthReply reply, health(*late));
    EXPECT_EQ(reply.status, "ok");
  }
  const auto signalled = std::chrono::steady_clock::now();
  EXPECT_EQ(ledger_.terminate(kExitTimeoutMs), 0)
      << "SIGTERM did not end tally-ledger within " << kExitTimeoutMs
      << " ms while a client was not reading its replies";
  std::cout << "[ hog      ] SIGTERM to exit: "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - signalled)
                   .count()
            << " ms" << std::endl;
}

}  // namespace
}  // namespace tally::testing
