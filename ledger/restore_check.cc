#include "ledger/restore_check.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "core/account.h"
#include "core/checked_math.h"
#include "core/limits.h"
#include "core/policy.h"
#include "core/reservation.h"

namespace tally::ledger {
namespace {

constexpr uint64_t kRefillCarryMax = 999;  // unit·ms / 1000, always < 1000

std::string keyOf(const AccountKey& key) {
  return key.subject + " " + key.route + " @" + std::to_string(key.generation);
}

std::string policyKey(Generation generation) { return "generation " + std::to_string(generation); }

std::string balancesText(const Balances& b) {
  return "opening " + std::to_string(b.opening) + ", minted " + std::to_string(b.minted) +
         ", overdraftIssued " + std::to_string(b.overdraft_issued) + ", available " +
         std::to_string(b.available) + ", reserved " + std::to_string(b.reserved) + ", spent " +
         std::to_string(b.spent) + ", retiredForEmergency " +
         std::to_string(b.retired_for_emergency) + ", overdraftRepaid " +
         std::to_string(b.overdraft_repaid) + ", transferredOut " +
         std::to_string(b.transferred_out);
}

std::string reservationText(const Reservation& r) {
  return std::string("state ") + reservationStateName(r.state) + ", " + r.subject + " " + r.route +
         " @" + std::to_string(r.policy_generation) + ", reservedUnits " +
         std::to_string(r.reserved_units) + ", actualUnits " + std::to_string(r.actual_units) +
         ", refundedUnits " + std::to_string(r.refunded_units) + ", debtUnits " +
         std::to_string(r.debt_units);
}

// --- Policies ---------------------------------------------------------------------------------

struct UnitField {
  const char* name;
  Units Budget::*member;
  uint64_t max;
};

// The unit values of a budget and their maxima (core/policy.cc validates the same).
constexpr UnitField kBudgetUnitFields[] = {
    {"refill_per_second", &Budget::refill_per_second, limits::kRefillPerSecondMax},
    {"burst", &Budget::burst, limits::kBurstUnitsMax},
    {"max_single_reservation", &Budget::max_single_reservation, limits::kUnitsPerRequestMax},
    {"max_overdraft", &Budget::max_overdraft, limits::kUnitsPerRequestMax},
};

void checkPolicy(const PolicyRecord& record, std::vector<BadRecord>* bad) {
  const Policy& policy = record.policy;
  const size_t before = bad->size();
  for (size_t i = 0; i < policy.budgets.size(); ++i) {
    const Budget& budget = policy.budgets[i];
    const std::string at = "budgets[" + std::to_string(i) + "].";
    for (const UnitField& field : kBudgetUnitFields) {
      const Units value = budget.*field.member;
      if (value > field.max) {
        bad->push_back({"policies", policyKey(policy.generation), at + field.name,
                        std::to_string(value), "above the maximum " + std::to_string(field.max)});
      }
    }
    if (budget.emergency.shard_units > limits::kUnitsPerRequestMax) {
      bad->push_back({"policies", policyKey(policy.generation), at + "emergency.shard_units",
                      std::to_string(budget.emergency.shard_units),
                      "above the maximum " + std::to_string(limits::kUnitsPerRequestMax)});
    }
  }
  if (bad->size() != before) return;
  if (Status status = validatePolicy(policy); !status.isOk()) {
    bad->push_back({"policies", policyKey(policy.generation), "policy", "", status.message()});
  }
}

// Today's maxima applied to every unit value; every other rule is left to validatePolicy.
Policy clamped(Policy policy) {
  for (Budget& budget : policy.budgets) {
    for (const UnitField& field : kBudgetUnitFields) {
      budget.*field.member = std::min(budget.*field.member, field.max);
    }
    budget.max_single_reservation = std::min(budget.max_single_reservation, budget.burst);
    budget.emergency.shard_units = std::min(budget.emergency.shard_units, budget.burst);
  }
  return policy;
}

// --- Accounts and reservations ----------------------------------------------------------------

const Budget* budgetOf(const std::map<Generation, Policy>& policies, const AccountKey& key) {
  auto it = policies.find(key.generation);
  return it == policies.end() ? nullptr : matchBudget(it->second, key.subject, key.route);
}

void checkAccount(const AccountRecord& record, const std::map<Generation, Policy>& policies,
                  std::vector<BadRecord>* bad) {
  const std::string key = keyOf(record.key);
  const size_t before = bad->size();
  for (const BalanceField& field : balancesAboveBound(record.balances)) {
    bad->push_back({"accounts", key, field.name, std::to_string(field.value),
                    "above the balance bound " + std::to_string(limits::kBalanceUnitsMax)});
  }
  if (bad->size() == before && !isConserved(record.balances)) {
    bad->push_back({"accounts", key, "balances", balancesText(record.balances),
                    "does not conserve (opening + minted + overdraftIssued must equal available "
                    "+ reserved + spent + retiredForEmergency + overdraftRepaid + "
                    "transferredOut)"});
  }
  if (record.refill_carry > kRefillCarryMax) {
    bad->push_back({"accounts", key, "refillCarry", std::to_string(record.refill_carry),
                    "above " + std::to_string(kRefillCarryMax)});
  }
  if (budgetOf(policies, record.key) == nullptr) {
    bad->push_back({"accounts", key, "generation", std::to_string(record.key.generation),
                    "no budget of that policy generation governs this subject/route"});
  }
}

struct ReservationUnitField {
  const char* name;
  Units Reservation::*member;
};
constexpr ReservationUnitField kReservationUnitFields[] = {
    {"reservedUnits", &Reservation::reserved_units},
    {"actualUnits", &Reservation::actual_units},
    {"refundedUnits", &Reservation::refunded_units},
    {"debtUnits", &Reservation::debt_units},
};

bool checkReservation(const Reservation& reservation, std::vector<BadRecord>* bad) {
  bool ok = true;
  for (const ReservationUnitField& field : kReservationUnitFields) {
    const Units value = reservation.*field.member;
    if (value > limits::kUnitsPerRequestMax) {
      bad->push_back({"reservations", reservation.reservation_id, field.name, std::to_string(value),
                      "above the request maximum " + std::to_string(limits::kUnitsPerRequestMax)});
      ok = false;
    }
  }
  return ok;
}

AccountKey accountOf(const Reservation& reservation) {
  return AccountKey{reservation.subject, reservation.route, reservation.policy_generation};
}

std::map<Generation, Policy> policiesOf(const std::vector<PolicyRecord>& records, bool clamp) {
  std::map<Generation, Policy> policies;
  for (const PolicyRecord& record : records) {
    policies.emplace(record.policy.generation, clamp ? clamped(record.policy) : record.policy);
  }
  return policies;
}

// The rebased image of a bad account: see planRepair() in the header.
Balances rebased(const Balances& old, Units burst, Units live_reserved) {
  Balances next;
  next.available = std::min(old.available, burst);
  next.reserved = live_reserved;
  next.retired_for_emergency = old.retired_for_emergency;
  next.opening =
      saturatingAdd(saturatingAdd(next.available, next.reserved), next.retired_for_emergency);
  return next;
}

std::string jsonEscaped(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 2);
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", byte);
      out += escape;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string describe(const BadRecord& record) {
  std::string text = record.table + " " + record.key + ": " + record.field;
  if (!record.value.empty()) text += " = " + record.value;
  return text + ": " + record.why;
}

std::vector<BadRecord> findBadRecords(const StoreContents& contents) {
  std::vector<BadRecord> bad;
  for (const PolicyRecord& record : contents.policies) checkPolicy(record, &bad);
  const std::map<Generation, Policy> policies = policiesOf(contents.policies, /*clamp=*/false);
  for (const AccountRecord& record : contents.accounts) checkAccount(record, policies, &bad);
  for (const Reservation& reservation : contents.reservations) {
    (void)checkReservation(reservation, &bad);
  }
  return bad;
}

RepairPlan planRepair(const StoreContents& contents) {
  RepairPlan plan;
  plan.batch.ledger_clock_ms = contents.ledger_clock_ms;
  const std::vector<BadRecord> bad = findBadRecords(contents);
  if (bad.empty()) return plan;
  std::map<std::string, std::vector<BadRecord>> bad_by_key;  // "table\nkey" → its findings
  for (const BadRecord& record : bad)
    bad_by_key[record.table + "\n" + record.key].push_back(record);
  const auto findings = [&](const std::string& table, const std::string& key) {
    auto it = bad_by_key.find(table + "\n" + key);
    return it == bad_by_key.end() ? std::vector<BadRecord>{} : it->second;
  };

  for (const PolicyRecord& record : contents.policies) {
    const std::vector<BadRecord> found = findings("policies", policyKey(record.policy.generation));
    if (found.empty()) continue;
    Policy fixed = clamped(record.policy);
    if (!validatePolicy(fixed).isOk()) {
      plan.unrepairable.insert(plan.unrepairable.end(), found.begin(), found.end());
      continue;
    }
    for (const BadRecord& finding : found) {
      plan.corrections.push_back({finding, "clamped", finding.value, "the maximum"});
    }
    plan.batch.policies.push_back(
        {.policy = std::move(fixed), .republished_from = record.republished_from});
  }
  const std::map<Generation, Policy> policies = policiesOf(contents.policies, /*clamp=*/true);

  // Reservations first: what the quarantined ones held leaves their accounts' `reserved`.
  std::map<AccountKey, Units> live_units;      // per account, what kept reservations hold
  std::map<AccountKey, Units> released_units;  // per account, what quarantined ones held
  for (const Reservation& reservation : contents.reservations) {
    std::vector<BadRecord> ignored;
    if (checkReservation(reservation, &ignored)) {
      if (holdsUnits(reservation.state)) {
        Units& units = live_units[accountOf(reservation)];
        units = saturatingAdd(units, reservation.reserved_units);
      }
      continue;
    }
    for (const BadRecord& finding : findings("reservations", reservation.reservation_id)) {
      plan.corrections.push_back({finding, "quarantined", reservationText(reservation), ""});
    }
    plan.batch.deleted_reservations.push_back(reservation.reservation_id);
    if (holdsUnits(reservation.state)) {
      Units& units = released_units[accountOf(reservation)];
      units = saturatingAdd(units, reservation.reserved_units);
    }
  }

  for (const AccountRecord& record : contents.accounts) {
    const std::string key = keyOf(record.key);
    std::vector<BadRecord> found = findings("accounts", key);
    const auto released = released_units.find(record.key);
    if (found.empty() && released == released_units.end()) continue;
    const Budget* budget = budgetOf(policies, record.key);
    const bool retired_ok = record.balances.retired_for_emergency <= limits::kBalanceUnitsMax;
    if (budget == nullptr || !retired_ok) {
      if (found.empty()) {
        found.push_back({"accounts", key, "reserved", std::to_string(record.balances.reserved),
                         "holds a quarantined reservation but cannot be corrected"});
      }
      plan.unrepairable.insert(plan.unrepairable.end(), found.begin(), found.end());
      continue;
    }
    AccountRecord fixed = record;
    fixed.refill_carry = std::min(record.refill_carry, kRefillCarryMax);
    const Units live = live_units[record.key];
    const Units released_here = released == released_units.end() ? 0 : released->second;
    std::string action;
    if (found.empty() && record.balances.reserved >= released_here &&
        record.balances.reserved - released_here == live) {
      // A healthy account: the quarantined reservations' units count as spent.
      fixed.balances.reserved -= released_here;
      fixed.balances.spent = saturatingAdd(fixed.balances.spent, released_here);
      action = "released-as-spent";
    }
    if (action.empty() || !isConserved(fixed.balances) ||
        !balancesAboveBound(fixed.balances).empty()) {
      action = "rebased";
      fixed.balances = rebased(record.balances, budget->burst, live);
    }
    if (found.empty()) {
      found.push_back(
          {"accounts", key, "reserved", std::to_string(record.balances.reserved),
           "held " + std::to_string(released_here) + " units of quarantined reservations"});
    }
    if (!isConserved(fixed.balances) || !balancesAboveBound(fixed.balances).empty()) {
      plan.unrepairable.insert(plan.unrepairable.end(), found.begin(), found.end());
      continue;
    }
    for (const BadRecord& finding : found) {
      plan.corrections.push_back(
          {finding, action, balancesText(record.balances), balancesText(fixed.balances)});
    }
    plan.batch.accounts.push_back(std::move(fixed));
  }
  return plan;
}

StoreContents applied(StoreContents contents, const StoreBatch& batch) {
  for (const PolicyRecord& record : batch.policies) {
    auto it = std::find_if(contents.policies.begin(), contents.policies.end(),
                           [&](const PolicyRecord& stored) {
                             return stored.policy.generation == record.policy.generation;
                           });
    if (it == contents.policies.end()) {
      contents.policies.push_back(record);
    } else {
      *it = record;
    }
  }
  for (const AccountRecord& record : batch.accounts) {
    auto it = std::find_if(contents.accounts.begin(), contents.accounts.end(),
                           [&](const AccountRecord& stored) { return stored.key == record.key; });
    if (it == contents.accounts.end()) {
      contents.accounts.push_back(record);
    } else {
      *it = record;
    }
  }
  const std::set<std::string> deleted(batch.deleted_reservations.begin(),
                                      batch.deleted_reservations.end());
  std::erase_if(contents.reservations, [&](const Reservation& reservation) {
    return deleted.contains(reservation.reservation_id);
  });
  return contents;
}

std::string quarantineLine(const Correction& c, uint64_t at_ms) {
  const auto field = [](const char* name, const std::string& value) {
    return std::string("\"") + name + "\":\"" + jsonEscaped(value) + "\"";
  };
  return "{\"atMs\":" + std::to_string(at_ms) + "," + field("table", c.record.table) + "," +
         field("key", c.record.key) + "," + field("field", c.record.field) + "," +
         field("value", c.record.value) + "," + field("why", c.record.why) + "," +
         field("action", c.action) + "," + field("before", c.before) + "," +
         field("after", c.after) + "}\n";
}

}  // namespace tally::ledger
