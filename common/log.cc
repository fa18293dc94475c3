#include "common/log.h"

#include <cstdio>
#include <ctime>
#include <span>

#include "common/wall_clock.h"

namespace tally {
namespace {

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

}  // namespace

LogLevel parseLogLevel(std::string_view level) {
  if (level == "debug") return LogLevel::kDebug;
  if (level == "warn") return LogLevel::kWarn;
  if (level == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::string logfmtValue(std::string_view value) {
  bool needs_quotes = value.empty();
  for (char ch : value) {
    if (ch == ' ' || ch == '"' || ch == '=' || ch == '\\' ||
        static_cast<unsigned char>(ch) < 0x20) {
      needs_quotes = true;
      break;
    }
  }
  if (!needs_quotes) return std::string(value);
  std::string quoted = "\"";
  for (char ch : value) {
    if (ch == '"' || ch == '\\') {
      quoted += '\\';
      quoted += ch;
    } else if (ch == '\n') {
      quoted += "\\n";
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      quoted += ' ';
    } else {
      quoted += ch;
    }
  }
  quoted += '"';
  return quoted;
}

void Logger::log(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (level >= level_) write(level, event, fields.begin(), fields.size());
}

void Logger::log(LogLevel level, std::string_view event, const std::vector<LogField>& fields) {
  if (level >= level_) write(level, event, fields.data(), fields.size());
}

void Logger::write(LogLevel level, std::string_view event, const LogField* fields, size_t count) {
  std::string line = "ts=" + formatRfc3339Ms(wallClockMs()) + " level=" + levelName(level) +
                     " component=" + component_ + " event=" + logfmtValue(event);
  for (const LogField& field : std::span(fields, count)) {
    line += ' ';
    line += field.key;
    line += '=';
    line += logfmtValue(field.value);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace tally
