// tallyctl: the operator's and scripts' client of tally-ledger and tally-agent. The command
// line, JSON fields and exit codes are an external contract: see usageText() in args.cc.

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "central-client/blocking_client.h"
#include "central-client/ledger_addresses.h"
#include "ctl/args.h"
#include "ctl/commands.h"
#include "ctl/partitioned.h"
#include "net/tls_session.h"
#include "shard/identity.h"

namespace {

using namespace tally;

void write(std::FILE* stream, const std::string& text) {
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), stream);
}

// --ledger-key: a base64 public key, or a file holding one (first line) or a key pair.
Result<PublicKey> ledgerKey(const std::string& text) {
  if (Result<PublicKey> key = identity::decodePublicKey(text); key.isOk()) return key;
  if (Result<identity::KeyPair> pair = identity::loadKeyPair(text); pair.isOk()) {
    return pair.value().public_key;
  }
  std::FILE* file = std::fopen(text.c_str(), "r");
  if (file == nullptr) {
    return Status::invalidArgument("--ledger-key '" + text +
                                   "' is neither a base64 public key nor a readable file");
  }
  char line[128] = {};
  const bool read = std::fgets(line, sizeof(line), file) != nullptr;
  std::fclose(file);
  std::string trimmed = read ? line : "";
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == '\r')) trimmed.pop_back();
  Result<PublicKey> key = identity::decodePublicKey(trimmed);
  if (!key.isOk())
    return Status::invalidArgument("--ledger-key " + text + ": " + key.status().message());
  return key;
}

// net::TlsSession as the blocking client drives it.
class TlsLinkSession final : public client::LinkSession {
 public:
  explicit TlsLinkSession(std::unique_ptr<net::TlsSession> session)
      : session_(std::move(session)) {}
  Status start() override { return session_->start(); }
  Status feed(std::span<const uint8_t> ciphertext) override { return session_->feed(ciphertext); }
  Status write(std::span<const uint8_t> plaintext) override { return session_->write(plaintext); }
  std::vector<uint8_t> takeCiphertext() override { return session_->takeCiphertext(); }
  std::vector<uint8_t> takePlaintext() override { return session_->takePlaintext(); }
  bool handshakeDone() const override { return session_->handshakeDone(); }
  bool peerRefused() const override { return session_->peerRefused(); }
  std::optional<std::string> peerAlert() const override { return session_->peerAlert(); }

 private:
  std::unique_ptr<net::TlsSession> session_;
};

// The TLS sessions of the link to a ledger: the operator key, pinning the ledger's key. None
// for --insecure or an agent's Unix socket.
Result<client::BlockingClientOptions> clientOptions(const ctl::Invocation& inv) {
  client::BlockingClientOptions options;
  if (inv.insecure || inv.endpoint.kind != client::Endpoint::Kind::kTcp) return options;
  if (inv.key_file.empty()) {
    return Status::invalidArgument(
        "the link to the ledger is TLS: give --key FILE (the ledger's DATA_DIR/operator.key), "
        "or --insecure for a ledger started with --insecure");
  }
  Result<identity::KeyPair> key = identity::loadKeyPair(inv.key_file);
  if (!key.isOk())
    return Status::invalidArgument("--key " + inv.key_file + ": " + key.status().message());
  std::string pin = inv.ledger_key;
  if (pin.empty()) {
    const size_t slash = inv.key_file.find_last_of('/');
    pin = (slash == std::string::npos ? std::string(".") : inv.key_file.substr(0, slash)) +
          "/ledger.key";
  }
  Result<PublicKey> ledger = ledgerKey(pin);
  if (!ledger.isOk()) {
    return Status::invalidArgument(ledger.status().message() +
                                   (inv.ledger_key.empty() ? " (give --ledger-key)" : ""));
  }
  options.tls = [operator_key = key.value(),
                 ledger_key = ledger.value()]() -> Result<std::unique_ptr<client::LinkSession>> {
    Result<std::unique_ptr<net::TlsSession>> session = net::TlsSession::create(net::TlsOptions{
        .role = net::TlsRole::kClient,
        .key = operator_key,
        .accept_peer = [ledger_key](const PublicKey& peer) { return peer == ledger_key; }});
    if (!session.isOk()) return session.status();
    return std::unique_ptr<client::LinkSession>(new TlsLinkSession(std::move(session).value()));
  };
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  Result<ctl::Invocation> parsed = ctl::parseArgs(args);
  if (!parsed.isOk()) {
    const ctl::CommandOutput output =
        ctl::renderUsageError(parsed.status(), ctl::jsonRequested(args));
    write(stdout, output.out);
    write(stderr, output.err);
    (void)std::fflush(stdout);  // the exit code already says the command failed
    return output.exit_code;
  }
  const ctl::Invocation& invocation = parsed.value();

  // One connection per invocation, opened only once the request is known to be valid. The
  // timeout covers connecting and the call together.
  const ctl::CallFn call = [&invocation](const wire::RequestBody& body) -> Result<wire::Response> {
    Result<client::BlockingClientOptions> options = clientOptions(invocation);
    if (!options.isOk()) return options.status();
    if (!invocation.ledgers.empty()) {  // every address speaks the same link (TLS or not)
      return client::callThePrimary(
          invocation.ledgers, body, invocation.timeout_ms,
          [&options](const client::Endpoint& endpoint, uint64_t timeout_ms) {
            return client::BlockingClient::connect(endpoint, timeout_ms, options.value());
          });
    }
    const auto started = std::chrono::steady_clock::now();
    Result<std::unique_ptr<client::BlockingClient>> connection = client::BlockingClient::connect(
        invocation.endpoint, invocation.timeout_ms, options.value());
    if (!connection.isOk()) return connection.status();
    const auto spent_ms =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - started)
                                  .count());
    const uint64_t left_ms =
        spent_ms < invocation.timeout_ms ? invocation.timeout_ms - spent_ms : 1;
    return connection.value()->call(body, left_ms);
  };

  // --partitions: each partition's addresses as --ledger's are (the same link options).
  const ctl::PartitionCallFn call_partition =
      [&invocation](uint32_t partition, const wire::RequestBody& body) -> Result<wire::Response> {
    Result<client::BlockingClientOptions> options = clientOptions(invocation);
    if (!options.isOk()) return options.status();
    return client::callThePrimary(
        invocation.partitions[partition], body, invocation.timeout_ms,
        [&options](const client::Endpoint& endpoint, uint64_t timeout_ms) {
          return client::BlockingClient::connect(endpoint, timeout_ms, options.value());
        });
  };

  const ctl::CommandOutput output = invocation.partitions.empty()
                                        ? ctl::runCommand(invocation, call)
                                        : ctl::runPartitionedCommand(invocation, call_partition);
  write(stdout, output.out);
  write(stderr, output.err);
  if (std::fflush(stdout) != 0 && output.exit_code == ctl::kExitOk) return ctl::kExitInternal;
  return output.exit_code;
}
