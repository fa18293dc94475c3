#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// A minimal JSON writer for tallyctl's --json output: one compact object per command.
//
// JsonWriter owns the text it builds. Callers nest beginObject()/endObject() and
// beginArray()/endArray() correctly and give every object member a key() first; misuse is a
// bug and asserts. Strings are escaped; bytes that are not valid UTF-8 become U+FFFD, so the
// output is always valid JSON whatever the ledger's strings hold.

namespace tally::ctl {

class JsonWriter {
 public:
  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  JsonWriter& key(std::string_view name);

  JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(const std::string& text) { return value(std::string_view(text)); }
  JsonWriter& value(uint64_t number);
  JsonWriter& value(int64_t number);
  JsonWriter& value(uint32_t number) { return value(static_cast<uint64_t>(number)); }
  JsonWriter& value(bool flag);
  JsonWriter& null();

  // key(name).value(v) in one call.
  template <typename T>
  JsonWriter& field(std::string_view name, const T& v) {
    key(name);
    return value(v);
  }

  // The finished document; every container must be closed.
  std::string take();

 private:
  enum class Scope : uint8_t { kObject, kArray };
  void beforeValue();

  std::string out_;
  std::vector<Scope> scopes_;
  std::vector<bool> first_;  // per scope: no member written yet
  bool after_key_ = false;
};

// `text` as a JSON string literal, quotes included.
std::string jsonQuote(std::string_view text);

}  // namespace tally::ctl
