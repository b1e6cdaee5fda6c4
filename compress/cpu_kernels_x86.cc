// The AVX2+F16C and AVX-512 kernel tables, and the CPU checks that gate them
// (contract: cpu_kernels_x86.h). Every function here carries the target
// attribute of the ISA it needs; the file itself is compiled with the
// library's common flags only, so nothing runs unless the check passed.
#include "compress/cpu_kernels_x86.h"

#if TESSERA_HAVE_X86

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <cpuid.h>
// GCC 12 reports its own AVX-512 intrinsics' _mm512_undefined_*() operands as
// "may be used uninitialized" once inlined; the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "compress/cpu_kernel_bodies.h"

namespace tessera::compress::kernels {
namespace {

// ---- AVX2 + F16C table ------------------------------------------------------
#define TESSERA_AVX2 [[gnu::target("avx2,f16c")]]
namespace avx2 {

TESSERA_AVX2 uint32_t MaxAbsBits(const float* x, size_t n) { return MaxAbsBitsBody(x, n); }

TESSERA_AVX2 void EncodeFp16(const float* x, size_t n, std::byte* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    const __m128i b = _mm256_cvtps_ph(_mm256_loadu_ps(x + i + 8), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), a);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i + 16), b);
  }
  for (; i < n; ++i) StoreU16(out, i, s::FloatToHalf(x[i]));
}

TESSERA_AVX2 void DecodeFp16(const std::byte* in, size_t n, float* dst, float alpha, bool add) {
  size_t i = 0;
  if (add) {
    const __m256 va = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(va, v)));
    }
    for (; i < n; ++i) dst[i] += alpha * s::HalfToFloat(LoadU16(in, i));
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))));
    }
    for (; i < n; ++i) dst[i] = s::HalfToFloat(LoadU16(in, i));
  }
}

TESSERA_AVX2 inline __m256i Bf16Round(__m256i b) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan_val = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan_val, is_nan);
}

TESSERA_AVX2 void EncodeBf16(const float* x, size_t n, std::byte* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = Bf16Round(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    const __m256i b = Bf16Round(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)));
    // packus works per 128-bit lane: [a0..3 b0..3 | a4..7 b4..7]; reorder the quadwords.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), packed);
  }
  EncodeBf16Body(x + i, n - i, out + 2 * i);
}

TESSERA_AVX2 void DecodeBf16(const std::byte* in, size_t n, float* dst, float alpha, bool add) {
  size_t i = 0;
  if (add) {
    const __m256 va = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
      const __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(va, v)));
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
  }
  DecodeBf16Body(in + 2 * i, n - i, dst + i, alpha, add);
}

TESSERA_AVX2 void DecodeFp32(const std::byte* in, size_t n, float* d, float a, bool add) {
  DecodeFp32Body(in, n, d, a, add);
}

// CounterHash32 of eight consecutive counters c0..c0+7.
TESSERA_AVX2 inline __m256i Hash8(__m256i counters, __m256i k0, __m256i k1) {
  __m256i x = _mm256_xor_si256(counters, k0);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, k1);
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// Stochastic levels of 8 floats given their 16-bit uniforms (as int32 lanes).
// Returns signed levels as int32 lanes. Mirrors scalar::StochasticLevel.
TESSERA_AVX2 inline __m256i Levels8(__m256 v, __m256 inv, __m256i levels, __m256i u16) {
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 a = _mm256_and_ps(v, sign_mask);
  const __m256 t = _mm256_mul_ps(a, inv);
  const __m256i l = _mm256_cvttps_epi32(t);
  const __m256 frac = _mm256_sub_ps(t, _mm256_cvtepi32_ps(l));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(u16), _mm256_set1_ps(1.0f / 65536.0f));
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(u, frac, _CMP_LT_OQ));  // -1 or 0
  __m256i q = _mm256_sub_epi32(l, up);
  q = _mm256_min_epi32(q, levels);
  // negate where the sign bit of v is set: sign_epi32 needs a signed selector.
  return _mm256_sign_epi32(q, _mm256_or_si256(_mm256_castps_si256(v), _mm256_set1_epi32(1)));
}

// Signed levels of the 16 elements x[i..i+16) whose first global index
// index0 + i is even: q_lo for i..i+7, q_hi for i+8..i+15.
struct StochasticConsts {
  __m256i k0, k1, levels, lane;
  __m256 inv;
};

TESSERA_AVX2 inline StochasticConsts MakeStochasticConsts(float inv, uint32_t levels, uint64_t key) {
  StochasticConsts c;
  c.k0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key)));
  c.k1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key >> 32)));
  c.levels = _mm256_set1_epi32(static_cast<int>(levels));
  c.lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  c.inv = _mm256_set1_ps(inv);
  return c;
}

TESSERA_AVX2 inline void StochasticBlock(const float* x, size_t i, uint64_t index0,
                                         const StochasticConsts& c, __m256i* q_lo, __m256i* q_hi) {
  const uint32_t c0 = static_cast<uint32_t>((index0 + i) >> 1);
  const __m256i h = Hash8(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0)), c.lane), c.k0, c.k1);
  // As 16 little-endian u16 values, h holds the uniforms of elements i..i+15 in order.
  const __m256i u_lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
  const __m256i u_hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
  *q_lo = Levels8(_mm256_loadu_ps(x + i), c.inv, c.levels, u_lo);
  *q_hi = Levels8(_mm256_loadu_ps(x + i + 8), c.inv, c.levels, u_hi);
}

TESSERA_AVX2 void EncodeQsgd(const float* x, size_t n, float inv, uint32_t levels, uint64_t key,
                             uint64_t index0, int8_t* out) {
  // One scalar element first when the global index is odd, so that blocks
  // start on a draw boundary.
  const size_t begin = ((index0 & 1) && n > 0) ? 1 : 0;
  EncodeQsgdBody(x, begin, inv, levels, key, index0, out);
  const StochasticConsts c = MakeStochasticConsts(inv, levels, key);
  size_t i = begin;
  for (; i + 16 <= n; i += 16) {
    __m256i q_lo, q_hi;
    StochasticBlock(x, i, index0, c, &q_lo, &q_hi);
    // int32 -> int16 (per-lane pack, then fix the quadword order) -> int8.
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q_lo, q_hi), 0xd8);
    const __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), b);
  }
  EncodeQsgdBody(x + i, n - i, inv, levels, key, index0 + i, out + i);
}

TESSERA_AVX2 uint32_t MaxAbsInt8(const int8_t* q, size_t n) { return MaxAbsInt8Body(q, n); }
TESSERA_AVX2 void DecodeQsgd(const int8_t* q, size_t n, float step, float* d, float a, bool add) {
  DecodeQsgdBody(q, n, step, d, a, add);
}

// 2-bit codes (1 for q > 0, 2 for q < 0, 0 for 0) shifted to their slot in
// a byte: lane j by 2 * (j % 4).
TESSERA_AVX2 inline __m256i TernCodes8(__m256i q) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i pos = _mm256_and_si256(_mm256_cmpgt_epi32(q, zero), _mm256_set1_epi32(1));
  const __m256i neg = _mm256_and_si256(_mm256_cmpgt_epi32(zero, q), _mm256_set1_epi32(2));
  return _mm256_sllv_epi32(_mm256_or_si256(pos, neg), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
}

TESSERA_AVX2 void EncodeTern(const float* x, size_t n, float inv, uint64_t key, uint64_t index0,
                             std::byte* out) {
  // Blocks of 16 elements fill 4 whole bytes and need an even global index at
  // their start; parts that start at an odd index take the portable loop.
  if (index0 & 1) {
    EncodeTernBody(x, n, inv, key, index0, out);
    return;
  }
  const StochasticConsts c = MakeStochasticConsts(inv, 1, key);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i q_lo, q_hi;
    StochasticBlock(x, i, index0, c, &q_lo, &q_hi);
    // u16 lanes after the pack: [lo0-3 hi0-3 | lo4-7 hi4-7]; OR each group
    // of four into the low u16 of its quadword.
    __m256i v = _mm256_packus_epi32(TernCodes8(q_lo), TernCodes8(q_hi));
    v = _mm256_or_si256(v, _mm256_srli_epi64(v, 32));
    v = _mm256_or_si256(v, _mm256_srli_epi64(v, 16));
    const size_t j = i / 4;
    out[j] = static_cast<std::byte>(_mm256_extract_epi64(v, 0) & 0xff);      // elements i..i+3
    out[j + 1] = static_cast<std::byte>(_mm256_extract_epi64(v, 2) & 0xff);  // i+4..i+7
    out[j + 2] = static_cast<std::byte>(_mm256_extract_epi64(v, 1) & 0xff);  // i+8..i+11
    out[j + 3] = static_cast<std::byte>(_mm256_extract_epi64(v, 3) & 0xff);  // i+12..i+15
  }
  EncodeTernBody(x + i, n - i, inv, key, index0 + i, out + i / 4);
}

TESSERA_AVX2 bool ValidTern(const std::byte* in, size_t n) { return ValidTernBody(in, n); }
TESSERA_AVX2 void DecodeTern(const std::byte* in, size_t n, float scale, float* d, float a, bool add) {
  DecodeTernBody(in, n, scale, d, a, add);
}

TESSERA_AVX2 double EncodeSigns(const float* x, size_t n, std::byte* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // Lanes 0-3, 4-7, 8-11, 12-15 of the canonical 16-lane sum.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256d acc2 = _mm256_setzero_pd(), acc3 = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 b = _mm256_loadu_ps(x + i + 8);
    const uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(a)) |
                          (static_cast<uint32_t>(_mm256_movemask_ps(b)) << 8);
    const uint16_t bits16 = static_cast<uint16_t>(bits);
    std::memcpy(out + i / 8, &bits16, 2);
    const __m256 aa = _mm256_and_ps(a, abs_mask);
    const __m256 ab = _mm256_and_ps(b, abs_mask);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(aa)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(aa, 1)));
    acc2 = _mm256_add_pd(acc2, _mm256_cvtps_pd(_mm256_castps256_ps128(ab)));
    acc3 = _mm256_add_pd(acc3, _mm256_cvtps_pd(_mm256_extractf128_ps(ab, 1)));
  }
  alignas(32) double lanes[16];
  _mm256_store_pd(lanes, acc0);
  _mm256_store_pd(lanes + 4, acc1);
  _mm256_store_pd(lanes + 8, acc2);
  _mm256_store_pd(lanes + 12, acc3);
  const size_t bytes = (n + 7) / 8;
  for (size_t b = i / 8; b < bytes; ++b) out[b] = std::byte{0};
  for (; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    out[i / 8] |= static_cast<std::byte>((b >> 31) << (i % 8));
    lanes[i % 16] += static_cast<double>(s::BitsToFloat(b & 0x7fffffffu));
  }
  return CombineLanes(lanes);
}

TESSERA_AVX2 void DecodeSigns(const std::byte* in, size_t n, float scale, float* dst, float alpha,
                              bool add) {
  // Broadcast one byte to 8 lanes, test bit j in lane j, select +-scale.
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 pos = _mm256_set1_ps(scale);
  const __m256 neg = _mm256_set1_ps(-scale);
  const __m256 va = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_set1_epi32(static_cast<int>(in[i / 8]));
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(b, bit), bit);
    const __m256 v = _mm256_blendv_ps(pos, neg, _mm256_castsi256_ps(set));
    if (add) {
      _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_mul_ps(va, v)));
    } else {
      _mm256_storeu_ps(dst + i, v);
    }
  }
  for (; i < n; ++i) {
    const bool negative = (static_cast<uint32_t>(in[i / 8]) >> (i % 8)) & 1u;
    const float v = negative ? -scale : scale;
    if (add) {
      dst[i] += alpha * v;
    } else {
      dst[i] = v;
    }
  }
}

TESSERA_AVX2 size_t Collect(const float* x, size_t n, uint32_t threshold, uint32_t* out,
                            size_t capacity) {
  // Compare magnitudes as signed int32 (abs bits are < 2^31); a threshold of
  // 0 accepts everything.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  size_t count = 0;
  size_t i = 0;
  if (threshold > 0) {
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask);
      const __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), abs_mask);
      const __m256i ge = _mm256_or_si256(_mm256_cmpgt_epi32(a, t), _mm256_cmpgt_epi32(b, t));
      if (_mm256_testz_si256(ge, ge)) continue;
      uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, t)))) |
                      (static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b, t)))) << 8);
      while (mask) {
        const int j = __builtin_ctz(mask);
        mask &= mask - 1;
        if (count < capacity) out[count] = static_cast<uint32_t>(i + j);
        ++count;
      }
    }
  }
  for (; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    if ((b & 0x7fffffffu) >= threshold) {
      if (count < capacity) out[count] = static_cast<uint32_t>(i);
      ++count;
    }
  }
  return count;
}

}  // namespace avx2

// ---- AVX-512 table: the AVX2 table with wider stochastic encoders -----------
// Only the compute-bound kernels gain from 16 lanes: QSGD and TernGrad encode
// (a counter hash, a float compare and a narrowing per element) and bf16
// encode (integer rounding with a NaN select); the rest are memory-bound and
// stay AVX2. (VCVTNEPS2BF16 is not used: it flushes subnormals.) The arithmetic is the same sequence of IEEE
// operations as scalar::StochasticLevel, so the bits are the same.
#define TESSERA_AVX512 [[gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,bmi2")]]
namespace avx512 {

// CounterHash32 of sixteen consecutive counters (Hash8 with 16 lanes).
TESSERA_AVX512 inline __m512i Hash16(__m512i counters, __m512i k0, __m512i k1) {
  __m512i x = _mm512_xor_si512(counters, k0);
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, k1);
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

struct Consts {
  __m512i k0, k1, levels, lane;
  __m512 inv;
};

TESSERA_AVX512 inline Consts MakeConsts(float inv, uint32_t levels, uint64_t key) {
  Consts c;
  c.k0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(key)));
  c.k1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(key >> 32)));
  c.levels = _mm512_set1_epi32(static_cast<int>(levels));
  c.lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  c.inv = _mm512_set1_ps(inv);
  return c;
}

// Unsigned levels of 16 floats (scalar::StochasticLevel of |v|) given their
// 16-bit uniforms as int32 lanes; *negative gets the lanes whose sign bit is set.
TESSERA_AVX512 inline __m512i Magnitudes16(__m512 v, const Consts& c, __m512i u16, __mmask16* negative) {
  const __m512i bits = _mm512_castps_si512(v);
  *negative = _mm512_movepi32_mask(bits);
  const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)));
  const __m512 t = _mm512_mul_ps(a, c.inv);
  const __m512i l = _mm512_cvttps_epi32(t);
  const __m512 frac = _mm512_sub_ps(t, _mm512_cvtepi32_ps(l));
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(u16), _mm512_set1_ps(1.0f / 65536.0f));
  const __mmask16 up = _mm512_cmp_ps_mask(u, frac, _CMP_LT_OQ);
  const __m512i q = _mm512_mask_add_epi32(l, up, l, _mm512_set1_epi32(1));
  return _mm512_min_epi32(q, c.levels);
}

// Levels of the 32 elements x[i..i+32) whose first global index index0 + i
// is even: one hash of 16 counters gives their 32 uniforms in order.
TESSERA_AVX512 inline void Block32(const float* x, size_t i, uint64_t index0, const Consts& c,
                                   __m512i* m_lo, __mmask16* neg_lo, __m512i* m_hi, __mmask16* neg_hi) {
  const uint32_t c0 = static_cast<uint32_t>((index0 + i) >> 1);
  const __m512i h = Hash16(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0)), c.lane), c.k0, c.k1);
  const __m512i u_lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h));
  const __m512i u_hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1));
  *m_lo = Magnitudes16(_mm512_loadu_ps(x + i), c, u_lo, neg_lo);
  *m_hi = Magnitudes16(_mm512_loadu_ps(x + i + 16), c, u_hi, neg_hi);
}

TESSERA_AVX512 void EncodeQsgd(const float* x, size_t n, float inv, uint32_t levels, uint64_t key,
                               uint64_t index0, int8_t* out) {
  const size_t begin = ((index0 & 1) && n > 0) ? 1 : 0;
  EncodeQsgdBody(x, begin, inv, levels, key, index0, out);
  const Consts c = MakeConsts(inv, levels, key);
  const __m512i zero = _mm512_setzero_si512();
  size_t i = begin;
  for (; i + 32 <= n; i += 32) {
    __m512i m_lo, m_hi;
    __mmask16 neg_lo, neg_hi;
    Block32(x, i, index0, c, &m_lo, &neg_lo, &m_hi, &neg_hi);
    // |q| <= levels <= 127, so the saturating narrowing is exact.
    const __m512i q_lo = _mm512_mask_sub_epi32(m_lo, neg_lo, zero, m_lo);
    const __m512i q_hi = _mm512_mask_sub_epi32(m_hi, neg_hi, zero, m_hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtsepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 16), _mm512_cvtsepi32_epi8(q_hi));
  }
  avx2::EncodeQsgd(x + i, n - i, inv, levels, key, index0 + i, out + i);
}

// scalar::FloatToBf16 of 16 floats: round to nearest even on the bits, NaNs
// kept quiet NaNs; the 16-bit results in the low halves of the lanes.
TESSERA_AVX512 inline __m512i Bf16Round16(__m512i b) {
  const __m512i high = _mm512_srli_epi32(b, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_or_epi32(rounded, is_nan, high, _mm512_set1_epi32(0x40));
}

TESSERA_AVX512 void EncodeBf16(const float* x, size_t n, std::byte* out) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // Every lane is below 2^16, so the truncating narrowing is exact.
    const __m256i a = _mm512_cvtepi32_epi16(Bf16Round16(_mm512_loadu_si512(x + i)));
    const __m256i b = _mm512_cvtepi32_epi16(Bf16Round16(_mm512_loadu_si512(x + i + 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32), b);
  }
  avx2::EncodeBf16(x + i, n - i, out + 2 * i);
}

// Two code bits per element, element j of 16 at bits 2j (q > 0) and 2j+1 (q < 0).
TESSERA_AVX512 inline uint32_t TernCodes16(__m512i magnitude, __mmask16 negative) {
  const __mmask16 nonzero = _mm512_test_epi32_mask(magnitude, magnitude);
  const uint32_t pos = static_cast<uint32_t>(nonzero & static_cast<__mmask16>(~negative));
  const uint32_t neg = static_cast<uint32_t>(nonzero & negative);
  return _pdep_u32(pos, 0x55555555u) | _pdep_u32(neg, 0xaaaaaaaau);
}

TESSERA_AVX512 void EncodeTern(const float* x, size_t n, float inv, uint64_t key, uint64_t index0,
                               std::byte* out) {
  if (index0 & 1) {  // as in the AVX2 kernel: odd starts take the portable loop
    EncodeTernBody(x, n, inv, key, index0, out);
    return;
  }
  const Consts c = MakeConsts(inv, 1, key);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i m_lo, m_hi;
    __mmask16 neg_lo, neg_hi;
    Block32(x, i, index0, c, &m_lo, &neg_lo, &m_hi, &neg_hi);
    const uint64_t codes = static_cast<uint64_t>(TernCodes16(m_lo, neg_lo)) |
                           (static_cast<uint64_t>(TernCodes16(m_hi, neg_hi)) << 32);
    std::memcpy(out + i / 4, &codes, 8);  // little-endian: elements i.. in order
  }
  avx2::EncodeTern(x + i, n - i, inv, key, index0 + i, out + i / 4);
}

}  // namespace avx512

}  // namespace

namespace x86 {

constexpr KernelTable kAvx2 = {
    "avx2",
    avx2::MaxAbsBits,
    avx2::EncodeFp16,
    avx2::DecodeFp16,
    avx2::EncodeBf16,
    avx2::DecodeBf16,
    avx2::DecodeFp32,
    avx2::EncodeQsgd,
    avx2::MaxAbsInt8,
    avx2::DecodeQsgd,
    avx2::EncodeTern,
    avx2::ValidTern,
    avx2::DecodeTern,
    avx2::EncodeSigns,
    avx2::DecodeSigns,
    avx2::Collect,
};

constexpr KernelTable kAvx512 = {
    "avx512",
    avx2::MaxAbsBits,
    avx2::EncodeFp16,
    avx2::DecodeFp16,
    avx512::EncodeBf16,
    avx2::DecodeBf16,
    avx2::DecodeFp32,
    avx512::EncodeQsgd,
    avx2::MaxAbsInt8,
    avx2::DecodeQsgd,
    avx512::EncodeTern,
    avx2::ValidTern,
    avx2::DecodeTern,
    avx2::EncodeSigns,
    avx2::DecodeSigns,
    avx2::Collect,
};

bool CpuHasAvx2() {
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
}
bool CpuHasAvx512() {
  __builtin_cpu_init();
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("bmi2");
}

}  // namespace x86
}  // namespace tessera::compress::kernels

#endif  // TESSERA_HAVE_X86
