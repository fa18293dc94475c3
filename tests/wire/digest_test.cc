#include "wire/digest.h"

#include <gtest/gtest.h>

#include <functional>

namespace tally::wire {
namespace {

ReserveRequest sampleRequest() {
  return ReserveRequest{
      .reservation_id = "req-0001",
      .request_digest = {},
      .subject = "tenant-7",
      .route = "/v1/chat/completions",
      .units = 600,
      .policy_generation = 3,
      .priority = 2,
  };
}

TEST(Sha256, MatchesNistVectors) {
  // FIPS 180-2, appendix B.1, and the empty message.
  EXPECT_EQ(digestHex(sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digestHex(sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digestHex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// Pinned: these values were computed once from the canonical encoding of
// schema::CanonicalReserve (the first one was also reproduced independently by laying out the
// canonical words by hand and hashing them with Python's hashlib). If this test fails, the encoding
// changed, and every stored digest and every peer running the previous version would disagree. Do
// not update the constants; restore the encoding instead.
TEST(CanonicalRequestDigest, MatchesPinnedVectors) {
  EXPECT_EQ(digestHex(canonicalRequestDigest(sampleRequest())),
            "b5840f724334f3b5fded85e5324033aa9ce3db0c3873fdd385361522023fb630");
  EXPECT_EQ(digestHex(canonicalRequestDigest(ReserveRequest{})),
            "458e9ea00768a422f9dbc20fed9b97e5e35a8cfcb4ca4fa3d0724441736de2f1");
  ReserveRequest extreme{
      .reservation_id = std::string(128, 'r'),
      .request_digest = {},
      .subject = "tenant-\xc3\xa9",  // UTF-8 é
      .route = "*",
      .units = UINT64_MAX,
      .policy_generation = UINT64_MAX,
      .priority = UINT32_MAX,
  };
  EXPECT_EQ(digestHex(canonicalRequestDigest(extreme)),
            "bfc9479988c4f5b11ab787a2b0077a6c367eca5cf13d7b0f2f544d41e4339f90");
}

// An empty region is left out of the canonical encoding: the vectors above are unchanged by the
// field's existence. A region is covered, and this vector pins how.
TEST(CanonicalRequestDigest, CoversARegionAndPinsIt) {
  ReserveRequest eu = sampleRequest();
  eu.region = "eu-west-1";
  EXPECT_NE(canonicalRequestDigest(eu), canonicalRequestDigest(sampleRequest()));
  ReserveRequest us = eu;
  us.region = "us-east-1";
  EXPECT_NE(canonicalRequestDigest(eu), canonicalRequestDigest(us));
  EXPECT_EQ(digestHex(canonicalRequestDigest(eu)),
            "c49276890db9dcf889f653720495131e3f9df57371ce15c3f334a546f0830741");
}

TEST(CanonicalRequestDigest, IgnoresTheDigestField) {
  ReserveRequest with_digest = sampleRequest();
  with_digest.request_digest.fill(0xee);
  EXPECT_EQ(canonicalRequestDigest(with_digest), canonicalRequestDigest(sampleRequest()));
}

TEST(CanonicalRequestDigest, ChangesWhenAnyIdentifyingFieldChanges) {
  const Digest base = canonicalRequestDigest(sampleRequest());
  const std::vector<std::pair<const char*, std::function<void(ReserveRequest*)>>> mutations = {
      {"reservation_id", [](ReserveRequest* r) { r->reservation_id = "req-0002"; }},
      {"subject", [](ReserveRequest* r) { r->subject = "tenant-8"; }},
      {"route", [](ReserveRequest* r) { r->route = "/v1/embeddings"; }},
      {"units", [](ReserveRequest* r) { r->units = 601; }},
      {"policy_generation", [](ReserveRequest* r) { r->policy_generation = 4; }},
      {"priority", [](ReserveRequest* r) { r->priority = 3; }},
  };
  for (const auto& [field, mutate] : mutations) {
    ReserveRequest changed = sampleRequest();
    mutate(&changed);
    EXPECT_NE(canonicalRequestDigest(changed), base) << field;
  }
}

TEST(CanonicalRequestDigest, DoesNotConfuseFieldBoundaries) {
  // Concatenation-ambiguous pairs must hash differently.
  const ReserveRequest a{.reservation_id = "r", .subject = "ab", .route = "c"};
  const ReserveRequest b{.reservation_id = "r", .subject = "a", .route = "bc"};
  EXPECT_NE(canonicalRequestDigest(a), canonicalRequestDigest(b));
}

TEST(DigestHex, RoundTripsAndAcceptsEitherCase) {
  const Digest digest = sha256("abc");
  Result<Digest> lower = parseDigestHex(digestHex(digest));
  ASSERT_TRUE(lower.isOk());
  EXPECT_EQ(lower.value(), digest);
  Result<Digest> upper =
      parseDigestHex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD");
  ASSERT_TRUE(upper.isOk());
  EXPECT_EQ(upper.value(), digest);
}

TEST(DigestHex, RejectsWrongLengthAndNonHex) {
  const std::string good = digestHex(sha256("abc"));
  EXPECT_EQ(parseDigestHex(good.substr(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parseDigestHex(good + "0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parseDigestHex("").status().code(), StatusCode::kInvalidArgument);
  std::string bad = good;
  bad[10] = 'g';
  Result<Digest> parsed = parseDigestHex(bad);
  ASSERT_FALSE(parsed.isOk());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("offset 10"), std::string::npos);
}

}  // namespace
}  // namespace tally::wire
