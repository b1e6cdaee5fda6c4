#include <cmath>
#include <limits>

#include "compress/codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::compress {
namespace {

using ::testing::HasSubstr;

TEST(CodecSpecTest, ParsesEveryCodecNameAndAlias) {
  const std::pair<const char*, CodecId> cases[] = {
      {"none", CodecId::kNone},     {"raw", CodecId::kNone},       {"fp32", CodecId::kNone},
      {"fp16", CodecId::kFp16},     {"FP16", CodecId::kFp16},      {"bf16", CodecId::kBf16},
      {"qsgd", CodecId::kQsgd},     {"int8", CodecId::kQsgd},      {"terngrad", CodecId::kTernGrad},
      {"onebit", CodecId::kOneBit}, {"sign", CodecId::kOneBit},    {"1bit", CodecId::kOneBit},
      {"topk", CodecId::kTopK},     {"top-k", CodecId::kTopK},     {"randomk", CodecId::kRandomK},
      {"random-k", CodecId::kRandomK}, {" randk ", CodecId::kRandomK}};
  for (const auto& [name, id] : cases) {
    absl::StatusOr<CodecSpec> spec = ParseCodecSpec(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->codec, id) << name;
  }
  for (int i = 0; i < kNumCodecs; ++i) {
    const CodecId id = static_cast<CodecId>(i);
    absl::StatusOr<CodecId> back = ParseCodecName(CodecName(id));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, id);
  }
}

TEST(CodecSpecTest, BiasedCodecsDefaultToErrorFeedback) {
  EXPECT_TRUE(ParseCodecSpec("topk")->error_feedback);
  EXPECT_TRUE(ParseCodecSpec("onebit")->error_feedback);
  EXPECT_FALSE(ParseCodecSpec("fp16")->error_feedback);
  EXPECT_FALSE(ParseCodecSpec("qsgd")->error_feedback);
  EXPECT_FALSE(ParseCodecSpec("randomk")->error_feedback);
  EXPECT_FALSE(ParseCodecSpec("topk:ef=false")->error_feedback);
  EXPECT_TRUE(ParseCodecSpec("qsgd:ef=on")->error_feedback);
}

TEST(CodecSpecTest, ParsesOptions) {
  absl::StatusOr<CodecSpec> s =
      ParseCodecSpec("topk:ratio=0.001, ef=0,seed=42,raw_below=10,part=4096");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->codec, CodecId::kTopK);
  EXPECT_DOUBLE_EQ(s->ratio, 0.001);
  EXPECT_FALSE(s->error_feedback);
  EXPECT_EQ(s->seed, 42u);
  EXPECT_EQ(s->raw_below, 10u);
  EXPECT_EQ(s->part_elements, 4096u);
  absl::StatusOr<CodecSpec> q = ParseCodecSpec("int8:levels=15");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->levels, 15);
}

TEST(CodecSpecTest, ToStringRoundTrips) {
  absl::StatusOr<CodecSpec> s = ParseCodecSpec("randomk:ratio=0.25,seed=9,part=1000,raw_below=3");
  ASSERT_TRUE(s.ok());
  absl::StatusOr<CodecSpec> back = ParseCodecSpec(s->ToString());
  ASSERT_TRUE(back.ok()) << back.status() << " for " << s->ToString();
  EXPECT_EQ(back->ToString(), s->ToString());
  EXPECT_EQ(back->codec, CodecId::kRandomK);
  EXPECT_DOUBLE_EQ(back->ratio, 0.25);
}

TEST(CodecSpecTest, RejectsBadInputWithClearErrors) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"zstd", "unknown codec 'zstd'"},
      {"", "unknown codec"},
      {"topk:ratio=0", "ratio must be in (0, 1]"},
      {"topk:ratio=1.5", "ratio must be in (0, 1]"},
      {"topk:ratio=-0.1", "ratio must be in (0, 1]"},
      {"topk:ratio=nan", "ratio must be in (0, 1]"},
      {"topk:ratio=abc", "cannot parse 'abc'"},
      {"qsgd:levels=0", "levels must be in [1, 127]"},
      {"qsgd:levels=128", "levels must be in [1, 127]"},
      {"qsgd:levels=-3", "levels must be in [1, 127]"},
      {"fp16:part=0", "part size"},
      {"fp16:part=4294967296", "part size"},
      {"fp16:colour=red", "unknown codec option 'colour'"},
      {"fp16:ratio", "is not key=value"},
      {"fp16:ef=maybe", "cannot parse 'maybe'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CodecSpec> s = ParseCodecSpec(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message)) << c.text;
  }
}

TEST(CodecSpecTest, ValidateChecksEveryField) {
  CodecSpec ok;
  EXPECT_TRUE(ok.Validate().ok());
  CodecSpec s = ok;
  s.ratio = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(s.Validate().ok());
  s = ok;
  s.ratio = 1.0;
  EXPECT_TRUE(s.Validate().ok());
  s = ok;
  s.levels = 127;
  EXPECT_TRUE(s.Validate().ok());
  s.levels = 1;
  EXPECT_TRUE(s.Validate().ok());
  s = ok;
  s.codec = static_cast<CodecId>(99);
  EXPECT_FALSE(s.Validate().ok());
  EXPECT_FALSE(Codec::Create(s).ok());
}

TEST(CodecSpecTest, KeptElementsIsCeilClampedToOneAndN) {
  EXPECT_EQ(KeptElements(0.01, 0), 0u);
  EXPECT_EQ(KeptElements(0.01, 1), 1u);
  EXPECT_EQ(KeptElements(0.01, 100), 1u);
  EXPECT_EQ(KeptElements(0.01, 101), 2u);
  EXPECT_EQ(KeptElements(0.001, 16u << 20), 16778u);
  EXPECT_EQ(KeptElements(1.0, 7), 7u);
  EXPECT_EQ(KeptElements(1e-9, 7), 1u);
}

}  // namespace
}  // namespace tessera::compress
