#pragma once

#include <string>
#include <vector>

#include "core/reservation.h"
#include "core/shard_record.h"
#include "core/shard_types.h"

// The checks the ledger applies to an agent's shard report (docs/SHARDS.md, "Report" rules 3
// and 4), as pure functions of the report and the shard's stored record. No state, no crypto.

namespace tally {

// Rule 3: the report is self-consistent. Empty if so, else why not.
//  * its balances conserve and `allocated` is the grant's;
//  * receipt ids are unique, each with origin = shard id and the shard's subject/route, each
//    holding units (RESERVED, EXPIRING, STARTED, USAGE_UNKNOWN) or terminal;
//  * Σ units of holding receipts = local_reserved;
//  * Σ actual of settled receipts = local_spent + overspent.
std::string checkReportConsistency(const ShardReport& report, uint64_t receipts_max);

// Rule 4: why the report is a conflict, or empty. A conflict when: overspent > 0; the record
// is already in CONFLICT; or, after an accepted report (every report is of a closed shard), the
// report names a receipt that one did not (admitted after close: another process or boot
// epoch used the shard), lacks one it had, changes a terminal one or a holding one's units;
// or units already reminted reappear as used.
std::string findReportConflict(const ShardRecord& record, const ShardReport& report);

// Whether the accepted report supersedes this one: an earlier report (of the same or an earlier
// boot epoch: the agent re-reported after a restart), delivered late (reordered) or replayed,
// with nothing in it the record does not know. Every
// receipt is the record's, the same or one that has resolved since (holding then, terminal now,
// with the same reserved units), no receipt is missing, and its balances prove no more unused
// and no more spent than the record's last report. Such a report is answered, not reconciled:
// it is no evidence of a second use of the shard.
bool supersededByRecord(const ShardRecord& record, const ShardReport& report);

// The receipts a conflict keeps: the record's receipts united with the report's, by id (of two
// terminal versions of one id, the one with the larger actual wins; a terminal version beats
// a holding one), sorted by id.
std::vector<Reservation> unionReceipts(const std::vector<Reservation>& stored,
                                       const std::vector<Reservation>& reported);

// Σ actual of the settled receipts.
Units settledUsage(const std::vector<Reservation>& receipts);

// The report's receipts sorted by id (the form the record keeps).
std::vector<Reservation> sortedReceipts(const std::vector<Reservation>& receipts);

}  // namespace tally
