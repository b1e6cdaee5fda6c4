#include "compress/tensor_compressor.h"

#include <vector>

#include "compress/compress_test_util.h"
#include "compress/scalar_ops.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using testing::Gaussian;

TEST(SplitIntoPartsTest, CoversTheTensorWithFixedSizeParts) {
  EXPECT_TRUE(SplitIntoParts(0, 10).empty());
  EXPECT_EQ(SplitIntoParts(5, 10), (std::vector<PartRange>{{0, 5}}));
  EXPECT_EQ(SplitIntoParts(10, 10), (std::vector<PartRange>{{0, 10}}));
  EXPECT_EQ(SplitIntoParts(25, 10), (std::vector<PartRange>{{0, 10}, {10, 10}, {20, 5}}));
  EXPECT_EQ(SplitIntoParts(3, 1), (std::vector<PartRange>{{0, 1}, {1, 1}, {2, 1}}));
}

TEST(TensorCompressorTest, SmallTensorsAreSentRaw) {
  CodecSpec spec = *ParseCodecSpec("topk:raw_below=100");
  auto small = TensorCompressor::Create(spec, 99);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->raw());
  EXPECT_EQ(small->codec().id(), CodecId::kNone);
  EXPECT_EQ(small->error_feedback(), nullptr);
  auto large = TensorCompressor::Create(spec, 100);
  ASSERT_TRUE(large.ok());
  EXPECT_FALSE(large->raw());
  EXPECT_EQ(large->codec().id(), CodecId::kTopK);
  EXPECT_NE(large->error_feedback(), nullptr);
  // Raw tensors round-trip exactly.
  std::vector<float> x = Gaussian(99, 1);
  std::vector<std::byte> wire(small->EncodedPartSize(0));
  ASSERT_TRUE(small->EncodePart(0, x, 1, wire).ok());
  EXPECT_EQ(testing::DecodeVec(wire, 99), x);
}

TEST(TensorCompressorTest, PartsDecodeIndependentlyIntoTheWholeTensor) {
  CodecSpec spec = *ParseCodecSpec("fp16:part=1000,raw_below=0");
  const size_t n = 4500;
  auto tc = TensorCompressor::Create(spec, n);
  ASSERT_TRUE(tc.ok());
  ASSERT_EQ(tc->parts().size(), 5u);
  std::vector<float> x = Gaussian(n, 2);
  std::vector<float> acc(n, 0.0f);
  size_t total = 0;
  // Decode in reverse order: each part says where it goes.
  std::vector<std::vector<std::byte>> wires(tc->parts().size());
  for (size_t p = 0; p < wires.size(); ++p) {
    wires[p].resize(tc->EncodedPartSize(p));
    absl::StatusOr<size_t> r = tc->EncodePart(p, x, 7, wires[p]);
    ASSERT_TRUE(r.ok()) << r.status();
    total += *r;
  }
  EXPECT_EQ(total, tc->EncodedSize());
  for (size_t p = wires.size(); p-- > 0;) {
    absl::StatusOr<WireInfo> info = InspectWire(wires[p]);
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(DecodeAdd(wires[p], std::span(acc).subspan(info->element_offset, info->num_elements)).ok());
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(acc[i], scalar::HalfToFloat(scalar::FloatToHalf(x[i])));
}

TEST(TensorCompressorTest, ElementDrawsDoNotDependOnTheSplit) {
  // QSGD: with the same scale in every part (each part holds +-8), encoding
  // in parts gives the same levels as encoding whole, because an element's
  // random draw depends on its index in the tensor.
  const size_t n = 10000;
  std::vector<float> x = Gaussian(n, 3);
  for (size_t i = 0; i < n; i += 1000) x[i + 500] = (i % 2000) ? 8.0f : -8.0f;
  CodecSpec whole_spec = *ParseCodecSpec("qsgd:levels=15,seed=9,raw_below=0,part=10000");
  for (uint64_t part : {1000u, 2000u, 5000u}) {
    CodecSpec parts_spec = whole_spec;
    parts_spec.part_elements = part;
    auto whole = TensorCompressor::Create(whole_spec, n);
    auto parts = TensorCompressor::Create(parts_spec, n);
    ASSERT_TRUE(whole.ok() && parts.ok());
    std::vector<std::byte> w(whole->EncodedPartSize(0));
    ASSERT_TRUE(whole->EncodePart(0, x, 42, w).ok());
    std::vector<float> from_whole = testing::DecodeVec(w, n);
    std::vector<float> from_parts(n);
    for (size_t p = 0; p < parts->parts().size(); ++p) {
      std::vector<std::byte> pw(parts->EncodedPartSize(p));
      ASSERT_TRUE(parts->EncodePart(p, x, 42, pw).ok());
      // Payload levels identical to the slice of the whole encoding.
      const PartRange r = parts->parts()[p];
      ASSERT_EQ(0, std::memcmp(pw.data() + kWireHeaderBytes + 8,
                               w.data() + kWireHeaderBytes + 8 + r.offset, r.size))
          << "part " << p << " of size " << part;
      ASSERT_TRUE(Decode(pw, std::span(from_parts).subspan(r.offset, r.size)).ok());
    }
    EXPECT_EQ(from_parts, from_whole);
  }
}

TEST(TensorCompressorTest, ErrorFeedbackSpansAllParts) {
  CodecSpec spec = *ParseCodecSpec("onebit:part=300,raw_below=0");
  const size_t n = 1000;
  auto tc = TensorCompressor::Create(spec, n);
  ASSERT_TRUE(tc.ok());
  ASSERT_NE(tc->error_feedback(), nullptr);
  std::vector<float> x = Gaussian(n, 4);
  std::vector<float> dec(n);
  for (size_t p = 0; p < tc->parts().size(); ++p) {
    std::vector<std::byte> w(tc->EncodedPartSize(p));
    ASSERT_TRUE(tc->EncodePart(p, x, 1, w).ok());
    const PartRange r = tc->parts()[p];
    ASSERT_TRUE(Decode(w, std::span(dec).subspan(r.offset, r.size)).ok());
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(tc->error_feedback()->residual()[i], x[i] - dec[i]);
}

TEST(TensorCompressorTest, RejectsWrongSizesAndParts) {
  auto tc = TensorCompressor::Create(*ParseCodecSpec("fp16:raw_below=0,part=10"), 25);
  ASSERT_TRUE(tc.ok());
  std::vector<float> x(24);
  std::vector<std::byte> w(1000);
  EXPECT_FALSE(tc->EncodePart(0, x, 0, w).ok());
  x.resize(25);
  EXPECT_FALSE(tc->EncodePart(3, x, 0, w).ok());
  EXPECT_TRUE(tc->EncodePart(2, x, 0, w).ok());
  CodecSpec bad;
  bad.ratio = 0;
  EXPECT_FALSE(TensorCompressor::Create(bad, 10).ok());
}

TEST(TensorCompressorTest, TensorStepIdChangesWithEveryField) {
  const uint64_t a = TensorStepId(1, 2, 3);
  EXPECT_EQ(a, TensorStepId(1, 2, 3));
  EXPECT_NE(a, TensorStepId(1, 2, 4));
  EXPECT_NE(a, TensorStepId(1, 3, 3));
  EXPECT_NE(a, TensorStepId(2, 2, 3));
  EXPECT_NE(TensorStepId(0, 0, 1), TensorStepId(0, 1, 0));
}

}  // namespace
}  // namespace tessera::compress
