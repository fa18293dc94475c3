#include "common/config_parse.h"

#include <gtest/gtest.h>

#include <string>

namespace tally {
namespace {

// A float where an integer belongs is refused by its type; converting it first (toml++'s
// value<int64_t>() does) is undefined behaviour once it is outside int64's range (the ledger
// config fuzzer's finding, tests/fuzz/regressions/ledger_config/).
TEST(ReadUnsignedTest, AFloatOutsideInt64IsRefusedAsNotAnInteger) {
  const toml::table table = toml::parse("frame_bytes_max = 10485e76\nsmall = 2.0\nfine = 7\n");
  uint64_t out = 3;
  for (const char* key : {"frame_bytes_max", "small"}) {
    const Status status = readUnsigned(table, "ledger.toml", key, 0, 1'000'000, &out);
    ASSERT_FALSE(status.isOk()) << key;
    EXPECT_NE(status.toString().find("must be an integer"), std::string::npos) << status.toString();
    EXPECT_NE(status.toString().find(key), std::string::npos) << status.toString();
  }
  EXPECT_EQ(out, 3u);
  ASSERT_TRUE(readUnsigned(table, "ledger.toml", "fine", 0, 10, &out).isOk());
  EXPECT_EQ(out, 7u);
}

}  // namespace
}  // namespace tally
