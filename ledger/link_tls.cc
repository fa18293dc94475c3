#include "ledger/link_tls.h"

#include <sys/stat.h>

#include <utility>

#include "common/wall_clock.h"
#include "core/link_authority.h"

namespace tally::ledger {

std::string operatorKeyPath(const std::string& data_dir) { return data_dir + "/operator.key"; }

Result<identity::KeyPair> loadOrCreateOperatorKey(const std::string& data_dir, Logger* logger) {
  const std::string path = operatorKeyPath(data_dir);
  struct stat existing {};
  const bool existed = ::stat(path.c_str(), &existing) == 0;
  Result<identity::KeyPair> key = identity::loadOrCreateKeyPair(path);
  if (key.isOk() && !existed) {
    logger->info("operator_key_created", {{"path", path},
                                          {"key_id", identity::keyIdOf(key.value().public_key)},
                                          {"use", "tallyctl --key " + path}});
  }
  return key;
}

bool admitsPeer(const Ledger& ledger, const PublicKey& operator_key, const PublicKey& key) {
  // The wall clock: the ledger clock is Unix ms too (it only never goes back), and a rotation's
  // window is minutes to days long.
  if (key == operator_key && key != PublicKey{}) return true;  // the first operator
  return identifyLinkPeer(ledger.shards(), ledger.operators().all(), key, wallClockMs()).role !=
         LinkRole::kNobody;
}

std::function<Result<std::unique_ptr<net::TlsSession>>()> serverTlsSessions(
    const identity::KeyPair& ledger_key, const Ledger* ledger, const PublicKey& operator_key) {
  return [ledger_key, ledger, operator_key]() {
    return net::TlsSession::create(
        net::TlsOptions{.role = net::TlsRole::kServer,
                        .key = ledger_key,
                        .accept_peer = [ledger, operator_key](const PublicKey& key) {
                          return admitsPeer(*ledger, operator_key, key);
                        }});
  };
}

bool startServerTls(net::FramedStream* stream,
                    const std::function<Result<std::unique_ptr<net::TlsSession>>()>& make_session,
                    Logger* logger) {
  Result<std::unique_ptr<net::TlsSession>> session = make_session();
  if (!session.isOk()) {
    logger->error("tls_session_failed", {{"error", session.status().toString()}});
    stream->close();
    return false;
  }
  stream->startTls(std::move(session).value());
  return !stream->closing() && !stream->shuttingDown();
}

std::function<Result<std::unique_ptr<net::TlsSession>>()> standbyTlsSessions(
    const identity::KeyPair& ledger_key) {
  return [ledger_key]() {
    return net::TlsSession::create(net::TlsOptions{
        .role = net::TlsRole::kServer, .key = ledger_key, .accept_peer = [](const PublicKey&) {
          return true;
        }});
  };
}

}  // namespace tally::ledger
