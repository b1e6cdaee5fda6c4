// Sparse embedding tables: feature admission, eviction by age and under a
// memory budget, on scripted id streams with exact expected counts.
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/table.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kWidth = 2;

proto::TableConfig Sparse() {
  proto::TableConfig c;
  c.set_table_id(5);
  c.set_width(kWidth);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(proto::SGD);
  c.set_learning_rate(1.0f);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.1f);
  c.set_init_seed(3);
  return c;
}

std::vector<float> Row(Table& t, Key k) {
  std::vector<float> out(kWidth);
  EXPECT_TRUE(t.ReadRows(std::vector<Key>{k}, out).ok());
  return out;
}

std::vector<float> Initial(const proto::TableConfig& c, Key k) {
  std::vector<float> out(kWidth);
  for (uint32_t j = 0; j < kWidth; ++j) out[j] = InitialValue(c, k, j);
  return out;
}

absl::Status Push(Table& t, std::vector<Key> keys, float g = 1.0f, uint64_t clock = 0) {
  return t.ApplyPush(keys, std::vector<float>(keys.size() * kWidth, g), clock);
}

TEST(AdmissionTest, AnIdGetsARowOnItsNthPushAndEarlierPushesAreDroppedAndCounted) {
  proto::TableConfig c = Sparse();
  c.set_admit_after(3);
  c.set_admission_sketch_width(1 << 16);
  Table t(c, [](Key) { return true; });
  EXPECT_FALSE(t.pull_creates_rows());
  // Scripted stream: key 1 seen 4 times, key 2 three times, key 3 twice.
  ASSERT_TRUE(Push(t, {1, 2}).ok());  // 1:1 2:1
  ASSERT_TRUE(Push(t, {1, 3}).ok());  // 1:2 3:1
  EXPECT_EQ(t.num_rows(), 0u);
  EXPECT_EQ(t.counters().admission_dropped, 4u);
  ASSERT_TRUE(Push(t, {1, 2}).ok());  // 1:3 -> admitted; 2:2
  EXPECT_EQ(t.num_rows(), 1u);
  ASSERT_TRUE(Push(t, {1, 2, 3}).ok());  // 1 has a row; 2:3 -> admitted; 3:2
  EXPECT_EQ(t.num_rows(), 2u);
  EXPECT_EQ(t.counters().admitted, 2u);
  EXPECT_EQ(t.counters().admission_dropped, 6u);  // 1, 2, 1, 3, 2, 3
  // Key 1 was updated by its admitting push and the next (lr 1, g 1: -2).
  const std::vector<float> init1 = Initial(c, 1);
  EXPECT_THAT(Row(t, 1), ::testing::ElementsAre(init1[0] - 1.0f - 1.0f, init1[1] - 1.0f - 1.0f));
  const std::vector<float> init2 = Initial(c, 2);
  EXPECT_THAT(Row(t, 2), ::testing::ElementsAre(init2[0] - 1.0f, init2[1] - 1.0f));
  // A pull of a key not admitted reads its initializer and creates nothing.
  EXPECT_EQ(Row(t, 3), Initial(c, 3));
  EXPECT_EQ(Row(t, 99), Initial(c, 99));
  EXPECT_EQ(t.num_rows(), 2u);
}

TEST(AdmissionTest, WithoutAdmissionEveryPushCreatesItsRow) {
  Table t(Sparse(), [](Key) { return true; });
  EXPECT_TRUE(t.pull_creates_rows());
  ASSERT_TRUE(Push(t, {1, 2, 3}).ok());
  EXPECT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.counters().admitted, 0u);
  EXPECT_EQ(t.counters().admission_dropped, 0u);
}

TEST(EvictionTest, RowsUnusedForMoreThanTheTtlGoWhenTheClockAdvances) {
  proto::TableConfig c = Sparse();
  c.set_evict_after_clocks(2);
  Table t(c, [](Key) { return true; });
  ASSERT_TRUE(Push(t, {1}, 1.0f, /*clock=*/0).ok());
  ASSERT_TRUE(Push(t, {2}, 1.0f, 1).ok());
  ASSERT_TRUE(Push(t, {3}, 1.0f, 2).ok());  // 2 - 0 = 2: not more than the TTL
  EXPECT_EQ(t.num_rows(), 3u);
  ASSERT_TRUE(Push(t, {3}, 1.0f, 3).ok());  // 3 - 0 > 2: key 1 goes; key 2 (3 - 1) stays
  EXPECT_EQ(t.num_rows(), 2u);
  EXPECT_EQ(t.counters().evicted_by_age, 1u);
  // Clock 10: keys 2 and 3 are both too old and go before the push is
  // applied; the push then creates key 3 afresh.
  ASSERT_TRUE(Push(t, {3}, 1.0f, 10).ok());
  EXPECT_EQ(t.num_rows(), 1u);
  EXPECT_EQ(t.counters().evicted_by_age, 3u);
  const std::vector<float> init3 = Initial(c, 3);
  EXPECT_THAT(Row(t, 3), ::testing::ElementsAre(init3[0] - 1.0f, init3[1] - 1.0f));
  // An evicted key comes back freshly initialized (and is not lost to a pull:
  // pulls create nothing in a table with eviction).
  EXPECT_EQ(Row(t, 1), Initial(c, 1));
  EXPECT_EQ(t.num_rows(), 1u);
  ASSERT_TRUE(Push(t, {1}, 0.5f, 10).ok());
  const std::vector<float> init = Initial(c, 1);
  EXPECT_THAT(Row(t, 1), ::testing::ElementsAre(init[0] - 0.5f, init[1] - 0.5f));
  // An older stamp (a slower worker) does not move the clock back.
  ASSERT_TRUE(Push(t, {4}, 1.0f, 4).ok());
  EXPECT_EQ(t.clock(), 10u);
  EXPECT_EQ(t.num_rows(), 3u);
}

TEST(EvictionTest, TheLeastRecentlyPushedRowGoesFirstUnderTheBudget) {
  proto::TableConfig c = Sparse();
  c.set_memory_budget_bytes(1);  // (a row of a table with eviction costs more)
  c.set_memory_budget_bytes(3 * Table::RowBytes(c) + 7);  // room for 3 rows
  Table t(c, [](Key) { return true; });
  ASSERT_TRUE(Push(t, {1, 2, 3}).ok());
  ASSERT_TRUE(Push(t, {1}).ok());  // recency, oldest first: 2 3 1
  std::vector<float> pulled(kWidth);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{2}, pulled).ok());  // a pull changes no recency
  ASSERT_TRUE(Push(t, {4}).ok());  // evicts 2
  ASSERT_TRUE(Push(t, {5}).ok());  // evicts 3
  EXPECT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.counters().evicted_by_budget, 2u);
  std::vector<Key> held;
  t.ForEachRow([&](Key k, std::span<const float>) { held.push_back(k); });
  EXPECT_THAT(held, ::testing::ElementsAre(1, 4, 5));  // least recently used first
  EXPECT_EQ(Row(t, 2), Initial(c, 2));  // gone: reads as new
  const std::vector<float> init1 = Initial(c, 1);
  EXPECT_THAT(Row(t, 1), ::testing::ElementsAre(init1[0] - 1.0f - 1.0f, init1[1] - 1.0f - 1.0f));  // kept its updates
}

TEST(EvictionTest, TheBudgetIsNeverExceededOnAZipfStream) {
  proto::TableConfig c = Sparse();
  c.set_optimizer(proto::ADAGRAD);
  c.mutable_optimizer_params()->set_epsilon(1e-6f);
  c.set_evict_after_clocks(20);
  c.set_memory_budget_bytes(500 * Table::RowBytes(c));
  c.set_admit_after(2);
  Table t(c, [](Key) { return true; });
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  uint64_t max_rows = 0;
  for (int push = 0; push < 3000; ++push) {
    std::vector<Key> keys;
    for (int i = 0; i < 16; ++i) keys.push_back(static_cast<Key>(std::pow(1e5, u(rng))));  // log-uniform ids
    ASSERT_TRUE(Push(t, keys, 0.1f, push / 50).ok());
    ASSERT_LE(t.num_rows() * Table::RowBytes(c), c.memory_budget_bytes());
    max_rows = std::max<uint64_t>(max_rows, t.num_rows());
  }
  EXPECT_EQ(max_rows, 500u);  // the budget was reached ...
  EXPECT_GT(t.counters().evicted_by_budget, 0u);  // ... and held by eviction
  EXPECT_GT(t.counters().admitted, 500u);
}

TEST(EvictionTest, ReplicasApplyingTheSamePushesAgreeExactly) {
  proto::TableConfig c = Sparse();
  c.set_optimizer(proto::ADAM);
  auto* p = c.mutable_optimizer_params();
  p->set_beta1(0.9f);
  p->set_beta2(0.99f);
  p->set_epsilon(1e-8f);
  c.set_evict_after_clocks(3);
  c.set_memory_budget_bytes(64 * Table::RowBytes(c));
  c.set_admit_after(2);
  c.set_admission_sketch_width(64);  // collisions too: they must be the same on both
  Table a(c, [](Key) { return true; }), b(c, [](Key) { return true; });
  std::mt19937_64 rng(4);
  for (int push = 0; push < 2000; ++push) {
    std::vector<Key> keys;
    std::vector<float> values;
    for (int i = 0; i < 8; ++i) {
      keys.push_back(rng() % 300);
      values.push_back(static_cast<float>(rng() % 100) / 50.0f - 1.0f);
      values.push_back(0.5f);
    }
    const uint64_t clock = push / 40 + rng() % 2;
    ASSERT_TRUE(a.ApplyPush(keys, values, clock).ok());
    ASSERT_TRUE(b.ApplyPush(keys, values, clock).ok());
  }
  std::vector<std::pair<Key, std::vector<float>>> ra, rb;
  a.ForEachRow([&](Key k, std::span<const float> r) { ra.emplace_back(k, std::vector<float>(r.begin(), r.end())); });
  b.ForEachRow([&](Key k, std::span<const float> r) { rb.emplace_back(k, std::vector<float>(r.begin(), r.end())); });
  EXPECT_EQ(ra, rb);
  EXPECT_GT(a.counters().evicted_by_age + a.counters().evicted_by_budget, 0u);
  EXPECT_EQ(a.counters().admitted, b.counters().admitted);
}

TEST(EvictionTest, RestoredRowsRespectTheBudget) {
  proto::TableConfig c = Sparse();
  c.set_memory_budget_bytes(1);
  c.set_memory_budget_bytes(2 * Table::RowBytes(c));
  Table t(c, [](Key) { return true; });
  ASSERT_TRUE(t.RestoreRows(std::vector<Key>{1, 2, 3}, std::vector<float>{1, 1, 2, 2, 3, 3}).ok());
  EXPECT_EQ(t.num_rows(), 2u);
  EXPECT_EQ(Row(t, 3), (std::vector<float>{3, 3}));
  EXPECT_EQ(Row(t, 1), Initial(c, 1));  // the first restored went first
}

TEST(EmbeddingConfigTest, BadAdmissionAndEvictionOptionsAreErrors) {
  proto::TableConfig dense = Sparse();
  dense.set_kind(proto::DENSE);
  dense.set_dense_rows(10);
  dense.set_admit_after(2);
  EXPECT_THAT(ValidateTableConfig(dense).message(), HasSubstr("sparse tables only"));
  dense.set_admit_after(0);
  dense.set_evict_after_clocks(5);
  EXPECT_THAT(ValidateTableConfig(dense).message(), HasSubstr("sparse tables only"));

  proto::TableConfig small = Sparse();
  small.set_memory_budget_bytes(10);
  EXPECT_THAT(ValidateTableConfig(small).message(), HasSubstr("less than one row"));

  proto::TableConfig never = Sparse();
  never.set_admit_after(70000);
  EXPECT_THAT(ValidateTableConfig(never).message(), HasSubstr("admit_after"));

  proto::TableConfig wide = Sparse();
  wide.set_width(1u << 26);
  wide.set_optimizer(proto::ADAM);
  wide.mutable_optimizer_params()->set_beta1(0.9f);
  wide.mutable_optimizer_params()->set_beta2(0.99f);
  wide.mutable_optimizer_params()->set_epsilon(1e-8f);
  EXPECT_THAT(ValidateTableConfig(wide).message(), HasSubstr("floats a row"));

  proto::TableConfig huge = Sparse();
  huge.set_admit_after(2);
  huge.set_admission_sketch_width(uint64_t{1} << 40);
  EXPECT_THAT(ValidateTableConfig(huge).message(), HasSubstr("admission_sketch_width"));
}

TEST(EmbeddingConfigTest, RowBytesCountsStateIndexAndRecency) {
  proto::TableConfig c = Sparse();
  c.set_width(16);
  EXPECT_EQ(Table::RowBytes(c), 16 * 4 + Table::kIndexBytesPerRow);
  c.set_optimizer(proto::ADAGRAD);
  c.mutable_optimizer_params()->set_epsilon(1e-8f);
  c.set_memory_budget_bytes(1 << 20);
  EXPECT_EQ(Table::RowBytes(c), 32 * 4 + Table::kIndexBytesPerRow + Table::kRecencyBytesPerRow);
}

}  // namespace
}  // namespace tessera
