#include "rdma/rdma_wire.h"

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::rdma {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::string Text(std::span<const std::byte> b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// A message with an inline envelope, an inline frame, a remote frame and an empty inline frame.
std::vector<std::byte> SampleMessage() {
  const std::vector<std::byte> envelope = Bytes("envelope-bytes");
  const std::vector<std::byte> frame = Bytes("0123456789");
  std::vector<PartDescriptor> parts = {{envelope.size(), 0}, {frame.size(), 0}, {1 << 20, 42}, {0, 0}};
  std::vector<std::span<const std::byte>> data = {envelope, frame, {}, {}};
  std::vector<std::byte> out(MessageWireBytes(parts));
  EXPECT_EQ(EncodeMessage(out, 17, 99, parts, data), out.size());
  return out;
}

TEST(rdmaWireTest, MessageRoundTrip) {
  const std::vector<std::byte> wire = SampleMessage();
  EXPECT_EQ(wire.size(), kWireHeaderBytes + 4 * kPartDescriptorBytes + 14 + 10);
  absl::StatusOr<WireFrame> f = ParseWire(wire);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kMessage);
  EXPECT_EQ(f->credits, 17);
  EXPECT_EQ(f->request_id, 99u);
  ASSERT_EQ(f->parts.size(), 4u);
  EXPECT_EQ(Text(f->inline_parts[0]), "envelope-bytes");
  EXPECT_EQ(Text(f->inline_parts[1]), "0123456789");
  EXPECT_EQ(f->parts[2].tag, 42u);
  EXPECT_EQ(f->parts[2].length, 1u << 20);
  EXPECT_TRUE(f->inline_parts[2].empty());
  EXPECT_EQ(f->parts[3].length, 0u);
}

TEST(rdmaWireTest, HeaderIsLittleEndianAtFixedOffsets) {
  const std::vector<std::byte> wire = SampleMessage();
  EXPECT_EQ(static_cast<uint8_t>(wire[0]), 'T');
  EXPECT_EQ(static_cast<uint8_t>(wire[1]), 'S');
  EXPECT_EQ(static_cast<uint8_t>(wire[2]), 'R');
  EXPECT_EQ(static_cast<uint8_t>(wire[3]), '1');
  EXPECT_EQ(static_cast<uint8_t>(wire[4]), kWireVersion);
  EXPECT_EQ(static_cast<uint8_t>(wire[5]), static_cast<uint8_t>(WireType::kMessage));
  EXPECT_EQ(static_cast<uint8_t>(wire[8]), 17);  // credits
  EXPECT_EQ(static_cast<uint8_t>(wire[9]), 0);
  EXPECT_EQ(static_cast<uint8_t>(wire[10]), 4);  // part count
  EXPECT_EQ(static_cast<uint8_t>(wire[16]), 99);  // request id
  // The remote part's tag in the table: part 2 at 32 + 2 * 16, tag at +8.
  EXPECT_EQ(static_cast<uint8_t>(wire[kWireHeaderBytes + 2 * kPartDescriptorBytes + 8]), 42);
}

TEST(rdmaWireTest, ControlMessagesRoundTrip) {
  std::vector<std::byte> buf(256);
  size_t n = EncodeClearToSend(buf, 3, ClearToSend{7, 0x1122334455667788ull, 65536, 0xabcdef01});
  absl::StatusOr<WireFrame> f = ParseWire(std::span<const std::byte>(buf.data(), n));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kClearToSend);
  EXPECT_EQ(f->credits, 3);
  EXPECT_EQ(f->clear_to_send.tag, 7u);
  EXPECT_EQ(f->clear_to_send.remote_address, 0x1122334455667788ull);
  EXPECT_EQ(f->clear_to_send.length, 65536u);
  EXPECT_EQ(f->clear_to_send.rkey, 0xabcdef01u);

  n = EncodeAbort(buf, WireType::kRefuse, 0, 9, AbortReason::kTooLarge);
  f = ParseWire(std::span<const std::byte>(buf.data(), n));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kRefuse);
  EXPECT_EQ(f->tag, 9u);
  EXPECT_EQ(f->reason, static_cast<uint32_t>(AbortReason::kTooLarge));

  n = EncodeCreditUpdate(buf, 32);
  f = ParseWire(std::span<const std::byte>(buf.data(), n));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kCreditUpdate);
  EXPECT_EQ(f->credits, 32);

  n = EncodeHello(buf, 1, "rdma://node-17.example:4000");
  f = ParseWire(std::span<const std::byte>(buf.data(), n));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->hello_address, "rdma://node-17.example:4000");
}

TEST(rdmaWireTest, EveryTruncationIsRejected) {
  const std::vector<std::byte> wire = SampleMessage();
  for (size_t n = 0; n < wire.size(); ++n) {
    absl::StatusOr<WireFrame> f = ParseWire(std::span<const std::byte>(wire.data(), n));
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  }
  std::vector<std::byte> longer = wire;
  longer.push_back(std::byte{0});
  EXPECT_THAT(std::string(ParseWire(longer).status().message()), HasSubstr("body bytes"));
}

TEST(rdmaWireTest, SpecificCorruptionsAreNamed) {
  auto corrupt = [](size_t offset, uint8_t value) {
    std::vector<std::byte> w = SampleMessage();
    w[offset] = std::byte{value};
    return std::string(ParseWire(w).status().message());
  };
  EXPECT_THAT(corrupt(0, 'X'), HasSubstr("magic"));
  EXPECT_THAT(corrupt(4, 9), HasSubstr("version"));
  EXPECT_THAT(corrupt(5, 77), HasSubstr("unknown type"));
  EXPECT_THAT(corrupt(6, 1), HasSubstr("flags"));
  EXPECT_THAT(corrupt(28, 1), HasSubstr("reserved"));
  EXPECT_THAT(corrupt(10, 0), HasSubstr("without parts"));
  EXPECT_THAT(corrupt(10, 200), HasSubstr("parts; the limit"));
  // An inline part claiming more bytes than the body holds.
  EXPECT_THAT(corrupt(kWireHeaderBytes + kPartDescriptorBytes, 11), HasSubstr("inline parts total"));
  // The remote part's tag set to 0 makes it inline, and the byte count no longer adds up.
  EXPECT_FALSE(ParseWire([] {
                 std::vector<std::byte> w = SampleMessage();
                 w[kWireHeaderBytes + 2 * kPartDescriptorBytes + 8] = std::byte{0};
                 return w;
               }())
                   .ok());
}

TEST(rdmaWireTest, RepeatedTagsAndEmptyRemotePartsAreRejected) {
  std::vector<std::byte> env = Bytes("e");
  std::vector<PartDescriptor> parts = {{1, 0}, {100, 5}, {200, 5}};
  std::vector<std::span<const std::byte>> data = {env, {}, {}};
  std::vector<std::byte> out(MessageWireBytes(parts));
  EncodeMessage(out, 0, 0, parts, data);
  EXPECT_THAT(std::string(ParseWire(out).status().message()), HasSubstr("tag repeated"));

  parts = {{1, 0}, {0, 5}};
  data = {env, {}};
  out.assign(MessageWireBytes(parts), std::byte{0});
  EncodeMessage(out, 0, 0, parts, data);
  EXPECT_THAT(std::string(ParseWire(out).status().message()), HasSubstr("empty part"));
}

TEST(rdmaWireTest, ControlMessageShapesAreChecked) {
  std::vector<std::byte> buf(256);
  size_t n = EncodeClearToSend(buf, 0, ClearToSend{7, 1, 10, 1});
  buf[12] = std::byte{0};  // tag 0
  EXPECT_THAT(std::string(ParseWire(std::span<const std::byte>(buf.data(), n)).status().message()),
              HasSubstr("tag 0"));
  n = EncodeClearToSend(buf, 0, ClearToSend{7, 1, 0, 1});  // zero length
  EXPECT_FALSE(ParseWire(std::span<const std::byte>(buf.data(), n)).ok());
  n = EncodeCreditUpdate(buf, 1);
  buf[12] = std::byte{4};  // a tag on a credit update
  EXPECT_FALSE(ParseWire(std::span<const std::byte>(buf.data(), n)).ok());
}

TEST(rdmaWireTest, GarbageNeverCrashesAndRarelyParses) {
  std::mt19937_64 rng(20240601);
  const std::vector<std::byte> valid = SampleMessage();
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> b;
    if (i % 2 == 0) {
      b.resize(rng() % 300);
      for (auto& x : b) x = static_cast<std::byte>(rng());
    } else {
      b = valid;  // valid message with a few random bytes flipped
      for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<std::byte>(rng());
    }
    absl::StatusOr<WireFrame> f = ParseWire(b);
    if (!f.ok()) continue;
    ++parsed;
    // Whatever parses must be self-consistent.
    if (f->type == WireType::kMessage) {
      ASSERT_EQ(f->parts.size(), f->inline_parts.size());
      size_t inline_total = 0;
      for (size_t p = 0; p < f->parts.size(); ++p) {
        if (f->parts[p].tag == 0) {
          ASSERT_EQ(f->inline_parts[p].size(), f->parts[p].length);
          inline_total += f->parts[p].length;
        }
      }
      ASSERT_EQ(inline_total + kWireHeaderBytes + f->parts.size() * kPartDescriptorBytes, b.size());
    }
  }
  EXPECT_LT(parsed, 20000 / 2);  // flips of payload bytes may parse; random headers never do
}

TEST(rdmaWireTest, HandshakeRoundTripAndOverflow) {
  Handshake h{64, 8192, "rdma://10.0.0.1:4000"};
  std::vector<std::byte> b = EncodeHandshake(h, 56);
  EXPECT_LE(b.size(), 56u);
  absl::StatusOr<Handshake> p = ParseHandshake(b);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->credits, 64u);
  EXPECT_EQ(p->slot_bytes, 8192u);
  EXPECT_EQ(p->address, "rdma://10.0.0.1:4000");
  EXPECT_FALSE(p->address_in_hello);

  // rdma_cm pads private data with zeros.
  b.resize(56, std::byte{0});
  ASSERT_TRUE(ParseHandshake(b).ok());

  Handshake long_name{64, 8192, "rdma://a-rather-long-host-name.rack-12.cluster.example.org:4000"};
  b = EncodeHandshake(long_name, 56);
  EXPECT_LE(b.size(), 56u);
  p = ParseHandshake(b);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->address_in_hello);
  EXPECT_TRUE(p->address.empty());
}

TEST(rdmaWireTest, HandshakeCarriesTheAuthenticationFlag) {
  for (const bool required : {false, true}) {
    for (const char* address : {"rdma://10.0.0.1:4000", "rdma://a-rather-long-host-name.rack-12.cluster.example.org:4000"}) {
      Handshake h{64, 8192, address};
      h.auth_required = required;
      absl::StatusOr<Handshake> p = ParseHandshake(EncodeHandshake(h, 56));
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(p->auth_required, required) << address;
    }
  }
  std::vector<std::byte> b = EncodeHandshake(Handshake{64, 8192, "rdma://h:1"}, 56);
  b[6] = std::byte{4};  // a flag nobody defined
  EXPECT_THAT(std::string(ParseHandshake(b).status().message()), HasSubstr("unknown flags"));
}

TEST(rdmaWireTest, AuthenticationMessagesRoundTrip) {
  std::array<std::byte, kAuthNonceBytes> nonce;
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::byte>(i * 7 + 1);
  std::vector<std::byte> challenge(AuthChallengeWireBytes("rdma://10.0.0.1:4000"));
  EXPECT_EQ(EncodeAuthChallenge(challenge, 5, nonce, "rdma://10.0.0.1:4000"), challenge.size());
  absl::StatusOr<WireFrame> f = ParseWire(challenge);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kAuthChallenge);
  EXPECT_EQ(f->credits, 5);
  EXPECT_EQ(f->auth_nonce, nonce);
  EXPECT_EQ(f->auth_address, "rdma://10.0.0.1:4000");

  std::array<std::byte, kAuthMacBytes> mac;
  for (size_t i = 0; i < mac.size(); ++i) mac[i] = static_cast<std::byte>(255 - i);
  std::vector<std::byte> proof(kAuthProofWireBytes);
  EXPECT_EQ(EncodeAuthProof(proof, 0, mac), proof.size());
  f = ParseWire(proof);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type, WireType::kAuthProof);
  EXPECT_EQ(f->auth_mac, mac);

  // Every truncation of either is rejected, and so is a proof of another length.
  for (const std::vector<std::byte>* wire : {&challenge, &proof}) {
    for (size_t n = 0; n < wire->size(); ++n) {
      EXPECT_FALSE(ParseWire(std::span<const std::byte>(wire->data(), n)).ok()) << n;
    }
  }
  // A challenge with a nonce but no address.
  std::vector<std::byte> bare(kWireHeaderBytes + kAuthNonceBytes);
  std::memcpy(bare.data(), challenge.data(), kWireHeaderBytes);
  bare[24] = std::byte{kAuthNonceBytes};  // body bytes
  EXPECT_THAT(std::string(ParseWire(bare).status().message()), HasSubstr("without nonce and address"));
  std::vector<std::byte> short_proof(kWireHeaderBytes + 16);
  std::memcpy(short_proof.data(), proof.data(), kWireHeaderBytes);
  short_proof[24] = std::byte{16};
  EXPECT_THAT(std::string(ParseWire(short_proof).status().message()), HasSubstr("authentication proof of 16 bytes"));
  // Neither carries a tag, a part count or a request id.
  std::vector<std::byte> tagged = proof;
  tagged[12] = std::byte{1};
  EXPECT_FALSE(ParseWire(tagged).ok());
}

TEST(rdmaWireTest, HandshakeRejectsBadInput) {
  std::vector<std::byte> b = EncodeHandshake(Handshake{64, 8192, "rdma://h:1"}, 56);
  for (size_t n = 0; n < kHandshakeFixedBytes + 10; ++n) {
    EXPECT_FALSE(ParseHandshake(std::span<const std::byte>(b.data(), n)).ok()) << n;
  }
  std::vector<std::byte> bad = b;
  bad[0] = std::byte{0};
  EXPECT_THAT(std::string(ParseHandshake(bad).status().message()), HasSubstr("not a Tessera peer"));
  EXPECT_FALSE(ParseHandshake(EncodeHandshake(Handshake{0, 8192, ""}, 56)).ok());       // no credits
  EXPECT_FALSE(ParseHandshake(EncodeHandshake(Handshake{64, 100, ""}, 56)).ok());       // tiny slots
  EXPECT_FALSE(ParseHandshake(EncodeHandshake(Handshake{100000, 8192, ""}, 56)).ok());  // window too large
}

TEST(rdmaWireTest, Addresses) {
  absl::StatusOr<HostPort> a = ParseRdmaAddress("rdma://10.1.2.3:4000", false, false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.1.2.3");
  EXPECT_EQ(a->port, 4000);
  a = ParseRdmaAddress("tcp://[fe80::1]:0", true, true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "fe80::1");
  EXPECT_EQ(a->port, 0);
  EXPECT_EQ(FormatRdmaAddress("fe80::1", 7), "rdma://[fe80::1]:7");
  EXPECT_EQ(FormatRdmaAddress("node", 7), "rdma://node:7");
  EXPECT_FALSE(ParseRdmaAddress("tcp://h:1", false, false).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://h:0", false, false).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://h:65536", false, true).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://h", false, true).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://:5", false, true).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://fe80::1:5", false, true).ok());
  EXPECT_FALSE(ParseRdmaAddress("rdma://h:5x", false, true).ok());
  EXPECT_FALSE(ParseRdmaAddress("ipc:///tmp/x", true, true).ok());
}

}  // namespace
}  // namespace tessera::rdma
