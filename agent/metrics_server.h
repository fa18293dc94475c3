#pragma once

#include "net/metrics_server.h"

// The agent's metrics endpoint is the shared one (net/metrics_server.h), also tally-ledger's.

namespace tally::agent {

using net::httpResponseFor;
using net::MetricsServer;

}  // namespace tally::agent
