#include "rdma/connection_auth.h"

#include <sodium.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "rdma/invariant.h"

namespace tessera::rdma {
namespace {

static_assert(sizeof(kAuthKdfContext) - 1 == crypto_kdf_CONTEXTBYTES);
static_assert(ConnectionAuthKey::kBytes == crypto_auth_hmacsha256_KEYBYTES);
static_assert(ConnectionAuthKey::kBytes == crypto_kdf_KEYBYTES);
static_assert(kAuthMacBytes == crypto_auth_hmacsha256_BYTES);

constexpr std::string_view kZ85Alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
static_assert(kZ85Alphabet.size() == 85);

// Digit value of a Z85 character, or -1.
int Z85Digit(char c) {
  const size_t at = kZ85Alphabet.find(c);
  return at == std::string_view::npos ? -1 : static_cast<int>(at);
}

void EnsureSodium() {
  static const bool ready = sodium_init() >= 0;
  RDMA_CHECK(ready);
}

void PutLength(std::vector<std::byte>& out, size_t n) {
  RDMA_CHECK(n <= 0xffffffffu);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
}

void PutText(std::vector<std::byte>& out, std::string_view text) {
  PutLength(out, text.size());
  for (char c : text) out.push_back(static_cast<std::byte>(c));
}

}  // namespace

ConnectionAuthKey::~ConnectionAuthKey() { sodium_memzero(bytes_.data(), bytes_.size()); }

absl::StatusOr<std::array<unsigned char, 32>> DecodeZ85Key(std::string_view z85) {
  if (z85.size() != 40) {
    return absl::InvalidArgumentError(absl::StrCat("a key is 40 Z85 characters; this one has ", z85.size()));
  }
  std::array<unsigned char, 32> out{};
  for (size_t group = 0; group < 8; ++group) {
    uint64_t value = 0;
    for (size_t i = 0; i < 5; ++i) {
      const int digit = Z85Digit(z85[group * 5 + i]);
      if (digit < 0) {
        return absl::InvalidArgumentError(absl::StrCat("not a Z85 key: character ", group * 5 + i + 1,
                                                       " is outside the Z85 alphabet"));
      }
      value = value * 85 + static_cast<uint64_t>(digit);
    }
    if (value > 0xffffffffu) {
      return absl::InvalidArgumentError(absl::StrCat("not a Z85 key: characters ", group * 5 + 1, "-", group * 5 + 5,
                                                     " do not encode 4 bytes"));
    }
    for (size_t i = 0; i < 4; ++i) out[group * 4 + i] = static_cast<unsigned char>(value >> (8 * (3 - i)));
  }
  return out;
}

absl::StatusOr<ConnectionAuthKey> DeriveConnectionAuthKey(std::string_view z85_secret_key) {
  absl::StatusOr<std::array<unsigned char, 32>> secret = DecodeZ85Key(z85_secret_key);
  if (!secret.ok()) return secret.status();
  EnsureSodium();
  std::array<unsigned char, ConnectionAuthKey::kBytes> derived{};
  const int rc = crypto_kdf_derive_from_key(derived.data(), derived.size(), kAuthKdfSubkeyId, kAuthKdfContext,
                                            secret->data());
  sodium_memzero(secret->data(), secret->size());
  RDMA_CHECK(rc == 0);
  ConnectionAuthKey key(derived);
  sodium_memzero(derived.data(), derived.size());
  return key;
}

std::vector<std::byte> EncodeAuthTranscript(const AuthTranscript& t) {
  std::vector<std::byte> out;
  out.reserve(4 + sizeof(kAuthTranscriptLabel) + 1 + 2 * kAuthNonceBytes + 8 + t.initiator_address.size() +
              t.acceptor_address.size());
  PutText(out, std::string_view(kAuthTranscriptLabel));
  out.push_back(static_cast<std::byte>(t.prover));
  out.insert(out.end(), t.initiator_nonce.begin(), t.initiator_nonce.end());
  out.insert(out.end(), t.acceptor_nonce.begin(), t.acceptor_nonce.end());
  PutText(out, t.initiator_address);
  PutText(out, t.acceptor_address);
  return out;
}

AuthMac ComputeAuthProof(const ConnectionAuthKey& key, const AuthTranscript& transcript) {
  EnsureSodium();
  const std::vector<std::byte> bytes = EncodeAuthTranscript(transcript);
  AuthMac mac{};
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(mac.data()),
                         reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), key.bytes().data());
  return mac;
}

bool VerifyAuthProof(const ConnectionAuthKey& key, const AuthTranscript& transcript,
                     std::span<const std::byte> proof) {
  if (proof.size() != kAuthMacBytes) return false;
  EnsureSodium();
  const std::vector<std::byte> bytes = EncodeAuthTranscript(transcript);
  // crypto_auth_hmacsha256_verify compares in constant time (crypto_verify_32).
  return crypto_auth_hmacsha256_verify(reinterpret_cast<const unsigned char*>(proof.data()),
                                       reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                                       key.bytes().data()) == 0;
}

void FillRandomBytes(std::span<std::byte> out) {
  EnsureSodium();
  randombytes_buf(out.data(), out.size());
}

}  // namespace tessera::rdma
