#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

// Value types shared by every state machine. All amounts are non-negative 64-bit integers in
// the policy's capacity unit; all times are milliseconds on the ledger clock (see ledger.h).

namespace tally {

using Units = uint64_t;
using Generation = uint64_t;

// sha256 of the canonical encoding of a request (computed in wire/, compared here).
using Digest = std::array<uint8_t, 32>;

struct AccountKey {
  std::string subject;
  std::string route;
  Generation generation = 0;

  auto operator<=>(const AccountKey&) const = default;
};

struct SubjectRoute {
  std::string subject;
  std::string route;

  auto operator<=>(const SubjectRoute&) const = default;
};

// Which accounts an audit lists: an empty field matches everything.
struct AccountFilter {
  std::string_view subject;
  std::string_view route;
  // A page: only subject/routes after (after_subject, after_route), at most routes_max of them
  // (0: no paging).
  std::string_view after_subject;
  std::string_view after_route;
  uint32_t routes_max = 0;

  bool all() const {
    return subject.empty() && route.empty() && !paged() && after_subject.empty() &&
           after_route.empty();
  }
  bool paged() const { return routes_max > 0; }
  bool matches(const SubjectRoute& key) const {
    if (!subject.empty() && key.subject != subject) return false;
    if (!route.empty() && key.route != route) return false;
    if (after_subject.empty() && after_route.empty()) return true;
    const std::string_view subject_key = key.subject;
    if (subject_key != after_subject) return subject_key > after_subject;
    return std::string_view(key.route) > after_route;
  }
};

// Why an admission was refused. Wire names are in limitingDimensionName().
enum class LimitingDimension : uint8_t {
  kNone = 0,
  kCapacity,              // available < units
  kDebt,                  // this account owes overdraft
  kFrozenRoute,           // another generation of this subject/route owes overdraft
  kMaxSingleReservation,  // units above the policy's maximum single reservation
  kGenerationDraining,    // the matched generation admits nothing new
  kNoBudget,              // no published budget matches subject/route
  kLedgerUnavailable,     // agent: the ledger is unreachable (partition); retry later
};

const char* limitingDimensionName(LimitingDimension dimension);

// Retry-after meaning "never under this policy" (units above max single reservation or burst,
// no budget, or refill rate 0).
inline constexpr int64_t kRetryNever = -1;

}  // namespace tally
