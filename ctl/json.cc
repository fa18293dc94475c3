#include "ctl/json.h"

#include <cstdio>
#include <utility>

#include "core/assert.h"

namespace tally::ctl {
namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is not valid.
size_t utf8SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  uint32_t min_code = 0;
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    min_code = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    min_code = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    min_code = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  uint32_t code = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong encodings, surrogates and code points past U+10FFFF are not valid UTF-8.
  if (code < min_code || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

std::string jsonQuote(std::string_view text) {
  std::string out = "\"";
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      default: break;
    }
    if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", static_cast<unsigned char>(c));
      out += escape;
      ++i;
      continue;
    }
    const size_t length = utf8SequenceLength(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    out.append(text.substr(i, length));
    i += length;
  }
  return out + "\"";
}

void JsonWriter::beforeValue() {
  if (scopes_.empty()) {
    TALLY_ASSERT(out_.empty());  // one top-level value per document
    return;
  }
  if (scopes_.back() == Scope::kObject) {
    TALLY_ASSERT(after_key_);
    after_key_ = false;
    return;
  }
  if (!first_.back()) out_ += ',';
  first_.back() = false;
}

JsonWriter& JsonWriter::beginObject() {
  beforeValue();
  out_ += '{';
  scopes_.push_back(Scope::kObject);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::endObject() {
  TALLY_ASSERT(!scopes_.empty() && scopes_.back() == Scope::kObject && !after_key_);
  scopes_.pop_back();
  first_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::beginArray() {
  beforeValue();
  out_ += '[';
  scopes_.push_back(Scope::kArray);
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::endArray() {
  TALLY_ASSERT(!scopes_.empty() && scopes_.back() == Scope::kArray);
  scopes_.pop_back();
  first_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  TALLY_ASSERT(!scopes_.empty() && scopes_.back() == Scope::kObject && !after_key_);
  if (!first_.back()) out_ += ',';
  first_.back() = false;
  out_ += jsonQuote(name);
  out_ += ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view text) {
  beforeValue();
  out_ += jsonQuote(text);
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t number) {
  beforeValue();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(int64_t number) {
  beforeValue();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(bool flag) {
  beforeValue();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  beforeValue();
  out_ += "null";
  return *this;
}

std::string JsonWriter::take() {
  TALLY_ASSERT(scopes_.empty() && !out_.empty());
  return std::move(out_);
}

}  // namespace tally::ctl
