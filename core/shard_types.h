#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/reservation.h"
#include "core/shard_account.h"
#include "core/types.h"

// Value types of emergency shards (SPEC §6), shared by the ledger's shard registry, the agent's
// shard book, the wire layer (schemas/emergency_shard.capnp, schemas/protocol.capnp) and the
// shells. Plain values: no crypto here. Signing and verifying go through ShardCrypto, which the
// wire layer implements (Ed25519 over the canonical Cap'n Proto encoding, libsodium) and unit
// tests fake.

namespace tally {

using PublicKey = std::array<uint8_t, 32>;  // Ed25519

// A gateway's or an operator's name: 1..bytes_max bytes of [A-Za-z0-9._-].
bool isIdentityName(std::string_view name, uint64_t bytes_max);
using Signature = std::array<uint8_t, 64>;  // Ed25519, detached

// emergencyShard.v1: what the ledger carved for one gateway, as signed.
struct ShardGrant {
  std::string shard_id;
  std::string subject;
  std::string route;
  Generation policy_generation = 0;
  uint64_t accounting_epoch_ms = 0;
  PublicKey gateway_id{};  // the gateway's public key
  std::string gateway_name;
  uint64_t gateway_boot_epoch = 0;
  uint64_t fence = 0;
  Units allocated_units = 0;
  uint64_t issued_at_ms = 0;
  uint64_t expires_at_ms = 0;
  std::string ledger_key_id;
  Signature signature{};  // by the ledger key over every other field

  bool operator==(const ShardGrant&) const = default;
};

// ShardIssueRequestV1: a healthy agent asking for a shard; signed by its gateway key.
struct ShardIssueRequest {
  std::string request_id;  // idempotency: the same id returns the same shard
  std::string gateway_name;
  PublicKey gateway_id{};
  uint64_t gateway_boot_epoch = 0;
  std::string subject;
  std::string route;
  Signature signature{};

  bool operator==(const ShardIssueRequest&) const = default;
};

// ShardReportV1: the agent's final word on a shard it closed, signed by its gateway key.
// `receipts` are limitReservation.v1 records with origin = shard id: terminal ones carry actual
// units; RESERVED, STARTED and USAGE_UNKNOWN ones hold units (counted in local_reserved).
struct ShardReport {
  ShardGrant shard;        // as issued, ledger signature included
  ShardBalances balances;  // allocated = available + reserved + spent + retired; plus overspent
  std::vector<Reservation> receipts;
  uint64_t gateway_boot_epoch = 0;  // of the agent that sends the report
  uint64_t reported_at_ms = 0;
  Signature signature{};

  bool operator==(const ShardReport&) const = default;
};

// The ledger's view of a shard. Wire names in shardStateName(): ISSUED, REVOKED, RECONCILING,
// RECONCILED, CONFLICT, WRITTEN_OFF.
enum class ShardState : uint8_t {
  kIssued = 0,
  kRevoked,      // an operator revoked it (fence bumped); a report is still accepted
  kReconciling,  // reported; STARTED/UNKNOWN receipts keep their units retired
  kReconciled,   // every receipt terminal; nothing of it is retired any more
  kConflict,     // two gateways or boot epochs, or overspend: nothing (more) is reminted
  kWrittenOff,   // expired unreported; its units stay retired for ever
};
inline constexpr int kShardStateCount = 6;
const char* shardStateName(ShardState state);
// Parses a wire name (as shardStateName prints it); false if unknown.
bool parseShardState(const std::string& name, ShardState* state);

// The central side of one shard. Invariant (audited):
//   allocated = spent + reminted + retired
// and, per account, retiredForEmergency = Σ retired over the shards carved from it.
struct ShardLedgerView {
  ShardGrant grant;
  ShardState state = ShardState::kIssued;
  uint64_t current_fence = 0;  // of the grant's subject/route, now
  Units spent_units = 0;
  Units reminted_units = 0;
  Units retired_units = 0;  // still retired: pending receipts, unreported, burst cap, written off
  Units debt_units = 0;     // overspend recorded as debt
  bool written_off = false;
  bool conserved = true;
  bool reported = false;
  ShardBalances last_reported;  // the agent's last accepted report, if any

  bool operator==(const ShardLedgerView&) const = default;
};

struct GatewayRecord {
  std::string gateway_name;
  PublicKey public_key{};
  bool enabled = true;
  uint64_t enrolled_at_ms = 0;
  // A key rotation (`tallyctl gateway rotate`, docs/security.md "Rotation"): the key public_key
  // replaced, still admitted on the link (and for the shards it signed) while now_ms <
  // previous_key_until_ms, until public_key is first used on the link. Zero: none.
  PublicKey previous_public_key{};
  uint64_t previous_key_until_ms = 0;

  bool operator==(const GatewayRecord&) const = default;
};

// Signs and verifies the three signed messages. shard/ implements it over the canonical
// Cap'n Proto encoding (shard/crypto.h); core only calls it.
class ShardCrypto {
 public:
  virtual ~ShardCrypto() = default;
  // The ledger side: signs `grant` (every field but `signature`) with the ledger key, setting
  // grant->ledger_key_id and grant->signature. Deterministic (Ed25519).
  virtual void signGrant(ShardGrant* grant) const = 0;
  // The agent side: does `grant.signature` verify under a configured ledger key whose id is
  // grant.ledger_key_id?
  virtual bool verifyGrant(const ShardGrant& grant) const = 0;
  virtual bool verifyIssueRequest(const ShardIssueRequest& request) const = 0;  // by gateway_id
  virtual bool verifyReport(const ShardReport& report) const = 0;  // by report.shard.gateway_id
};

}  // namespace tally
