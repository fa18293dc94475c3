// The real tallyctl binary with bad command lines: with --json, stdout is exactly one JSON object
// (and a newline) whatever went wrong, and the exit code is the documented one.

#include <sys/wait.h>

#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctl/exit_codes.h"

namespace tally::ctl {
namespace {

// A strict JSON reader for one value (RFC 8259 grammar, no extensions); it records the string
// members of the top-level object. Enough to prove the output parses, without a JSON library.
class StrictJson {
 public:
  explicit StrictJson(std::string_view text) : text_(text) {}

  // True when the whole text is one object followed by exactly one newline.
  bool parseOneObject() {
    if (peek() != '{' || !value(0)) return false;
    return pos_ + 1 == text_.size() && text_[pos_] == '\n';
  }
  std::optional<std::string> member(const std::string& key) const {
    for (const auto& [k, v] : members_) {
      if (k == key) return v;
    }
    return std::nullopt;
  }
  bool hasMember(const std::string& key) const {
    for (const std::string& k : keys_) {
      if (k == key) return true;
    }
    return false;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void spaces() {
    while (peek() == ' ' || peek() == '\t' || peek() == '\r' || (peek() == '\n' && depth_ > 0)) {
      ++pos_;
    }
  }
  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool string(std::string* out) {
    if (peek() != '"') return false;
    ++pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      const char e = peek();
      ++pos_;
      if (e == 'u') {
        for (int i = 0; i < 4; ++i, ++pos_) {
          if (!std::isxdigit(static_cast<unsigned char>(peek()))) return false;
        }
        out->push_back('?');
      } else if (std::string_view("\"\\/bfnrt").find(e) != std::string_view::npos && e != '\0') {
        out->push_back(e == 'n' ? '\n' : e);
      } else {
        return false;
      }
    }
    return false;
  }
  bool number() {
    const size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else {
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return false;
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    }
    if (peek() == '.') {
      ++pos_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return false;
      while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    }
    return pos_ > start;
  }
  bool value(int level) {
    spaces();
    bool ok = false;
    std::string ignored;
    switch (peek()) {
      case '{': ok = container(level, '}'); break;
      case '[': ok = container(level, ']'); break;
      case '"': ok = string(&ignored); break;
      case 't': ok = literal("true"); break;
      case 'f': ok = literal("false"); break;
      case 'n': ok = literal("null"); break;
      default: ok = number();
    }
    spaces();
    return ok;
  }
  bool container(int level, char close) {
    ++pos_;
    ++depth_;
    spaces();
    if (peek() == close) {
      ++pos_;
      --depth_;
      return true;
    }
    for (;;) {
      if (close == '}') {
        std::string key;
        spaces();
        if (!string(&key)) return false;
        spaces();
        if (peek() != ':') return false;
        ++pos_;
        spaces();
        if (level == 0) {
          keys_.push_back(key);
          if (peek() == '"') {
            std::string text;
            if (!string(&text)) return false;
            members_.emplace_back(key, text);
            spaces();
          } else if (!value(level + 1)) {
            return false;
          }
        } else if (!value(level + 1)) {
          return false;
        }
      } else if (!value(level + 1)) {
        return false;
      }
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != close) return false;
      ++pos_;
      --depth_;
      return true;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<std::string> keys_;
  std::vector<std::pair<std::string, std::string>> members_;
};

TEST(StrictJsonTest, RefusesWhatIsNotExactlyOneObject) {
  EXPECT_TRUE(StrictJson("{\"a\":[1,{\"b\":null}],\"c\":\"x\"}\n").parseOneObject());
  EXPECT_TRUE(StrictJson("{}\n").parseOneObject());
  for (std::string_view bad : {"", "\n", "{}", "{}\n{}\n", "{\"a\":1,}\n", "[]\n", "{\"a\"}\n",
                               "{\"a\":01}\n", "{'a':1}\n", "{\"a\":\"\x01\"}\n", "usage\n"}) {
    EXPECT_FALSE(StrictJson(bad).parseOneObject()) << bad;
  }
}

struct CtlRun {
  int exit_code = -1;
  std::string out;
};

// Runs tallyctl with `args` (simple words: no shell quoting needed), stderr discarded.
CtlRun runTallyctl(const std::vector<std::string>& args) {
  std::string command = TALLYCTL_PATH;
  for (const std::string& arg : args) command += " '" + arg + "'";
  command += " 2>/dev/null";
  CtlRun run;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST(TallyctlBinaryTest, WithJsonEveryFailureIsExactlyOneJsonObjectOnStdout) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string code;
  };
  const std::vector<Case> cases = {
      {{"--json", "frobnicate"}, kExitUsage, "USAGE"},            // unknown command
      {{"frobnicate", "--json"}, kExitUsage, "USAGE"},            // --json last
      {{"--bogus", "health", "--json"}, kExitUsage, "USAGE"},     // unknown flag
      {{"--json", "reserve", "--id", "r"}, kExitUsage, "USAGE"},  // missing flags
      {{"reserve", "--id", "r", "--subject", "s", "--route", "x", "--units", "-5", "--json"},
       kExitUsage,
       "USAGE"},                                                           // invalid value
      {{"--json", "query", "--id"}, kExitUsage, "USAGE"},                  // no value
      {{"--json", "--timeout-ms", "0", "health"}, kExitUsage, "USAGE"},    // out of range
      {{"--json", "--ledger", "nowhere", "health"}, kExitUsage, "USAGE"},  // bad endpoint
      {{"--json", "policy", "publish", "/nonexistent/p.toml"}, kExitUsage, "USAGE"},  // bad file
      // Nothing listens on port 1: the connection fails (plaintext: no key needed to try).
      {{"--json", "--ledger", "127.0.0.1:1", "--insecure", "--timeout-ms", "2000", "health"},
       kExitUnavailable,
       "UNAVAILABLE"},
  };
  for (const Case& c : cases) {
    std::string line;
    for (const std::string& arg : c.args) line += arg + " ";
    const CtlRun run = runTallyctl(c.args);
    EXPECT_EQ(run.exit_code, c.exit_code) << line;
    StrictJson json(run.out);
    ASSERT_TRUE(json.parseOneObject()) << line << "\nstdout: " << run.out;
    EXPECT_TRUE(json.hasMember("error")) << line;
    EXPECT_EQ(json.member("code"), c.code) << line << "\nstdout: " << run.out;
    EXPECT_FALSE(json.member("message").value_or("").empty()) << line;
  }
}

TEST(TallyctlBinaryTest, WithoutJsonAUsageErrorKeepsStdoutEmpty) {
  const CtlRun run = runTallyctl({"frobnicate"});
  EXPECT_EQ(run.exit_code, kExitUsage);
  EXPECT_EQ(run.out, "");
}

TEST(TallyctlBinaryTest, WithJsonHelpAndVersionAreOneJsonObjectToo) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--help", "--json"},
                                               std::vector<std::string>{"--json", "--version"}}) {
    const CtlRun run = runTallyctl(args);
    EXPECT_EQ(run.exit_code, kExitOk);
    EXPECT_TRUE(StrictJson(run.out).parseOneObject()) << run.out;
  }
}

}  // namespace
}  // namespace tally::ctl
