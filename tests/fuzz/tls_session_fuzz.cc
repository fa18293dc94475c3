// The TLS boundary (net/tls_session.h): whatever bytes a network peer sends.
//
// Input: [mode u8][bytes]. Mode 0: the bytes reach a ledger-side (server) session as a client's
// first flights; mode 1: they reach a gateway-side (client) session as the server's answer to its
// ClientHello; mode 2: a genuine handshake completes in memory first, then the bytes arrive as
// records on the established session. The bytes come in pieces whose lengths are the first bytes
// of the rest, as a socket cuts them.
//
// Checks: no crash, leak or sanitizer report; a session that failed stays failed (every later
// feed fails) and delivers no plaintext; no handshake completes with a peer key that was not
// accepted (the fuzzer holds no pinned private key, so no handshake may complete at all in modes
// 0 and 1).

#include <memory>
#include <set>

#include "net/tls_session.h"
#include "tests/fuzz/fuzz_support.h"

using namespace tally;

namespace {

std::unique_ptr<net::TlsSession> make(net::TlsRole role, const identity::KeyPair& key,
                                      const PublicKey& pinned) {
  Result<std::unique_ptr<net::TlsSession>> created = net::TlsSession::create(
      net::TlsOptions{.role = role, .key = key, .accept_peer = [pinned](const PublicKey& k) {
                        return k == pinned;
                      }});
  if (!created.isOk()) fuzz::fail("TlsSession::create", created.status().toString());
  std::unique_ptr<net::TlsSession> session = std::move(created).value();
  if (!session->start().isOk()) fuzz::fail("TlsSession::start");
  return session;
}

void pump(net::TlsSession& a, net::TlsSession& b) {
  for (int round = 0; round < 20; ++round) {
    const std::vector<uint8_t> to_b = a.takeCiphertext();
    const std::vector<uint8_t> to_a = b.takeCiphertext();
    if (to_b.empty() && to_a.empty()) return;
    if (!to_b.empty()) (void)b.feed(to_b);
    if (!to_a.empty()) (void)a.feed(to_a);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzBytes in(data, size);
  const uint8_t mode = in.u8() % 3;
  std::unique_ptr<net::TlsSession> peer;  // mode 2: the genuine other side
  std::unique_ptr<net::TlsSession> target;
  if (mode == 0) {
    target = make(net::TlsRole::kServer, fuzz::ledgerKey(), fuzz::gatewayKey().public_key);
  } else if (mode == 1) {
    target = make(net::TlsRole::kClient, fuzz::gatewayKey(), fuzz::ledgerKey().public_key);
    (void)target->takeCiphertext();  // its ClientHello, answered by the fuzzer
  } else {
    target = make(net::TlsRole::kServer, fuzz::ledgerKey(), fuzz::gatewayKey().public_key);
    peer = make(net::TlsRole::kClient, fuzz::gatewayKey(), fuzz::ledgerKey().public_key);
    pump(*peer, *target);
    if (!target->handshakeDone() || !peer->handshakeDone()) fuzz::fail("genuine handshake");
  }
  while (!in.empty()) {
    const size_t length = 1 + in.u8() * 4;
    const bool failed_before = target->failed();
    const Status status = target->feed(in.bytes(length));
    if (failed_before && status.isOk()) fuzz::fail("a failed session accepted bytes again");
    if (target->failed() && !target->takePlaintext().empty() && failed_before) {
      fuzz::fail("a failed session delivered plaintext");
    }
    (void)target->takeCiphertext();
  }
  if (mode != 2 && target->handshakeDone()) fuzz::fail("a handshake completed with no pinned key");
  return 0;
}
