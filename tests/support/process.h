#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

// A child process for integration tests: a real tally-ledger / tally-agent binary.
//
// Readiness is explicit: the child gets `--ready-fd N` and writes "ready PORT\n" there once it
// serves; waitReady() blocks on that pipe with a deadline (no sleeps). Stderr goes to a log file
// in the test's temp dir, printed when a test fails. The destructor SIGKILLs and reaps the
// child if it is still running, so no test leaves a process behind.

namespace tally::testing {

// How a tally-ledger / tally-agent started here talks on the agent-ledger link. The tests that
// predate TLS on the link (issue 12) run both daemons with `--insecure` (kPlaintext, the
// default: appended to their arguments here, the one place); tests of the link itself
// (tests/integration/tls_*_test.cc) pass kTls and give the daemons their keys.
enum class Link : uint8_t { kPlaintext, kTls };

class Process {
 public:
  // `args` excludes argv[0]. When `ready_fd` is true, "--ready-fd N" is appended. For
  // tally-ledger and tally-agent with Link::kPlaintext, "--insecure" is appended too.
  Process(std::string binary, std::vector<std::string> args, std::string log_path,
          bool ready_fd = true, Link link = Link::kPlaintext);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits for the readiness line; returns the port it names, or -1 on timeout/early exit.
  int waitReady(uint64_t timeout_ms);
  // The whole line waitReady() read ("ready 7411 9465"), without its newline; empty before.
  const std::string& readyLine() const { return ready_line_; }
  // Sends `signal`; returns false if the process is gone.
  bool signal(int signal_number);
  // Waits for exit up to `timeout_ms`; returns the exit status (WEXITSTATUS, or 128+signal),
  // or -1 on timeout.
  int waitExit(uint64_t timeout_ms);
  // SIGKILL and reap.
  void kill9();
  // Reaps the child if it has exited (without waiting); true when it is gone.
  bool exited();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  std::string log() const;

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  int ready_read_fd_ = -1;
  std::string ready_line_;
};

// Path of a built binary (build/<preset>/bin/NAME), from the TALLY_BIN_DIR compile definition;
// the TALLY_BIN_DIR environment variable, when set, overrides it.
std::string binaryPath(const std::string& name);

// CLOCK_MONOTONIC in ms: the tests' deadlines (never the daemons' clocks).
uint64_t monotonicNowMs();

}  // namespace tally::testing
