// The AVX2 and AVX-512 kernels must give the same bits as the portable ones
// (and the portable fp16 conversion the same bits as the F16C instructions).
#include "compress/cpu_kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compress/compress_test_util.h"
#include "compress/scalar_ops.h"
#include "gtest/gtest.h"

namespace tessera::compress::kernels {
namespace {

using testing::BitPatterns;
using testing::Bits;
using testing::Gaussian;

// Every test runs once per vector table, against the portable one.
class KernelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    vec_ = GetParam() == "avx2" ? Avx2() : Avx512();
    if (vec_ == nullptr) GTEST_SKIP() << "this CPU lacks what the " << GetParam() << " table needs";
    ASSERT_EQ(std::string(vec_->name), GetParam());
  }
  const KernelTable& portable_ = Portable();
  const KernelTable* vec_ = nullptr;
};

// Lengths around the vector widths (8, 16) and a long one.
const size_t kLengths[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4099};

void ExpectSameFloats(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(Bits(a[i]), Bits(b[i])) << what << " at " << i;
  }
}

TEST_P(KernelsTest, Fp16EncodeMatchesF16COnAllKindsOfValues) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<float> x = BitPatterns(100003, seed);
    // Dense coverage of the rounding boundaries around the fp16 range.
    for (uint32_t b = 0x33000000u; b < 0x47800000u; b += 0x1001u) {
      float f;
      std::memcpy(&f, &b, 4);
      x.push_back(f);
    }
    std::vector<std::byte> a(2 * x.size()), b(2 * x.size());
    portable_.encode_fp16(x.data(), x.size(), a.data());
    vec_->encode_fp16(x.data(), x.size(), b.data());
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t ha, hb;
      std::memcpy(&ha, &a[2 * i], 2);
      std::memcpy(&hb, &b[2 * i], 2);
      ASSERT_EQ(ha, hb) << "float bits " << std::hex << Bits(x[i]);
    }
  }
}

TEST_P(KernelsTest, Fp16DecodeMatchesF16COnEveryHalf) {
  std::vector<std::byte> in(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(&in[2 * h], &v, 2);
  }
  std::vector<float> a(65536), b(65536);
  portable_.decode_fp16(in.data(), 65536, a.data(), 1.0f, false);
  vec_->decode_fp16(in.data(), 65536, b.data(), 1.0f, false);
  ExpectSameFloats(a, b, "half->float");
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(a[h]), Bits(scalar::HalfToFloat(static_cast<uint16_t>(h))));
  }
}

TEST_P(KernelsTest, ElementwiseKernelsAgreeAtEveryLengthAndAlignment) {
  for (size_t n : kLengths) {
    for (size_t misalign : {0, 1, 3}) {
      std::vector<float> x = Gaussian(n, n * 7 + misalign, 3.0f);
      if (n > 5) x[5] = 0.0f, x[n - 1] = -0.0f;
      // Wire buffers at odd addresses.
      std::vector<std::byte> wa(4 * n + 8), wb(4 * n + 8);
      std::byte* pa = wa.data() + misalign;
      std::byte* pb = wb.data() + misalign;
      std::vector<float> acc0 = Gaussian(n, 99), da = acc0, db = acc0;

      portable_.encode_fp16(x.data(), n, pa);
      vec_->encode_fp16(x.data(), n, pb);
      ASSERT_EQ(0, std::memcmp(pa, pb, 2 * n)) << "fp16 n=" << n;
      portable_.decode_fp16(pa, n, da.data(), 0.5f, true);
      vec_->decode_fp16(pb, n, db.data(), 0.5f, true);
      ExpectSameFloats(da, db, "fp16 decode-add");

      portable_.encode_bf16(x.data(), n, pa);
      vec_->encode_bf16(x.data(), n, pb);
      ASSERT_EQ(0, std::memcmp(pa, pb, 2 * n)) << "bf16 n=" << n;
      portable_.decode_bf16(pa, n, da.data(), 1.0f, false);
      vec_->decode_bf16(pb, n, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "bf16 decode");
      da = db = acc0;
      portable_.decode_bf16(pa, n, da.data(), -1.0f, true);
      vec_->decode_bf16(pb, n, db.data(), -1.0f, true);
      ExpectSameFloats(da, db, "bf16 decode-add");

      const double sa = portable_.encode_signs(x.data(), n, pa);
      const double sb = vec_->encode_signs(x.data(), n, pb);
      ASSERT_EQ(sa, sb) << "sign sum n=" << n;
      ASSERT_EQ(0, std::memcmp(pa, pb, (n + 7) / 8)) << "signs n=" << n;
      portable_.decode_signs(pa, n, 0.75f, da.data(), 1.0f, false);
      vec_->decode_signs(pb, n, 0.75f, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "sign decode");
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::signbit(da[i]), std::signbit(x[i]));

      EXPECT_EQ(portable_.max_abs_bits(x.data(), n), vec_->max_abs_bits(x.data(), n));
    }
  }
}

TEST_P(KernelsTest, Bf16AgreesOnSpecialValues) {
  std::vector<float> x = BitPatterns(50001, 5);
  std::vector<std::byte> a(2 * x.size()), b(2 * x.size());
  portable_.encode_bf16(x.data(), x.size(), a.data());
  vec_->encode_bf16(x.data(), x.size(), b.data());
  ASSERT_EQ(a, b);
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &a[2 * i], 2);
    ASSERT_EQ(h, scalar::FloatToBf16(x[i]));
    ASSERT_EQ(std::isnan(scalar::Bf16ToFloat(h)), std::isnan(x[i]));
  }
}

TEST_P(KernelsTest, StochasticKernelsAgreeForAnyOffset) {
  for (size_t n : kLengths) {
    for (uint64_t index0 : {0ull, 1ull, 2ull, 15ull, 1000001ull}) {
      std::vector<float> x = Gaussian(n, n + index0);
      float scale = 0;
      for (float v : x) scale = std::max(scale, std::abs(v));
      if (scale == 0) scale = 1;
      const uint64_t key = scalar::StreamKey(3, index0);
      for (uint32_t levels : {1u, 7u, 127u}) {
        std::vector<int8_t> a(n), b(n);
        const float inv = static_cast<float>(levels) / scale;
        portable_.encode_qsgd(x.data(), n, inv, levels, key, index0, a.data());
        vec_->encode_qsgd(x.data(), n, inv, levels, key, index0, b.data());
        ASSERT_EQ(a, b) << "qsgd n=" << n << " index0=" << index0 << " levels=" << levels;
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = scalar::ElementUniform16(key, index0 + i);
          const int32_t q = static_cast<int32_t>(scalar::StochasticLevel(std::abs(x[i]), inv, levels, u));
          ASSERT_EQ(a[i], std::signbit(x[i]) ? -q : q);
        }
        EXPECT_EQ(portable_.max_abs_int8(a.data(), n), vec_->max_abs_int8(b.data(), n));
      }
      std::vector<std::byte> ta((n + 3) / 4 + 1), tb((n + 3) / 4 + 1);
      portable_.encode_terngrad(x.data(), n, 1.0f / scale, key, index0, ta.data());
      vec_->encode_terngrad(x.data(), n, 1.0f / scale, key, index0, tb.data());
      ASSERT_EQ(0, std::memcmp(ta.data(), tb.data(), (n + 3) / 4)) << "terngrad n=" << n << " index0=" << index0;
      EXPECT_TRUE(portable_.valid_terngrad(ta.data(), n));
      std::vector<float> da(n), db(n);
      portable_.decode_terngrad(ta.data(), n, scale, da.data(), 1.0f, false);
      vec_->decode_terngrad(tb.data(), n, scale, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "terngrad decode");
    }
  }
}

TEST_P(KernelsTest, CollectAgrees) {
  std::vector<float> x = Gaussian(100003, 21);
  for (uint32_t t : {0u, Bits(0.5f), Bits(2.0f), Bits(3.5f), Bits(100.0f)}) {
    std::vector<uint32_t> a(x.size()), b(x.size());
    const size_t na = portable_.collect_at_least(x.data(), x.size(), t, a.data(), a.size());
    const size_t nb = vec_->collect_at_least(x.data(), x.size(), t, b.data(), b.size());
    ASSERT_EQ(na, nb);
    a.resize(na);
    b.resize(nb);
    ASSERT_EQ(a, b);
    // Capacity: counts everything, writes only the first ones.
    std::vector<uint32_t> c(5);
    EXPECT_EQ(vec_->collect_at_least(x.data(), x.size(), t, c.data(), c.size()), na);
    for (size_t i = 0; i < std::min<size_t>(5, na); ++i) EXPECT_EQ(c[i], a[i]);
  }
}

// Inputs a gradient rarely has but a codec may meet: every finite bit
// pattern class (subnormals, huge values, values just above and below a
// level), scaled so that t = |x| * inv spans below 2^-126 to the level count,
// with inputs at exactly the scale and lengths that end mid-block.
TEST_P(KernelsTest, StochasticKernelsAgreeOnHardInputs) {
  for (uint64_t seed = 0; seed < 6; ++seed) {
    std::vector<float> x;
    for (float v : BitPatterns(4096 + 37 * seed, seed)) {
      if (std::isfinite(v)) x.push_back(v);
    }
    float scale = 0;
    for (float v : x) scale = std::max(scale, std::abs(v));
    x.push_back(scale);
    x.push_back(-scale);
    const uint64_t index0 = seed * 1000003;
    const uint64_t key = scalar::StreamKey(11, seed);
    for (uint32_t levels : {1u, 2u, 127u}) {
      const float inv = static_cast<float>(levels) / scale;
      std::vector<int8_t> a(x.size()), b(x.size());
      portable_.encode_qsgd(x.data(), x.size(), inv, levels, key, index0, a.data());
      vec_->encode_qsgd(x.data(), x.size(), inv, levels, key, index0, b.data());
      ASSERT_EQ(a, b) << "qsgd seed=" << seed << " levels=" << levels;
    }
    // Scaled down so that many elements land strictly between levels.
    for (float& v : x) v = v / scale * 3.5f;
    for (uint32_t levels : {1u, 4u, 127u}) {
      const float inv = static_cast<float>(levels) / 3.5f;
      std::vector<int8_t> a(x.size()), b(x.size());
      portable_.encode_qsgd(x.data(), x.size(), inv, levels, key, index0 + 1, a.data());
      vec_->encode_qsgd(x.data(), x.size(), inv, levels, key, index0 + 1, b.data());
      ASSERT_EQ(a, b) << "qsgd scaled seed=" << seed << " levels=" << levels;
    }
    std::vector<std::byte> ta(x.size() / 4 + 1), tb(x.size() / 4 + 1);
    portable_.encode_terngrad(x.data(), x.size(), 1.0f / 3.5f, key, index0 & ~1ull, ta.data());
    vec_->encode_terngrad(x.data(), x.size(), 1.0f / 3.5f, key, index0 & ~1ull, tb.data());
    ASSERT_EQ(0, std::memcmp(ta.data(), tb.data(), (x.size() + 3) / 4)) << "terngrad seed=" << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Tables, KernelsTest, ::testing::Values("avx2", "avx512"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(KernelsPortableTest, BestIsTheWidestTableTheCpuHas) {
  // Nothing in this test binary caps Best(): it is the widest table.
  const KernelTable* wide = Avx512() ? Avx512() : Avx2();
  EXPECT_EQ(&Best(), wide ? wide : &Portable());
  if (Avx512() != nullptr) {
    EXPECT_NE(Avx2(), nullptr) << "the AVX-512 table calls AVX2 kernels";
  }
}

TEST(KernelsPortableTest, ACapPicksTheWidestTablePresentAtOrBelowIt) {
  EXPECT_EQ(*CappedTable("portable"), &Portable());
  EXPECT_EQ(*CappedTable("avx2"), Avx2() ? Avx2() : &Portable());
  const KernelTable* wide = Avx512() ? Avx512() : Avx2();
  EXPECT_EQ(*CappedTable("avx512"), wide ? wide : &Portable());
  absl::StatusOr<const KernelTable*> bad = CappedTable("sse");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("portable, avx2 or avx512"), std::string::npos) << bad.status();
  EXPECT_FALSE(CapBest("sse").ok());
}

TEST(KernelsPortableTest, ACapAfterTheCodecsChoseATableIsRefusedUnlessItChangesNothing) {
  const KernelTable& chosen = Best();
  EXPECT_TRUE(CapBest(chosen.name).ok()) << "the same table";
  if (&chosen != &Portable()) {
    absl::Status late = CapBest("portable");
    EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
    EXPECT_NE(late.message().find(chosen.name), std::string::npos) << late;
  }
  EXPECT_EQ(&Best(), &chosen);
}

}  // namespace
}  // namespace tessera::compress::kernels
