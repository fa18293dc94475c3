#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/operator_types.h"
#include "core/status.h"

// The ledger's operators (docs/security.md "Operators"): the first operator, the ledger's own
// operator key (DATA_DIR/operator.key, named kFirstOperatorName, role admin, never stored), and
// those enrolled with `tallyctl operator enroll`, kept in the store. Pure; owned by the Ledger.

namespace tally {

inline constexpr const char* kFirstOperatorName = "admin";
OperatorRecord firstOperator(const PublicKey& operator_key);

class OperatorRegistry {
 public:
  // The ledger's operator key (zero: none, e.g. an --insecure ledger).
  void setFirstOperatorKey(const PublicKey& key);

  // `is_gateway_key`: the key is an enrolled gateway's (refused: a key is one identity).
  OperatorReply enroll(const std::string& name, const PublicKey& public_key, OperatorRole role,
                       bool is_gateway_key, uint64_t now_ms);
  OperatorReply setEnabled(const std::string& name, bool enabled);
  OperatorReply list() const;  // the first operator, then the enrolled ones by name

  // Every operator identifyLinkPeer considers: the first one (if its key is set), then the
  // enrolled ones by name.
  const std::vector<OperatorRecord>& all() const { return all_; }
  bool holdsKey(const PublicKey& key) const;

  Status restore(const OperatorRecord& record);
  // The enrolled operators changed since the last take, by name.
  std::vector<const OperatorRecord*> takeChanged();
  bool changed() const { return !changed_.empty(); }

 private:
  void rebuildAll();

  PublicKey first_key_{};
  std::map<std::string, OperatorRecord> enrolled_;
  std::vector<OperatorRecord> all_;
  std::set<std::string> changed_;
};

}  // namespace tally
