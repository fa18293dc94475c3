#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/ledger_protocol.h"

// What a partitioned agent (docs/scale-out.md "Partitioned subjects") does with the answers of
// several partitions, once agentPartitionRoute (core/agent_partitions.h) said a request goes to
// more than one:
//
//  * Fleet-wide requests (kEvery): health, an audit of every subject and the policy are asked of
//    every partition and the answers merged into one (mergeFleetAnswers); every other fleet-wide
//    kind is one the agent answers itself without the ledger (a refusal: operator and
//    agent-to-ledger requests, publish/rollback), the same for every partition, so partition 0's
//    answer is the answer.
//  * A follow-up whose partition the agent has no record of (kUnrecorded): the agent asks every
//    partition a query for its reservation id (ids are unique in the fleet) and sends the
//    follow-up to the one that holds it (decideUnrecorded).
//  * The record of a reservation's partition is forgotten once an answer shows the reservation
//    final (partitionRecordDone).
//
// Pure: no I/O, no clock. answers[i] is always partition i's.

namespace tally {

enum class FleetRequest : uint8_t {
  kMerged,        // ask every partition, merge the answers (mergeFleetAnswers)
  kFirstOnly,     // answered by the agent alike for every partition: partition 0 answers
  kNotMergeable,  // asked of every partition but no merge is defined: refused (fleetRefusal)
};
// For a request agentPartitionRoute sends to every partition.
FleetRequest fleetRequestOf(const LedgerRequest& request);
// The refusal of a kNotMergeable request (an ErrorReply kInvalidArgument naming what to do).
LedgerReply fleetRefusal(const LedgerRequest& request);

// One answer from the answers of every partition to a kMerged request:
//  * health: the worst status (HEALTHY < DEGRADED < PARTITIONED < DISCONNECTED < any other text),
//    the latest now_ms; a partition answering anything else counts as UNAVAILABLE;
//  * audit of every subject: mergePartitionAudits (core/partition_map.h), as `tallyctl
//    --partitions audit`; a partition that answers anything but its audit fails the request,
//    named ("partition 1 did not answer with its audit: …"), its error code kept;
//  * policy: one document, generation the lowest of the partitions' (the fleet is at least
//    there), budgets in partition order without repeats (a pattern budget is in every
//    partition); if generations differ the reply's message names each. A partition that answers
//    anything but its policy fails the request, named, as for the audit.
LedgerReply mergeFleetAnswers(const LedgerRequest& request, std::span<const LedgerReply> answers);

struct UnrecordedDecision {
  enum class Kind : uint8_t {
    kForward,  // send the follow-up to `partition` (and record it there)
    kAnswer,   // answer `reply` (no partition holds the reservation, or it cannot be known now)
  };
  Kind kind = Kind::kAnswer;
  uint32_t partition = 0;
  LedgerReply reply;
};
// The query answers of every partition for `reservation_id`: the one partition whose answer is
// the reservation (code kOk) gets the follow-up. None: if every partition answered NOT_FOUND,
// that answer (the ledger's own to a follow-up on an unknown id); if some did not answer, an
// ErrorReply kUnavailable naming them ("retry with the same id"). Two (a fleet-unique id held
// twice: a map that differed between writers): ErrorReply kInternal naming both.
UnrecordedDecision decideUnrecorded(std::string_view reservation_id,
                                    std::span<const LedgerReply> query_answers);

// Whether `answer` to a reserve or follow-up shows the reservation final (settled, released,
// expired, rejected): its record of partition is no longer needed. A QUEUED answer is not
// (the outcome is the ledger's, later), nor an error (the gateway retries with the same id).
bool partitionRecordDone(const LedgerReply& answer);

}  // namespace tally
