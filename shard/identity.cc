#include "shard/identity.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/data_dir.h"
#include "core/assert.h"
#include "core/limits.h"

namespace tally::identity {
namespace {

// A key or name file is one short line; anything longer is not ours.
constexpr size_t kFileBytesMax = 4096;

std::string errnoText(int error) { return std::strerror(error); }

std::string octalMode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  FileCloser(const FileCloser&) = delete;
  FileCloser& operator=(const FileCloser&) = delete;
  ~FileCloser() {
    if (fd_ >= 0) (void)::close(fd_);
  }

 private:
  int fd_;
};

// Reads all of an open regular file (at most kFileBytesMax bytes).
Result<std::string> readAll(int fd, const std::string& path) {
  std::string content;
  char buffer[512];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Status::ioError("read " + path + ": " + errnoText(errno));
    }
    if (got == 0) break;
    content.append(buffer, static_cast<size_t>(got));
    if (content.size() > kFileBytesMax) {
      return Status::invalidArgument(path + ": longer than " + std::to_string(kFileBytesMax) +
                                     " bytes; not a tally identity file");
    }
  }
  return content;
}

// One line: the content without its final newline; no other line break allowed.
Result<std::string> singleLine(std::string content, const std::string& path) {
  if (!content.empty() && content.back() == '\n') content.pop_back();
  if (!content.empty() && content.back() == '\r') content.pop_back();
  if (content.find_first_of("\r\n") != std::string::npos) {
    return Status::invalidArgument(path + ": more than one line");
  }
  return content;
}

// Opens `path` for reading; kNotFound if it does not exist.
Result<int> openExisting(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return Status::notFound(path + ": no such file");
    return Status::ioError("open " + path + ": " + errnoText(errno));
  }
  return fd;
}

// Creates `path` with O_CREAT|O_EXCL and `mode`, writes `content`, and makes it durable.
// kFailedPrecondition if it already exists (someone else created it first).
Status createFile(const std::string& path, const std::string& content, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
  if (fd < 0) {
    if (errno == EEXIST) return Status::failedPrecondition(path + ": already exists");
    return Status::ioError("create " + path + ": " + errnoText(errno));
  }
  FileCloser closer(fd);
  // The umask may have cleared bits of `mode`, never added any; set it exactly.
  if (::fchmod(fd, mode) != 0) return Status::ioError("chmod " + path + ": " + errnoText(errno));
  if (Status status = writeAllAndSync(fd, path, content); !status.isOk()) return status;
  return syncParentDirectory(path);
}

std::string base64Of(const uint8_t* bytes, size_t size) {
  std::string out(sodium_base64_encoded_len(size, sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), bytes, size, sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

// Strict standard padded base64 of exactly `size` bytes.
bool fromBase64(std::string_view text, uint8_t* out, size_t size) {
  if (text.size() != sodium_base64_encoded_len(size, sodium_base64_VARIANT_ORIGINAL) - 1) {
    return false;
  }
  size_t decoded = 0;
  const char* end = nullptr;
  if (sodium_base642bin(out, size, text.data(), text.size(), nullptr, &decoded, &end,
                        sodium_base64_VARIANT_ORIGINAL) != 0) {
    return false;
  }
  return decoded == size && end == text.data() + text.size();
}

Result<KeyPair> parseKeyFile(const std::string& content, const std::string& path) {
  Result<std::string> line = singleLine(content, path);
  if (!line.isOk()) return line.status();
  SecretKey secret{};
  if (!fromBase64(line.value(), secret.data(), secret.size())) {
    sodium_memzero(secret.data(), secret.size());
    return Status::invalidArgument(path +
                                   ": not a key file (expected one line of base64 naming a "
                                   "64-byte Ed25519 secret key)");
  }
  Seed seed{};
  std::memcpy(seed.data(), secret.data(), seed.size());
  KeyPair pair = keyPairFromSeed(seed);
  sodium_memzero(seed.data(), seed.size());
  const bool matches = pair.secret_key == secret;
  sodium_memzero(secret.data(), secret.size());
  if (!matches) {
    return Status::invalidArgument(path + ": corrupt key file (its public key does not match)");
  }
  return pair;
}

}  // namespace

void initSodium() {
  static std::once_flag once;
  std::call_once(once, [] { TALLY_ASSERT(sodium_init() >= 0); });
}

KeyPair keyPairFromSeed(const Seed& seed) {
  initSodium();
  KeyPair pair;
  TALLY_ASSERT(
      crypto_sign_seed_keypair(pair.public_key.data(), pair.secret_key.data(), seed.data()) == 0);
  return pair;
}

KeyPair generateKeyPair() {
  initSodium();
  KeyPair pair;
  TALLY_ASSERT(crypto_sign_keypair(pair.public_key.data(), pair.secret_key.data()) == 0);
  return pair;
}

Result<KeyPair> loadKeyPair(const std::string& path) {
  initSodium();
  Result<int> fd = openExisting(path);
  if (!fd.isOk()) return fd.status();
  FileCloser closer(fd.value());
  struct stat info {};
  if (::fstat(fd.value(), &info) != 0)
    return Status::ioError("stat " + path + ": " + errnoText(errno));
  if (!S_ISREG(info.st_mode)) return Status::invalidArgument(path + ": not a regular file");
  if ((info.st_mode & 077) != 0) {
    return Status::invalidArgument(path + ": key file mode " + octalMode(info.st_mode) +
                                   " lets group or others access it; refusing to use it "
                                   "(chmod 600 " +
                                   path + ")");
  }
  Result<std::string> content = readAll(fd.value(), path);
  if (!content.isOk()) return content.status();
  Result<KeyPair> pair = parseKeyFile(content.value(), path);
  sodium_memzero(content.value().data(), content.value().size());
  return pair;
}

Result<KeyPair> loadOrCreateKeyPair(const std::string& path) {
  Result<KeyPair> existing = loadKeyPair(path);
  if (existing.isOk() || existing.status().code() != StatusCode::kNotFound) return existing;
  KeyPair pair = generateKeyPair();
  std::string line = base64Of(pair.secret_key.data(), pair.secret_key.size()) + "\n";
  const Status created = createFile(path, line, 0600);
  sodium_memzero(line.data(), line.size());
  if (created.code() == StatusCode::kFailedPrecondition) return loadKeyPair(path);  // lost a race
  if (!created.isOk()) return created;
  return pair;
}

std::string encodePublicKey(const PublicKey& key) { return base64Of(key.data(), key.size()); }

Result<PublicKey> decodePublicKey(std::string_view base64) {
  initSodium();
  PublicKey key{};
  if (!fromBase64(base64, key.data(), key.size())) {
    return Status::invalidArgument(
        "public key: expected 44 characters of standard base64 naming 32 bytes, got \"" +
        std::string(base64.substr(0, 64)) + "\"");
  }
  return key;
}

std::string keyIdOf(const PublicKey& key) {
  initSodium();
  std::array<uint8_t, crypto_hash_sha256_BYTES> hash{};
  TALLY_ASSERT(crypto_hash_sha256(hash.data(), key.data(), key.size()) == 0);
  constexpr size_t kKeyIdBytes = 8;
  char hex[2 * kKeyIdBytes + 1];
  sodium_bin2hex(hex, sizeof(hex), hash.data(), kKeyIdBytes);
  return hex;
}

Signature signDetached(const KeyPair& key_pair, std::string_view message) {
  initSodium();
  Signature signature{};
  TALLY_ASSERT(crypto_sign_detached(signature.data(), nullptr,
                                    reinterpret_cast<const uint8_t*>(message.data()),
                                    message.size(), key_pair.secret_key.data()) == 0);
  return signature;
}

bool verifyDetached(const PublicKey& key, const Signature& signature, std::string_view message) {
  initSodium();
  return crypto_sign_verify_detached(signature.data(),
                                     reinterpret_cast<const uint8_t*>(message.data()),
                                     message.size(), key.data()) == 0;
}

// --- Gateway names -----------------------------------------------------------------------------

std::string gatewayNamePath(const std::string& dir) { return dir + "/gateway.name"; }

Status validateGatewayName(std::string_view name) {
  if (name.empty() || name.size() > limits::kGatewayNameBytesMax) {
    return Status::invalidArgument("gateway name: " + std::to_string(name.size()) +
                                   " bytes, 1 to " + std::to_string(limits::kGatewayNameBytesMax) +
                                   " required");
  }
  for (const char c : name) {
    const bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!allowed) {
      return Status::invalidArgument("gateway name \"" + std::string(name) +
                                     "\": only A-Z a-z 0-9 . _ - allowed");
    }
  }
  return Status::ok();
}

Result<std::string> loadOrCreateGatewayName(const std::string& dir,
                                            const std::string& default_name) {
  const std::string path = gatewayNamePath(dir);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second only after losing a create race
    Result<int> fd = openExisting(path);
    if (fd.isOk()) {
      FileCloser closer(fd.value());
      Result<std::string> content = readAll(fd.value(), path);
      if (!content.isOk()) return content.status();
      Result<std::string> name = singleLine(std::move(content).value(), path);
      if (!name.isOk()) return name.status();
      if (Status valid = validateGatewayName(name.value()); !valid.isOk()) {
        return Status::invalidArgument(path + ": " + valid.message());
      }
      return name;
    }
    if (fd.status().code() != StatusCode::kNotFound) return fd.status();
    if (Status valid = validateGatewayName(default_name); !valid.isOk()) return valid;
    const Status created = createFile(path, default_name + "\n", 0644);
    if (created.isOk()) return default_name;
    if (created.code() != StatusCode::kFailedPrecondition) return created;
  }
  return Status::ioError(path + ": created and removed concurrently");
}

}  // namespace tally::identity
