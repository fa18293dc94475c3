#include "ctl/policy_toml.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>

#include <toml++/toml.h>

#include "wire/codec.h"

namespace tally::ctl {
namespace {

constexpr std::string_view kBudgetKeys[] = {
    "subject",
    "route",
    "region",
    "unit",
    "refill_per_second",
    "burst",
    "max_single_reservation",
    "hold_ttl_ms",
    "hard_execution_limit_ms",
    "max_overdraft",
    "weight",
    "priority",
    "fairness_budget",
    "estimator_digest",
    "accounting_epoch",
    "emergency",
    "rollout",
};
constexpr std::string_view kEmergencyKeys[] = {"enabled", "shard_units", "shard_ttl_ms"};
constexpr std::string_view kRolloutKeys[] = {"mode", "percent"};
constexpr std::string_view kEpochNames[] = {"hour", "day"};
constexpr std::string_view kRolloutNames[] = {"off", "shadow", "enforce"};

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kI64Max = std::numeric_limits<int64_t>::max();

const char* typeName(toml::node_type type) {
  switch (type) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
  }
  return "value";
}

std::string location(std::string_view source, uint32_t line) {
  std::string out(source);
  if (line != 0) out += ":" + std::to_string(line);
  return out;
}

// One table of one budget: the [[budget]] itself or its [budget.emergency]/[budget.rollout].
struct Site {
  std::string_view source;
  size_t budget_number = 0;  // 1-based, as core validatePolicy() counts
  const toml::table* table = nullptr;
  std::string_view prefix;   // "" or "emergency." / "rollout."
  uint32_t header_line = 0;  // line of the [[budget]] header
};

Status siteError(const Site& site, uint32_t line, const std::string& text) {
  return Status::invalidArgument(location(site.source, line != 0 ? line : site.header_line) +
                                 ": budget #" + std::to_string(site.budget_number) + ": " + text);
}

Status keyError(const Site& site, const toml::node& node, std::string_view key,
                const std::string& why) {
  return siteError(site, node.source().begin.line,
                   "key '" + std::string(site.prefix) + std::string(key) + "': " + why);
}

Status checkKnownKeys(const Site& site, std::span<const std::string_view> known) {
  for (auto&& [key, node] : *site.table) {
    if (std::find(known.begin(), known.end(), key.str()) != known.end()) continue;
    return siteError(site, key.source().begin.line,
                     "unknown key '" + std::string(site.prefix) + std::string(key.str()) + "'");
  }
  return Status::ok();
}

// The node for `key`, or null when absent; an absent required key is an error.
Status find(const Site& site, std::string_view key, bool required, const toml::node** node) {
  *node = site.table->get(key);
  if (*node == nullptr && required) {
    return siteError(site, 0,
                     "missing required key '" + std::string(site.prefix) + std::string(key) + "'");
  }
  return Status::ok();
}

Status readUnsigned(const Site& site, std::string_view key, bool required, uint64_t max,
                    uint64_t* out) {
  const toml::node* node = nullptr;
  if (Status s = find(site, key, required, &node); !s.isOk() || node == nullptr) return s;
  if (!node->is_integer()) {
    return keyError(site, *node, key,
                    std::string("must be an integer, not a ") + typeName(node->type()));
  }
  const int64_t value = node->as_integer()->get();
  if (value < 0) {
    return keyError(site, *node, key, "must not be negative (got " + std::to_string(value) + ")");
  }
  if (static_cast<uint64_t>(value) > max) {
    return keyError(site, *node, key,
                    std::to_string(value) + " is above the maximum " + std::to_string(max));
  }
  *out = static_cast<uint64_t>(value);
  return Status::ok();
}

Status readU32(const Site& site, std::string_view key, uint32_t* out) {
  uint64_t value = *out;
  if (Status s = readUnsigned(site, key, false, kU32Max, &value); !s.isOk()) return s;
  *out = static_cast<uint32_t>(value);
  return Status::ok();
}

Status readString(const Site& site, std::string_view key, bool required, std::string* out) {
  const toml::node* node = nullptr;
  if (Status s = find(site, key, required, &node); !s.isOk() || node == nullptr) return s;
  if (!node->is_string()) {
    return keyError(site, *node, key,
                    std::string("must be a string, not a ") + typeName(node->type()));
  }
  *out = node->as_string()->get();
  return Status::ok();
}

Status readBool(const Site& site, std::string_view key, bool* out) {
  const toml::node* node = nullptr;
  if (Status s = find(site, key, false, &node); !s.isOk() || node == nullptr) return s;
  if (!node->is_boolean()) {
    return keyError(site, *node, key,
                    std::string("must be true or false, not a ") + typeName(node->type()));
  }
  *out = node->as_boolean()->get();
  return Status::ok();
}

// An optional string that must be one of `names`; `*index` is its position there.
Status readChoice(const Site& site, std::string_view key, std::span<const std::string_view> names,
                  size_t* index) {
  std::string value;
  if (Status s = readString(site, key, false, &value); !s.isOk()) return s;
  const toml::node* node = site.table->get(key);
  if (node == nullptr) return Status::ok();
  const auto it = std::find(names.begin(), names.end(), value);
  if (it == names.end()) {
    std::string choices;
    for (std::string_view name : names)
      choices += (choices.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    return keyError(site, *node, key, "\"" + value + "\" is not one of " + choices);
  }
  *index = static_cast<size_t>(it - names.begin());
  return Status::ok();
}

// A [budget.NAME] sub-table, or null when absent.
Status subTable(const Site& site, std::string_view key, const toml::table** out) {
  const toml::node* node = site.table->get(key);
  *out = nullptr;
  if (node == nullptr) return Status::ok();
  if (!node->is_table()) {
    return keyError(
        site, *node, key,
        "must be a table ([budget." + std::string(key) + "]), not a " + typeName(node->type()));
  }
  *out = node->as_table();
  return Status::ok();
}

Status readEmergency(const Site& budget_site, EmergencyMode* out) {
  const toml::table* table = nullptr;
  if (Status s = subTable(budget_site, "emergency", &table); !s.isOk() || table == nullptr) {
    return s;
  }
  Site site = budget_site;
  site.table = table;
  site.prefix = "emergency.";
  if (Status s = checkKnownKeys(site, kEmergencyKeys); !s.isOk()) return s;
  if (Status s = readBool(site, "enabled", &out->enabled); !s.isOk()) return s;
  // Shard size and TTL have no sensible default: required once emergency mode is on.
  if (Status s = readUnsigned(site, "shard_units", out->enabled, kI64Max, &out->shard_units);
      !s.isOk()) {
    return s;
  }
  return readUnsigned(site, "shard_ttl_ms", out->enabled, kI64Max, &out->shard_ttl_ms);
}

Status readRollout(const Site& budget_site, Rollout* out) {
  const toml::table* table = nullptr;
  if (Status s = subTable(budget_site, "rollout", &table); !s.isOk() || table == nullptr) {
    return s;
  }
  Site site = budget_site;
  site.table = table;
  site.prefix = "rollout.";
  if (Status s = checkKnownKeys(site, kRolloutKeys); !s.isOk()) return s;
  size_t mode = static_cast<size_t>(out->mode);
  if (Status s = readChoice(site, "mode", kRolloutNames, &mode); !s.isOk()) return s;
  out->mode = static_cast<RolloutMode>(mode);
  return readU32(site, "percent", &out->percent);
}

Status readScalars(const Site& site, Budget* b) {
  const std::pair<std::string_view, std::string*> strings[] = {
      {"subject", &b->subject_pattern}, {"route", &b->route}, {"unit", &b->unit}};
  for (const auto& [key, field] : strings) {
    if (Status s = readString(site, key, true, field); !s.isOk()) return s;
  }
  if (Status s = readString(site, "region", false, &b->region); !s.isOk()) return s;
  if (Status s = readString(site, "estimator_digest", false, &b->estimator_digest); !s.isOk()) {
    return s;
  }
  const std::pair<std::string_view, uint64_t*> required[] = {
      {"refill_per_second", &b->refill_per_second},
      {"burst", &b->burst},
      {"max_single_reservation", &b->max_single_reservation},
      {"hold_ttl_ms", &b->hold_ttl_ms},
      {"hard_execution_limit_ms", &b->hard_execution_limit_ms},
  };
  for (const auto& [key, field] : required) {
    if (Status s = readUnsigned(site, key, true, kI64Max, field); !s.isOk()) return s;
  }
  if (Status s = readUnsigned(site, "max_overdraft", false, kI64Max, &b->max_overdraft);
      !s.isOk()) {
    return s;
  }
  const std::pair<std::string_view, uint32_t*> small[] = {
      {"weight", &b->weight},
      {"priority", &b->priority},
      {"fairness_budget", &b->fairness_budget_permille},
  };
  for (const auto& [key, field] : small) {
    if (Status s = readU32(site, key, field); !s.isOk()) return s;
  }
  size_t epoch = static_cast<size_t>(b->accounting_epoch);
  if (Status s = readChoice(site, "accounting_epoch", kEpochNames, &epoch); !s.isOk()) return s;
  b->accounting_epoch = static_cast<EpochPeriod>(epoch);
  return Status::ok();
}

// Runs core validateBudget() and points its error at the key's line when toml++ knows it.
Status validateAtSource(const Site& site, const Budget& budget) {
  Status status = validateBudget(budget);
  if (status.isOk()) return status;
  uint32_t line = 0;
  const std::string& message = status.message();
  const size_t open = message.find('\'');
  const size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
  if (close != std::string::npos) {
    const toml::node* node = site.table->at_path(message.substr(open + 1, close - open - 1)).node();
    if (node != nullptr) line = node->source().begin.line;
  }
  // Core says "budget key 'K': …"; the budget is already named by siteError().
  constexpr std::string_view kCorePrefix = "budget key ";
  const std::string text =
      message.starts_with(kCorePrefix) ? "key " + message.substr(kCorePrefix.size()) : message;
  return siteError(site, line, text);
}

Result<Budget> readBudget(const Site& site) {
  if (Status s = checkKnownKeys(site, kBudgetKeys); !s.isOk()) return s;
  Budget budget;
  if (Status s = readScalars(site, &budget); !s.isOk()) return s;
  if (Status s = readEmergency(site, &budget.emergency); !s.isOk()) return s;
  if (Status s = readRollout(site, &budget.rollout); !s.isOk()) return s;
  if (budget.estimator_digest.size() > wire::kEstimatorDigestBytesMax) {
    return siteError(site, site.table->get("estimator_digest")->source().begin.line,
                     "key 'estimator_digest': longer than " +
                         std::to_string(wire::kEstimatorDigestBytesMax) + " bytes");
  }
  if (Status s = validateAtSource(site, budget); !s.isOk()) return s;
  return budget;
}

Result<toml::table> parseDocument(std::string_view text, std::string_view source_name) {
  const auto syntaxError = [&](const toml::parse_error& error) {
    const toml::source_position& at = error.source().begin;
    return Status::invalidArgument(location(source_name, at.line) + ":" +
                                   std::to_string(at.column) +
                                   ": invalid TOML: " + std::string(error.description()));
  };
#if TOML_EXCEPTIONS
  // toml++ reports syntax errors by exception; they stop here, at the parse boundary.
  try {
    return toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    return syntaxError(error);
  }
#else
  toml::parse_result result = toml::parse(text, source_name);
  if (!result) return syntaxError(result.error());
  return std::move(result).table();
#endif
}

Result<Policy> readPolicy(const toml::table& root, std::string_view source) {
  for (auto&& [key, node] : root) {
    if (key.str() == "budget") continue;
    return Status::invalidArgument(location(source, key.source().begin.line) +
                                   ": unknown top-level key '" + std::string(key.str()) +
                                   "' (a policy file holds only [[budget]] tables)");
  }
  const toml::node* budgets = root.get("budget");
  if (budgets == nullptr || (budgets->is_array() && budgets->as_array()->empty())) {
    return Status::invalidArgument(std::string(source) + ": no [[budget]] tables");
  }
  if (!budgets->is_array_of_tables()) {
    return Status::invalidArgument(location(source, budgets->source().begin.line) +
                                   ": key 'budget': must be an array of tables, written "
                                   "[[budget]], not a " +
                                   typeName(budgets->type()));
  }
  const toml::array& tables = *budgets->as_array();
  if (tables.size() > limits::kBudgetsPerPolicyMax) {
    return Status::invalidArgument(std::string(source) + ": more than " +
                                   std::to_string(limits::kBudgetsPerPolicyMax) + " budgets");
  }
  Policy policy;
  std::vector<uint32_t> header_lines;
  for (size_t i = 0; i < tables.size(); ++i) {
    const toml::table& table = *tables[i].as_table();
    const Site site{.source = source,
                    .budget_number = i + 1,
                    .table = &table,
                    .header_line = table.source().begin.line};
    Result<Budget> budget = readBudget(site);
    if (!budget.isOk()) return budget.status();
    policy.budgets.push_back(std::move(budget).value());
    header_lines.push_back(site.header_line);
  }
  if (Status s = validatePolicy(policy); !s.isOk()) {
    // validatePolicy() names budgets "#N"; point at that budget's header.
    size_t number = 0;
    uint32_t line = 0;
    if (std::sscanf(s.message().c_str(), "budget #%zu", &number) == 1 && number >= 1 &&
        number <= header_lines.size()) {
      line = header_lines[number - 1];
    }
    return Status::invalidArgument(location(source, line) + ": " + s.message());
  }
  return policy;
}

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string tomlString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char escape[8];
          std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned char>(c));
          out += escape;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void appendBudget(const Budget& b, std::string* out) {
  const auto line = [out](std::string_view key, const std::string& value) {
    *out += std::string(key) + " = " + value + "\n";
  };
  *out += "[[budget]]\n";
  line("subject", tomlString(b.subject_pattern));
  line("route", tomlString(b.route));
  line("region", tomlString(b.region));
  line("unit", tomlString(b.unit));
  line("refill_per_second", std::to_string(b.refill_per_second));
  line("burst", std::to_string(b.burst));
  line("max_single_reservation", std::to_string(b.max_single_reservation));
  line("hold_ttl_ms", std::to_string(b.hold_ttl_ms));
  line("hard_execution_limit_ms", std::to_string(b.hard_execution_limit_ms));
  line("max_overdraft", std::to_string(b.max_overdraft));
  line("weight", std::to_string(b.weight));
  line("priority", std::to_string(b.priority));
  line("fairness_budget", std::to_string(b.fairness_budget_permille) + "  # permille");
  line("estimator_digest", tomlString(b.estimator_digest));
  line("accounting_epoch", tomlString(epochPeriodName(b.accounting_epoch)));
  *out += "\n[budget.emergency]\n";
  line("enabled", b.emergency.enabled ? "true" : "false");
  line("shard_units", std::to_string(b.emergency.shard_units));
  line("shard_ttl_ms", std::to_string(b.emergency.shard_ttl_ms));
  *out += "\n[budget.rollout]\n";
  line("mode", tomlString(rolloutModeName(b.rollout.mode)));
  line("percent", std::to_string(b.rollout.percent));
}

}  // namespace

Result<Policy> parsePolicyToml(std::string_view text, std::string_view source_name) {
  const std::string_view source = source_name.empty() ? "<policy>" : source_name;
  if (text.size() > kPolicyFileBytesMax) {
    return Status::invalidArgument(std::string(source) + ": larger than " +
                                   std::to_string(kPolicyFileBytesMax) + " bytes");
  }
  Result<toml::table> root = parseDocument(text, source);
  if (!root.isOk()) return root.status();
  return readPolicy(root.value(), source);
}

Result<Policy> parsePolicyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::ioError("cannot open policy file '" + path + "'");
  std::string text;
  char buffer[64 * 1024];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kPolicyFileBytesMax) {
      return Status::invalidArgument(path + ": larger than " + std::to_string(kPolicyFileBytesMax) +
                                     " bytes");
    }
  }
  if (in.bad()) return Status::ioError("cannot read policy file '" + path + "'");
  return parsePolicyToml(text, path);
}

std::string policyToToml(const Policy& policy) {
  std::string out = "# admissionBudget.v1";
  if (policy.generation != 0) out += ", policy generation " + std::to_string(policy.generation);
  out += "\n";
  for (const Budget& budget : policy.budgets) {
    out += "\n";
    appendBudget(budget, &out);
  }
  return out;
}

}  // namespace tally::ctl
