#pragma once

#include <cstdint>

#include "core/types.h"

namespace tally {

struct RetryAfterInput {
  Units units = 0;      // what the caller asked for
  Units available = 0;  // the account's available after refill
  Units debt = 0;       // overdraft that refill repays before anything becomes available
  Units refill_per_second = 0;
  Units burst = 0;
};

// A conservative Retry-After in ms: the time refill alone needs to repay `debt` and then make
// `units` available, rounded up. kRetryNever when the units can never fit (above burst, or no
// refill). Competing reservations can only make the real wait longer, never shorter, so a
// caller that waits this long loses nothing by trying earlier than necessary; it never learns
// another tenant's balance from it either (it depends only on this account).
int64_t retryAfterMs(const RetryAfterInput& input);

}  // namespace tally
