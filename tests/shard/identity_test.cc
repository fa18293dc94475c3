// shard/identity: key files, public keys, key ids, signatures and gateway names.

#include "shard/identity.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/limits.h"

namespace tally::identity {
namespace {

namespace fs = std::filesystem;

// RFC 8032 §7.1, test 1.
constexpr char kRfcSeedHex[] = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
constexpr char kRfcPublicKeyBase64[] = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
constexpr char kRfcSecretKeyBase64[] =
    "nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2DXWpgBgrEKt9VL/tPJZAc6DuFy89qmIyWvAhpo9wdRGg==";

Seed rfcSeed() {
  Seed seed{};
  for (size_t i = 0; i < seed.size(); ++i) {
    seed[i] = static_cast<uint8_t>(std::stoi(std::string(kRfcSeedHex + 2 * i, 2), nullptr, 16));
  }
  return seed;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tally-identity-XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void writeFile(const std::string& path, const std::string& content, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
  }
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

mode_t modeOf(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0);
  return info.st_mode & 07777;
}

void expectInvalid(const Status& status, const std::string& words) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.toString();
  EXPECT_NE(status.message().find(words), std::string::npos) << status.toString();
}

TEST(Identity, KeyPairFromSeedMatchesRfc8032) {
  const KeyPair pair = keyPairFromSeed(rfcSeed());
  EXPECT_EQ(encodePublicKey(pair.public_key), kRfcPublicKeyBase64);
  // sha256(public key)[0..8] computed independently (Python hashlib).
  EXPECT_EQ(keyIdOf(pair.public_key), "21fe31dfa154a261");
}

TEST(Identity, CreatesKeyFileOnceAndReloadsTheSameKey) {
  TempDir dir;
  const std::string path = dir.file("gateway.key");
  EXPECT_EQ(loadKeyPair(path).status().code(), StatusCode::kNotFound);
  Result<KeyPair> created = loadOrCreateKeyPair(path);
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  EXPECT_EQ(modeOf(path), 0600u);
  Result<KeyPair> again = loadOrCreateKeyPair(path);
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again.value(), created.value());
  Result<KeyPair> loaded = loadKeyPair(path);
  ASSERT_TRUE(loaded.isOk());
  EXPECT_EQ(loaded.value(), created.value());
  // One line of padded base64: 88 characters and a newline.
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.size(), 88u);
  EXPECT_EQ(line.back(), '=');
}

TEST(Identity, ReadsAKeyFileWrittenByHand) {
  TempDir dir;
  const std::string path = dir.file("ledger.key");
  writeFile(path, std::string(kRfcSecretKeyBase64) + "\n", 0600);
  Result<KeyPair> loaded = loadKeyPair(path);
  ASSERT_TRUE(loaded.isOk()) << loaded.status().toString();
  EXPECT_EQ(loaded.value(), keyPairFromSeed(rfcSeed()));
}

TEST(Identity, RefusesKeyFileOthersCanAccess) {
  TempDir dir;
  const std::string path = dir.file("gateway.key");
  for (mode_t mode : {0644, 0640, 0604, 0660, 0601}) {
    writeFile(path, std::string(kRfcSecretKeyBase64) + "\n", mode);
    Result<KeyPair> loaded = loadKeyPair(path);
    ASSERT_FALSE(loaded.isOk()) << mode;
    expectInvalid(loaded.status(), "group or others");
    // Never silently replaced either.
    EXPECT_FALSE(loadOrCreateKeyPair(path).isOk()) << mode;
  }
  writeFile(path, std::string(kRfcSecretKeyBase64) + "\n", 0400);
  EXPECT_TRUE(loadKeyPair(path).isOk());
}

TEST(Identity, RefusesCorruptKeyFiles) {
  TempDir dir;
  const std::string path = dir.file("gateway.key");
  std::string wrong_half = kRfcSecretKeyBase64;
  wrong_half[60] = wrong_half[60] == 'A' ? 'B' : 'A';  // a public half that is not the seed's
  const std::string cases[] = {
      "",
      "not base64 at all\n",
      std::string(kRfcPublicKeyBase64) + "\n",                        // 32 bytes, not 64
      std::string(kRfcSecretKeyBase64).substr(0, 86) + "\n",          // truncated
      std::string(kRfcSecretKeyBase64) + "\n" + kRfcSecretKeyBase64,  // two lines
      " " + std::string(kRfcSecretKeyBase64) + "\n",
      wrong_half + "\n",
      std::string(8192, 'A'),
  };
  for (const std::string& content : cases) {
    writeFile(path, content, 0600);
    Result<KeyPair> loaded = loadKeyPair(path);
    ASSERT_FALSE(loaded.isOk()) << content;
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument) << content;
    EXPECT_NE(loaded.status().message().find(path), std::string::npos);
    EXPECT_FALSE(loadOrCreateKeyPair(path).isOk()) << content;
  }
}

TEST(Identity, PublicKeyBase64RoundTripsAndRefusesBadInput) {
  const KeyPair pair = generateKeyPair();
  const std::string text = encodePublicKey(pair.public_key);
  EXPECT_EQ(text.size(), 44u);
  Result<PublicKey> decoded = decodePublicKey(text);
  ASSERT_TRUE(decoded.isOk());
  EXPECT_EQ(decoded.value(), pair.public_key);
  const std::string bad[] = {
      "",
      text.substr(0, 43),
      text + "A",
      text.substr(0, 42) + "==",                       // 31 bytes
      "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo",   // unpadded
      "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo=",  // URL-safe alphabet
      "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHUR!=",
      std::string(kRfcSecretKeyBase64),  // a secret key is not a public key
  };
  for (const std::string& input : bad) {
    Result<PublicKey> got = decodePublicKey(input);
    ASSERT_FALSE(got.isOk()) << input;
    expectInvalid(got.status(), "public key");
  }
}

TEST(Identity, SignaturesAreDeterministicAndBound) {
  const KeyPair pair = keyPairFromSeed(rfcSeed());
  // RFC 8032 §7.1 test 1: the empty message.
  const Signature empty = signDetached(pair, "");
  char hex[2 * 64 + 1];
  for (size_t i = 0; i < empty.size(); ++i) std::snprintf(hex + 2 * i, 3, "%02x", empty[i]);
  EXPECT_STREQ(hex,
               "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bac"
               "c61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
  EXPECT_TRUE(verifyDetached(pair.public_key, empty, ""));
  EXPECT_FALSE(verifyDetached(pair.public_key, empty, "x"));
  EXPECT_FALSE(verifyDetached(generateKeyPair().public_key, empty, ""));
}

TEST(Identity, GatewayNameFileIsCreatedOnceFromTheDefault) {
  TempDir dir;
  Result<std::string> created = loadOrCreateGatewayName(dir.path(), "gw-eu-1");
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  EXPECT_EQ(created.value(), "gw-eu-1");
  std::ifstream in(gatewayNamePath(dir.path()));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "gw-eu-1\n");
  // The file wins over a later default.
  Result<std::string> again = loadOrCreateGatewayName(dir.path(), "other-name");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again.value(), "gw-eu-1");
}

TEST(Identity, GatewayNamesAreValidated) {
  for (const std::string& good :
       {std::string("a"), std::string("gw-eu_1.example"), std::string(128, 'x')}) {
    EXPECT_TRUE(validateGatewayName(good).isOk()) << good;
  }
  for (const std::string& bad : {std::string(""), std::string(129, 'x'), std::string("gw eu"),
                                 std::string("gw/1"), std::string("gw\n"), std::string("é")}) {
    expectInvalid(validateGatewayName(bad), "gateway name");
  }
  TempDir dir;
  expectInvalid(loadOrCreateGatewayName(dir.path(), "bad name").status(), "gateway name");
  EXPECT_FALSE(fs::exists(gatewayNamePath(dir.path())));
  writeFile(gatewayNamePath(dir.path()), "has space\n", 0644);
  Result<std::string> read = loadOrCreateGatewayName(dir.path(), "gw-1");
  ASSERT_FALSE(read.isOk());
  expectInvalid(read.status(), gatewayNamePath(dir.path()));
}

}  // namespace
}  // namespace tally::identity
