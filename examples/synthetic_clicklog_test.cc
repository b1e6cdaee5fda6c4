#include "examples/synthetic_clicklog.h"

#include <cmath>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::examples {
namespace {

ClickLogOptions SmallOptions() {
  ClickLogOptions o;
  o.features = 20000;
  o.fields = 10;
  o.zipf = 1.1;
  o.seed = 11;
  return o;
}

TEST(ZipfSamplerTest, RejectsBadParameters) {
  EXPECT_FALSE(ZipfSampler::Create(0, 1.0).ok());
  EXPECT_FALSE(ZipfSampler::Create(10, -0.5).ok());
  EXPECT_FALSE(ZipfSampler::Create(10, std::nan("")).ok());
  EXPECT_TRUE(ZipfSampler::Create(1, 1.0).ok());
}

TEST(ZipfSamplerTest, StaysInRange) {
  for (double s : {0.0, 0.5, 1.0, 1.1, 2.5}) {
    absl::StatusOr<ZipfSampler> z = ZipfSampler::Create(7, s);
    ASSERT_TRUE(z.ok());
    SplitMixRng rng(3);
    for (int i = 0; i < 10000; ++i) {
      const uint64_t k = z->Sample(rng);
      ASSERT_GE(k, 1u);
      ASSERT_LE(k, 7u);
    }
  }
}

// Rank 1 is 10^s times as frequent as rank 10.
TEST(ZipfSamplerTest, RankOneVersusRankTenFrequency) {
  for (double s : {0.8, 1.0, 1.1, 1.3}) {
    absl::StatusOr<ZipfSampler> z = ZipfSampler::Create(100000, s);
    ASSERT_TRUE(z.ok());
    SplitMixRng rng(12345);
    uint64_t rank1 = 0, rank10 = 0;
    for (int i = 0; i < 1000000; ++i) {
      const uint64_t k = z->Sample(rng);
      rank1 += k == 1;
      rank10 += k == 10;
    }
    ASSERT_GT(rank10, 0u);
    const double ratio = static_cast<double>(rank1) / static_cast<double>(rank10);
    EXPECT_NEAR(ratio / std::pow(10.0, s), 1.0, 0.06) << "exponent " << s << " ratio " << ratio;
  }
}

// The whole distribution of a small support against the exact probabilities.
TEST(ZipfSamplerTest, MatchesExactProbabilitiesOnSmallSupport) {
  const double s = 1.1;
  const int n = 5;
  absl::StatusOr<ZipfSampler> z = ZipfSampler::Create(n, s);
  ASSERT_TRUE(z.ok());
  double norm = 0;
  for (int k = 1; k <= n; ++k) norm += std::pow(k, -s);
  std::vector<uint64_t> counts(n + 1, 0);
  SplitMixRng rng(99);
  const int draws = 500000;
  for (int i = 0; i < draws; ++i) counts[z->Sample(rng)]++;
  for (int k = 1; k <= n; ++k) {
    const double expected = std::pow(k, -s) / norm;
    EXPECT_NEAR(static_cast<double>(counts[k]) / draws, expected, 0.004) << "rank " << k;
  }
}

TEST(SyntheticClickLogTest, RejectsBadOptions) {
  ClickLogOptions o = SmallOptions();
  o.fields = 0;
  EXPECT_FALSE(SyntheticClickLog::Create(o).ok());
  o = SmallOptions();
  o.features = 5;
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(o);
  ASSERT_FALSE(log.ok());
  EXPECT_THAT(std::string(log.status().message()), testing::HasSubstr("features"));
  o = SmallOptions();
  o.zipf = -1;
  EXPECT_FALSE(SyntheticClickLog::Create(o).ok());
}

TEST(SyntheticClickLogTest, DeterministicGivenSeed) {
  absl::StatusOr<SyntheticClickLog> a = SyntheticClickLog::Create(SmallOptions());
  absl::StatusOr<SyntheticClickLog> b = SyntheticClickLog::Create(SmallOptions());
  ASSERT_TRUE(a.ok() && b.ok());
  ClickLogBatch ta = a->TrainPartition(1, 3, 3000);
  ClickLogBatch tb = b->TrainPartition(1, 3, 3000);
  EXPECT_EQ(ta.keys, tb.keys);
  EXPECT_EQ(ta.labels, tb.labels);
  EXPECT_EQ(ta.truth_logits, tb.truth_logits);
  EXPECT_EQ(a->TestSet(500).keys, b->TestSet(500).keys);

  ClickLogOptions other = SmallOptions();
  other.seed = 12;
  absl::StatusOr<SyntheticClickLog> c = SyntheticClickLog::Create(other);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->TrainPartition(1, 3, 3000).keys, ta.keys);
}

TEST(SyntheticClickLogTest, PartitionsTileTheTrainSet) {
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(SmallOptions());
  ASSERT_TRUE(log.ok());
  ClickLogBatch whole = log->TrainPartition(0, 1, 1001);
  ASSERT_EQ(whole.size(), 1001u);
  std::vector<Key> joined;
  std::vector<float> labels;
  for (uint32_t p = 0; p < 3; ++p) {
    ClickLogBatch part = log->TrainPartition(p, 3, 1001);
    joined.insert(joined.end(), part.keys.begin(), part.keys.end());
    labels.insert(labels.end(), part.labels.begin(), part.labels.end());
  }
  EXPECT_EQ(joined, whole.keys);
  EXPECT_EQ(labels, whole.labels);
  EXPECT_EQ(log->TrainPartition(3, 3, 1001).size(), 0u);
}

TEST(SyntheticClickLogTest, TestSetDiffersFromTrainSet) {
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(SmallOptions());
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->TestSet(100).keys, log->TrainPartition(0, 1, 100).keys);
}

TEST(SyntheticClickLogTest, ExamplesHaveDistinctScrambledKeys) {
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(SmallOptions());
  ASSERT_TRUE(log.ok());
  ClickLogBatch batch = log->TestSet(2000);
  ASSERT_EQ(batch.keys.size(), batch.size() * 10);
  std::unordered_set<Key> all;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::span<const Key> keys = batch.keys_of(i);
    std::unordered_set<Key> distinct(keys.begin(), keys.end());
    EXPECT_EQ(distinct.size(), keys.size()) << "example " << i;
    all.insert(keys.begin(), keys.end());
  }
  // Hot ids are not small integers.
  for (uint64_t rank = 1; rank <= 10; ++rank) EXPECT_GT(log->KeyOfRank(rank), uint64_t{1} << 32);
  EXPECT_TRUE(all.count(log->KeyOfRank(1)));
}

TEST(SyntheticClickLogTest, TruthLogitIsBiasPlusWeights) {
  absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(SmallOptions());
  ASSERT_TRUE(log.ok());
  std::unordered_map<Key, float> weight_of_key;
  for (uint64_t r = 1; r <= log->options().features; ++r) weight_of_key[log->KeyOfRank(r)] = log->TruthWeight(r);
  ClickLogBatch batch = log->TestSet(50);
  for (size_t i = 0; i < batch.size(); ++i) {
    double logit = log->truth_bias();
    for (Key k : batch.keys_of(i)) logit += weight_of_key.at(k);
    EXPECT_NEAR(batch.truth_logits[i], logit, 1e-4);
  }
}

TEST(SyntheticClickLogTest, TruthAucInBand) {
  for (ClickLogOptions o : {SmallOptions(), ClickLogOptions{}}) {
    absl::StatusOr<SyntheticClickLog> log = SyntheticClickLog::Create(o);
    ASSERT_TRUE(log.ok());
    ClickLogBatch test = log->TestSet(20000);
    absl::StatusOr<double> auc = Auc(test.truth_logits, test.labels);
    ASSERT_TRUE(auc.ok()) << auc.status();
    EXPECT_GE(*auc, 0.75);
    EXPECT_LE(*auc, 0.85);
    double clicks = 0;
    for (float y : test.labels) clicks += y;
    const double rate = clicks / static_cast<double>(test.size());
    EXPECT_GT(rate, 0.15);
    EXPECT_LT(rate, 0.5);
  }
}

TEST(AucTest, HandMadeCases) {
  const std::vector<float> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, labels), 0.0);
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels), 0.5);
  // One of four positive/negative pairs is inverted.
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.1f, 0.6f, 0.5f, 0.9f}, labels), 0.75);
  // A tie between one positive and one negative counts one half.
  EXPECT_DOUBLE_EQ(*Auc(std::vector<float>{0.1f, 0.5f, 0.5f, 0.9f}, labels), 0.875);
}

TEST(AucTest, Errors) {
  EXPECT_FALSE(Auc(std::vector<float>{0.1f}, std::vector<float>{0, 1}).ok());
  EXPECT_FALSE(Auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 1}).ok());
  EXPECT_FALSE(Auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{0, 2}).ok());
  EXPECT_FALSE(Auc(std::vector<float>{std::nanf(""), 0.2f}, std::vector<float>{0, 1}).ok());
}

TEST(LogLossTest, KnownValues) {
  EXPECT_NEAR(LogLossFromLogits(std::vector<float>{0.0f}, std::vector<float>{1}), std::log(2.0), 1e-12);
  EXPECT_NEAR(LogLossFromLogits(std::vector<float>{0.0f, 0.0f}, std::vector<float>{0, 1}), std::log(2.0), 1e-12);
  // Large logits stay finite and exact.
  EXPECT_NEAR(LogLossFromLogits(std::vector<float>{100.0f}, std::vector<float>{0}), 100.0, 1e-9);
  EXPECT_NEAR(LogLossFromLogits(std::vector<float>{-100.0f}, std::vector<float>{0}), 0.0, 1e-9);
  EXPECT_NEAR(LogLossFromLogits(std::vector<float>{2.0f}, std::vector<float>{1}), std::log1p(std::exp(-2.0)), 1e-12);
  EXPECT_EQ(LogLossFromLogits({}, {}), 0.0);
}

}  // namespace
}  // namespace tessera::examples
