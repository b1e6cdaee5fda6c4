// Unbiasedness of the stochastic codecs: over many encodes with different
// tensor ids and seeds, the mean of the decoded values must match the input
// per coordinate within a z-bound from the analytic variance. The same check
// must reject a random-k without rescaling and a deterministic quantizer.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "compress/compress_test_util.h"
#include "compress/scalar_ops.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using testing::DecodeVec;
using testing::EncodeVec;
using testing::MakeCodec;
using testing::Spec;

constexpr int kTrials = 6000;
constexpr double kZ = 5.5;  // per coordinate; 100s of coordinates, false alarms ~1e-6

// Zeros, tiny values, an outlier, ties and ordinary values.
std::vector<float> TestInput() {
  std::vector<float> x = testing::Gaussian(200, 1234, 0.3f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 1e-30f;
  x[3] = -1e-30f;
  x[4] = 3e-7f;
  x[5] = 5.0f;  // outlier: the scale of max-based codecs
  for (int i = 6; i < 14; ++i) x[i] = (i % 2) ? 0.25f : -0.25f;  // ties
  x[14] = -5.0f;  // tied with the outlier
  x[15] = 2.5f;   // exactly a half of the scale
  return x;
}

struct Sample {
  std::vector<double> sum;
  int trials = 0;
};

// Runs `decode_once(trial)` kTrials times and sums the decoded vectors.
Sample Collect(size_t n, const std::function<std::vector<float>(int)>& decode_once) {
  Sample s;
  s.sum.assign(n, 0.0);
  for (int t = 0; t < kTrials; ++t) {
    std::vector<float> y = decode_once(t);
    for (size_t i = 0; i < n; ++i) s.sum[i] += y[i];
  }
  s.trials = kTrials;
  return s;
}

// Empty when every coordinate's mean is within kZ standard errors (from the
// analytic per-draw variance) plus a float-rounding allowance of the input;
// else the first failing coordinate, described.
std::string CheckUnbiased(const std::vector<float>& x, const Sample& s,
                          const std::vector<double>& variance, const std::vector<double>& rounding) {
  for (size_t i = 0; i < x.size(); ++i) {
    const double mean = s.sum[i] / s.trials;
    const double bound = kZ * std::sqrt(variance[i] / s.trials) + rounding[i];
    if (std::abs(mean - x[i]) > bound) {
      return "coordinate " + std::to_string(i) + ": input " + std::to_string(x[i]) + ", mean " +
             std::to_string(mean) + ", allowed deviation " + std::to_string(bound);
    }
  }
  return "";
}

float MaxAbs(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::abs(v));
  return m;
}

// Different tensor ids, and a different seed every 7 trials.
std::vector<float> EncodeDecode(CodecId id, const std::vector<float>& x, int trial, int levels = 127,
                                double ratio = 0.1) {
  Codec c = MakeCodec(Spec(id, ratio, levels, /*seed=*/trial / 7));
  return DecodeVec(EncodeVec(c, x, /*tensor_id=*/trial), x.size());
}

// Variance of step * (floor(t) + Bernoulli(frac(t))), t = |x| / step.
std::vector<double> LevelVariance(const std::vector<float>& x, double step) {
  std::vector<double> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = std::abs(x[i]) / step;
    const double p = t - std::floor(t);
    v[i] = step * step * p * (1 - p);
  }
  return v;
}

// Float rounding of the level arithmetic (inv, step) plus the 2^-16 grid of
// the uniforms: a few ulps of |x| and 2^-15 of a step.
std::vector<double> LevelRounding(const std::vector<float>& x, double step) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = 4e-7 * std::abs(x[i]) + step * 0x1p-15;
  return r;
}

TEST(UnbiasednessTest, QsgdIsUnbiasedForEveryLevelCount) {
  const std::vector<float> x = TestInput();
  for (int levels : {1, 4, 127}) {
    Sample s = Collect(x.size(), [&](int t) { return EncodeDecode(CodecId::kQsgd, x, t, levels); });
    const double step = static_cast<double>(MaxAbs(x)) / levels;
    EXPECT_EQ(CheckUnbiased(x, s, LevelVariance(x, step), LevelRounding(x, step)), "")
        << "levels " << levels;
  }
}

TEST(UnbiasednessTest, TernGradIsUnbiased) {
  const std::vector<float> x = TestInput();
  Sample s = Collect(x.size(), [&](int t) { return EncodeDecode(CodecId::kTernGrad, x, t); });
  const double step = MaxAbs(x);
  EXPECT_EQ(CheckUnbiased(x, s, LevelVariance(x, step), LevelRounding(x, step)), "");
}

// Random-k: coordinate i is kept with probability 1/m (m = its stratum size)
// and then sent as m * x: variance x^2 (m - 1).
std::vector<double> RandomKVariance(const std::vector<float>& x, double ratio, double unscaled = 1.0) {
  const size_t n = x.size(), k = KeptElements(ratio, n);
  std::vector<double> v(n);
  for (size_t b = 0; b < k; ++b) {
    const size_t lo = b * n / k, hi = (b + 1) * n / k;
    const double m = static_cast<double>(hi - lo);
    for (size_t i = lo; i < hi; ++i) {
      const double value = x[i] * (unscaled == 1.0 ? m : 1.0);
      v[i] = value * value / m - std::pow(value / m, 2);
    }
  }
  return v;
}

std::vector<double> RelativeRounding(const std::vector<float>& x) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = 4e-7 * std::abs(x[i]);
  return r;
}

TEST(UnbiasednessTest, RandomKIsUnbiased) {
  const std::vector<float> x = TestInput();
  for (double ratio : {0.1, 0.37}) {
    Sample s = Collect(x.size(), [&](int t) { return EncodeDecode(CodecId::kRandomK, x, t, 127, ratio); });
    EXPECT_EQ(CheckUnbiased(x, s, RandomKVariance(x, ratio), RelativeRounding(x)), "") << ratio;
  }
}

TEST(UnbiasednessTest, CheckRejectsRandomKWithoutRescaling) {
  // The same coordinates, sent without the d/k factor.
  const std::vector<float> x = TestInput();
  const double ratio = 0.1;
  const size_t n = x.size(), k = KeptElements(ratio, n);
  Sample s = Collect(n, [&](int t) {
    std::vector<float> y = EncodeDecode(CodecId::kRandomK, x, t, 127, ratio);
    for (size_t b = 0; b < k; ++b) {
      const size_t lo = b * n / k, hi = (b + 1) * n / k;
      for (size_t i = lo; i < hi; ++i) y[i] /= static_cast<float>(hi - lo);
    }
    return y;
  });
  EXPECT_NE(CheckUnbiased(x, s, RandomKVariance(x, ratio, /*unscaled=*/0.0), RelativeRounding(x)), "");
  // Judged with the rescaled codec's (larger) variance it must fail too.
  EXPECT_NE(CheckUnbiased(x, s, RandomKVariance(x, ratio), RelativeRounding(x)), "");
}

TEST(UnbiasednessTest, CheckRejectsDeterministicRounding) {
  // Round-to-nearest onto the same levels: zero variance, biased.
  const std::vector<float> x = TestInput();
  for (int levels : {4, 127}) {
    const float scale = MaxAbs(x);
    const float step = scale / levels;
    const float inv = static_cast<float>(levels) / scale;
    Sample s = Collect(x.size(), [&](int) {
      std::vector<float> y(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        y[i] = std::copysign(std::nearbyint(std::abs(x[i]) * inv) * step, x[i]);
      }
      return y;
    });
    EXPECT_NE(CheckUnbiased(x, s, LevelVariance(x, step), LevelRounding(x, step)), "") << levels;
  }
}

TEST(UnbiasednessTest, CheckRejectsAQuantizerThatIgnoresTheFraction) {
  // Stochastic rounding with a constant probability 1/2 instead of frac(t):
  // noisy like QSGD but biased.
  const std::vector<float> x = TestInput();
  const float scale = MaxAbs(x);
  const int levels = 4;
  const float step = scale / levels;
  Sample s = Collect(x.size(), [&](int t) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float l = std::floor(std::abs(x[i]) / step);
      const bool up = scalar::CounterHash32(t, static_cast<uint32_t>(i)) & 1;
      y[i] = std::copysign((l + (up ? 1.0f : 0.0f)) * step, x[i]);
    }
    return y;
  });
  EXPECT_NE(CheckUnbiased(x, s, LevelVariance(x, step), LevelRounding(x, step)), "");
}

}  // namespace
}  // namespace tessera::compress
