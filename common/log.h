#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

// Structured logs for the daemons: one logfmt line per event on stderr,
//   ts=2026-11-29T19:47:44.123Z level=info event=listening addr=127.0.0.1:7411
// Values with spaces, quotes or '=' are quoted. Not thread-safe by design: each daemon logs
// from its loop thread only.

namespace tally {

enum class LogLevel : uint8_t { kDebug = 0, kInfo, kWarn, kError };

// "debug", "warn" or "error"; anything else is kInfo.
LogLevel parseLogLevel(std::string_view level);

struct LogField {
  std::string_view key;
  std::string value;

  LogField(std::string_view k, std::string_view v) : key(k), value(v) {}
  LogField(std::string_view k, const char* v) : key(k), value(v) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(std::string_view k, uint64_t v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, int64_t v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, int v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, unsigned v) : key(k), value(std::to_string(v)) {}
  LogField(std::string_view k, bool v) : key(k), value(v ? "true" : "false") {}
};

class Logger {
 public:
  explicit Logger(std::string component, LogLevel level = LogLevel::kInfo)
      : component_(std::move(component)), level_(level) {}

  void log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});
  // The same, for fields known only at run time (a core machine's notes).
  void log(LogLevel level, std::string_view event, const std::vector<LogField>& fields);
  void info(std::string_view event, std::initializer_list<LogField> fields = {}) {
    log(LogLevel::kInfo, event, fields);
  }
  void warn(std::string_view event, std::initializer_list<LogField> fields = {}) {
    log(LogLevel::kWarn, event, fields);
  }
  void error(std::string_view event, std::initializer_list<LogField> fields = {}) {
    log(LogLevel::kError, event, fields);
  }
  void debug(std::string_view event, std::initializer_list<LogField> fields = {}) {
    log(LogLevel::kDebug, event, fields);
  }
  void setLevel(LogLevel level) { level_ = level; }

 private:
  void write(LogLevel level, std::string_view event, const LogField* fields, size_t count);

  std::string component_;
  LogLevel level_;
};

// Formats one logfmt value (quoted when needed). Exposed for tests.
std::string logfmtValue(std::string_view value);

}  // namespace tally
