#pragma once

#include <string_view>

// Reading a daemon's command line one argument at a time, with the usage and version handling
// both daemons share. Output goes to stdout (help, version) and stderr (usage errors).

namespace tally {

class DaemonArgs {
 public:
  // `program` names the daemon in messages ("tally-agent"); `usage` is printed after errors.
  DaemonArgs(int argc, char** argv, const char* program, const char* usage)
      : argc_(argc), argv_(argv), program_(program), usage_(usage) {}

  // Moves to the next argument; false after the last one.
  bool next() { return ++index_ < argc_; }
  // The current argument.
  const char* current() const { return argv_[index_]; }

  // --help or -h prints the usage to stdout, --version "PROGRAM VERSION"; true when the current
  // argument was one of them (the caller exits 0).
  bool printedHelpOrVersion(const char* version) const;
  // The value that follows the current flag, consumed; nullptr when there is none, after printing
  // "PROGRAM: FLAG needs a value" and the usage to stderr.
  const char* value();

 private:
  int argc_;
  char** argv_;
  const char* program_;
  const char* usage_;
  int index_ = 0;
};

}  // namespace tally
