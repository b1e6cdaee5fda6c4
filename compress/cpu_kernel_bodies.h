#pragma once
// The loop bodies of the CPU kernels (internal to tessera_compress; included
// only by cpu_kernels.cc and cpu_kernels_x86.cc).
//
// Contract:
// - Owns the plain-loop definition of every kernel in cpu_kernels.h and the
//   unaligned little-endian access to wire bytes they share. Each body is
//   forced inline into its caller, so it is compiled once per table: the
//   portable table (cpu_kernels.cc) compiles it for the baseline ISA, the
//   AVX2 and AVX-512 tables (cpu_kernels_x86.cc) inline it into functions
//   compiled for their targets, either as the whole kernel or for the tail
//   the vector loop leaves. No out-of-line copy is ever called, so no code
//   built for one ISA runs on behalf of another.
// - Pure functions of their arguments: no allocation, no state, reentrant;
//   the results are the ones the vector kernels must match bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "compress/scalar_ops.h"

namespace tessera::compress::kernels {

namespace s = ::tessera::compress::scalar;

#define TESSERA_BODY [[gnu::always_inline]] inline

// ---- unaligned little-endian access to wire bytes -------------------------
TESSERA_BODY uint16_t LoadU16(const std::byte* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, p + 2 * i, 2);
  return v;
}
TESSERA_BODY void StoreU16(std::byte* p, size_t i, uint16_t v) { std::memcpy(p + 2 * i, &v, 2); }
TESSERA_BODY float LoadF32(const std::byte* p, size_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// ---- loop bodies: compiled once per table ----------------------------------
// Each body is a plain loop; the portable table compiles it for the baseline
// ISA, the AVX2 table inlines it into a function compiled for AVX2+F16C.

TESSERA_BODY uint32_t MaxAbsBitsBody(const float* __restrict x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m;
}

TESSERA_BODY void EncodeFp16Body(const float* __restrict x, size_t n, std::byte* __restrict out) {
  for (size_t i = 0; i < n; ++i) StoreU16(out, i, s::FloatToHalf(x[i]));
}

TESSERA_BODY void DecodeFp16Body(const std::byte* __restrict in, size_t n, float* __restrict dst,
                                 float alpha, bool add) {
  if (add) {
    for (size_t i = 0; i < n; ++i) dst[i] += alpha * s::HalfToFloat(LoadU16(in, i));
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = s::HalfToFloat(LoadU16(in, i));
  }
}

TESSERA_BODY void EncodeBf16Body(const float* __restrict x, size_t n, std::byte* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const uint32_t nan = (b >> 16) | 0x40u;
    StoreU16(out, i, static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded));
  }
}

TESSERA_BODY void DecodeBf16Body(const std::byte* __restrict in, size_t n, float* __restrict dst,
                                 float alpha, bool add) {
  if (add) {
    for (size_t i = 0; i < n; ++i) dst[i] += alpha * s::Bf16ToFloat(LoadU16(in, i));
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = s::Bf16ToFloat(LoadU16(in, i));
  }
}

TESSERA_BODY void DecodeFp32Body(const std::byte* __restrict in, size_t n, float* __restrict dst,
                                 float alpha, bool add) {
  if (add) {
    for (size_t i = 0; i < n; ++i) dst[i] += alpha * LoadF32(in, i);
  } else if (n > 0) {  // empty spans may carry null pointers, which memcpy must not see
    std::memcpy(dst, in, n * 4);
  }
}

TESSERA_BODY int8_t QsgdOne(float x, float inv, uint32_t levels, uint32_t u16) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const float a = s::BitsToFloat(b & 0x7fffffffu);
  const int32_t q = static_cast<int32_t>(s::StochasticLevel(a, inv, levels, u16));
  return static_cast<int8_t>((b >> 31) ? -q : q);
}

TESSERA_BODY void EncodeQsgdBody(const float* __restrict x, size_t n, float inv, uint32_t levels,
                                 uint64_t key, uint64_t index0, int8_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = QsgdOne(x[i], inv, levels, s::ElementUniform16(key, index0 + i));
  }
}

TESSERA_BODY uint32_t MaxAbsInt8Body(const int8_t* __restrict q, size_t n) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    int32_t a = q[i] < 0 ? -q[i] : q[i];
    m = a > m ? a : m;
  }
  return static_cast<uint32_t>(m);
}

TESSERA_BODY void DecodeQsgdBody(const int8_t* __restrict q, size_t n, float step,
                                 float* __restrict dst, float alpha, bool add) {
  if (add) {
    for (size_t i = 0; i < n; ++i) dst[i] += alpha * (static_cast<float>(q[i]) * step);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(q[i]) * step;
  }
}

TESSERA_BODY uint32_t TernCode(float x, float inv, uint32_t u16) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const float a = s::BitsToFloat(b & 0x7fffffffu);
  const uint32_t q = s::StochasticLevel(a, inv, 1, u16);
  return q == 0 ? 0u : ((b >> 31) ? 2u : 1u);
}

TESSERA_BODY void EncodeTernBody(const float* __restrict x, size_t n, float inv, uint64_t key,
                                 uint64_t index0, std::byte* __restrict out) {
  const size_t full = n / 4;
  for (size_t j = 0; j < full; ++j) {
    uint32_t byte = 0;
    for (size_t t = 0; t < 4; ++t) {
      const size_t i = 4 * j + t;
      byte |= TernCode(x[i], inv, s::ElementUniform16(key, index0 + i)) << (2 * t);
    }
    out[j] = static_cast<std::byte>(byte);
  }
  if (n % 4) {
    uint32_t byte = 0;
    for (size_t i = 4 * full; i < n; ++i) {
      byte |= TernCode(x[i], inv, s::ElementUniform16(key, index0 + i)) << (2 * (i % 4));
    }
    out[full] = static_cast<std::byte>(byte);
  }
}

TESSERA_BODY bool ValidTernBody(const std::byte* __restrict in, size_t n) {
  const size_t bytes = (n + 3) / 4;
  uint32_t bad = 0;
  for (size_t j = 0; j < bytes; ++j) {
    const uint32_t b = static_cast<uint32_t>(in[j]);
    // a code of 3 has both bits set: (b & (b >> 1)) & 0x55
    bad |= (b & (b >> 1)) & 0x55u;
  }
  if (n % 4) {
    const uint32_t last = static_cast<uint32_t>(in[bytes - 1]);
    bad |= last >> (2 * (n % 4));
  }
  return bad == 0;
}

TESSERA_BODY void DecodeTernBody(const std::byte* __restrict in, size_t n, float scale,
                                 float* __restrict dst, float alpha, bool add) {
  const float neg = -scale;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t code = (static_cast<uint32_t>(in[i / 4]) >> (2 * (i % 4))) & 3u;
    const float v = code == 1 ? scale : (code == 2 ? neg : 0.0f);
    if (add) {
      dst[i] += alpha * v;
    } else {
      dst[i] = v;
    }
  }
}

TESSERA_BODY double CombineLanes(double* lanes) {
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

TESSERA_BODY double EncodeSignsBody(const float* __restrict x, size_t n, std::byte* __restrict out) {
  double lanes[16] = {};
  const size_t full = n / 16;
  for (size_t j = 0; j < full; ++j) {
    uint32_t bits = 0;
    for (size_t t = 0; t < 16; ++t) {
      uint32_t b;
      std::memcpy(&b, x + 16 * j + t, 4);
      bits |= (b >> 31) << t;
      lanes[t] += static_cast<double>(s::BitsToFloat(b & 0x7fffffffu));
    }
    out[2 * j] = static_cast<std::byte>(bits & 0xff);
    out[2 * j + 1] = static_cast<std::byte>(bits >> 8);
  }
  const size_t bytes = (n + 7) / 8;
  for (size_t b = 2 * full; b < bytes; ++b) out[b] = std::byte{0};
  for (size_t i = 16 * full; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    out[i / 8] |= static_cast<std::byte>((b >> 31) << (i % 8));
    lanes[i % 16] += static_cast<double>(s::BitsToFloat(b & 0x7fffffffu));
  }
  return CombineLanes(lanes);
}

TESSERA_BODY void DecodeSignsBody(const std::byte* __restrict in, size_t n, float scale,
                                  float* __restrict dst, float alpha, bool add) {
  const float neg = -scale;
  for (size_t i = 0; i < n; ++i) {
    const bool negative = (static_cast<uint32_t>(in[i / 8]) >> (i % 8)) & 1u;
    const float v = negative ? neg : scale;
    if (add) {
      dst[i] += alpha * v;
    } else {
      dst[i] = v;
    }
  }
}

TESSERA_BODY size_t CollectBody(const float* __restrict x, size_t n, uint32_t threshold,
                                uint32_t* __restrict out, size_t capacity) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    if ((b & 0x7fffffffu) >= threshold) {
      if (count < capacity) out[count] = static_cast<uint32_t>(i);
      ++count;
    }
  }
  return count;
}

}  // namespace tessera::compress::kernels
