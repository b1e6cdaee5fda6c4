// The counter-based RNG: pure, stable across releases (the wire depends on
// it: random-k indices are recomputed by the receiver), and balanced.
#include <cmath>
#include <set>
#include <vector>

#include "compress/compress_test_util.h"
#include "compress/scalar_ops.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using scalar::CounterHash32;
using scalar::ElementUniform16;
using scalar::StreamKey;

TEST(CounterRngTest, SameKeyAndCounterGiveTheSameBitsInAnyOrder) {
  const uint64_t key = StreamKey(7, 11);
  std::vector<uint32_t> forward(1000), backward(1000);
  for (uint32_t c = 0; c < 1000; ++c) forward[c] = CounterHash32(key, c);
  for (uint32_t c = 1000; c-- > 0;) backward[c] = CounterHash32(key, c);
  EXPECT_EQ(forward, backward);
  EXPECT_EQ(StreamKey(7, 11), key);
}

TEST(CounterRngTest, GoldenValuesAreStable) {
  // Changing these breaks decoding of random-k parts produced by older
  // senders and CPU/GPU agreement: do not.
  EXPECT_EQ(scalar::Mix64(0), 0u);
  EXPECT_EQ(scalar::Mix64(1), 0x5692161d100b05e5ull);
  EXPECT_EQ(StreamKey(0, 0), 0x48218226ff3cd4bfull);
  EXPECT_EQ(StreamKey(1, 2), 0xf2826f98653e9e57ull);
  EXPECT_EQ(CounterHash32(StreamKey(1, 2), 0), 0xbccca2c2u);
  EXPECT_EQ(CounterHash32(StreamKey(1, 2), 12345), 0xf6420638u);
  EXPECT_EQ(ElementUniform16(StreamKey(1, 2), 24691), 0xf6420638u >> 16);
  EXPECT_EQ(ElementUniform16(StreamKey(1, 2), 24690), 0xf6420638u & 0xffff);
}

TEST(CounterRngTest, StreamsDifferBySeedAndTensor) {
  std::set<uint64_t> keys;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (uint64_t tensor = 0; tensor < 50; ++tensor) keys.insert(StreamKey(seed, tensor));
  }
  EXPECT_EQ(keys.size(), 2500u);
  // Neighbouring streams are not shifted copies of each other.
  size_t equal = 0;
  for (uint32_t c = 0; c < 10000; ++c) {
    equal += CounterHash32(StreamKey(0, 0), c) == CounterHash32(StreamKey(0, 1), c + 1);
  }
  EXPECT_LT(equal, 3u);
}

TEST(CounterRngTest, EveryBitIsBalancedAndUniform16IsUniform) {
  // z-test on each of the 32 bits over 2^18 consecutive counters of a few
  // streams, and a chi-square test of the top 4 bits of the 16-bit uniforms.
  constexpr uint32_t kN = 1u << 18;
  for (uint64_t tensor : {0ull, 1ull, 999ull}) {
    const uint64_t key = StreamKey(3, tensor);
    std::vector<uint32_t> ones(32, 0);
    std::vector<double> bins(16, 0);
    for (uint32_t c = 0; c < kN; ++c) {
      const uint32_t h = CounterHash32(key, c);
      for (int b = 0; b < 32; ++b) ones[b] += (h >> b) & 1;
      bins[ElementUniform16(key, c) >> 12] += 1;
    }
    for (int b = 0; b < 32; ++b) {
      const double z = (ones[b] - kN / 2.0) / std::sqrt(kN / 4.0);
      EXPECT_LT(std::abs(z), 5.0) << "bit " << b << " tensor " << tensor;
    }
    double chi2 = 0;
    const double expect = kN / 16.0;
    for (double v : bins) chi2 += (v - expect) * (v - expect) / expect;
    EXPECT_LT(chi2, 50.0) << "15 degrees of freedom; tensor " << tensor;  // p ~ 1e-5
  }
}

TEST(CounterRngTest, NeighbouringCountersAreUncorrelated) {
  const uint64_t key = StreamKey(5, 5);
  constexpr uint32_t kN = 1u << 18;
  double sum = 0;
  for (uint32_t c = 0; c < kN; ++c) {
    const double a = CounterHash32(key, c) / 4294967296.0 - 0.5;
    const double b = CounterHash32(key, c + 1) / 4294967296.0 - 0.5;
    sum += a * b;
  }
  // Correlation estimate; its standard error is 1/sqrt(N) after normalising
  // by the variance 1/12.
  const double corr = sum / kN * 12.0;
  EXPECT_LT(std::abs(corr), 5.0 / std::sqrt(static_cast<double>(kN)));
}

}  // namespace
}  // namespace tessera::compress
