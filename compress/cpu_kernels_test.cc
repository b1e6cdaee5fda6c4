// The AVX2 kernels must give the same bits as the portable ones (and the
// portable fp16 conversion the same bits as the F16C instructions).
#include "compress/cpu_kernels.h"

#include <cstring>
#include <vector>

#include "compress/compress_test_util.h"
#include "compress/scalar_ops.h"
#include "gtest/gtest.h"

namespace tessera::compress::kernels {
namespace {

using testing::BitPatterns;
using testing::Bits;
using testing::Gaussian;

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    avx2_ = Avx2();
    if (avx2_ == nullptr) GTEST_SKIP() << "this CPU has no AVX2+F16C: only the portable path exists";
  }
  const KernelTable& portable_ = Portable();
  const KernelTable* avx2_ = nullptr;
};

// Lengths around the vector widths (8, 16) and a long one.
const size_t kLengths[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4099};

void ExpectSameFloats(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(Bits(a[i]), Bits(b[i])) << what << " at " << i;
  }
}

TEST_F(KernelsTest, Fp16EncodeMatchesF16COnAllKindsOfValues) {
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
    avx2_->encode_fp16(x.data(), x.size(), b.data());
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t ha, hb;
      std::memcpy(&ha, &a[2 * i], 2);
      std::memcpy(&hb, &b[2 * i], 2);
      ASSERT_EQ(ha, hb) << "float bits " << std::hex << Bits(x[i]);
    }
  }
}

TEST_F(KernelsTest, Fp16DecodeMatchesF16COnEveryHalf) {
  std::vector<std::byte> in(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(&in[2 * h], &v, 2);
  }
  std::vector<float> a(65536), b(65536);
  portable_.decode_fp16(in.data(), 65536, a.data(), 1.0f, false);
  avx2_->decode_fp16(in.data(), 65536, b.data(), 1.0f, false);
  ExpectSameFloats(a, b, "half->float");
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(a[h]), Bits(scalar::HalfToFloat(static_cast<uint16_t>(h))));
  }
}

TEST_F(KernelsTest, ElementwiseKernelsAgreeAtEveryLengthAndAlignment) {
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
      avx2_->encode_fp16(x.data(), n, pb);
      ASSERT_EQ(0, std::memcmp(pa, pb, 2 * n)) << "fp16 n=" << n;
      portable_.decode_fp16(pa, n, da.data(), 0.5f, true);
      avx2_->decode_fp16(pb, n, db.data(), 0.5f, true);
      ExpectSameFloats(da, db, "fp16 decode-add");

      portable_.encode_bf16(x.data(), n, pa);
      avx2_->encode_bf16(x.data(), n, pb);
      ASSERT_EQ(0, std::memcmp(pa, pb, 2 * n)) << "bf16 n=" << n;
      portable_.decode_bf16(pa, n, da.data(), 1.0f, false);
      avx2_->decode_bf16(pb, n, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "bf16 decode");
      da = db = acc0;
      portable_.decode_bf16(pa, n, da.data(), -1.0f, true);
      avx2_->decode_bf16(pb, n, db.data(), -1.0f, true);
      ExpectSameFloats(da, db, "bf16 decode-add");

      const double sa = portable_.encode_signs(x.data(), n, pa);
      const double sb = avx2_->encode_signs(x.data(), n, pb);
      ASSERT_EQ(sa, sb) << "sign sum n=" << n;
      ASSERT_EQ(0, std::memcmp(pa, pb, (n + 7) / 8)) << "signs n=" << n;
      portable_.decode_signs(pa, n, 0.75f, da.data(), 1.0f, false);
      avx2_->decode_signs(pb, n, 0.75f, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "sign decode");
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::signbit(da[i]), std::signbit(x[i]));

      EXPECT_EQ(portable_.max_abs_bits(x.data(), n), avx2_->max_abs_bits(x.data(), n));
    }
  }
}

TEST_F(KernelsTest, Bf16AgreesOnSpecialValues) {
  std::vector<float> x = BitPatterns(50001, 5);
  std::vector<std::byte> a(2 * x.size()), b(2 * x.size());
  portable_.encode_bf16(x.data(), x.size(), a.data());
  avx2_->encode_bf16(x.data(), x.size(), b.data());
  ASSERT_EQ(a, b);
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &a[2 * i], 2);
    ASSERT_EQ(h, scalar::FloatToBf16(x[i]));
    ASSERT_EQ(std::isnan(scalar::Bf16ToFloat(h)), std::isnan(x[i]));
  }
}

TEST_F(KernelsTest, StochasticKernelsAgreeForAnyOffset) {
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
        avx2_->encode_qsgd(x.data(), n, inv, levels, key, index0, b.data());
        ASSERT_EQ(a, b) << "qsgd n=" << n << " index0=" << index0 << " levels=" << levels;
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = scalar::ElementUniform16(key, index0 + i);
          const int32_t q = static_cast<int32_t>(scalar::StochasticLevel(std::abs(x[i]), inv, levels, u));
          ASSERT_EQ(a[i], std::signbit(x[i]) ? -q : q);
        }
        EXPECT_EQ(portable_.max_abs_int8(a.data(), n), avx2_->max_abs_int8(b.data(), n));
      }
      std::vector<std::byte> ta((n + 3) / 4 + 1), tb((n + 3) / 4 + 1);
      portable_.encode_terngrad(x.data(), n, 1.0f / scale, key, index0, ta.data());
      avx2_->encode_terngrad(x.data(), n, 1.0f / scale, key, index0, tb.data());
      ASSERT_EQ(0, std::memcmp(ta.data(), tb.data(), (n + 3) / 4)) << "terngrad n=" << n << " index0=" << index0;
      EXPECT_TRUE(portable_.valid_terngrad(ta.data(), n));
      std::vector<float> da(n), db(n);
      portable_.decode_terngrad(ta.data(), n, scale, da.data(), 1.0f, false);
      avx2_->decode_terngrad(tb.data(), n, scale, db.data(), 1.0f, false);
      ExpectSameFloats(da, db, "terngrad decode");
    }
  }
}

TEST_F(KernelsTest, CollectAgrees) {
  std::vector<float> x = Gaussian(100003, 21);
  for (uint32_t t : {0u, Bits(0.5f), Bits(2.0f), Bits(3.5f), Bits(100.0f)}) {
    std::vector<uint32_t> a(x.size()), b(x.size());
    const size_t na = portable_.collect_at_least(x.data(), x.size(), t, a.data(), a.size());
    const size_t nb = avx2_->collect_at_least(x.data(), x.size(), t, b.data(), b.size());
    ASSERT_EQ(na, nb);
    a.resize(na);
    b.resize(nb);
    ASSERT_EQ(a, b);
    // Capacity: counts everything, writes only the first ones.
    std::vector<uint32_t> c(5);
    EXPECT_EQ(avx2_->collect_at_least(x.data(), x.size(), t, c.data(), c.size()), na);
    for (size_t i = 0; i < std::min<size_t>(5, na); ++i) EXPECT_EQ(c[i], a[i]);
  }
}

TEST(KernelsPortableTest, BestIsAvx2WhenTheCpuHasIt) {
  const KernelTable* a = Avx2();
  EXPECT_EQ(&Best(), a ? a : &Portable());
}

}  // namespace
}  // namespace tessera::compress::kernels
