#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/ledger_types.h"
#include "core/status.h"
#include "core/types.h"

// The canonical request digest (SPEC §5): sha256 (OpenSSL) over capnp::canonicalize() of a
// schema::CanonicalReserve holding exactly the identifying fields of a reserve request. The hashed
// bytes are the canonical single segment as Cap'n Proto defines it (root pointer first, no
// segment table, trailing zero data words and null pointers dropped, text in field order), so a
// client in another language reproduces it with its own canonicalization. Two processes, or two
// versions, compute the same digest for the same request; the test vectors in
// tests/wire/digest_test.cc pin it. The digest field itself is not part of what is hashed.

namespace tally::wire {

// sha256 of raw bytes.
Digest sha256(std::span<const uint8_t> bytes);
Digest sha256(std::string_view bytes);

// Hashes reservation_id, subject, route, units, policy_generation and priority; ignores
// request.request_digest.
Digest canonicalRequestDigest(const ReserveRequest& request);

// 64 lowercase hex characters.
std::string digestHex(const Digest& digest);
// Exactly 64 hex characters, either case; anything else is kInvalidArgument.
Result<Digest> parseDigestHex(std::string_view hex);

}  // namespace tally::wire
