#include "core/retry_after.h"

#include <limits>

namespace tally {

int64_t retryAfterMs(const RetryAfterInput& in) {
  if (in.units > in.burst || in.refill_per_second == 0) return kRetryNever;
  using u128 = unsigned __int128;
  const u128 shortfall = in.units > in.available ? u128{in.units - in.available} : 0;
  const u128 need = shortfall + in.debt;
  if (need == 0) return 0;
  const u128 ms = (need * 1000 + in.refill_per_second - 1) / in.refill_per_second;
  constexpr u128 kMax = static_cast<u128>(std::numeric_limits<int64_t>::max());
  return ms > kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(ms);
}

}  // namespace tally
