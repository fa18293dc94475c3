// net/tls_session: two TLS 1.3 sessions pumping bytes to each other in memory — the handshake with
// pinned Ed25519 keys both ways, data both ways however the network cuts it, and every way the
// connection must end: a tampered record, a replayed record, a peer key that is not pinned (on
// either side), a peer that offers only TLS 1.2, close_notify.

#include "net/tls_session.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shard/identity.h"
#include "tests/net/tls_test_keys.h"

namespace tally::net {
namespace {

using test_support::kGateway;
using test_support::kLedger;
using test_support::kStranger;

std::function<bool(const PublicKey&)> pinned(std::set<PublicKey> keys) {
  return [keys = std::move(keys)](const PublicKey& key) { return keys.contains(key); };
}

std::unique_ptr<TlsSession> session(TlsRole role, const identity::KeyPair& key,
                                    std::function<bool(const PublicKey&)> accept) {
  Result<std::unique_ptr<TlsSession>> created =
      TlsSession::create(TlsOptions{.role = role, .key = key, .accept_peer = std::move(accept)});
  EXPECT_TRUE(created.isOk()) << created.status().toString();
  return created.isOk() ? std::move(created).value() : nullptr;
}

std::vector<uint8_t> bytesOf(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// Moves ciphertext both ways until neither side has any left (or one fails), feeding it in
// pieces of `cut` bytes as a socket might deliver it.
void pump(TlsSession& a, TlsSession& b, size_t cut = SIZE_MAX) {
  for (int round = 0; round < 100; ++round) {
    const std::vector<uint8_t> a_to_b = a.takeCiphertext();
    const std::vector<uint8_t> b_to_a = b.takeCiphertext();
    if (a_to_b.empty() && b_to_a.empty()) return;
    for (size_t at = 0; at < a_to_b.size() && !b.failed(); at += cut) {
      (void)b.feed(std::span(a_to_b).subspan(at, std::min(cut, a_to_b.size() - at)));
    }
    for (size_t at = 0; at < b_to_a.size() && !a.failed(); at += cut) {
      (void)a.feed(std::span(b_to_a).subspan(at, std::min(cut, b_to_a.size() - at)));
    }
  }
  ADD_FAILURE() << "the sessions never went quiet";
}

class TlsSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = session(TlsRole::kClient, kGateway, pinned({kLedger.public_key}));
    server_ = session(TlsRole::kServer, kLedger, pinned({kGateway.public_key}));
    ASSERT_NE(client_, nullptr);
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(client_->start().isOk());
    ASSERT_TRUE(server_->start().isOk());
  }

  void handshake() {
    pump(*client_, *server_);
    ASSERT_TRUE(client_->handshakeDone()) << client_->error().toString();
    ASSERT_TRUE(server_->handshakeDone()) << server_->error().toString();
  }

  std::unique_ptr<TlsSession> client_;
  std::unique_ptr<TlsSession> server_;
};

TEST_F(TlsSessionTest, HandshakeAuthenticatesBothKeysAndCarriesDataBothWays) {
  handshake();
  EXPECT_EQ(client_->peerKey(), kLedger.public_key);
  EXPECT_EQ(server_->peerKey(), kGateway.public_key);

  ASSERT_TRUE(client_->write(bytesOf("reserve r-1")).isOk());
  ASSERT_TRUE(server_->write(bytesOf("ok r-1")).isOk());
  pump(*client_, *server_);
  EXPECT_EQ(server_->takePlaintext(), bytesOf("reserve r-1"));
  EXPECT_EQ(client_->takePlaintext(), bytesOf("ok r-1"));
}

TEST_F(TlsSessionTest, CiphertextIsNotThePlaintext) {
  handshake();
  const std::string secret = "tenant-a chat.generate 600 units";
  ASSERT_TRUE(client_->write(bytesOf(secret)).isOk());
  const std::vector<uint8_t> wire = client_->takeCiphertext();
  ASSERT_FALSE(wire.empty());
  EXPECT_EQ(std::search(wire.begin(), wire.end(), secret.begin(), secret.end()), wire.end());
  ASSERT_TRUE(server_->feed(wire).isOk());
  EXPECT_EQ(server_->takePlaintext(), bytesOf(secret));
}

TEST_F(TlsSessionTest, WrittenBeforeTheHandshakeIsDeliveredAfterIt) {
  ASSERT_TRUE(client_->write(bytesOf("early")).isOk());
  handshake();
  pump(*client_, *server_);
  EXPECT_EQ(server_->takePlaintext(), bytesOf("early"));
}

TEST_F(TlsSessionTest, BytesCutAnywhereArriveWholeAndInOrder) {
  std::vector<uint8_t> big(300 * 1024);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + i / 251);
  pump(*client_, *server_, 1);  // the handshake one byte at a time
  ASSERT_TRUE(server_->handshakeDone());
  ASSERT_TRUE(client_->write(big).isOk());
  pump(*client_, *server_, 1'000);
  EXPECT_EQ(server_->takePlaintext(), big);
}

TEST_F(TlsSessionTest, ATamperedRecordEndsTheSession) {
  handshake();
  ASSERT_TRUE(client_->write(bytesOf("settle r-1 7")).isOk());
  std::vector<uint8_t> record = client_->takeCiphertext();
  ASSERT_GT(record.size(), 6u);
  record[record.size() - 1] ^= 0x01;  // a bit of the authentication tag
  const Status status = server_->feed(record);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.toString();
  EXPECT_TRUE(server_->failed());
  EXPECT_TRUE(server_->takePlaintext().empty());
  // Final: the next genuine record is refused too.
  ASSERT_TRUE(client_->write(bytesOf("settle r-2 7")).isOk());
  EXPECT_FALSE(server_->feed(client_->takeCiphertext()).isOk());
  EXPECT_FALSE(server_->write(bytesOf("anything")).isOk());
}

TEST_F(TlsSessionTest, AReplayedRecordEndsTheSession) {
  handshake();
  ASSERT_TRUE(client_->write(bytesOf("settle r-1 7")).isOk());
  const std::vector<uint8_t> record = client_->takeCiphertext();
  ASSERT_TRUE(server_->feed(record).isOk());
  EXPECT_EQ(server_->takePlaintext(), bytesOf("settle r-1 7"));
  const Status replayed = server_->feed(record);  // the same bytes again: a replay
  EXPECT_EQ(replayed.code(), StatusCode::kCorruption) << replayed.toString();
  EXPECT_TRUE(server_->takePlaintext().empty());
}

TEST(TlsSessionPinning, TheClientRefusesALedgerKeyItDoesNotPin) {
  auto client = session(TlsRole::kClient, kGateway, pinned({kLedger.public_key}));
  auto impostor = session(TlsRole::kServer, kStranger, pinned({kGateway.public_key}));
  ASSERT_TRUE(client->start().isOk());
  pump(*client, *impostor);
  EXPECT_FALSE(client->handshakeDone());
  EXPECT_TRUE(client->failed());
  EXPECT_TRUE(client->peerRefused());
  EXPECT_EQ(client->error().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(impostor->handshakeDone());
  EXPECT_FALSE(client->peerKey().has_value());
}

TEST(TlsSessionPinning, TheServerRefusesAGatewayKeyItDoesNotAdmit) {
  auto stranger = session(TlsRole::kClient, kStranger, pinned({kLedger.public_key}));
  auto ledger = session(TlsRole::kServer, kLedger, pinned({kGateway.public_key}));
  ASSERT_TRUE(stranger->start().isOk());
  ASSERT_TRUE(ledger->start().isOk());
  pump(*stranger, *ledger);
  EXPECT_FALSE(ledger->handshakeDone());
  EXPECT_TRUE(ledger->peerRefused());
  EXPECT_FALSE(ledger->peerKey().has_value());
  // The stranger never gets to send data the ledger would read.
  EXPECT_FALSE(stranger->write(bytesOf("publish")).isOk() && ledger->handshakeDone());
  pump(*stranger, *ledger);
  EXPECT_TRUE(ledger->takePlaintext().empty());
  EXPECT_TRUE(stranger->failed());
}

TEST(TlsSessionPinning, AcceptPeerIsRequired) {
  Result<std::unique_ptr<TlsSession>> created =
      TlsSession::create(TlsOptions{.role = TlsRole::kServer, .key = kLedger});
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TlsSessionTest, CloseNotifyEndsTheStreamCleanly) {
  handshake();
  ASSERT_TRUE(client_->write(bytesOf("last")).isOk());
  client_->close();
  pump(*client_, *server_);
  EXPECT_EQ(server_->takePlaintext(), bytesOf("last"));
  EXPECT_TRUE(server_->closed());
  EXPECT_FALSE(server_->failed());
  EXPECT_FALSE(client_->write(bytesOf("more")).isOk());
}

// A client that offers at most TLS 1.2 (OpenSSL directly) gets no session.
TEST(TlsSessionVersion, OnlyTls13IsAccepted) {
  auto ledger = session(TlsRole::kServer, kLedger, pinned({kGateway.public_key}));
  ASSERT_TRUE(ledger->start().isOk());
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION), 1);
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  BIO_set_mem_eof_return(in, -1);
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  bool handshake_succeeded = false;
  for (int round = 0; round < 10 && !ledger->failed(); ++round) {
    handshake_succeeded = SSL_do_handshake(ssl) == 1;
    std::vector<uint8_t> hello(BIO_ctrl_pending(out));
    if (!hello.empty()) BIO_read(out, hello.data(), static_cast<int>(hello.size()));
    if (!hello.empty()) (void)ledger->feed(hello);
    const std::vector<uint8_t> answer = ledger->takeCiphertext();
    if (!answer.empty()) BIO_write(in, answer.data(), static_cast<int>(answer.size()));
  }
  EXPECT_FALSE(handshake_succeeded);
  EXPECT_TRUE(ledger->failed());
  EXPECT_NE(ledger->error().message().find("unsupported protocol"), std::string::npos)
      << ledger->error().toString();
  EXPECT_FALSE(ledger->handshakeDone());
  SSL_free(ssl);
  SSL_CTX_free(ctx);
}

TEST(TlsSessionCertificate, IsTheKeysSelfSignedEd25519Certificate) {
  Result<std::string> pem = TlsSession::certificatePem(kGateway);
  ASSERT_TRUE(pem.isOk()) << pem.status().toString();
  BIO* bio = BIO_new_mem_buf(pem.value().data(), static_cast<int>(pem.value().size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  ASSERT_NE(cert, nullptr);
  EVP_PKEY* key = X509_get0_pubkey(cert);
  ASSERT_EQ(EVP_PKEY_id(key), EVP_PKEY_ED25519);
  PublicKey raw{};
  size_t length = raw.size();
  ASSERT_EQ(EVP_PKEY_get_raw_public_key(key, raw.data(), &length), 1);
  EXPECT_EQ(raw, kGateway.public_key);   // the same key libsodium derives from the seed
  EXPECT_EQ(X509_verify(cert, key), 1);  // self-signed
  X509_free(cert);
  BIO_free(bio);
}

}  // namespace
}  // namespace tally::net
