#pragma once

#include <string>

#include "core/status.h"

// A minimal sd_notify(3) without libsystemd: one datagram with `state` (e.g. "READY=1",
// "STOPPING=1") to the AF_UNIX socket named by $NOTIFY_SOCKET. A name starting with '@' is in
// the abstract namespace. Without $NOTIFY_SOCKET (not under systemd) it does nothing and
// returns ok.

namespace tally {

Status sdNotify(const std::string& state);

// Socket activation (sd_listen_fds(3)): the number of descriptors passed from fd 3 on when
// $LISTEN_PID is this process and $LISTEN_FDS is set; 0 otherwise. Unsets both variables so
// that children do not inherit them.
int sdListenFds();

}  // namespace tally
