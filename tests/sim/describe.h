#pragma once

#include <string>

#include "core/ledger_types.h"
#include "wire/codec.h"

// One-line descriptions of requests and replies for the trace.

namespace tally::sim {

std::string describe(const wire::RequestBody& request);
std::string describe(const wire::ResponseBody& response);
std::string describe(const Reservation& reservation);

}  // namespace tally::sim
