#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/log.h"
#include "core/ledger.h"
#include "core/status.h"
#include "net/framed_stream.h"
#include "net/tls_session.h"
#include "shard/identity.h"

// The ledger's side of TLS on the link (docs/security.md "The link"): who it admits, and the
// operator key it creates at first start.
//
// A client is admitted if the Ed25519 key it presents is the key of an enrolled, enabled gateway
// (the ledger's gateway registry, asked at each handshake: a disabled or unknown key is refused)
// or the operator key (DIR/operator.key). The ledger presents its signing key (ledger.key), the
// key agents pin (ledger_public_keys).

namespace tally::ledger {

// DIR/operator.key: tallyctl's identity (`tallyctl --key`). Created 0600 at first start; its
// path is logged once then (event=operator_key_created).
std::string operatorKeyPath(const std::string& data_dir);
Result<identity::KeyPair> loadOrCreateOperatorKey(const std::string& data_dir, Logger* logger);

// Whether `key` may open a TLS session with the ledger right now: it is the operator or an
// enrolled, enabled gateway (core/link_authority.h identifyLinkPeer, which the server asks
// again before every request on the connection).
bool admitsPeer(const Ledger& ledger, const PublicKey& operator_key, const PublicKey& key);

// Makes one server session per accepted connection. `ledger` must outlive the sessions.
std::function<Result<std::unique_ptr<net::TlsSession>>()> serverTlsSessions(
    const identity::KeyPair& ledger_key, const Ledger* ledger, const PublicKey& operator_key);

// Starts TLS on an accepted connection with a session `make_session` makes (the servers'
// options.tls). False when the connection is closing (no session could be made: logged; or the
// session failed at once): the caller does not start reading it.
bool startServerTls(net::FramedStream* stream,
                    const std::function<Result<std::unique_ptr<net::TlsSession>>()>& make_session,
                    Logger* logger);

// A standby's sessions (ledger/standby_server.h): the same ledger key, and any client key, since
// a standby performs nothing: it answers NOT_PRIMARY naming the primary, and the client learns
// from the key it pinned that the answer is the ledger's. It has no gateway registry to ask.
std::function<Result<std::unique_ptr<net::TlsSession>>()> standbyTlsSessions(
    const identity::KeyPair& ledger_key);

}  // namespace tally::ledger
