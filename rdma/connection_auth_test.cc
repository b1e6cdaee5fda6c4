// The pure pieces of RDMA connection authentication: Z85 keys, the key
// derivation, the transcript and the proof.
#include "rdma/connection_auth.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two job secret keys (Z85 of 32 random bytes).
constexpr char kSecretA[] = "Ra]8Hb}#}Kz4!FS!*2I]/=Av#aiLKw7ETIsnJ-LG";
constexpr char kSecretB[] = "g*[3LarCm@*mW($XTv}LD)$GZUJp@]jL0Gnp5rDQ";

AuthNonce Nonce(uint8_t seed) {
  AuthNonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::byte>(seed + 3 * i);
  return n;
}

AuthTranscript Sample() {
  AuthTranscript t;
  t.prover = AuthRole::kInitiator;
  t.initiator_nonce = Nonce(1);
  t.acceptor_nonce = Nonce(2);
  t.initiator_address = "rdma://10.0.0.1:4000";
  t.acceptor_address = "rdma://10.0.0.2:4000";
  return t;
}

ConnectionAuthKey Key(const char* secret) {
  absl::StatusOr<ConnectionAuthKey> key = DeriveConnectionAuthKey(secret);
  EXPECT_TRUE(key.ok()) << key.status();
  return *key;
}

TEST(rdmaConnectionAuthTest, Z85DecodesTheSpecificationsExample) {
  // ZeroMQ RFC 32: the bytes 86 4F D2 6F B5 59 F7 5B encode as "HelloWorld";
  // a key is eight groups of five characters ("00000" is four zero bytes).
  absl::StatusOr<std::array<unsigned char, 32>> key = DecodeZ85Key("HelloWorld" + std::string(30, '0'));
  ASSERT_TRUE(key.ok()) << key.status();
  const unsigned char expected[8] = {0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B};
  EXPECT_EQ(std::memcmp(key->data(), expected, 8), 0);
  for (size_t i = 8; i < 32; ++i) EXPECT_EQ((*key)[i], 0) << i;
  // The largest group is 0xFFFFFFFF.
  key = DecodeZ85Key("%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0%nSc0");
  ASSERT_TRUE(key.ok());
  for (unsigned char b : *key) EXPECT_EQ(b, 0xff);
}

TEST(rdmaConnectionAuthTest, Z85RejectsBadKeysWithoutEchoingThem) {
  EXPECT_THAT(std::string(DecodeZ85Key("short").status().message()), HasSubstr("40 Z85 characters"));
  EXPECT_FALSE(DecodeZ85Key(std::string(kSecretA) + "0").ok());
  std::string bad = kSecretA;
  bad[17] = '"';  // not in the alphabet
  absl::Status s = DecodeZ85Key(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("character 18"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr(bad.substr(0, 10))));
  // A group above 0xFFFFFFFF.
  s = DecodeZ85Key("#####" + std::string(35, '0')).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("characters 1-5"));
}

TEST(rdmaConnectionAuthTest, DerivedKeyIsDeterministicPerSecretAndIsNotTheSecret) {
  const ConnectionAuthKey a1 = Key(kSecretA);
  const ConnectionAuthKey a2 = Key(kSecretA);
  const ConnectionAuthKey b = Key(kSecretB);
  EXPECT_EQ(a1.bytes(), a2.bytes());
  EXPECT_NE(a1.bytes(), b.bytes());
  EXPECT_NE(a1.bytes(), *DecodeZ85Key(kSecretA)) << "the raw secret must not key the MAC";
  EXPECT_FALSE(DeriveConnectionAuthKey("not a key").ok());
}

TEST(rdmaConnectionAuthTest, ProofVerifiesOnlyForTheSameKeyAndTranscript) {
  const ConnectionAuthKey key = Key(kSecretA);
  const AuthTranscript t = Sample();
  const AuthMac proof = ComputeAuthProof(key, t);
  EXPECT_TRUE(VerifyAuthProof(key, t, proof));
  EXPECT_FALSE(VerifyAuthProof(Key(kSecretB), t, proof)) << "another job's key";

  // Every field of the transcript is bound: change any one and the proof fails.
  const std::vector<std::pair<const char*, std::function<void(AuthTranscript&)>>> changes = {
      {"prover role", [](AuthTranscript& x) { x.prover = AuthRole::kAcceptor; }},
      {"initiator nonce", [](AuthTranscript& x) { x.initiator_nonce[31] ^= std::byte{1}; }},
      {"acceptor nonce", [](AuthTranscript& x) { x.acceptor_nonce[0] ^= std::byte{0x80}; }},
      {"nonces swapped", [](AuthTranscript& x) { std::swap(x.initiator_nonce, x.acceptor_nonce); }},
      {"initiator address", [](AuthTranscript& x) { x.initiator_address = "rdma://10.0.0.9:4000"; }},
      {"acceptor address", [](AuthTranscript& x) { x.acceptor_address = "rdma://10.0.0.2:4001"; }},
      {"addresses swapped", [](AuthTranscript& x) { std::swap(x.initiator_address, x.acceptor_address); }},
  };
  for (const auto& [what, change] : changes) {
    AuthTranscript other = t;
    change(other);
    EXPECT_FALSE(VerifyAuthProof(key, other, proof)) << what;
  }
  // Truncated, extended and flipped proofs fail.
  EXPECT_FALSE(VerifyAuthProof(key, t, std::span<const std::byte>(proof.data(), 31)));
  std::vector<std::byte> longer(proof.begin(), proof.end());
  longer.push_back(std::byte{0});
  EXPECT_FALSE(VerifyAuthProof(key, t, longer));
  for (size_t i = 0; i < proof.size(); ++i) {
    AuthMac flipped = proof;
    flipped[i] ^= std::byte{4};
    EXPECT_FALSE(VerifyAuthProof(key, t, flipped)) << "byte " << i;
  }
}

TEST(rdmaConnectionAuthTest, AddressBoundariesAreUnambiguous) {
  // "ab" + "c" and "a" + "bc" must not give one transcript.
  AuthTranscript x = Sample();
  x.initiator_address = "rdma://h:1";
  x.acceptor_address = "0rdma://g:2";
  AuthTranscript y = Sample();
  y.initiator_address = "rdma://h:10";
  y.acceptor_address = "rdma://g:2";
  EXPECT_NE(EncodeAuthTranscript(x), EncodeAuthTranscript(y));
  const ConnectionAuthKey key = Key(kSecretA);
  EXPECT_FALSE(VerifyAuthProof(key, y, ComputeAuthProof(key, x)));
}

TEST(rdmaConnectionAuthTest, TranscriptLayout) {
  const std::vector<std::byte> b = EncodeAuthTranscript(Sample());
  const size_t label = sizeof(kAuthTranscriptLabel) - 1;
  ASSERT_EQ(b.size(), 4 + label + 1 + 32 + 32 + 4 + 20 + 4 + 20);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), label);
  EXPECT_EQ(std::memcmp(b.data() + 4, kAuthTranscriptLabel, label), 0);
  EXPECT_EQ(static_cast<char>(b[4 + label]), 'I');
  EXPECT_EQ(b[4 + label + 1], Nonce(1)[0]);
  EXPECT_EQ(b[4 + label + 1 + 32], Nonce(2)[0]);
  EXPECT_EQ(static_cast<uint8_t>(b[4 + label + 1 + 64]), 20);
}

TEST(rdmaConnectionAuthTest, RandomBytesAreFresh) {
  AuthNonce a{}, b{};
  FillRandomBytes(a);
  FillRandomBytes(b);
  EXPECT_NE(a, b);
  EXPECT_NE(a, AuthNonce{});
}

}  // namespace
}  // namespace tessera::rdma
