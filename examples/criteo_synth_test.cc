#include "examples/criteo_synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::examples {
namespace {

using ::testing::HasSubstr;

// A smaller set for the structural tests: fewer, smaller fields.
CriteoSynthOptions SmallOptions() {
  CriteoSynthOptions o;
  o.dense_fields = 5;
  o.categorical_fields = 6;
  o.max_cardinality = 5000;
  o.interaction_pairs = 3;
  o.seed = 11;
  return o;
}

CriteoSynth CreateOrDie(const CriteoSynthOptions& options) {
  absl::StatusOr<CriteoSynth> synth = CriteoSynth::Create(options);
  EXPECT_TRUE(synth.ok()) << synth.status();
  return *std::move(synth);
}

void ExpectSameBatch(const CriteoBatch& a, const CriteoBatch& b) {
  EXPECT_EQ(a.dense_fields, b.dense_fields);
  EXPECT_EQ(a.categorical_fields, b.categorical_fields);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.truth_logits, b.truth_logits);
}

double Mean(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double Stddev(const std::vector<float>& v) {
  const double mean = Mean(v);
  double sum = 0;
  for (float x : v) sum += (x - mean) * (x - mean);
  return std::sqrt(sum / static_cast<double>(v.size()));
}

// The error of Create(options), which must fail.
std::string ErrorOf(const CriteoSynthOptions& options) {
  absl::StatusOr<CriteoSynth> synth = CriteoSynth::Create(options);
  EXPECT_FALSE(synth.ok());
  if (synth.ok()) return "";
  EXPECT_EQ(synth.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(synth.status().message());
}

TEST(CriteoSynthTest, DefaultCardinalitiesAreLogSpacedFromTensToMillions) {
  const CriteoSynth synth = CreateOrDie(CriteoSynthOptions{});
  const std::vector<uint64_t>& c = synth.options().cardinalities;
  ASSERT_EQ(c.size(), 26u);
  EXPECT_EQ(c.front(), 10u);
  EXPECT_EQ(c.back(), 1'000'000u);
  for (size_t f = 1; f < c.size(); ++f) {
    EXPECT_GT(c[f], c[f - 1]);
    // A constant ratio of 10^(5/25) between neighbours, up to rounding.
    EXPECT_NEAR(std::log10(static_cast<double>(c[f]) / static_cast<double>(c[f - 1])), 0.2, 0.03) << f;
  }
  EXPECT_EQ(CriteoSynth::DefaultCardinalities(1, 10, 100), std::vector<uint64_t>{10});
  EXPECT_EQ(CriteoSynth::DefaultCardinalities(3, 10, 1000), (std::vector<uint64_t>{10, 100, 1000}));
}

TEST(CriteoSynthTest, RejectsBadOptionsNamingTheOption) {
  CriteoSynthOptions o = SmallOptions();
  o.cardinalities = {10, 20, 30};
  EXPECT_THAT(ErrorOf(o), HasSubstr("cardinalities"));
  o.cardinalities = {10, 20, 30, 0, 50, 60};
  EXPECT_THAT(ErrorOf(o), HasSubstr("cardinalities[3]"));
  o.cardinalities = {10, 20, 30, uint64_t{1} << 40, 50, 60};
  EXPECT_THAT(ErrorOf(o), HasSubstr("cardinalities[3]"));
  o = SmallOptions();
  o.categorical_fields = 0;
  EXPECT_THAT(ErrorOf(o), HasSubstr("categorical_fields"));
  o = SmallOptions();
  o.zipf = -0.5;
  EXPECT_THAT(ErrorOf(o), HasSubstr("zipf"));
  o.zipf = std::nan("");
  EXPECT_THAT(ErrorOf(o), HasSubstr("zipf"));
  o.zipf = INFINITY;
  EXPECT_THAT(ErrorOf(o), HasSubstr("zipf"));
  o = SmallOptions();
  o.logit_stddev = -1;
  EXPECT_THAT(ErrorOf(o), HasSubstr("logit_stddev"));
  o = SmallOptions();
  o.truth_bias = std::nan("");
  EXPECT_THAT(ErrorOf(o), HasSubstr("truth_bias"));
  o = SmallOptions();
  o.min_cardinality = 0;
  EXPECT_THAT(ErrorOf(o), HasSubstr("min_cardinality"));
  o = SmallOptions();
  o.max_cardinality = 5;
  EXPECT_THAT(ErrorOf(o), HasSubstr("max_cardinality"));
  o = SmallOptions();
  o.dense_share = 1.5;
  EXPECT_THAT(ErrorOf(o), HasSubstr("dense_share"));
  o = SmallOptions();
  o.interaction_share = -0.1;
  EXPECT_THAT(ErrorOf(o), HasSubstr("interaction_share"));
  o = SmallOptions();
  o.dense_share = 0.6;
  o.interaction_share = 0.6;
  EXPECT_THAT(ErrorOf(o), HasSubstr("dense_share + interaction_share"));
  o = SmallOptions();
  o.interaction_pairs = 16;  // 6 fields have only 15 pairs
  EXPECT_THAT(ErrorOf(o), HasSubstr("interaction_pairs"));

  // The edges that are allowed.
  o = SmallOptions();
  o.interaction_pairs = 15;
  o.dense_fields = 0;
  o.zipf = 0;
  o.logit_stddev = 0;
  o.cardinalities = {1, 1, 2, 3, uint64_t{1} << 39, 7};
  EXPECT_TRUE(CriteoSynth::Create(o).ok());
}

TEST(CriteoSynthTest, DeterministicGivenSeed) {
  const CriteoSynth a = CreateOrDie(SmallOptions());
  const CriteoSynth b = CreateOrDie(SmallOptions());
  ExpectSameBatch(a.TrainPartition(1, 3, 3000), b.TrainPartition(1, 3, 3000));
  ExpectSameBatch(a.TestSet(500), b.TestSet(500));
  EXPECT_EQ(a.interaction_pairs().size(), 3u);
  EXPECT_TRUE(std::equal(a.interaction_pairs().begin(), a.interaction_pairs().end(),
                         b.interaction_pairs().begin(), b.interaction_pairs().end()));
}

TEST(CriteoSynthTest, DifferentSeedsGiveDifferentData) {
  CriteoSynthOptions other = SmallOptions();
  other.seed = 12;
  const CriteoBatch a = CreateOrDie(SmallOptions()).TrainRange(0, 2000);
  const CriteoBatch b = CreateOrDie(other).TrainRange(0, 2000);
  ASSERT_EQ(a.keys.size(), b.keys.size());
  size_t same_keys = 0, same_dense = 0, same_logits = 0;
  for (size_t i = 0; i < a.keys.size(); ++i) same_keys += a.keys[i] == b.keys[i];
  for (size_t i = 0; i < a.dense.size(); ++i) same_dense += a.dense[i] == b.dense[i] && a.dense[i] != 0;
  for (size_t i = 0; i < a.size(); ++i) same_logits += a.truth_logits[i] == b.truth_logits[i];
  // Keys are salted by the seed, so not even the hot ids coincide.
  EXPECT_EQ(same_keys, 0u);
  EXPECT_LT(same_dense, a.dense.size() / 20);
  EXPECT_LT(same_logits, a.size() / 100);
}

TEST(CriteoSynthTest, PartitionsTileTheTrainSet) {
  const CriteoSynth synth = CreateOrDie(SmallOptions());
  const uint64_t total = 1001;
  const CriteoBatch whole = synth.TrainPartition(0, 1, total);
  ASSERT_EQ(whole.size(), total);
  ASSERT_EQ(whole.dense.size(), total * 5);
  ASSERT_EQ(whole.keys.size(), total * 6);
  for (uint32_t parts : {2u, 3u}) {
    CriteoBatch joined;
    for (uint32_t p = 0; p < parts; ++p) {
      const CriteoBatch part = synth.TrainPartition(p, parts, total);
      // The same convention as SyntheticClickLog.
      EXPECT_EQ(part.size(), (p + 1) * total / parts - p * total / parts);
      joined.dense_fields = part.dense_fields;
      joined.categorical_fields = part.categorical_fields;
      joined.dense.insert(joined.dense.end(), part.dense.begin(), part.dense.end());
      joined.keys.insert(joined.keys.end(), part.keys.begin(), part.keys.end());
      joined.labels.insert(joined.labels.end(), part.labels.begin(), part.labels.end());
      joined.truth_logits.insert(joined.truth_logits.end(), part.truth_logits.begin(), part.truth_logits.end());
    }
    ExpectSameBatch(joined, whole);
  }
  EXPECT_EQ(synth.TrainPartition(3, 3, total).size(), 0u);
}

TEST(CriteoSynthTest, TrainRangeAgreesWithTrainPartition) {
  const CriteoSynth synth = CreateOrDie(SmallOptions());
  const uint64_t total = 1000;
  const CriteoBatch part = synth.TrainPartition(1, 3, total);  // [333, 666)
  ExpectSameBatch(synth.TrainRange(333, 666), part);
  // Streamed in uneven mini-batches into one reused batch.
  CriteoBatch streamed, batch;
  for (uint64_t begin = 333; begin < 666; begin += 64) {
    synth.FillTrainRange(begin, std::min<uint64_t>(begin + 64, 666), batch);
    streamed.dense_fields = batch.dense_fields;
    streamed.categorical_fields = batch.categorical_fields;
    streamed.dense.insert(streamed.dense.end(), batch.dense.begin(), batch.dense.end());
    streamed.keys.insert(streamed.keys.end(), batch.keys.begin(), batch.keys.end());
    streamed.labels.insert(streamed.labels.end(), batch.labels.begin(), batch.labels.end());
    streamed.truth_logits.insert(streamed.truth_logits.end(), batch.truth_logits.begin(), batch.truth_logits.end());
  }
  ExpectSameBatch(streamed, part);
  EXPECT_EQ(synth.TrainRange(10, 10).size(), 0u);
  EXPECT_EQ(synth.TrainRange(10, 5).size(), 0u);
  // The held-out stream is a different one.
  EXPECT_NE(synth.TestSet(100).keys, synth.TrainRange(0, 100).keys);
}

TEST(CriteoSynthTest, KeysAreDistinctAcrossAndWithinFields) {
  const CriteoSynth synth = CreateOrDie(CriteoSynthOptions{});
  // Every rank of the small fields, and a sample of the large ones, including
  // the last rank.
  std::unordered_map<Key, std::pair<uint32_t, uint64_t>> owner;
  SplitMixRng rng(5);
  for (uint32_t f = 0; f < 26; ++f) {
    const uint64_t n = synth.cardinality(f);
    std::vector<uint64_t> ranks;
    for (uint64_t r = 1; r <= std::min<uint64_t>(n, 5000); ++r) ranks.push_back(r);
    for (int s = 0; s < 2000 && n > 5000; ++s) ranks.push_back(5001 + rng.Next() % (n - 5000));
    ranks.push_back(n);
    for (uint64_t r : ranks) {
      const auto [it, inserted] = owner.try_emplace(synth.KeyOf(f, r), f, r);
      ASSERT_TRUE(inserted || it->second == std::make_pair(f, r))
          << "key of (" << f << ", " << r << ") is also the key of (" << it->second.first << ", "
          << it->second.second << ")";
    }
  }
  // Hot ids are not small integers.
  for (uint32_t f = 0; f < 26; ++f) EXPECT_GT(synth.KeyOf(f, 1), uint64_t{1} << 32);

  // The keys of an example are its fields' keys, in field order.
  const CriteoBatch batch = synth.TestSet(2000);
  for (uint32_t f = 0; f < 8; ++f) {  // the fields with cardinality <= 5000, all listed above
    ASSERT_LE(synth.cardinality(f), 5000u);
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto it = owner.find(batch.keys_of(i)[f]);
      ASSERT_TRUE(it != owner.end()) << "example " << i << " field " << f;
      EXPECT_EQ(it->second.first, f);
    }
  }
}

TEST(CriteoSynthTest, TopRanksFollowTheZipfLaw) {
  for (double zipf : {0.8, 1.1}) {
    CriteoSynthOptions o;
    o.zipf = zipf;
    const CriteoSynth synth = CreateOrDie(o);
    const uint32_t field = 25;  // a million ranks
    const CriteoBatch batch = synth.TestSet(200000);
    uint64_t rank1 = 0, rank2 = 0, rank4 = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Key k = batch.keys_of(i)[field];
      rank1 += k == synth.KeyOf(field, 1);
      rank2 += k == synth.KeyOf(field, 2);
      rank4 += k == synth.KeyOf(field, 4);
    }
    ASSERT_GT(rank2, 0u);
    ASSERT_GT(rank4, 0u);
    const double ratio2 = static_cast<double>(rank1) / static_cast<double>(rank2);
    const double ratio4 = static_cast<double>(rank1) / static_cast<double>(rank4);
    EXPECT_NEAR(ratio2 / std::pow(2.0, zipf), 1.0, 0.06) << "zipf " << zipf << " P(1)/P(2) " << ratio2;
    EXPECT_NEAR(ratio4 / std::pow(4.0, zipf), 1.0, 0.08) << "zipf " << zipf << " P(1)/P(4) " << ratio4;
  }
}

TEST(CriteoSynthTest, DenseFeaturesAreNonNegativeHeavyTailedLogCounts) {
  const CriteoSynth synth = CreateOrDie(CriteoSynthOptions{});
  const CriteoBatch batch = synth.TestSet(20000);
  ASSERT_EQ(batch.dense.size(), batch.size() * 13);
  for (uint32_t j = 0; j < 13; ++j) {
    std::vector<double> positive_counts;
    for (size_t i = 0; i < batch.size(); ++i) {
      const float x = batch.dense_of(i)[j];
      ASSERT_TRUE(std::isfinite(x));
      ASSERT_GE(x, 0.0f);
      // log1p of an integer count.
      const double count = std::expm1(static_cast<double>(x));
      ASSERT_NEAR(count, std::round(count), 1e-5 * std::max(1.0, count)) << "field " << j;
      if (x > 0) positive_counts.push_back(std::round(count));
    }
    // Both zeros and counts occur.
    EXPECT_GT(positive_counts.size(), batch.size() / 5) << "field " << j;
    EXPECT_LT(positive_counts.size(), batch.size()) << "field " << j;
    // Heavy tail: the 99.9th percentile of the positive counts is over ten
    // times their median (a light-tailed count, e.g. Poisson, is far from it).
    std::sort(positive_counts.begin(), positive_counts.end());
    const double median = positive_counts[positive_counts.size() / 2];
    const double p999 = positive_counts[positive_counts.size() * 999 / 1000];
    EXPECT_GT(p999, 10 * median) << "field " << j << " median " << median << " p99.9 " << p999;
  }
}

TEST(CriteoSynthTest, DefaultsGiveExpectedClickRateAndTruthAuc) {
  const CriteoSynth synth = CreateOrDie(CriteoSynthOptions{});
  const CriteoBatch test = synth.TestSet(20000);
  const double rate = Mean(test.labels);
  absl::StatusOr<double> auc = Auc(test.truth_logits, test.labels);
  ASSERT_TRUE(auc.ok()) << auc.status();
  std::printf("[ criteo  ] defaults: click rate %.4f, ground-truth AUC %.4f, logit mean %.3f stddev %.3f\n", rate,
              *auc, Mean(test.truth_logits), Stddev(test.truth_logits));
  EXPECT_GE(rate, 0.22);
  EXPECT_LE(rate, 0.32);
  EXPECT_GE(*auc, 0.70);
  EXPECT_LE(*auc, 0.90);

  // Trivial scores do clearly worse: a constant, and the dense part of the
  // truth alone (the dense share is a fifth of the logit variance).
  absl::StatusOr<double> constant_auc = Auc(std::vector<float>(test.size(), 0.0f), test.labels);
  ASSERT_TRUE(constant_auc.ok());
  EXPECT_DOUBLE_EQ(*constant_auc, 0.5);
  CriteoSynthOptions dense_only = CriteoSynthOptions{};
  dense_only.dense_share = 1.0;
  dense_only.interaction_share = 0.0;
  // Same seed, so the same dense features; their truth logit is a fixed
  // positive multiple of the default model's dense term.
  const CriteoBatch dense_test = CreateOrDie(dense_only).TestSet(20000);
  ASSERT_EQ(dense_test.dense, test.dense);
  absl::StatusOr<double> dense_auc = Auc(dense_test.truth_logits, test.labels);
  ASSERT_TRUE(dense_auc.ok());
  std::printf("[ criteo  ] AUC of the dense part of the truth alone: %.4f\n", *dense_auc);
  EXPECT_LT(*dense_auc, *auc - 0.08);
  EXPECT_GT(*dense_auc, 0.5);  // the dense part does carry signal
}

TEST(CriteoSynthTest, TruthLogitHasTheRequestedMeanAndStddev) {
  struct Case {
    double dense_share, interaction_share;
  };
  for (const Case c : {Case{0.2, 0.3}, Case{1.0, 0.0}, Case{0.0, 0.0}, Case{0.0, 1.0}}) {
    for (const auto& [stddev, seed] : {std::pair{0.5, uint64_t{7}}, std::pair{2.0, uint64_t{8}}}) {
      CriteoSynthOptions o;
      o.dense_share = c.dense_share;
      o.interaction_share = c.interaction_share;
      o.logit_stddev = stddev;
      o.truth_bias = -1.0;
      o.seed = seed;
      const CriteoBatch test = CreateOrDie(o).TestSet(20000);
      const std::string what = absl::StrCat("dense_share ", c.dense_share, " interaction_share ",
                                            c.interaction_share, " logit_stddev ", stddev, " seed ", seed);
      // Sampling noise: about 0.5% of the stddev on the stddev, 0.7% on the mean.
      EXPECT_NEAR(Stddev(test.truth_logits) / stddev, 1.0, 0.06) << what;
      EXPECT_NEAR(Mean(test.truth_logits), -1.0, 0.03 * stddev) << what;
    }
  }
  CriteoSynthOptions flat;
  flat.logit_stddev = 0;
  const CriteoBatch test = CreateOrDie(flat).TestSet(1000);
  for (float z : test.truth_logits) ASSERT_FLOAT_EQ(z, static_cast<float>(flat.truth_bias));
}

// The interaction term has zero mean given any one field's id, so one-hot
// linear models cannot see it: the mean truth logit per id of an interacting
// field is flat, while the id-weight term makes it vary.
TEST(CriteoSynthTest, InteractionsAreInvisibleToPerIdMeans) {
  const auto between_id_variance = [](uint32_t field, const CriteoBatch& batch) {
    std::unordered_map<Key, std::pair<double, uint64_t>> by_key;  // sum, count
    for (size_t i = 0; i < batch.size(); ++i) {
      auto& [sum, count] = by_key[batch.keys_of(i)[field]];
      sum += batch.truth_logits[i];
      ++count;
    }
    const double mean = Mean(batch.truth_logits);
    double variance = 0;
    uint64_t counted = 0;
    for (const auto& [key, sum_count] : by_key) {
      const auto& [sum, count] = sum_count;
      if (count < 1000) continue;  // well-estimated ids only
      variance += count * (sum / count - mean) * (sum / count - mean);
      counted += count;
    }
    return counted > 0 ? variance / counted : -1.0;
  };
  CriteoSynthOptions interactions_only;
  interactions_only.dense_share = 0;
  interactions_only.interaction_share = 1;
  const CriteoSynth synth = CreateOrDie(interactions_only);
  CriteoSynthOptions ids_only = interactions_only;
  ids_only.interaction_share = 0;
  const CriteoSynth linear = CreateOrDie(ids_only);
  const CriteoBatch batch = synth.TestSet(60000);
  const CriteoBatch linear_batch = linear.TestSet(60000);
  ASSERT_EQ(batch.keys, linear_batch.keys);  // the same ids, differently labelled
  absl::StatusOr<double> auc = Auc(batch.truth_logits, batch.labels);
  ASSERT_TRUE(auc.ok());
  EXPECT_GT(*auc, 0.7);  // the interactions carry the whole signal
  const double variance = interactions_only.logit_stddev * interactions_only.logit_stddev;
  int checked = 0;
  for (const auto& [f, g] : synth.interaction_pairs()) {
    for (uint32_t field : {f, g}) {
      if (synth.cardinality(field) > 2000) continue;
      const double flat = between_id_variance(field, batch);
      const double varying = between_id_variance(field, linear_batch);
      ASSERT_GE(flat, 0);
      EXPECT_LT(flat, 0.01 * variance) << "field " << field;
      EXPECT_GT(varying, 3 * flat) << "field " << field;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no interacting field with few ids; pick another seed";
}

TEST(CriteoSynthTest, GenerationSpeed) {
  const CriteoSynth synth = CreateOrDie(CriteoSynthOptions{});
  CriteoBatch batch;
  const uint64_t examples = 200000;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t begin = 0; begin < examples; begin += 4096) {
    synth.FillTrainRange(begin, std::min(begin + 4096, examples), batch);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ criteo  ] %llu examples in %.3f s: %.0f examples/s, %.2fM categorical ids/s (one core)\n",
              static_cast<unsigned long long>(examples), seconds, examples / seconds, examples * 26 / seconds / 1e6);
  // A timing is never a test assertion; only check the work happened.
  EXPECT_EQ(batch.size(), examples - 48 * 4096);  // the last, partial mini-batch
}

}  // namespace
}  // namespace tessera::examples
