#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/policy.h"
#include "core/status.h"

// Policy files (admissionBudget.v1 as TOML), the format operators publish with
// `tallyctl policy publish FILE.toml`. examples/policy.toml documents every key and default.
//
//   [[budget]]                  one per (subject pattern, route)
//   subject, route, unit,       required strings
//   refill_per_second, burst, max_single_reservation, hold_ttl_ms, hard_execution_limit_ms
//                               required non-negative integers
//   region, estimator_digest    optional strings (default "")
//   max_overdraft (0), weight (1), priority (0), fairness_budget (0, permille)
//                               optional non-negative integers
//   accounting_epoch            optional "hour" | "day" (default "hour")
//   [budget.emergency]          optional: enabled (false), shard_units, shard_ttl_ms (both
//                               required when enabled = true)
//   [budget.rollout]            optional: mode "off" | "shadow" | "enforce" ("enforce"),
//                               percent (100)
//
// Every error is kInvalidArgument (kIoError for an unreadable file) and names the source, the
// line where toml++ knows it, the budget (1-based, as core validatePolicy() counts) and the key,
// e.g. "policy.toml:14: budget #2: key 'burst': must be an integer, not a string".

namespace tally::ctl {

// Policy files above this size are refused before parsing.
inline constexpr uint64_t kPolicyFileBytesMax = 16 << 20;

// Parses and validates (core validatePolicy()) a policy. The generation is left 0: the ledger
// assigns it at publish. `source_name` only labels errors.
Result<Policy> parsePolicyToml(std::string_view text, std::string_view source_name);
Result<Policy> parsePolicyFile(const std::string& path);

// A policy file that parsePolicyToml() reads back as `policy` (generation aside, which is
// written as a comment). Every key is written, defaults included.
std::string policyToToml(const Policy& policy);

}  // namespace tally::ctl
