#pragma once
// Helpers shared by the compress tests.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "compress/codec.h"
#include "gtest/gtest.h"

namespace tessera::compress::testing {

// Every codec, for tests that go over all of them.
inline constexpr CodecId kAllCodecs[] = {CodecId::kNone,     CodecId::kFp16,   CodecId::kBf16, CodecId::kQsgd,
                                         CodecId::kTernGrad, CodecId::kOneBit, CodecId::kTopK, CodecId::kRandomK};

inline CodecSpec Spec(CodecId id, double ratio = 0.01, int levels = 127, uint64_t seed = 1) {
  CodecSpec s;
  s.codec = id;
  s.ratio = ratio;
  s.levels = levels;
  s.seed = seed;
  return s;
}

inline Codec MakeCodec(const CodecSpec& spec) {
  absl::StatusOr<Codec> c = Codec::Create(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

inline std::vector<std::byte> EncodeVec(const Codec& codec, std::span<const float> x,
                                        uint64_t tensor_id = 0, uint64_t offset = 0) {
  std::vector<std::byte> out(codec.EncodedSize(x.size()));
  absl::StatusOr<size_t> n = codec.Encode(x, {.tensor_id = tensor_id, .element_offset = offset}, out);
  EXPECT_TRUE(n.ok()) << n.status();
  if (n.ok()) {
    EXPECT_EQ(*n, out.size());
  }
  return out;
}

inline std::vector<float> DecodeVec(std::span<const std::byte> wire, size_t n) {
  std::vector<float> out(n, -12345.0f);
  absl::Status s = Decode(wire, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

inline std::vector<float> Gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// Random 32-bit patterns with a share of special values (zeros, subnormals,
// infinities, NaNs, values near fp16 limits).
inline std::vector<float> BitPatterns(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
                               0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x477fe000u,
                               0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u,
                               0x33000001u, 0x32ffffffu, 0x3f800000u, 0x3f801000u, 0x3f803000u,
                               0x7f7fffffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u};
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (i % 7 == 0) b = specials[(i / 7) % (sizeof(specials) / sizeof(specials[0]))];
    std::memcpy(&x[i], &b, 4);
  }
  return x;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace tessera::compress::testing
