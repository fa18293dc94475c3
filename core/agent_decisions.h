#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/ledger_types.h"
#include "core/link_health.h"
#include "core/outbox.h"
#include "core/policy.h"

// The agent's routing decisions as small pure functions, and the bounded id/age sets behind its
// RESERVATION_UNKNOWN and USAGE_UNKNOWN gauges. No I/O, no clock: time is an argument.

namespace tally {

// The rollout mode for (subject, route): the matched budget's effective mode; no policy known
// yet, or no budget matching, means enforce (the ledger decides).
RolloutMode rolloutModeFor(const std::optional<Policy>& policy, const std::string& subject,
                           const std::string& route);

// What the agent knows about a reserve when it arrives.
struct ReserveFacts {
  bool shard_owned = false;  // the shard keeper holds this id
  bool local = false;        // a reservation the agent admitted itself (off / shadow)
  bool unknown = false;      // RESERVATION_UNKNOWN
  RolloutMode mode = RolloutMode::kEnforce;
  bool link_usable = false;
  bool shards_enabled = false;  // a shard keeper is configured
  bool sent_to_ledger = false;  // the id is among those recently sent to the ledger
};
// Where a reserve goes, by precedence.
enum class ReserveRoute : uint8_t {
  kShards,              // the shard keeper answers for its own reservation
  kLocalDuplicate,      // the local receipt again
  kResolveUnknown,      // resolved by a query with the same id, never a new id
  kLocalOff,            // rollout off: admitted locally
  kShadowUnreachable,   // shadow, link unusable: admitted locally
  kSentToLedgerBefore,  // partition, the ledger may hold it: UNAVAILABLE, never a shard admission
  kTryShard,            // partition: from a usable shard if one can, else rejected
  kRejectUnavailable,   // partition, no shards: REJECTED ledger-unavailable
  kForward,             // to the ledger (enforce, or shadow to learn its decision)
};
ReserveRoute reserveRoute(const ReserveFacts& facts);

// The link can carry admissions and the start CAS: connected and not PARTITIONED.
bool linkUsable(bool connected, LinkHealth health);

// Where a settle / release / markUnknown / reportOperation goes.
enum class FollowUp : uint8_t {
  kLocal,    // a reservation the agent admitted itself (off / shadow)
  kOutbox,   // durably queued, delivered in order later
  kForward,  // straight to the ledger
};
// Never overtake: while anything is queued, later operations queue behind it.
FollowUp followUpRoute(bool local, bool outbox_nonempty, bool link_usable);

// Where a start goes: local, forward, or (partition) a retryable kUnavailable.
enum class StartRoute : uint8_t { kLocal, kForward, kUnavailable };
StartRoute startRoute(bool local, bool link_usable);

// A receipt for `request` in `state`, made by the agent at `now_ms` (not the ledger's).
Reservation agentReceiptOf(const ReserveRequest& request, ReservationState state, uint64_t now_ms);

// The rejection a reserve gets while the ledger is unreachable (enforce mode, no shards).
ReservationReply ledgerUnavailableRejection(const ReserveRequest& request, int64_t retry_after_ms,
                                            uint64_t now_ms);

// Whether the ledger's answer to a queued outbox entry delivers it. An answer that says the
// ledger changed nothing (no ReservationReply at all, RESOURCE_EXHAUSTED, ARITHMETIC_OVERFLOW)
// does not: the acknowledged entry stays queued and is retried. Every other reply (OK,
// duplicate, NOT_FOUND, INVALID_STATE, conflicts, …) is the ledger's final word on it.
bool outboxAnswerDelivers(const ReservationReply* reply);

// What a shadow-mode ledger answer means, for the shadow-decision metric.
struct ShadowDecision {
  const char* outcome = "admitted";  // admitted | rejected | unavailable | error
  LimitingDimension dimension = LimitingDimension::kNone;
  bool admit_locally = false;  // the ledger did not reserve: the agent admits on its own
};
// `reply` is null when the ledger's answer was lost or was not a ReservationReply.
ShadowDecision classifyShadow(const ReservationReply* reply, bool transport_failed);

// What became of a reserve the agent forwarded, as the link reports it.
enum class LinkOutcome : uint8_t {
  kAnswered,  // the ledger answered (`reply`: its ReservationReply, or null for another body)
  kNotSent,   // refused before it was sent (the link's own queue is full): nothing happened
  kLost,      // sent, and the answer is lost: the debit may or may not have happened
};
// What the agent does with that outcome.
enum class ReserveAnswer : uint8_t {
  kPassOn,       // the ledger's answer goes to the gateway
  kAdmitShadow,  // shadow: the ledger did not reserve; admitted locally (origin "shadow")
  kNotSent,      // kUnavailable "not sent to the ledger: …"
  kUnknown,      // RESERVATION_UNKNOWN: kUnavailable "outcome unknown; retry with the same id"
};
struct ReserveAnswerPlan {
  ReserveAnswer action = ReserveAnswer::kPassOn;
  std::optional<ShadowDecision> shadow;  // shadow mode: the decision to count
  bool learn_shard_account = false;      // enforce, admitted, and the budget wants shards
};
// `shards_wanted`: shards are configured and the budget has emergency mode on
// (AgentPolicy::wantsShards).
ReserveAnswerPlan planReserveAnswer(RolloutMode mode, LinkOutcome outcome,
                                    const ReservationReply* reply, bool shards_wanted);

// A bounded set of ids, each with the time it entered; answers the count and the oldest age.
// "Oldest" orders by (time, id). Each id is stored once: the age index holds views of the
// hash map's keys (stable, the map being node-based). The agent asks it on every reserve and
// adds to it on every send, so each operation takes as few lookups as it can.
class AgedIds {
 public:
  explicit AgedIds(uint64_t entries_max) : entries_max_(entries_max) {}
  // A copy's age index points into the copy's own map (moving keeps the nodes).
  AgedIds(const AgedIds& other);
  AgedIds& operator=(const AgedIds& other);
  AgedIds(AgedIds&&) = default;
  AgedIds& operator=(AgedIds&&) = default;

  // False (nothing changed) when full; true when added or already present.
  bool add(const std::string& id, uint64_t now_ms);
  // As add(), but when full the oldest id makes room (a bounded memory of recent ids).
  void addEvictingOldest(const std::string& id, uint64_t now_ms);
  bool remove(const std::string& id);
  bool contains(const std::string& id) const { return since_.contains(id); }
  size_t size() const { return since_.size(); }
  uint64_t oldestAgeMs(uint64_t now_ms) const;
  // Up to `max` ids, oldest first.
  std::vector<std::string> oldest(size_t max) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view id) const { return std::hash<std::string_view>{}(id); }
  };
  using Since = std::unordered_map<std::string, uint64_t, Hash, std::equal_to<>>;

  // Enters `id` at `now_ms`; the caller checked that it is absent and that there is room.
  Since::iterator insert(const std::string& id, uint64_t now_ms);
  void erase(Since::iterator it);

  uint64_t entries_max_;
  Since since_;
  std::set<std::pair<uint64_t, std::string_view>> by_age_;
};

// The USAGE_UNKNOWN gauge: the ledger's OK answer to a follow-up the agent carried (forwarded
// or delivered from the outbox) enters `id` when a markUnknown left it USAGE_UNKNOWN, and takes
// it out when a settle or reportOperation closed it (a release never changes it).
void trackUsageUnknown(AgedIds* usage_unknown, OutboxKind kind, const std::string& id,
                       const ReservationReply* reply, uint64_t now_ms);

// The two deadlines of a stopping agent: the shutdown deadline (every requester still waiting
// is answered once) and the drain's end (outbox empty, link gone, or its timeout).
class AgentDeadlines {
 public:
  // Arms the shutdown deadline; true when it is now (timeout 0): answer everyone at once.
  bool beginShutdown(uint64_t now_ms, uint64_t timeout_ms);
  void beginDrain(uint64_t now_ms, uint64_t timeout_ms);
  // True once: the shutdown deadline passed, or the drain ended with requesters left.
  bool answerPendingNow(uint64_t now_ms);
  // True once: the drain ends now (then answer everyone still waiting: answerAll()).
  bool drainEnds(uint64_t now_ms, bool outbox_empty, bool connected);
  // The requesters were answered (marks the answer as done; true the first time).
  bool answerAll();
  bool draining() const { return draining_; }

 private:
  bool shutting_down_ = false;
  uint64_t shutdown_deadline_ms_ = 0;
  bool answered_ = false;
  bool draining_ = false;
  uint64_t drain_deadline_ms_ = 0;
};

}  // namespace tally
