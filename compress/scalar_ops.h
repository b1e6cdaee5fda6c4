#pragma once
// Scalar reference operations shared by the CPU kernels, the CUDA kernels and
// the tests. Everything here is a pure function of its arguments, written
// with integer and IEEE-754 single-precision operations only (no fused
// multiply-add, no reassociation), so that the same inputs give the same bits
// on any CPU path (scalar or SIMD) and on a GPU.
//
// Contract:
// - Header-only, no dependencies; compiles as C++20 and as CUDA (__host__
//   __device__).
// - The vectorized CPU kernels and the CUDA kernels must agree with these
//   functions bit for bit; compress tests check that.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif

namespace tessera::compress::scalar {

TESSERA_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TESSERA_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---------------------------------------------------------------------------
// Counter-based random numbers.
//
// A stream is named by a 64-bit key derived from (seed, tensor id); inside a
// stream, draw number c is a pure function of (key, c). Nothing is carried
// from one draw to the next, so any subset of draws can be computed in any
// order, by any number of threads, on any device, with the same result.

// SplitMix64's output function (a bijection of 64-bit integers with good
// avalanche).
TESSERA_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The key of the random stream of one tensor (or tensor part set) in one step.
TESSERA_HD uint64_t StreamKey(uint64_t seed, uint64_t tensor_id) {
  return Mix64(seed ^ Mix64(tensor_id + 0x9e3779b97f4a7c15ull));
}

// 32 random bits for draw `counter` of stream `key`: two multiply-xorshift
// rounds with the key's halves mixed in before and between them.
TESSERA_HD uint32_t CounterHash32(uint64_t key, uint32_t counter) {
  uint32_t x = counter ^ static_cast<uint32_t>(key);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= static_cast<uint32_t>(key >> 32);
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The 16-bit uniform used to round element `index` (its index in the whole
// tensor, not in a part): elements 2c and 2c+1 share draw c, taking its low
// and high halves. Requires index < 2^33.
TESSERA_HD uint32_t ElementUniform16(uint64_t key, uint64_t index) {
  uint32_t bits = CounterHash32(key, static_cast<uint32_t>(index >> 1));
  return (index & 1) ? (bits >> 16) : (bits & 0xffffu);
}

// ---------------------------------------------------------------------------
// fp16 (IEEE binary16) and bf16, round to nearest, ties to even.

// Bit-identical to x86 F16C VCVTPS2PH with round-to-nearest-even, including
// subnormals, overflow to infinity and NaN (quieted, upper payload kept).
TESSERA_HD uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {  // normal half (>= 2^-14)
    uint32_t mant_round = abs + 0x0fffu + ((abs >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((mant_round - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) {  // < 2^-25: rounds to zero (2^-25 itself is a tie to 0)
    return static_cast<uint16_t>(sign);
  }
  // Subnormal half: value = m * 2^-24 with m in [0, 1024].
  const uint32_t exp = abs >> 23;                 // 102..112
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;              // 14..24
  uint32_t m = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return static_cast<uint16_t>(sign | m);
}

// Exact; NaN payloads are kept and quieted (as F16C VCVTPH2PS does).
TESSERA_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise. value = mant * 2^-24.
    uint32_t e = 113u;  // biased float exponent of 2^-14
    uint32_t m = mant;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  return BitsToFloat(bits);
}

TESSERA_HD uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

TESSERA_HD float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// ---------------------------------------------------------------------------
// Stochastic rounding to levels (QSGD, TernGrad).
//
// Given |x| <= scale, inv = levels / scale (computed once per part as a float
// division), returns q in [0, levels] with E[q] ~= |x| * inv: the floor of
// t = |x| * inv, plus one when the 16-bit uniform u16 / 2^16 is below the
// fraction t - floor(t). The bias of one draw is below 2^-16 of a level.
TESSERA_HD uint32_t StochasticLevel(float abs_x, float inv, uint32_t levels, uint32_t u16) {
  const float t = abs_x * inv;
  const int32_t l = static_cast<int32_t>(t);  // t >= 0: truncation is floor
  const float frac = t - static_cast<float>(l);  // exact
  const float u = static_cast<float>(static_cast<int32_t>(u16)) * (1.0f / 65536.0f);
  const int32_t q = l + (u < frac ? 1 : 0);
  return static_cast<uint32_t>(q > static_cast<int32_t>(levels) ? static_cast<int32_t>(levels) : q);
}

// Random-k, stratified: the k selected coordinates of a part of n elements
// (1 <= k <= n < 2^32) are one per stratum b in [0, k), stratum b being
// [b*n/k, (b+1)*n/k). Each coordinate's chance of selection is 1/|stratum|,
// and its value is sent multiplied by |stratum| (= n/k when k divides n).
TESSERA_HD uint64_t StratumBegin(uint64_t b, uint64_t n, uint64_t k) { return b * n / k; }

TESSERA_HD uint64_t RandomKStreamKey(uint64_t stream_key, uint64_t element_offset) {
  return Mix64(stream_key ^ Mix64(element_offset ^ 0x52414e444f4d4bull));
}

// Index (inside the part) chosen in stratum b.
TESSERA_HD uint64_t RandomKIndex(uint64_t rk_key, uint64_t b, uint64_t n, uint64_t k) {
  const uint64_t lo = StratumBegin(b, n, k);
  const uint64_t size = StratumBegin(b + 1, n, k) - lo;
  const uint64_t r = CounterHash32(rk_key, static_cast<uint32_t>(b));
  return lo + ((r * size) >> 32);
}

}  // namespace tessera::compress::scalar
