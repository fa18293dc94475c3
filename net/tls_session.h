#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/shard_types.h"
#include "core/status.h"
#include "shard/identity.h"

// One TLS 1.3 session over memory buffers (OpenSSL 3, memory BIOs): no socket, no loop, no clock.
// Its owner moves bytes: what arrives from the network goes in with feed(), what the application
// sends goes in with write(); what to put on the network comes out of takeCiphertext(), what the
// peer sent out of takePlaintext(). The framed-stream layer (net/framed_stream.h) is meant to sit
// on it (docs/security.md "The link"); the tests pump bytes between two sessions in memory.
//
// Identities are Ed25519 keys (shard/identity.h: the gateway's enrolled key, the ledger's signing
// key): each side presents a self-signed X.509 certificate made from its key at create(), and
// authenticates the peer by its key alone — certificate chains, names and dates are not
// consulted; the peer's certificate key must be accepted by `accept_peer` (pinning), and TLS 1.3's
// CertificateVerify proves the peer holds its private key. Both sides always authenticate
// (mutual TLS). Only TLS 1.3 and only the Ed25519 signature scheme are offered or accepted.
//
// Failure is final: after a refused peer (kFailedPrecondition, peerRefused()), a tampered,
// replayed or reordered record (kCorruption), or any other handshake error (kUnavailable), every
// later call returns the same error; takeCiphertext() may still hold the alert to send before
// closing. OpenSSL failing to build the session is kIoError. A close_notify from the peer ends the
// stream: closed() is true. Not thread-safe: it belongs to the loop of its connection.

namespace tally::net {

enum class TlsRole : uint8_t { kClient, kServer };

struct TlsOptions {
  TlsRole role = TlsRole::kClient;
  identity::KeyPair key;  // ours: presented as a self-signed Ed25519 certificate
  // Whether the peer's Ed25519 public key is acceptable: the agent pins the ledger's key(s), the
  // ledger admits enrolled, enabled gateways (and operators). Required.
  std::function<bool(const PublicKey&)> accept_peer;
  // Plaintext held before the handshake completes or while the peer does not read, beyond
  // which write() refuses (kResourceExhausted).
  size_t pending_plaintext_bytes_max = 16u << 20;
};

class TlsSession {
 public:
  // kInvalidArgument without accept_peer; kIoError if OpenSSL cannot build the context.
  static Result<std::unique_ptr<TlsSession>> create(TlsOptions options);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // The client's first flight (its ClientHello) is ready in takeCiphertext() after start().
  [[nodiscard]] Status start();
  // Ciphertext from the network, cut anywhere. Advances the handshake, decrypts what it can.
  [[nodiscard]] Status feed(std::span<const uint8_t> ciphertext);
  // Application bytes to send: encrypted now if the handshake is done, else once it is.
  [[nodiscard]] Status write(std::span<const uint8_t> plaintext);
  // Sends close_notify (in takeCiphertext()); nothing more may be written.
  void close();

  std::vector<uint8_t> takeCiphertext();
  std::vector<uint8_t> takePlaintext();

  bool handshakeDone() const { return handshake_done_; }
  bool failed() const { return !error_.isOk(); }
  const Status& error() const { return error_; }
  bool closed() const { return peer_closed_; }
  // The handshake failed because this side's accept_peer refused the peer's key. (A peer that
  // refuses ours sends an alert: here that is a kUnavailable handshake error.)
  bool peerRefused() const { return peer_refused_; }
  // The peer's authenticated key, once the handshake is done.
  const std::optional<PublicKey>& peerKey() const { return peer_key_; }
  // The description of the fatal alert the peer sent ("certificate unknown", …), if it sent
  // one: the peer ended the session (e.g. it refused our key).
  const std::optional<std::string>& peerAlert() const { return peer_alert_; }
  // Plaintext written and not yet encrypted (the handshake is not done): counts against the
  // owner's write bounds.
  size_t pendingPlaintextBytes() const { return pending_plaintext_.size(); }

  // A self-signed X.509 certificate (PEM) for `key`, as create() makes it: for operators who want
  // to inspect what a daemon presents (`openssl x509 -text`).
  static Result<std::string> certificatePem(const identity::KeyPair& key);

  struct Impl;
  // OpenSSL's info callback records a received fatal alert here.
  void notePeerAlert(std::string description) {
    if (!peer_alert_.has_value()) peer_alert_ = std::move(description);
  }

 private:
  explicit TlsSession(TlsOptions options);
  Status advance();
  Status fail(Status status);

  TlsOptions options_;
  std::unique_ptr<Impl> impl_;
  bool handshake_done_ = false;
  bool peer_closed_ = false;
  bool closing_ = false;
  bool peer_refused_ = false;
  std::optional<PublicKey> peer_key_;
  std::optional<std::string> peer_alert_;
  std::vector<uint8_t> pending_plaintext_;  // written before the handshake completed
  std::vector<uint8_t> received_;
  Status error_;
};

}  // namespace tally::net
