// Wire accounting and robustness: sizes are exact, and truncated, extended or
// corrupted bytes give errors (never crashes, never writes the destination).
#include <cstring>
#include <random>
#include <vector>

#include "compress/compress_test_util.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using testing::EncodeVec;
using testing::Gaussian;
using testing::MakeCodec;
using testing::Spec;

const auto& kAll = testing::kAllCodecs;

TEST(WireFormatTest, ReportedSizeEqualsProducedSize) {
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.03, 15));
    for (size_t n : {0ul, 1ul, 2ul, 3ul, 4ul, 5ul, 7ul, 8ul, 9ul, 15ul, 16ul, 17ul, 1000ul, 100003ul}) {
      std::vector<float> x = Gaussian(n, n);
      // A larger buffer: Encode must report the exact size, not the capacity.
      std::vector<std::byte> out(c.EncodedSize(n) + 64);
      absl::StatusOr<size_t> r = c.Encode(x, {.tensor_id = n, .element_offset = 2 * n}, out);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(*r, c.EncodedSize(n)) << CodecName(id) << " n=" << n;
      absl::StatusOr<WireInfo> info = InspectWire(std::span(out).first(*r));
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->wire_bytes, *r);
      EXPECT_EQ(info->codec, id);
      EXPECT_EQ(info->num_elements, n);
      EXPECT_EQ(info->element_offset, 2 * n);
    }
  }
  // Compression ratios are what the format says.
  const size_t n = 1 << 20;
  EXPECT_EQ(MakeCodec(Spec(CodecId::kNone)).EncodedSize(n), 32 + 4 * n);
  EXPECT_EQ(MakeCodec(Spec(CodecId::kFp16)).EncodedSize(n), 32 + 2 * n);
  EXPECT_EQ(MakeCodec(Spec(CodecId::kQsgd)).EncodedSize(n), 40 + n);
  EXPECT_EQ(MakeCodec(Spec(CodecId::kTernGrad)).EncodedSize(n), 40 + n / 4);
  EXPECT_EQ(MakeCodec(Spec(CodecId::kOneBit)).EncodedSize(n), 40 + n / 8);
  EXPECT_EQ(MakeCodec(Spec(CodecId::kTopK, 0.001)).EncodedSize(n), 40 + 8 * KeptElements(0.001, n));
  EXPECT_EQ(MakeCodec(Spec(CodecId::kRandomK, 0.001)).EncodedSize(n), 40 + 4 * KeptElements(0.001, n));
}

TEST(WireFormatTest, TruncatedAndExtendedBuffersAreErrors) {
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.1));
    std::vector<float> x = Gaussian(37, 1);
    std::vector<std::byte> wire = EncodeVec(c, x);
    std::vector<float> acc(37, 7.0f);
    for (size_t len = 0; len < wire.size(); ++len) {
      // A fresh allocation of exactly len bytes, so reading past it is caught
      // by sanitizers.
      std::vector<std::byte> cut(wire.begin(), wire.begin() + len);
      absl::Status s = DecodeAdd(cut, acc);
      EXPECT_FALSE(s.ok()) << CodecName(id) << " len=" << len;
    }
    std::vector<std::byte> longer = wire;
    longer.push_back(std::byte{0});
    EXPECT_FALSE(DecodeAdd(longer, acc).ok()) << CodecName(id);
    for (float v : acc) ASSERT_EQ(v, 7.0f) << "destination written on error";
    // Wrong destination size.
    std::vector<float> small(36);
    EXPECT_FALSE(Decode(wire, small).ok());
  }
}

TEST(WireFormatTest, CorruptedHeadersAreErrors) {
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.1));
    std::vector<float> x = Gaussian(64, 2);
    const std::vector<std::byte> wire = EncodeVec(c, x);
    std::vector<float> out(64);
    // Magic, codec id, reserved byte, element count: any change is detected.
    for (size_t byte : {0ul, 1ul, 2ul, 3ul, 4ul, 5ul, 8ul, 9ul, 12ul, 15ul}) {
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<std::byte> bad = wire;
        bad[byte] ^= static_cast<std::byte>(1 << bit);
        // (A flip of the codec id to another valid id is caught by the size
        // or the levels field.)
        EXPECT_FALSE(Decode(bad, out).ok()) << CodecName(id) << " byte " << byte << " bit " << bit;
      }
    }
  }
}

template <typename T>
void PutAt(std::vector<std::byte>& w, size_t at, T v) {
  std::memcpy(w.data() + at, &v, sizeof(T));
}

TEST(WireFormatTest, CorruptedPayloadFieldsAreErrors) {
  const size_t n = 21;
  std::vector<float> x = Gaussian(n, 3);
  std::vector<float> out(n);
  constexpr size_t h = kWireHeaderBytes;
  {  // qsgd: levels 0 and > 127, value outside [-levels, levels], bad scale.
    std::vector<std::byte> w = EncodeVec(MakeCodec(Spec(CodecId::kQsgd, 0.1, 5)), x);
    auto bad = w;
    PutAt<uint16_t>(bad, 6, 0);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint16_t>(bad, 6, 128);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<int8_t>(bad, h + 8 + 3, 6);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<int8_t>(bad, h + 8 + 3, -128);
    EXPECT_FALSE(Decode(bad, out).ok());
    for (float s : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      bad = w;
      PutAt<float>(bad, h, s);
      EXPECT_FALSE(Decode(bad, out).ok()) << s;
    }
    bad = w;
    PutAt<uint32_t>(bad, h + 4, 1);
    EXPECT_FALSE(Decode(bad, out).ok());
  }
  {  // terngrad: code 3, padding bits.
    std::vector<std::byte> w = EncodeVec(MakeCodec(Spec(CodecId::kTernGrad)), x);
    auto bad = w;
    bad[h + 8] |= std::byte{0x03};
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    bad.back() |= std::byte{0x80};  // n = 21: last byte holds one element
    EXPECT_FALSE(Decode(bad, out).ok());
  }
  {  // onebit: padding bits.
    std::vector<std::byte> w = EncodeVec(MakeCodec(Spec(CodecId::kOneBit)), x);
    auto bad = w;
    bad.back() |= std::byte{0x80};
    EXPECT_FALSE(Decode(bad, out).ok());
  }
  {  // topk: indices out of order, repeated, out of range; k > n; k = 0.
    std::vector<std::byte> w = EncodeVec(MakeCodec(Spec(CodecId::kTopK, 0.2)), x);  // k = 5
    auto bad = w;
    uint32_t i0, i1;
    std::memcpy(&i0, &w[h + 8], 4);
    std::memcpy(&i1, &w[h + 12], 4);
    PutAt<uint32_t>(bad, h + 8, i1);
    PutAt<uint32_t>(bad, h + 12, i0);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint32_t>(bad, h + 12, i0);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint32_t>(bad, h + 8 + 4 * 4, static_cast<uint32_t>(n));
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint64_t>(bad, h, n + 1);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint64_t>(bad, h, 0);
    EXPECT_FALSE(Decode(bad, out).ok());
    bad = w;
    PutAt<uint64_t>(bad, h, ~0ull);  // size arithmetic must not overflow
    EXPECT_FALSE(Decode(bad, out).ok());
  }
  {  // huge element counts do not overflow the size computation
    std::vector<std::byte> w = EncodeVec(MakeCodec(Spec(CodecId::kNone)), x);
    for (uint64_t count : {~0ull, 1ull << 62, (1ull << 62) + 1, 0x4000000000000005ull}) {
      auto bad = w;
      PutAt<uint64_t>(bad, 8, count);
      EXPECT_FALSE(InspectWire(bad).ok()) << count;
    }
    auto bad = w;
    PutAt<uint64_t>(bad, 16, ~0ull);  // offset + n overflows
    EXPECT_FALSE(InspectWire(bad).ok());
  }
}

TEST(WireFormatTest, RandomGarbageAndMutationsNeverCrashOrWriteOnError) {
  std::mt19937_64 rng(5);
  std::vector<float> x = Gaussian(300, 4);
  for (CodecId id : kAll) {
    const std::vector<std::byte> wire = EncodeVec(MakeCodec(Spec(id, 0.05, 31)), x);
    for (int trial = 0; trial < 3000; ++trial) {
      std::vector<std::byte> bad = wire;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= static_cast<std::byte>(1 + rng() % 255);
      if (trial % 5 == 0) bad.resize(rng() % (bad.size() + 1));
      std::vector<float> acc(300, 1.5f);
      absl::Status s = DecodeAdd(bad, acc);
      if (!s.ok()) {
        for (float v : acc) ASSERT_EQ(v, 1.5f) << CodecName(id) << ": destination written on error";
      }
    }
  }
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::byte> garbage(rng() % 200);
    for (auto& b : garbage) b = static_cast<std::byte>(rng());
    std::vector<float> out(rng() % 50);
    EXPECT_FALSE(Decode(garbage, out).ok());
  }
}

}  // namespace
}  // namespace tessera::compress
