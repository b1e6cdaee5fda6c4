#include "server/table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <thread>
#include <vector>

namespace tessera {
namespace {

proto::TableConfig Config(proto::TableKind kind, proto::OptimizerKind opt, uint32_t width) {
  proto::TableConfig c;
  c.set_table_id(3);
  c.set_width(width);
  c.set_kind(kind);
  if (kind == proto::DENSE) c.set_dense_rows(10);
  c.set_optimizer(opt);
  c.set_learning_rate(0.5f);
  return c;
}

TEST(TableTest, AccumulateAddsExactly) {
  auto c = Config(proto::SPARSE, proto::ACCUMULATE, 2);
  Table t(c, [](Key) { return true; });
  std::vector<Key> keys = {7, 9, 7};
  std::vector<float> g = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(t.ApplyPush(keys, g).ok());
  std::vector<float> out(4);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{7, 9}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{6, 8, 3, 4}));
  EXPECT_EQ(t.num_rows(), 2u);
}

TEST(TableTest, SgdStepsAgainstTheGradient) {
  auto c = Config(proto::SPARSE, proto::SGD, 1);
  Table t(c, [](Key) { return true; });
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{1}, std::vector<float>{4}).ok());
  std::vector<float> out(1);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{1}, out).ok());
  EXPECT_FLOAT_EQ(out[0], -2.0f);
}

// A push of many keys is applied through a pipeline (lookups run ahead of
// the updates): it must end exactly as the same rows pushed one at a time,
// with keys repeated close together and far apart, keys new to the table
// (whose first copy creates the row a later copy, already looked up as
// absent, must find), pieces of rows, and admission counting every copy.
TEST(TableTest, ABigPushEndsAsTheSameRowsPushedOneByOne) {
  for (const auto opt : {proto::SGD, proto::ACCUMULATE, proto::ADAGRAD}) {
    for (const uint32_t admit_after : {0u, 2u}) {
      for (const bool piece : {false, true}) {
        auto c = Config(proto::SPARSE, opt, 8);
        c.set_admit_after(admit_after);
        c.mutable_optimizer_params()->set_epsilon(1e-6f);
        c.mutable_optimizer_params()->set_initial_accumulator(0.1f);
        if (piece && opt == proto::ADAGRAD) continue;  // pieces only where the optimizer updates pieces
        const Columns cols = piece ? Columns{2, 5} : Columns{};
        const uint32_t w = piece ? 5 : 8;
        Table big(c, [](Key) { return true; }), one(c, [](Key) { return true; });
        // 40 rows exist before; the push names 300 keys over 100 ids, so
        // most repeat, at distances from 1 to ~200.
        std::vector<Key> warm;
        for (Key k = 0; k < 40; ++k) warm.push_back(k * 7919);
        std::vector<float> warm_g(warm.size() * w, 0.25f);
        ASSERT_TRUE(big.ApplyPush(warm, warm_g, 0, cols).ok());
        ASSERT_TRUE(one.ApplyPush(warm, warm_g, 0, cols).ok());
        std::vector<Key> keys;
        std::vector<float> g;
        uint64_t x = 12345;
        for (int i = 0; i < 300; ++i) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          keys.push_back(((x >> 33) % 100) * 7919);
          for (uint32_t j = 0; j < w; ++j) g.push_back(static_cast<float>((i * 31 + j) % 17) - 8.0f);
        }
        ASSERT_TRUE(big.ApplyPush(keys, g, 0, cols).ok());
        if (opt == proto::ADAGRAD) {
          // A stateful optimizer steps once per key and push (repeats summed):
          // the reference is one push of each key's sum.
          std::map<Key, std::vector<float>> sums;
          for (size_t i = 0; i < keys.size(); ++i) {
            auto& s = sums.try_emplace(keys[i], w, 0.0f).first->second;
            for (uint32_t j = 0; j < w; ++j) s[j] += g[i * w + j];
          }
          for (const auto& [k, s] : sums) ASSERT_TRUE(one.ApplyPush(std::vector<Key>{k}, s, 0, cols).ok());
        } else {
          for (size_t i = 0; i < keys.size(); ++i) {
            ASSERT_TRUE(one.ApplyPush(std::vector<Key>{keys[i]},
                                      std::span<const float>(g).subspan(i * w, w), 0, cols)
                            .ok());
          }
        }
        EXPECT_EQ(big.num_rows(), one.num_rows()) << opt << " admit " << admit_after;
        EXPECT_EQ(big.counters().admission_dropped, one.counters().admission_dropped);
        std::vector<std::pair<Key, std::vector<float>>> a, b;
        big.ForEachRow([&](Key k, std::span<const float> r) { a.emplace_back(k, std::vector<float>(r.begin(), r.end())); });
        one.ForEachRow([&](Key k, std::span<const float> r) { b.emplace_back(k, std::vector<float>(r.begin(), r.end())); });
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        EXPECT_EQ(a, b) << "optimizer " << opt << ", admit after " << admit_after << ", piece " << piece;
      }
    }
  }
}

TEST(TableTest, DenseRejectsKeysItDoesNotHoldAndChangesNothing) {
  auto c = Config(proto::DENSE, proto::ACCUMULATE, 1);
  Table t(c, [](Key k) { return k % 2 == 0; });
  EXPECT_EQ(t.num_rows(), 5u);
  // Key 4 is held, key 3 is not: the whole push is refused.
  auto s = t.ApplyPush(std::vector<Key>{4, 3}, std::vector<float>{1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not held"), std::string::npos) << s;
  s = t.ApplyPush(std::vector<Key>{12}, std::vector<float>{1});
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
  std::vector<float> out(1);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{4}, out).ok());
  EXPECT_EQ(out[0], 0.0f);
}

TEST(TableTest, WrongValueCountIsAnError) {
  auto c = Config(proto::SPARSE, proto::ACCUMULATE, 4);
  Table t(c, [](Key) { return true; });
  EXPECT_FALSE(t.ApplyPush(std::vector<Key>{1, 2}, std::vector<float>(7)).ok());
  EXPECT_EQ(t.num_rows(), 0u);
  std::vector<float> out(3);
  EXPECT_FALSE(t.ReadRows(std::vector<Key>{1}, out).ok());
}

// 128 KiB rows: at least Table::kLendMinBytes, so a single-row read is lent.
constexpr uint32_t kLargeWidth = 1 << 15;
static_assert(kLargeWidth * sizeof(float) >= Table::kLendMinBytes);

TEST(TableTest, LargeRowIsLentAndCopiedOnWriteWhileLent) {
  auto c = Config(proto::DENSE, proto::ACCUMULATE, kLargeWidth);
  Table t(c, [](Key) { return true; });
  const std::vector<Key> key = {3};
  ASSERT_TRUE(t.ApplyPush(key, std::vector<float>(kLargeWidth, 1.0f)).ok());
  auto lent = t.ReadRowsShared(key, nullptr);
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->size(), kLargeWidth * sizeof(float));
  EXPECT_EQ(t.rows_lent(), 1u);
  // A push while the view lives goes to a copy; the view keeps the old bytes.
  ASSERT_TRUE(t.ApplyPush(key, std::vector<float>(kLargeWidth, 2.0f)).ok());
  EXPECT_EQ(t.copies_on_write(), 1u);
  for (float v : lent->As<float>()) ASSERT_EQ(v, 1.0f);
  std::vector<float> now(kLargeWidth);
  ASSERT_TRUE(t.ReadRows(key, now).ok());
  EXPECT_EQ(now, std::vector<float>(kLargeWidth, 3.0f));
  // Once every view is gone, pushes write in place again.
  lent = Buffer();
  ASSERT_TRUE(t.ApplyPush(key, std::vector<float>(kLargeWidth, 1.0f)).ok());
  EXPECT_EQ(t.copies_on_write(), 1u);
  ASSERT_TRUE(t.ReadRows(key, now).ok());
  EXPECT_EQ(now[0], 4.0f);
}

TEST(TableTest, LentRowOutlivesTheTableAndOtherThreadsMayDropIt) {
  auto c = Config(proto::SPARSE, proto::ACCUMULATE, kLargeWidth);
  std::optional<Buffer> view;
  {
    Table t(c, [](Key) { return true; });
    ASSERT_TRUE(t.ApplyPush(std::vector<Key>{42}, std::vector<float>(kLargeWidth, 5.0f)).ok());
    auto lent = t.ReadRowsShared(std::vector<Key>{42}, nullptr);
    ASSERT_TRUE(lent.ok());
    view = *lent;
    // A copy of the view dropped on another thread releases its loan too:
    // with only `view` left the row is still lent.
    Buffer other = *lent;
    lent = Buffer();
    std::thread([b = std::move(other)]() mutable { b = Buffer(); }).join();
    ASSERT_TRUE(t.ApplyPush(std::vector<Key>{42}, std::vector<float>(kLargeWidth, 1.0f)).ok());
    EXPECT_EQ(t.copies_on_write(), 1u);
  }
  for (float v : view->As<float>()) ASSERT_EQ(v, 5.0f);
}

TEST(TableTest, SmallRowsAndSeveralKeysAreCopied) {
  BufferPool pool;
  auto small = Config(proto::SPARSE, proto::ACCUMULATE, 4);
  Table s(small, [](Key) { return true; });
  ASSERT_TRUE(s.ApplyPush(std::vector<Key>{1}, std::vector<float>{1, 2, 3, 4}).ok());
  auto copy = s.ReadRowsShared(std::vector<Key>{1}, &pool);
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(s.ApplyPush(std::vector<Key>{1}, std::vector<float>{1, 1, 1, 1}).ok());
  EXPECT_EQ(std::vector<float>(copy->As<float>().begin(), copy->As<float>().end()),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(s.rows_lent(), 0u);
  EXPECT_EQ(s.copies_on_write(), 0u);

  auto large = Config(proto::SPARSE, proto::ACCUMULATE, kLargeWidth);
  Table l(large, [](Key) { return true; });
  ASSERT_TRUE(l.ApplyPush(std::vector<Key>{1}, std::vector<float>(kLargeWidth, 7.0f)).ok());
  auto two = l.ReadRowsShared(std::vector<Key>{2, 1}, &pool);  // key 2 is created (zeros)
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 2 * kLargeWidth * sizeof(float));
  EXPECT_EQ(two->As<float>()[0], 0.0f);
  EXPECT_EQ(two->As<float>()[kLargeWidth], 7.0f);
  EXPECT_EQ(l.rows_lent(), 0u);
  EXPECT_EQ(pool.misses(), 1u);
}

TEST(TableTest, ReadRowsSharedRejectsKeysItDoesNotHold) {
  auto c = Config(proto::DENSE, proto::ACCUMULATE, kLargeWidth);
  Table t(c, [](Key k) { return k != 4; });
  EXPECT_FALSE(t.ReadRowsShared(std::vector<Key>{4}, nullptr).ok());
  EXPECT_FALSE(t.ReadRowsShared(std::vector<Key>{11}, nullptr).ok());
  EXPECT_EQ(t.rows_lent(), 0u);
}

TEST(TableTest, CheckPushMatchesApplyPush) {
  auto c = Config(proto::DENSE, proto::ACCUMULATE, 2);
  Table t(c, [](Key) { return true; });
  EXPECT_TRUE(t.CheckPush(std::vector<Key>{1}, std::vector<float>{1, 2}).ok());
  EXPECT_FALSE(t.CheckPush(std::vector<Key>{1}, std::vector<float>{1}).ok());
  EXPECT_FALSE(t.CheckPush(std::vector<Key>{10}, std::vector<float>{1, 2}).ok());
  std::vector<float> out(2);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{1}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 0}));  // checking changes nothing
}

TEST(TableTest, InitializerDependsOnlyOnSeedTableAndKey) {
  auto c = Config(proto::SPARSE, proto::SGD, 8);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.1f);
  c.set_init_seed(42);
  Table a(c, [](Key) { return true; });
  Table b(c, [](Key) { return true; });
  std::vector<float> ra(16), rb(16);
  ASSERT_TRUE(a.ReadRows(std::vector<Key>{5, 6}, ra).ok());
  ASSERT_TRUE(b.ReadRows(std::vector<Key>{6, 5}, rb).ok());  // other touch order
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ra[i], rb[8 + i]);
    EXPECT_EQ(ra[8 + i], rb[i]);
    EXPECT_LE(std::fabs(ra[i]), 0.1f);
  }
  EXPECT_NE(ra[0], ra[8]);
}

TEST(TableTest, NormalInitializerHasTheRequestedSpread) {
  proto::TableConfig c = Config(proto::SPARSE, proto::SGD, 1);
  c.set_init(proto::NORMAL);
  c.set_init_scale(2.0f);
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int k = 0; k < n; ++k) {
    double v = InitialValue(c, k, 0);
    sum += v;
    sq += v * v;
  }
  double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(sd, 2.0, 0.1);
}

TEST(TableTest, ValidateRejectsBadConfigs) {
  auto ok = Config(proto::DENSE, proto::SGD, 4);
  EXPECT_TRUE(ValidateTableConfig(ok).ok());
  auto c = ok;
  c.set_width(0);
  EXPECT_FALSE(ValidateTableConfig(c).ok());
  c = ok;
  c.set_dense_rows(0);
  EXPECT_FALSE(ValidateTableConfig(c).ok());
  c = ok;
  c.set_learning_rate(NAN);
  EXPECT_FALSE(ValidateTableConfig(c).ok());
  c = ok;
  c.set_optimizer(static_cast<proto::OptimizerKind>(99));
  EXPECT_FALSE(ValidateTableConfig(c).ok());
  c = Config(proto::SPARSE, proto::SGD, 4);
  c.set_dense_rows(3);
  EXPECT_FALSE(ValidateTableConfig(c).ok());
}

// EraseRows: a state transfer replacing a backup's copy of some shards.

// The stored rows a table holds, in ForEachRow's order (least recently used
// first in a table with eviction); creates nothing.
std::vector<std::pair<Key, std::vector<float>>> HeldRows(const Table& t) {
  std::vector<std::pair<Key, std::vector<float>>> rows;
  t.ForEachRow([&](Key k, std::span<const float> row) {
    rows.emplace_back(k, std::vector<float>(row.begin(), row.end()));
  });
  return rows;
}

// The stored row of `key` in `t`, or empty when it has none.
std::vector<float> HeldRow(const Table& t, Key key) {
  for (auto& [k, row] : HeldRows(t))
    if (k == key) return row;
  return {};
}

proto::TableConfig SparseWithInit() {
  auto c = Config(proto::SPARSE, proto::SGD, 2);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.1f);
  c.set_init_seed(7);
  return c;
}

TEST(TableTest, EraseRowsDropsTheSelectedSparseRowsAndTheyComeBackFresh) {
  const auto c = SparseWithInit();
  Table t(c, [](Key) { return true; });
  const std::vector<Key> keys = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(t.ApplyPush(keys, std::vector<float>(keys.size() * 2, 1.0f)).ok());
  const auto before = HeldRows(t);
  ASSERT_EQ(before.size(), keys.size());
  EXPECT_EQ(t.EraseRows([](Key k) { return k % 2 == 0; }), 3u);
  EXPECT_EQ(t.num_rows(), 3u);
  std::map<Key, std::vector<float>> kept;
  for (auto& [k, row] : HeldRows(t)) kept[k] = row;
  std::map<Key, std::vector<float>> want;
  for (auto& [k, row] : before)
    if (k % 2 != 0) want[k] = row;
  EXPECT_EQ(kept, want) << "the rows not selected changed";
  // Selecting nothing drops nothing.
  EXPECT_EQ(t.EraseRows([](Key) { return false; }), 0u);
  EXPECT_EQ(t.num_rows(), 3u);
  // A dropped key pushed again starts from its initializer, as in a table
  // that never had it; a kept one goes on from where it was.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{2, 3}, std::vector<float>(4, 0.5f)).ok());
  Table fresh(c, [](Key) { return true; });
  ASSERT_TRUE(fresh.ApplyPush(std::vector<Key>{2}, std::vector<float>(2, 0.5f)).ok());
  EXPECT_EQ(HeldRow(t, 2), HeldRow(fresh, 2));
  Table twice(c, [](Key) { return true; });
  ASSERT_TRUE(twice.ApplyPush(std::vector<Key>{3}, std::vector<float>(2, 1.0f)).ok());
  ASSERT_TRUE(twice.ApplyPush(std::vector<Key>{3}, std::vector<float>(2, 0.5f)).ok());
  EXPECT_EQ(HeldRow(t, 3), HeldRow(twice, 3));
  EXPECT_EQ(t.num_rows(), 4u);
  // And the slots of dropped rows are reused without disturbing the others.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{4, 6, 7}, std::vector<float>(6, 1.0f)).ok());
  EXPECT_EQ(t.num_rows(), 7u);
  EXPECT_EQ(HeldRow(t, 1), want.at(1));
  EXPECT_EQ(HeldRow(t, 5), want.at(5));
}

TEST(TableTest, EraseRowsInATableWithEvictionKeepsTheRecencyOrder) {
  auto c = SparseWithInit();
  c.set_evict_after_clocks(2);
  Table t(c, [](Key) { return true; });
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{1, 2}, std::vector<float>(4, 1.0f), /*clock=*/0).ok());
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{3, 4}, std::vector<float>(4, 1.0f), 1).ok());
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{5, 6}, std::vector<float>(4, 1.0f), 2).ok());
  ASSERT_EQ(t.num_rows(), 6u);
  // The least recently used row (1), the most recently used (6) and one between.
  EXPECT_EQ(t.EraseRows([](Key k) { return k == 1 || k == 4 || k == 6; }), 3u);
  EXPECT_EQ(t.num_rows(), 3u);
  EXPECT_EQ(t.counters().evicted_by_age, 0u) << "an erased row is not an eviction";
  EXPECT_EQ(t.counters().evicted_by_budget, 0u);
  std::vector<Key> order;
  for (auto& [k, row] : HeldRows(t)) order.push_back(k);
  EXPECT_EQ(order, (std::vector<Key>{2, 3, 5}));
  // Eviction by age goes on over what is left: at clock 3 key 2 (stamped 0)
  // goes; key 4 comes back fresh.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{4}, std::vector<float>(2, 0.5f), 3).ok());
  EXPECT_EQ(t.counters().evicted_by_age, 1u);
  order.clear();
  for (auto& [k, row] : HeldRows(t)) order.push_back(k);
  EXPECT_EQ(order, (std::vector<Key>{3, 5, 4}));
  Table fresh(c, [](Key) { return true; });
  ASSERT_TRUE(fresh.ApplyPush(std::vector<Key>{4}, std::vector<float>(2, 0.5f), 3).ok());
  EXPECT_EQ(HeldRow(t, 4), HeldRow(fresh, 4));
  // Every row left is evicted in turn, and only those.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{1}, std::vector<float>(2, 1.0f), 10).ok());
  EXPECT_EQ(t.counters().evicted_by_age, 4u);
  order.clear();
  for (auto& [k, row] : HeldRows(t)) order.push_back(k);
  EXPECT_EQ(order, (std::vector<Key>{1}));
}

TEST(TableTest, EraseRowsLeavesDenseRows) {
  auto c = Config(proto::DENSE, proto::ACCUMULATE, 1);
  Table t(c, [](Key k) { return k < 6; });
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{0, 3}, std::vector<float>{1, 2}).ok());
  const auto before = HeldRows(t);
  EXPECT_EQ(t.EraseRows([](Key) { return true; }), 0u);
  EXPECT_EQ(t.num_rows(), 6u);
  EXPECT_EQ(HeldRows(t), before);
  std::vector<float> out(2);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{0, 3}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace tessera
