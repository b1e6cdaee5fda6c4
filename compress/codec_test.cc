#include "compress/codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "compress/compress_test_util.h"
#include "compress/cpu_kernels.h"
#include "compress/scalar_ops.h"
#include "compress/topk_select.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using testing::Bits;
using testing::DecodeVec;
using testing::EncodeVec;
using testing::Gaussian;
using testing::MakeCodec;
using testing::Spec;

const auto& kAll = testing::kAllCodecs;

TEST(CodecTest, NoneRoundTripsBitExact) {
  Codec c = MakeCodec(Spec(CodecId::kNone));
  std::vector<float> x = testing::BitPatterns(1001, 3);
  std::vector<float> y = DecodeVec(EncodeVec(c, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(Bits(x[i]), Bits(y[i])) << i;
}

TEST(CodecTest, Fp16WithinHalfAnUlpAndKnownValues) {
  Codec c = MakeCodec(Spec(CodecId::kFp16));
  std::vector<float> x = Gaussian(4099, 1, 10.0f);
  x.push_back(1.0f);
  x.push_back(65504.0f);
  x.push_back(65520.0f);   // ties to even -> infinity
  x.push_back(1e-8f);      // subnormal half
  x.push_back(-3.0e-8f);
  std::vector<float> y = DecodeVec(EncodeVec(c, x), x.size());
  for (size_t i = 0; i < 4099; ++i) {
    // Normal halves: relative error at most 2^-11; subnormals: 2^-25 absolute.
    EXPECT_LE(std::abs(y[i] - x[i]), std::max(std::abs(x[i]) * 0x1p-11f, 0x1p-25f)) << x[i];
  }
  EXPECT_EQ(y[4099], 1.0f);
  EXPECT_EQ(y[4100], 65504.0f);
  EXPECT_TRUE(std::isinf(y[4101]));
  EXPECT_EQ(y[4102], 0x1p-24f * std::nearbyint(1e-8f / 0x1p-24f));
  EXPECT_EQ(y[4103], -0x1p-24f * std::nearbyint(3.0e-8f / 0x1p-24f));
}

TEST(CodecTest, Bf16WithinHalfAnUlp) {
  Codec c = MakeCodec(Spec(CodecId::kBf16));
  std::vector<float> x = Gaussian(5000, 2, 1e5f);
  std::vector<float> y = DecodeVec(EncodeVec(c, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::abs(y[i] - x[i]), std::abs(x[i]) * 0x1p-8f) << x[i];
    EXPECT_EQ(Bits(y[i]) & 0xffffu, 0u);
  }
  // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  std::vector<float> t = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};
  std::vector<float> ty = DecodeVec(EncodeVec(c, t), 2);
  EXPECT_EQ(ty[0], 1.0f);
  EXPECT_EQ(ty[1], 1.0f + 4 * 0x1p-8f);
}

TEST(CodecTest, QsgdValuesAreNeighbouringLevels) {
  for (int levels : {1, 3, 15, 127}) {
    Codec c = MakeCodec(Spec(CodecId::kQsgd, 0.01, levels));
    std::vector<float> x = Gaussian(3001, 4);
    x[17] = 0.0f;
    const float scale = std::abs(*std::max_element(x.begin(), x.end(), [](float a, float b) {
      return std::abs(a) < std::abs(b);
    }));
    const float step = scale / static_cast<float>(levels);
    std::vector<float> y = DecodeVec(EncodeVec(c, x, 5), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float q = y[i] / step;
      EXPECT_NEAR(q, std::nearbyint(q), 1e-3) << "not a level: " << y[i];
      EXPECT_LE(std::abs(y[i] - x[i]), step * 1.0001f) << i;
      if (y[i] != 0.0f) {
        EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i]));
      }
    }
    EXPECT_EQ(y[17], 0.0f);
  }
}

TEST(CodecTest, TernGradValuesAreZeroOrSignedScale) {
  Codec c = MakeCodec(Spec(CodecId::kTernGrad));
  std::vector<float> x = Gaussian(1003, 5);
  const float scale = std::abs(*std::max_element(x.begin(), x.end(), [](float a, float b) {
    return std::abs(a) < std::abs(b);
  }));
  std::vector<float> y = DecodeVec(EncodeVec(c, x, 9), x.size());
  size_t nonzero = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f) continue;
    ++nonzero;
    EXPECT_EQ(std::abs(y[i]), scale);
    EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i]));
  }
  EXPECT_GT(nonzero, 100u);
  EXPECT_LT(nonzero, 900u);
}

TEST(CodecTest, OneBitSendsSignTimesMeanMagnitude) {
  Codec c = MakeCodec(Spec(CodecId::kOneBit));
  std::vector<float> x = Gaussian(1234, 6);
  x[3] = 0.0f;
  double mean = 0;
  for (float v : x) mean += std::abs(v);
  mean /= x.size();
  std::vector<float> y = DecodeVec(EncodeVec(c, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_FLOAT_EQ(std::abs(y[i]), static_cast<float>(mean));
    EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << i;
  }
  EXPECT_GT(y[3], 0.0f);  // +0 is non-negative
}

// Reference top-k: stable sort by magnitude, descending; ties by index.
std::vector<uint32_t> ReferenceTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    return (Bits(x[a]) & 0x7fffffffu) > (Bits(x[b]) & 0x7fffffffu);
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint32_t> WireIndices(const std::vector<std::byte>& wire) {
  uint64_t k;
  std::memcpy(&k, wire.data() + kWireHeaderBytes, 8);
  std::vector<uint32_t> idx(k);
  std::memcpy(idx.data(), wire.data() + kWireHeaderBytes + 8, 4 * k);
  return idx;
}

TEST(CodecTest, TopKKeepsExactlyTheLargestMagnitudes) {
  // Sizes cover the radix path (small n, dense k) and the sampled path.
  for (size_t n : {1ul, 10ul, 1000ul, 70000ul, 300000ul}) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5, 1.0}) {
      std::vector<float> x = Gaussian(n, n + 7);
      Codec c = MakeCodec(Spec(CodecId::kTopK, ratio));
      const size_t k = KeptElements(ratio, n);
      std::vector<std::byte> wire = EncodeVec(c, x);
      std::vector<uint32_t> idx = WireIndices(wire);
      ASSERT_EQ(idx, ReferenceTopK(x, k)) << "n=" << n << " ratio=" << ratio;
      std::vector<float> y = DecodeVec(wire, n);
      for (uint32_t i : idx) EXPECT_EQ(y[i], x[i]);
      EXPECT_EQ(static_cast<size_t>(std::count(y.begin(), y.end(), 0.0f)), n - k);
    }
  }
}

TEST(CodecTest, TopKBreaksTiesByLowerIndexDeterministically) {
  for (size_t n : {1000ul, 200000ul}) {
    // Magnitudes in {0, 1, 2} with both signs: many ties at the threshold.
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
      const int m = static_cast<int>(scalar::CounterHash32(77, static_cast<uint32_t>(i)) % 1000);
      x[i] = m < 2 ? 2.0f : (m < 10 ? 1.0f : 0.0f);
      if (i % 3 == 0) x[i] = -x[i];
    }
    Codec c = MakeCodec(Spec(CodecId::kTopK, 0.005));
    const size_t k = KeptElements(0.005, n);
    std::vector<std::byte> a = EncodeVec(c, x);
    EXPECT_EQ(WireIndices(a), ReferenceTopK(x, k)) << n;
    EXPECT_EQ(a, EncodeVec(c, x)) << "same input, different bytes";
  }
  // All equal: the first k win.
  std::vector<float> same(100000, -0.5f);
  Codec c = MakeCodec(Spec(CodecId::kTopK, 0.01));
  std::vector<uint32_t> idx = WireIndices(EncodeVec(c, same));
  ASSERT_EQ(idx.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_EQ(idx[i], i);
}

TEST(CodecTest, TopKSampledAndRadixPathsAgree) {
  const kernels::KernelTable& kt = kernels::Best();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<float> x = Gaussian(262144 + seed, seed);
    for (size_t i = 0; i < x.size(); i += 97) x[i] = 0.0f;  // zeros
    x[5] = 1e6f;                                            // outlier
    for (size_t k : {1ul, 50ul, 262ul, 2000ul}) {
      std::vector<uint32_t> a, b;
      ASSERT_TRUE(SelectTopK(x.data(), x.size(), k, kt, a).ok());
      ASSERT_TRUE(SelectTopKRadix(x.data(), x.size(), k, b).ok());
      ASSERT_EQ(a, b) << "seed " << seed << " k " << k;
    }
  }
}

TEST(CodecTest, RandomKSendsOneScaledValuePerStratum) {
  const size_t n = 1003;
  std::vector<float> x = Gaussian(n, 8);
  for (double ratio : {0.01, 0.1, 0.3, 1.0}) {
    Codec c = MakeCodec(Spec(CodecId::kRandomK, ratio));
    const size_t k = KeptElements(ratio, n);
    std::vector<float> y = DecodeVec(EncodeVec(c, x, 11), n);
    for (size_t b = 0; b < k; ++b) {
      const size_t lo = b * n / k, hi = (b + 1) * n / k;
      size_t hits = 0;
      for (size_t i = lo; i < hi; ++i) {
        if (y[i] != 0.0f) {
          ++hits;
          EXPECT_EQ(y[i], x[i] * static_cast<float>(hi - lo));
        }
      }
      EXPECT_EQ(hits, 1u) << "stratum " << b;
    }
  }
  // Same seed and tensor id: same coordinates; another id: others.
  Codec c = MakeCodec(Spec(CodecId::kRandomK, 0.05));
  EXPECT_EQ(EncodeVec(c, x, 1), EncodeVec(c, x, 1));
  EXPECT_NE(DecodeVec(EncodeVec(c, x, 1), n), DecodeVec(EncodeVec(c, x, 2), n));
}

TEST(CodecTest, DecodeAddEqualsAccumulatorPlusAlphaTimesDecode) {
  std::vector<float> x = Gaussian(2049, 12);
  std::vector<float> acc0 = Gaussian(2049, 13);
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id, 0.05));
    std::vector<std::byte> wire = EncodeVec(c, x, 3);
    std::vector<float> dec = DecodeVec(wire, x.size());
    for (float alpha : {1.0f, -1.0f, 0.25f}) {
      std::vector<float> acc = acc0;
      ASSERT_TRUE(DecodeAdd(wire, acc, alpha).ok());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(Bits(acc[i]), Bits(acc0[i] + alpha * dec[i])) << CodecName(id) << " " << i;
      }
    }
  }
}

TEST(CodecTest, NonFiniteInputIsRejectedOrCarriedAsDocumented) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x = Gaussian(100000, 14);
    x[77777] = bad;
    for (CodecId id : kAll) {
      Codec c = MakeCodec(Spec(id, 0.01));
      std::vector<std::byte> out(c.EncodedSize(x.size()));
      absl::StatusOr<size_t> r = c.Encode(x, {}, out);
      const bool rejects = id == CodecId::kQsgd || id == CodecId::kTernGrad ||
                           id == CodecId::kOneBit || id == CodecId::kTopK;
      EXPECT_EQ(!r.ok(), rejects) << CodecName(id) << " " << bad << " " << r.status();
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      }
      if (r.ok() && id != CodecId::kRandomK) {
        std::vector<float> y = DecodeVec(out, x.size());
        EXPECT_EQ(std::isnan(y[77777]), std::isnan(bad)) << CodecName(id);
        EXPECT_EQ(std::isinf(y[77777]), std::isinf(bad)) << CodecName(id);
      }
    }
  }
}

TEST(CodecTest, TinyPartsEncodeAsZerosInsteadOfOverflowing) {
  std::vector<float> x = {1e-38f, -3e-39f, 0.0f, 1e-45f};
  for (CodecId id : {CodecId::kQsgd, CodecId::kTernGrad}) {
    Codec c = MakeCodec(Spec(id));
    std::vector<float> y = DecodeVec(EncodeVec(c, x), x.size());
    for (float v : y) EXPECT_EQ(v, 0.0f) << CodecName(id);
  }
}

TEST(CodecTest, EncodeChecksOutputSizeAndLimits) {
  std::vector<float> x = Gaussian(100, 15);
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id));
    std::vector<std::byte> small(c.EncodedSize(x.size()) - 1);
    absl::StatusOr<size_t> r = c.Encode(x, {}, small);
    EXPECT_FALSE(r.ok()) << CodecName(id);
    // The RNG counter covers indices below 2^33.
    std::vector<std::byte> out(c.EncodedSize(x.size()));
    EXPECT_FALSE(c.Encode(x, {.element_offset = (1ull << 33) - 50}, out).ok()) << CodecName(id);
    EXPECT_TRUE(c.Encode(x, {.element_offset = (1ull << 33) - 100}, out).ok()) << CodecName(id);
  }
}

TEST(CodecTest, EmptyTensorsEncodeAndDecode) {
  for (CodecId id : kAll) {
    Codec c = MakeCodec(Spec(id));
    std::vector<std::byte> wire = EncodeVec(c, {});
    EXPECT_EQ(wire.size(), c.EncodedSize(0));
    std::vector<float> none;
    EXPECT_TRUE(Decode(wire, none).ok()) << CodecName(id);
  }
}

}  // namespace
}  // namespace tessera::compress
