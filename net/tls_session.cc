#include "net/tls_session.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace tally::net {
namespace {

// Each OpenSSL object with its own free function.
struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

// The oldest queued OpenSSL error, with `what` in front; the queue is cleared.
std::string opensslError(const char* what) {
  std::string out = what;
  const unsigned long code = ERR_get_error();
  if (code != 0) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof(buffer));
    out += ": ";
    out += buffer;
  }
  ERR_clear_error();
  return out;
}

// The Ed25519 key of `pair` (libsodium's secret key is seed ‖ public key; OpenSSL takes the seed).
PkeyPtr privateKeyOf(const identity::KeyPair& pair) {
  return PkeyPtr(
      EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, pair.secret_key.data(), 32));
}

// A self-signed certificate for `key`: subject and issuer CN=tally, serial 1, valid from 2000 for
// 100 years (dates are not checked by peers; see the header).
X509Ptr selfSigned(EVP_PKEY* key) {
  X509Ptr cert(X509_new());
  if (!cert) return nullptr;
  if (X509_set_version(cert.get(), 2) != 1 ||
      ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) != 1 ||
      ASN1_TIME_set_string(X509_getm_notBefore(cert.get()), "20000101000000Z") != 1 ||
      ASN1_TIME_set_string(X509_getm_notAfter(cert.get()), "21000101000000Z") != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return nullptr;
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("tally"), -1, -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), name) != 1) {
    return nullptr;
  }
  if (X509_sign(cert.get(), key, nullptr) <= 0) return nullptr;  // Ed25519: no digest
  return cert;
}

// The raw Ed25519 key of a certificate, or nothing if it is not an Ed25519 key.
std::optional<PublicKey> ed25519KeyOf(X509* cert) {
  EVP_PKEY* key = X509_get0_pubkey(cert);
  if (key == nullptr || EVP_PKEY_id(key) != EVP_PKEY_ED25519) return std::nullopt;
  PublicKey out{};
  size_t length = out.size();
  if (EVP_PKEY_get_raw_public_key(key, out.data(), &length) != 1 || length != out.size()) {
    return std::nullopt;
  }
  return out;
}

}  // namespace

struct TlsSession::Impl {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx;
  std::unique_ptr<SSL, SslFree> ssl;
  BIO* network_in = nullptr;   // owned by ssl: ciphertext fed to OpenSSL
  BIO* network_out = nullptr;  // owned by ssl: ciphertext OpenSSL produced
};

namespace {

// Replaces chain verification: the peer is its leaf certificate's Ed25519 key, accepted or not.
int verifyPeer(X509_STORE_CTX* store, void* arg) {
  auto* accept = static_cast<std::function<bool(const PublicKey&)>*>(arg);
  X509* leaf = X509_STORE_CTX_get0_cert(store);
  const std::optional<PublicKey> key = leaf != nullptr ? ed25519KeyOf(leaf) : std::nullopt;
  if (!key.has_value() || !(*accept)(*key)) {
    X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
    return 0;
  }
  return 1;
}

// Records the first fatal alert the peer sends (where = SSL_CB_READ_ALERT).
void onInfo(const SSL* ssl, int where, int value) {
  if ((where & SSL_CB_READ_ALERT) != SSL_CB_READ_ALERT) return;  // not an alert we received
  if ((value >> 8) != SSL3_AL_FATAL) return;
  auto* session = static_cast<TlsSession*>(SSL_get_app_data(ssl));
  if (session != nullptr) session->notePeerAlert(SSL_alert_desc_string_long(value));
}

}  // namespace

TlsSession::TlsSession(TlsOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

TlsSession::~TlsSession() = default;

Result<std::unique_ptr<TlsSession>> TlsSession::create(TlsOptions options) {
  if (!options.accept_peer) {
    return Status::invalidArgument("TLS session: accept_peer is required (peer keys are pinned)");
  }
  std::unique_ptr<TlsSession> session(new TlsSession(std::move(options)));
  Impl& impl = *session->impl_;
  const bool client = session->options_.role == TlsRole::kClient;
  impl.ctx.reset(SSL_CTX_new(client ? TLS_client_method() : TLS_server_method()));
  if (!impl.ctx) return Status::ioError(opensslError("SSL_CTX_new"));
  SSL_CTX* ctx = impl.ctx.get();
  PkeyPtr key = privateKeyOf(session->options_.key);
  if (!key) return Status::ioError(opensslError("Ed25519 key"));
  X509Ptr cert = selfSigned(key.get());
  if (!cert) return Status::ioError(opensslError("self-signed certificate"));
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set1_sigalgs_list(ctx, "ed25519") != 1 ||
      SSL_CTX_use_certificate(ctx, cert.get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    return Status::ioError(opensslError("TLS context"));
  }
  // No resumption: every connection authenticates its peer's key afresh.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  if (SSL_CTX_set_num_tickets(ctx, 0) != 1) return Status::ioError(opensslError("tickets"));
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_cert_verify_callback(ctx, verifyPeer, &session->options_.accept_peer);

  impl.ssl.reset(SSL_new(ctx));
  if (!impl.ssl) return Status::ioError(opensslError("SSL_new"));
  impl.network_in = BIO_new(BIO_s_mem());
  impl.network_out = BIO_new(BIO_s_mem());
  if (impl.network_in == nullptr || impl.network_out == nullptr) {
    BIO_free(impl.network_in);
    BIO_free(impl.network_out);
    return Status::ioError(opensslError("BIO_new"));
  }
  // An empty input BIO means "wait for more bytes", not end of file.
  BIO_set_mem_eof_return(impl.network_in, -1);
  SSL_set_bio(impl.ssl.get(), impl.network_in, impl.network_out);
  SSL_set_app_data(impl.ssl.get(), session.get());
  SSL_set_info_callback(impl.ssl.get(), onInfo);
  if (client) {
    SSL_set_connect_state(impl.ssl.get());
  } else {
    SSL_set_accept_state(impl.ssl.get());
  }
  return session;
}

Status TlsSession::fail(Status status) {
  if (error_.isOk()) error_ = std::move(status);
  ERR_clear_error();
  return error_;
}

Status TlsSession::start() {
  if (failed()) return error_;
  return advance();
}

Status TlsSession::feed(std::span<const uint8_t> ciphertext) {
  if (failed()) return error_;
  size_t at = 0;
  while (at < ciphertext.size()) {
    const int chunk = static_cast<int>(std::min<size_t>(ciphertext.size() - at, 1 << 30));
    const int written = BIO_write(impl_->network_in, ciphertext.data() + at, chunk);
    if (written <= 0) return fail(Status::ioError(opensslError("BIO_write")));
    at += static_cast<size_t>(written);
  }
  return advance();
}

Status TlsSession::write(std::span<const uint8_t> plaintext) {
  if (failed()) return error_;
  if (closing_) return fail(Status::failedPrecondition("TLS session: write after close"));
  if (pending_plaintext_.size() + plaintext.size() > options_.pending_plaintext_bytes_max) {
    return Status::resourceExhausted("TLS session: " + std::to_string(pending_plaintext_.size()) +
                                     " bytes already wait to be encrypted");
  }
  pending_plaintext_.insert(pending_plaintext_.end(), plaintext.begin(), plaintext.end());
  return advance();
}

void TlsSession::close() {
  if (failed() || closing_) return;
  closing_ = true;
  if (handshake_done_ && pending_plaintext_.empty()) (void)SSL_shutdown(impl_->ssl.get());
}

Status TlsSession::advance() {
  SSL* ssl = impl_->ssl.get();
  if (!handshake_done_) {
    const int rc = SSL_do_handshake(ssl);
    if (rc != 1) {
      const int error = SSL_get_error(ssl, rc);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return Status::ok();
      if (SSL_get_verify_result(ssl) != X509_V_OK) {
        peer_refused_ = true;
        return fail(Status::failedPrecondition("TLS handshake: the peer's key is not accepted"));
      }
      return fail(Status::unavailable(opensslError("TLS handshake")));
    }
    X509* peer = SSL_get0_peer_certificate(ssl);
    peer_key_ = peer != nullptr ? ed25519KeyOf(peer) : std::nullopt;
    if (!peer_key_.has_value() || !options_.accept_peer(*peer_key_)) {  // verified already
      peer_key_.reset();
      peer_refused_ = true;
      return fail(Status::failedPrecondition("TLS handshake: the peer's key is not accepted"));
    }
    handshake_done_ = true;
  }
  // Encrypt what waits, then decrypt what arrived.
  size_t sent = 0;
  while (sent < pending_plaintext_.size()) {
    const int chunk = static_cast<int>(std::min<size_t>(pending_plaintext_.size() - sent, 1 << 20));
    size_t written = 0;
    if (SSL_write_ex(ssl, pending_plaintext_.data() + sent, static_cast<size_t>(chunk), &written) !=
        1) {
      const int error = SSL_get_error(ssl, 0);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) break;
      return fail(Status::unavailable(opensslError("TLS write")));
    }
    sent += written;
  }
  pending_plaintext_.erase(pending_plaintext_.begin(),
                           pending_plaintext_.begin() + static_cast<ptrdiff_t>(sent));
  if (closing_ && pending_plaintext_.empty()) (void)SSL_shutdown(ssl);
  uint8_t buffer[16 * 1024];
  while (!peer_closed_) {
    size_t read = 0;
    if (SSL_read_ex(ssl, buffer, sizeof(buffer), &read) == 1) {
      received_.insert(received_.end(), buffer, buffer + read);
      continue;
    }
    const int error = SSL_get_error(ssl, 0);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) break;
    if (error == SSL_ERROR_ZERO_RETURN) {
      peer_closed_ = true;
      break;
    }
    return fail(Status::corruption(opensslError("TLS record")));
  }
  return Status::ok();
}

std::vector<uint8_t> TlsSession::takeCiphertext() {
  std::vector<uint8_t> out;
  const size_t pending = BIO_ctrl_pending(impl_->network_out);
  if (pending == 0) return out;
  out.resize(pending);
  const int read = BIO_read(impl_->network_out, out.data(), static_cast<int>(pending));
  out.resize(read > 0 ? static_cast<size_t>(read) : 0);
  return out;
}

std::vector<uint8_t> TlsSession::takePlaintext() { return std::exchange(received_, {}); }

Result<std::string> TlsSession::certificatePem(const identity::KeyPair& key) {
  PkeyPtr pkey = privateKeyOf(key);
  if (!pkey) return Status::ioError(opensslError("Ed25519 key"));
  X509Ptr cert = selfSigned(pkey.get());
  if (!cert) return Status::ioError(opensslError("self-signed certificate"));
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert.get()) != 1) {
    return Status::ioError(opensslError("PEM_write_bio_X509"));
  }
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(length));
}

}  // namespace tally::net
