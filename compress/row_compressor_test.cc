#include "compress/row_compressor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace tessera::compress {
namespace {

CodecSpec Spec(const char* text) {
  absl::StatusOr<CodecSpec> s = ParseCodecSpec(text);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(RowCompressorTest, SmallPushesGoRaw) {
  auto rc = RowCompressor::Create(Spec("topk:raw_below=64"), 4, 1);
  ASSERT_TRUE(rc.ok());
  std::vector<Key> keys = {1, 2, 3};
  std::vector<float> v(12, 1.0f);
  auto e = (*rc)->Encode(keys, v);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->raw);
  EXPECT_TRUE(e->parts.empty());
  EXPECT_EQ((*rc)->residual_rows(), 0u);
}

TEST(RowCompressorTest, PartsTileTheValuesAndDecodeExactlyWithTheRawCodec) {
  auto rc = RowCompressor::Create(Spec("none:raw_below=1,part=7"), 3, 1);
  ASSERT_TRUE(rc.ok());
  std::vector<Key> keys = {10, 11, 12, 13, 14};
  std::vector<float> v(15);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 3.0f;
  auto e = (*rc)->Encode(keys, v);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->parts.size(), 3u);  // 7 + 7 + 1 elements
  size_t bytes = 0;
  for (const Buffer& b : e->parts) bytes += b.size();
  EXPECT_EQ(e->wire_bytes, bytes);
  EXPECT_EQ(bytes, 3 * kWireHeaderBytes + 15 * sizeof(float));
  std::vector<float> out(15, 99.0f);
  // Any order of parts decodes the same.
  std::vector<Buffer> shuffled = {e->parts[2], e->parts[0], e->parts[1]};
  ASSERT_TRUE(DecodeRowParts(shuffled, out).ok());
  EXPECT_EQ(out, v);
}

TEST(RowCompressorTest, BadCoverageAndBadBytesAreErrors) {
  auto rc = RowCompressor::Create(Spec("fp16:raw_below=1,part=4"), 2, 1);
  ASSERT_TRUE(rc.ok());
  std::vector<Key> keys = {1, 2, 3, 4};
  std::vector<float> v(8, 1.5f), out(8);
  auto e = (*rc)->Encode(keys, v);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->parts.size(), 2u);
  EXPECT_FALSE(DecodeRowParts(std::vector<Buffer>{e->parts[0]}, out).ok()) << "a gap";
  EXPECT_FALSE(DecodeRowParts(std::vector<Buffer>{e->parts[0], e->parts[0], e->parts[1]}, out).ok()) << "overlap";
  std::vector<float> small(6);
  EXPECT_FALSE(DecodeRowParts(e->parts, small).ok()) << "beyond the end";
  Buffer corrupt = Buffer::CopyOf(e->parts[1].data(), e->parts[1].size());
  corrupt.mutable_data()[0] = std::byte{'X'};
  EXPECT_FALSE(DecodeRowParts(std::vector<Buffer>{e->parts[0], corrupt}, out).ok());
  Buffer truncated = e->parts[1].Slice(0, e->parts[1].size() - 1);
  EXPECT_FALSE(DecodeRowParts(std::vector<Buffer>{e->parts[0], truncated}, out).ok());
  EXPECT_TRUE(DecodeRowParts(e->parts, out).ok());
  EXPECT_EQ(out, v);
  // The header-only check agrees, before anything is allocated.
  EXPECT_TRUE(CheckRowParts(e->parts, 8).ok());
  EXPECT_FALSE(CheckRowParts(e->parts, 9).ok());
  EXPECT_FALSE(CheckRowParts(e->parts, uint64_t{1} << 40).ok());
  EXPECT_FALSE(CheckRowParts(std::vector<Buffer>{e->parts[0], truncated}, 8).ok());
  EXPECT_FALSE((*rc)->Encode(keys, std::span<const float>(v).first(7)).ok()) << "values do not match keys";
  EXPECT_FALSE(RowCompressor::Create(Spec("fp16"), 0, 1).ok());
}

// Per key: everything pushed == everything decoded + the key's residual, over
// pushes with changing key sets and repeated keys.
TEST(RowCompressorTest, ErrorFeedbackConservesEveryKeysMass) {
  constexpr uint32_t kWidth = 3;
  auto rc = RowCompressor::Create(Spec("topk:ratio=0.1,raw_below=1,part=50"), kWidth, 7);
  ASSERT_TRUE(rc.ok());
  std::mt19937_64 rng(3);
  std::map<Key, std::vector<double>> pushed, received;
  double magnitude = 0;
  for (int step = 0; step < 200; ++step) {
    std::vector<Key> keys(20 + rng() % 30);
    for (Key& k : keys) k = rng() % 40;  // repeats within a push are common
    std::vector<float> v(keys.size() * kWidth);
    std::normal_distribution<float> g(0.0f, step % 7 == 0 ? 10.0f : 1.0f);
    for (float& x : v) {
      x = g(rng);
      magnitude += std::abs(x);
    }
    auto e = (*rc)->Encode(keys, v);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_FALSE(e->raw);
    std::vector<float> decoded(v.size());
    ASSERT_TRUE(DecodeRowParts(e->parts, decoded).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& p = pushed[keys[i]];
      auto& r = received[keys[i]];
      p.resize(kWidth);
      r.resize(kWidth);
      for (uint32_t j = 0; j < kWidth; ++j) {
        p[j] += v[i * kWidth + j];
        r[j] += decoded[i * kWidth + j];
      }
    }
  }
  const double tolerance = 1e-5 * magnitude;
  double worst = 0, residual_norm = 0;
  for (const auto& [key, p] : pushed) {
    std::vector<float> res = (*rc)->Residual(key);
    for (uint32_t j = 0; j < kWidth; ++j) {
      worst = std::max(worst, std::abs(p[j] - received[key][j] - res[j]));
      residual_norm += std::abs(res[j]);
    }
  }
  EXPECT_LT(worst, tolerance) << "mass lost or created";
  EXPECT_GT(residual_norm, 0.0) << "top-k 10% must leave something behind";
  EXPECT_LE((*rc)->residual_rows(), 40u);
}

// Without error feedback top-k just drops what it does not send.
TEST(RowCompressorTest, WithoutErrorFeedbackNothingIsCarried) {
  auto rc = RowCompressor::Create(Spec("topk:ratio=0.25,ef=false,raw_below=1"), 1, 7);
  ASSERT_TRUE(rc.ok());
  std::vector<Key> keys = {1, 2, 3, 4};
  std::vector<float> v = {4, 3, 2, 1}, out(4);
  auto e = (*rc)->Encode(keys, v);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(DecodeRowParts(e->parts, out).ok());
  EXPECT_EQ(out, (std::vector<float>{4, 0, 0, 0}));
  EXPECT_EQ((*rc)->residual_rows(), 0u);
}

TEST(RowCompressorTest, PullSpecsAreElementwiseWithoutErrorFeedback) {
  EXPECT_TRUE(ParsePullSpec("fp16").ok());
  EXPECT_TRUE(ParsePullSpec("qsgd:levels=15").ok());
  EXPECT_FALSE(ParsePullSpec("topk").ok());
  EXPECT_FALSE(ParsePullSpec("onebit:ef=false").ok());
  EXPECT_FALSE(ParsePullSpec("fp16:ef=true").ok());
  EXPECT_FALSE(ParsePullSpec("nonsense").ok());
  auto codec = Codec::Create(*ParsePullSpec("bf16:raw_below=4,part=3"));
  ASSERT_TRUE(codec.ok());
  std::vector<float> v = {1, 2, 3, 4, 5, 6, 7}, out(7);
  auto e = EncodeValues(*codec, v, 1);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->parts.size(), 3u);
  ASSERT_TRUE(DecodeRowParts(e->parts, out).ok());
  EXPECT_EQ(out, v);  // small integers are exact in bf16
  EXPECT_TRUE(EncodeValues(*codec, std::span<const float>(v).first(3), 1)->raw);
}

}  // namespace
}  // namespace tessera::compress
