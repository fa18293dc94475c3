#include "central-client/ledger_addresses.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/ledger_protocol.h"

namespace tally::client {
namespace {

Endpoint tcp(const std::string& host, uint16_t port) {
  return Endpoint{.kind = Endpoint::Kind::kTcp, .host = host, .port = port};
}

TEST(LedgerAddressesTest, OneAddressOrACommaSeparatedList) {
  Result<std::vector<Endpoint>> one = parseLedgerAddresses("10.0.0.5:7411");
  ASSERT_TRUE(one.isOk()) << one.status().toString();
  EXPECT_EQ(one.value(), std::vector<Endpoint>{tcp("10.0.0.5", 7411)});
  Result<std::vector<Endpoint>> list =
      parseLedgerAddresses("10.0.0.5:7411, ledger-b.internal:7412,[::1]:7413");
  ASSERT_TRUE(list.isOk()) << list.status().toString();
  EXPECT_EQ(list.value(),
            (std::vector<Endpoint>{tcp("10.0.0.5", 7411), tcp("ledger-b.internal", 7412),
                                   tcp("::1", 7413)}));
  EXPECT_EQ(ledgerAddressesName(list.value()), "10.0.0.5:7411,ledger-b.internal:7412,[::1]:7413");
}

TEST(LedgerAddressesTest, EmptyItemsBadAddressesAndRepeatsAreRefusedNamingThem) {
  for (const char* bad :
       {"", ",", "h:1,", ",h:1", "h:1,,h:2", "h", "h:0", "h:1,h:70000", "::1:5"}) {
    Result<std::vector<Endpoint>> parsed = parseLedgerAddresses(bad);
    EXPECT_FALSE(parsed.isOk()) << "'" << bad << "'";
    if (!parsed.isOk()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    }
  }
  Result<std::vector<Endpoint>> twice = parseLedgerAddresses("h:1,h:2,h:1");
  ASSERT_FALSE(twice.isOk());
  EXPECT_NE(twice.status().message().find("h:1 is given twice"), std::string::npos)
      << twice.status().toString();
}

TEST(LedgerAddressesTest, TheNotPrimaryMessageNamesThePrimaryWhenKnown) {
  EXPECT_EQ(notPrimaryMessage("10.0.0.5:7411"), "not the primary; the primary is 10.0.0.5:7411");
  EXPECT_EQ(primaryNamedIn(notPrimaryMessage("10.0.0.5:7411")), "10.0.0.5:7411");
  EXPECT_EQ(primaryNamedIn(notPrimaryMessage("[::1]:7411")), "[::1]:7411");
  for (const char* unknown : {"", "127.0.0.1:0", "nohost", ":7411", "h:"}) {
    EXPECT_EQ(notPrimaryMessage(unknown), "not the primary; the primary is not known") << unknown;
    EXPECT_EQ(primaryNamedIn(notPrimaryMessage(unknown)), "") << unknown;
  }
  EXPECT_EQ(primaryNamedIn("connection refused"), "");
  EXPECT_EQ(primaryNamedIn("not the primary; the primary is a:1; and more"), "");
}

TEST(AddressRotationTest, UnreachableMovesToTheNextAndWrapsAround) {
  AddressRotation rotation({tcp("a", 1), tcp("b", 2), tcp("c", 3)}, /*follow_unlisted=*/true);
  EXPECT_EQ(rotation.current(), tcp("a", 1));
  rotation.onUnreachable();
  EXPECT_EQ(rotation.current(), tcp("b", 2));
  rotation.onUnreachable();
  rotation.onUnreachable();
  EXPECT_EQ(rotation.current(), tcp("a", 1));
  AddressRotation single({tcp("a", 1)}, true);
  single.onUnreachable();
  EXPECT_EQ(single.current(), tcp("a", 1));
}

TEST(AddressRotationTest, NotPrimaryMovesToTheNamedPrimary) {
  AddressRotation rotation({tcp("a", 1), tcp("b", 2), tcp("c", 3)}, /*follow_unlisted=*/true);
  rotation.onNotPrimary(notPrimaryMessage("c:3"));  // listed: that entry
  EXPECT_EQ(rotation.current(), tcp("c", 3));
  rotation.onNotPrimary(notPrimaryMessage(""));  // names none: the next
  EXPECT_EQ(rotation.current(), tcp("a", 1));
  rotation.onNotPrimary(notPrimaryMessage("a:1"));  // names itself: the next
  EXPECT_EQ(rotation.current(), tcp("b", 2));
  rotation.onNotPrimary(notPrimaryMessage("d:4"));  // not listed: followed (the agent)
  EXPECT_EQ(rotation.current(), tcp("d", 4));
  rotation.onUnreachable();  // and back to the list, after the one that named it
  EXPECT_EQ(rotation.current(), tcp("c", 3));
}

TEST(AddressRotationTest, WithoutFollowingOnlyListedAddressesAreTried) {
  AddressRotation rotation({tcp("a", 1), tcp("b", 2)}, /*follow_unlisted=*/false);
  rotation.onNotPrimary(notPrimaryMessage("d:4"));
  EXPECT_EQ(rotation.current(), tcp("b", 2));
  rotation.onNotPrimary(notPrimaryMessage("a:1"));
  EXPECT_EQ(rotation.current(), tcp("a", 1));
}

}  // namespace
}  // namespace tally::client
