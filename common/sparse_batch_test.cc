#include "common/sparse_batch.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Key> Unique(const SparseBatch& b) { return {b.unique().begin(), b.unique().end()}; }
std::vector<uint32_t> Inverse(const SparseBatch& b) { return {b.inverse().begin(), b.inverse().end()}; }

TEST(SparseBatchTest, UniqueKeysInFirstOccurrenceOrderAndInverse) {
  const std::vector<Key> keys = {42, 7, 42, 1000000000000ULL, 7, 7, 3};
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(Unique(*b), ElementsAre(42, 7, 1000000000000ULL, 3));
  EXPECT_THAT(Inverse(*b), ElementsAre(0, 1, 0, 2, 1, 1, 3));
  EXPECT_EQ(b->positions(), keys.size());
}

TEST(SparseBatchTest, EmptyBatch) {
  absl::StatusOr<SparseBatch> b = SparseBatch::Build({});
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->unique().empty());
  EXPECT_TRUE(b->inverse().empty());
  EXPECT_TRUE(b->Gather({}, 3, {}).ok());
  EXPECT_TRUE(b->ScatterAdd({}, 3, {}).ok());
}

TEST(SparseBatchTest, AllPositionsShareOneKey) {
  const std::vector<Key> keys(5, 9);
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(Unique(*b), ElementsAre(9));
  EXPECT_THAT(Inverse(*b), ElementsAre(0, 0, 0, 0, 0));
}

TEST(SparseBatchTest, GatherExpandsUniqueRowsToEveryPosition) {
  const std::vector<Key> keys = {5, 6, 5, 8};
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok());
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6};  // width 2: key 5, 6, 8
  std::vector<float> out(8, -1);
  ASSERT_TRUE(b->Gather(rows, 2, out).ok());
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4, 1, 2, 5, 6));
}

TEST(SparseBatchTest, ScatterAddSumsDuplicatesAndOverwrites) {
  const std::vector<Key> keys = {5, 6, 5, 8, 5};
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok());
  const std::vector<float> grads = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50};
  std::vector<float> unique(6, 99);  // stale contents must not leak into the sums
  ASSERT_TRUE(b->ScatterAdd(grads, 2, unique).ok());
  EXPECT_THAT(unique, ElementsAre(9, 90, 2, 20, 4, 40));
}

TEST(SparseBatchTest, WidthOneFastPath) {
  const std::vector<Key> keys = {3, 1, 3, 3};
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok());
  std::vector<float> out(4);
  ASSERT_TRUE(b->Gather(std::vector<float>{0.5f, 1.5f}, 1, out).ok());
  EXPECT_THAT(out, ElementsAre(0.5f, 1.5f, 0.5f, 0.5f));
  std::vector<float> unique(2);
  ASSERT_TRUE(b->ScatterAdd(std::vector<float>{1, 2, 3, 4}, 1, unique).ok());
  EXPECT_THAT(unique, ElementsAre(8, 2));
}

TEST(SparseBatchTest, SizeMismatchesFailAndWriteNothing) {
  const std::vector<Key> keys = {1, 2, 1};
  absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
  ASSERT_TRUE(b.ok());
  std::vector<float> out(6, -1);
  absl::Status s = b->Gather(std::vector<float>(3), 2, out);  // needs 2 rows of 2
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unique_rows needs 2 rows of 2 floats (4), got 3"));
  EXPECT_THAT(out, ElementsAre(-1, -1, -1, -1, -1, -1));

  s = b->Gather(std::vector<float>(4), 2, std::span<float>(out).first(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("out needs 3 rows"));

  std::vector<float> unique(4, -1);
  s = b->ScatterAdd(std::vector<float>(5), 2, unique);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unique, ElementsAre(-1, -1, -1, -1));
  s = b->ScatterAdd(std::vector<float>(6), 2, std::span<float>(unique).first(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(b->Gather(std::vector<float>(4), 0, out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ScatterAdd(std::vector<float>(6), 0, unique).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SparseBatchTest, ResetReplacesThePreviousBatch) {
  SparseBatch b;
  ASSERT_TRUE(b.Reset(std::vector<Key>{1, 2, 3, 1}).ok());
  ASSERT_TRUE(b.Reset(std::vector<Key>{3, 3, 4}).ok());
  EXPECT_THAT(Unique(b), ElementsAre(3, 4));
  EXPECT_THAT(Inverse(b), ElementsAre(0, 0, 1));
}

// Against a naive reference on random batches with many duplicates, for
// several widths: the contract's equations hold position by position.
TEST(SparseBatchTest, MatchesNaiveReferenceOnRandomBatches) {
  std::mt19937_64 rng(12345);
  for (uint32_t width : {1u, 3u, 16u}) {
    for (int round = 0; round < 20; ++round) {
      const size_t n = 1 + rng() % 2000;
      const uint64_t distinct = 1 + rng() % 300;
      std::vector<Key> keys(n);
      for (Key& k : keys) k = (rng() % distinct) * 0x9e3779b97f4a7c15ULL;  // spread over 64 bits
      absl::StatusOr<SparseBatch> b = SparseBatch::Build(keys);
      ASSERT_TRUE(b.ok());

      std::map<Key, size_t> first;  // reference: key -> index of first occurrence order
      std::vector<Key> ref_unique;
      for (Key k : keys) {
        if (first.try_emplace(k, ref_unique.size()).second) ref_unique.push_back(k);
      }
      ASSERT_EQ(Unique(*b), ref_unique);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(b->unique()[b->inverse()[i]], keys[i]);

      std::vector<float> rows(ref_unique.size() * width);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i) * 0.25f;
      std::vector<float> out(n * width);
      ASSERT_TRUE(b->Gather(rows, width, out).ok());
      for (size_t i = 0; i < n; ++i) {
        for (uint32_t j = 0; j < width; ++j) {
          ASSERT_EQ(out[i * width + j], rows[first[keys[i]] * width + j]);
        }
      }

      std::vector<float> grads(n * width);
      for (float& g : grads) g = static_cast<float>(rng() % 1000) / 8.0f;  // exact sums in fp32
      std::vector<float> sums(ref_unique.size() * width);
      ASSERT_TRUE(b->ScatterAdd(grads, width, sums).ok());
      std::vector<double> ref(sums.size(), 0.0);
      for (size_t i = 0; i < n; ++i) {
        for (uint32_t j = 0; j < width; ++j) ref[first[keys[i]] * width + j] += grads[i * width + j];
      }
      for (size_t i = 0; i < sums.size(); ++i) ASSERT_EQ(static_cast<double>(sums[i]), ref[i]);
    }
  }
}

}  // namespace
}  // namespace tessera
