#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "wire/codec.h"

// The Prometheus text exposition format (version 0.0.4), shared by tally-agent's and
// tally-ledger's metrics: HELP/TYPE headers, samples, seconds, a fixed-bucket histogram, and the
// outcome label of an answer. Pure (no I/O, no clock).

namespace tally::net {

void promHeader(std::string* out, const char* name, const char* type, const char* help);
void promSample(std::string* out, const std::string& name, const std::string& labels,
                const std::string& value);
std::string promLower(std::string text);
// Microseconds as seconds, "%.6g".
std::string promSeconds(uint64_t us);

// Upper bounds of a latency histogram's buckets, in microseconds (100 µs to 5 s).
inline constexpr std::array<uint64_t, 15> kLatencyBucketsUs = {
    100,    250,     500,     1'000,   2'500,     5'000,     10'000,   25'000,
    50'000, 100'000, 250'000, 500'000, 1'000'000, 2'500'000, 5'000'000};

// A histogram over fixed upper bounds (N of them, plus +Inf), rendered as NAME_bucket,
// NAME_sum and NAME_count. `Seconds`: the values are microseconds, shown as seconds.
template <size_t N>
struct PromHistogram {
  std::array<uint64_t, N> bounds{};
  std::array<uint64_t, N> buckets{};  // non-cumulative
  uint64_t count = 0;
  uint64_t sum = 0;

  void observe(uint64_t value) {
    ++count;
    sum += value;
    for (size_t i = 0; i < N; ++i) {
      if (value <= bounds[i]) {
        ++buckets[i];
        return;
      }
    }
  }

  // `labels` (may be empty) prefix every sample's own; `seconds`: values are microseconds.
  void render(std::string* out, const std::string& name, const std::string& labels,
              bool seconds) const {
    const std::string prefix = labels.empty() ? "" : labels + ",";
    auto show = [seconds](uint64_t v) { return seconds ? promSeconds(v) : std::to_string(v); };
    uint64_t cumulative = 0;
    for (size_t i = 0; i < N; ++i) {
      cumulative += buckets[i];
      promSample(out, name + "_bucket", prefix + "le=\"" + show(bounds[i]) + "\"",
                 std::to_string(cumulative));
    }
    promSample(out, name + "_bucket", prefix + "le=\"+Inf\"", std::to_string(count));
    promSample(out, name + "_sum", labels, show(sum));
    promSample(out, name + "_count", labels, std::to_string(count));
  }
};

// Requests counted by (op, outcome) over a fixed set of N ops, each op an index into the
// names given to render(): a count costs an array index and a search among a few outcomes,
// never a string built per request. Rendered by op name, then outcome, whatever the order of
// the answers.
template <size_t N>
class RequestCounts {
 public:
  void add(size_t op, std::string_view outcome) {
    std::map<std::string, uint64_t, std::less<>>& by_outcome = counts_[op];
    auto it = by_outcome.find(outcome);
    if (it == by_outcome.end()) it = by_outcome.emplace(std::string(outcome), 0).first;
    ++it->second;
  }
  uint64_t get(size_t op, std::string_view outcome) const {
    auto it = counts_[op].find(outcome);
    return it == counts_[op].end() ? 0 : it->second;
  }
  // One sample of `name` per (op, outcome) counted, labelled op="…",outcome="…".
  void render(std::string* out, const std::string& name,
              const std::array<const char*, N>& op_names) const {
    std::array<size_t, N> by_name{};
    for (size_t i = 0; i < N; ++i) by_name[i] = i;
    std::sort(by_name.begin(), by_name.end(), [&](size_t a, size_t b) {
      return std::string_view(op_names[a]) < std::string_view(op_names[b]);
    });
    for (size_t op : by_name) {
      for (const auto& [outcome, value] : counts_[op]) {
        promSample(out, name,
                   std::string("op=\"") + op_names[op] + "\",outcome=\"" + outcome + "\"",
                   std::to_string(value));
      }
    }
  }

 private:
  std::array<std::map<std::string, uint64_t, std::less<>>, N> counts_;
};

// The outcome label of one answer: the reply code ("ok", "rejected", "queued", …) or
// "error_<code>" for an ErrorReply. outcomeName is the same text without building a string
// (both daemons count every answer by it); it stays valid for the life of the process.
std::string_view outcomeName(const wire::ResponseBody& body);
std::string outcomeLabel(const wire::ResponseBody& body);
// A reply code's label ("ok", "not_found", …; "unknown" for a value outside the enum).
std::string_view replyCodeOutcome(ReplyCode code);

}  // namespace tally::net
