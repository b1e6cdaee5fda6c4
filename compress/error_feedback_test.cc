#include "compress/error_feedback.h"

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "compress/compress_test_util.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using testing::Gaussian;
using testing::MakeCodec;
using testing::Spec;

struct Ledger {
  std::vector<double> inputs, sent, magnitude;  // per coordinate, over steps
  double max_residual_norm = 0, max_input_norm = 0;
};

double Norm(std::span<const float> v) {
  double s = 0;
  for (float f : v) s += static_cast<double>(f) * f;
  return std::sqrt(s);
}

// Runs `steps` encodes of fresh Gaussian gradients (with a drift, so the
// residual is pushed the same way every step) and records the ledger.
// `step` encodes one gradient and returns the decoded vector.
template <typename Step>
Ledger RunSteps(size_t n, int steps, Step step, std::span<const float> (*residual)(void*), void* ef) {
  Ledger l;
  l.inputs.assign(n, 0);
  l.sent.assign(n, 0);
  l.magnitude.assign(n, 0);
  for (int t = 0; t < steps; ++t) {
    std::vector<float> g = Gaussian(n, 1000 + t);
    for (size_t i = 0; i < n; ++i) g[i] += 0.1f * static_cast<float>(i % 5);
    std::vector<float> before(residual(ef).begin(), residual(ef).end());
    std::vector<float> dec = step(g, t);
    for (size_t i = 0; i < n; ++i) {
      l.inputs[i] += g[i];
      l.sent[i] += dec[i];
      l.magnitude[i] += std::abs(g[i]) + std::abs(before[i]) + std::abs(dec[i]) +
                        std::abs(residual(ef)[i]);
    }
    l.max_residual_norm = std::max(l.max_residual_norm, Norm(residual(ef)));
    l.max_input_norm = std::max(l.max_input_norm, Norm(g));
  }
  return l;
}

// Empty when sum(inputs) == sum(sent) + residual within the rounding of the
// two float operations per step (a few ulps of the magnitudes involved).
std::string CheckConservation(const Ledger& l, std::span<const float> residual) {
  for (size_t i = 0; i < residual.size(); ++i) {
    const double lhs = l.inputs[i];
    const double rhs = l.sent[i] + residual[i];
    const double tol = 2 * FLT_EPSILON * l.magnitude[i] + 1e-30;
    if (std::abs(lhs - rhs) > tol) {
      return "coordinate " + std::to_string(i) + ": inputs " + std::to_string(lhs) + ", sent + residual " +
             std::to_string(rhs) + ", tolerance " + std::to_string(tol);
    }
  }
  return "";
}

std::span<const float> ResidualOf(void* ef) { return static_cast<ErrorFeedback*>(ef)->residual(); }

TEST(ErrorFeedbackTest, ConservesTheSumAndKeepsTheResidualBounded) {
  const size_t n = 512;
  const int steps = 200;
  const CodecId ids[] = {CodecId::kOneBit, CodecId::kTopK, CodecId::kQsgd, CodecId::kTernGrad,
                         CodecId::kFp16, CodecId::kBf16, CodecId::kNone};
  for (CodecId id : ids) {
    Codec codec = MakeCodec(Spec(id, /*ratio=*/0.1, /*levels=*/7));
    ErrorFeedback ef(n);
    Ledger l = RunSteps(
        n, steps,
        [&](const std::vector<float>& g, int t) {
          std::vector<std::byte> wire(codec.EncodedSize(n));
          absl::StatusOr<size_t> r = ef.Encode(codec, g, {.tensor_id = static_cast<uint64_t>(t)}, wire);
          EXPECT_TRUE(r.ok()) << r.status();
          return testing::DecodeVec(wire, n);
        },
        ResidualOf, &ef);
    EXPECT_EQ(CheckConservation(l, ef.residual()), "") << CodecName(id);
    // Bounded: for top-k with ratio d the residual stays below about
    // (2/d) * gradient norm; without feedback subtraction it would grow like
    // steps * norm. The same loose bound holds for the other codecs.
    EXPECT_LT(l.max_residual_norm, 25.0 * l.max_input_norm) << CodecName(id);
    RecordProperty(std::string(CodecName(id)) + "_residual_over_input",
                   std::to_string(l.max_residual_norm / l.max_input_norm));
  }
}

TEST(ErrorFeedbackTest, CheckRejectsFeedbackThatForgetsWhatWasSent) {
  // Negative control: a residual that accumulates inputs but never subtracts
  // what was sent breaks conservation (and the bound).
  const size_t n = 256;
  Codec codec = MakeCodec(Spec(CodecId::kTopK, 0.1));
  std::vector<float> broken(n, 0.0f);
  struct Holder {
    std::vector<float>* r;
  } holder{&broken};
  Ledger l = RunSteps(
      n, 200,
      [&](const std::vector<float>& g, int) {
        for (size_t i = 0; i < n; ++i) broken[i] += g[i];
        std::vector<std::byte> wire = testing::EncodeVec(codec, broken);
        return testing::DecodeVec(wire, n);
      },
      [](void* h) { return std::span<const float>(*static_cast<Holder*>(h)->r); }, &holder);
  EXPECT_NE(CheckConservation(l, broken), "");
  EXPECT_GT(l.max_residual_norm, 25.0 * l.max_input_norm);
}

TEST(ErrorFeedbackTest, TopKEventuallySendsEveryCoordinate) {
  // With feedback, small coordinates accumulate until they are sent.
  const size_t n = 1000;
  Codec codec = MakeCodec(Spec(CodecId::kTopK, 0.01));
  ErrorFeedback ef(n);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 1.0f + 0.001f * static_cast<float>(i);
  std::vector<bool> sent(n, false);
  for (int t = 0; t < 300; ++t) {
    std::vector<std::byte> wire(codec.EncodedSize(n));
    ASSERT_TRUE(ef.Encode(codec, g, {}, wire).ok());
    std::vector<float> d = testing::DecodeVec(wire, n);
    for (size_t i = 0; i < n; ++i) sent[i] = sent[i] || d[i] != 0.0f;
  }
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(sent[i]) << i;
}

TEST(ErrorFeedbackTest, PartsUseTheirOwnSliceOfTheResidual) {
  const size_t n = 100;
  Codec codec = MakeCodec(Spec(CodecId::kOneBit));
  ErrorFeedback ef(n);
  std::vector<float> g = Gaussian(40, 3);
  std::vector<std::byte> wire(codec.EncodedSize(40));
  ASSERT_TRUE(ef.Encode(codec, g, {.element_offset = 60}, wire).ok());
  for (size_t i = 0; i < 60; ++i) EXPECT_EQ(ef.residual()[i], 0.0f);
  std::vector<float> d = testing::DecodeVec(wire, 40);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(ef.residual()[60 + i], g[i] - d[i]);
  // A part that does not fit is an error.
  EXPECT_FALSE(ef.Encode(codec, g, {.element_offset = 61}, wire).ok());
  ef.Reset();
  for (float r : ef.residual()) EXPECT_EQ(r, 0.0f);
}

TEST(ErrorFeedbackTest, EncodeErrorResetsThePartsResidual) {
  const size_t n = 64;
  Codec codec = MakeCodec(Spec(CodecId::kOneBit));
  ErrorFeedback ef(n);
  std::vector<float> g = Gaussian(n, 4);
  std::vector<std::byte> wire(codec.EncodedSize(n));
  ASSERT_TRUE(ef.Encode(codec, g, {}, wire).ok());
  g[10] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(ef.Encode(codec, g, {}, wire).ok());
  for (float r : ef.residual()) EXPECT_EQ(r, 0.0f);
}

}  // namespace
}  // namespace tessera::compress
