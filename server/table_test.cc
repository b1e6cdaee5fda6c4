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

// Memory given back (server/table.h): rows dropped for good give their
// chunks, index slots and recency records back, and the rows left keep their
// values, keys and recency order.
TEST(TableTest, RowsEvictedByAgeGiveTheirMemoryBack) {
  auto c = Config(proto::SPARSE, proto::ADAGRAD, 8);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.1f);
  c.set_init_seed(7);
  c.set_evict_after_clocks(2);
  Table t(c, [](Key) { return true; });
  Table reference(c, [](Key) { return true; });  // the same pushes, never enough dropped to give back
  constexpr Key kRows = 200000;
  std::vector<Key> keys(kRows);
  for (Key k = 0; k < kRows; ++k) keys[k] = k * 7919;
  std::vector<float> grads(keys.size() * 8);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>(i % 97 + 1);  // (no zero: Adagrad of 0 at state 0 is NaN)
  ASSERT_TRUE(t.ApplyPush(keys, grads, /*clock=*/0).ok());
  // Every 50th row is touched again later, in a known order.
  std::vector<Key> kept, first_keys;
  std::vector<float> first_grads;
  for (Key k = kRows; k-- > 0;)
    if (k % 50 == 0) kept.push_back(keys[k]);
  for (Key k = 0; k < kRows; k += 50) {
    first_keys.push_back(keys[k]);
    first_grads.insert(first_grads.end(), grads.begin() + 8 * k, grads.begin() + 8 * k + 8);
  }
  ASSERT_TRUE(reference.ApplyPush(first_keys, first_grads, /*clock=*/0).ok());
  std::vector<float> kept_grads(kept.size() * 8, 0.5f);
  ASSERT_TRUE(t.ApplyPush(kept, kept_grads, /*clock=*/1).ok());
  ASSERT_TRUE(reference.ApplyPush(kept, kept_grads, /*clock=*/1).ok());
  const size_t chunks_full = t.chunks(), index_full = t.index_capacity();
  ASSERT_EQ(t.compactions(), 0u);
  ASSERT_EQ(t.num_rows(), kRows);
  // Clock 3: every row stamped 0 is too old and goes; 4,000 are left.
  const std::vector<Key> late = {1, 2, 3};
  ASSERT_TRUE(t.ApplyPush(late, std::vector<float>(late.size() * 8, 0.25f), /*clock=*/3).ok());
  ASSERT_TRUE(reference.ApplyPush(late, std::vector<float>(late.size() * 8, 0.25f), /*clock=*/3).ok());
  EXPECT_EQ(t.counters().evicted_by_age, kRows - kept.size());
  EXPECT_EQ(t.num_rows(), kept.size() + late.size());
  EXPECT_EQ(t.compactions(), 1u);
  EXPECT_EQ(t.row_slots(), t.num_rows()) << "the rows left fill the first slots";
  EXPECT_EQ(t.chunks(), (t.num_rows() + t.rows_per_chunk() - 1) / t.rows_per_chunk());
  EXPECT_LT(t.chunks(), chunks_full);
  EXPECT_LE(t.index_capacity(), 16384u) << "4,003 rows need at most 8,192 slots, with room to grow twice that";
  EXPECT_LT(t.index_capacity(), index_full);
  // The same rows, values and recency order as the table that never
  // gave anything back (its rows stamped 0 were never there).
  EXPECT_EQ(HeldRows(t), HeldRows(reference));
  // And it goes on alike: pushes, new rows into the freed room, eviction.
  std::vector<Key> more(10000);
  for (size_t i = 0; i < more.size(); ++i) more[i] = 1000000 + i;
  more.push_back(kept[5]);
  for (uint64_t clock : {4, 5}) {
    ASSERT_TRUE(t.ApplyPush(more, std::vector<float>(more.size() * 8, 0.125f), clock).ok());
    ASSERT_TRUE(reference.ApplyPush(more, std::vector<float>(more.size() * 8, 0.125f), clock).ok());
  }
  EXPECT_EQ(HeldRows(t), HeldRows(reference));
  std::vector<float> a(more.size() * 8), b(more.size() * 8);
  ASSERT_TRUE(t.ReadRows(more, a).ok());
  ASSERT_TRUE(reference.ReadRows(more, b).ok());
  EXPECT_EQ(a, b);
}

TEST(TableTest, ErasedRowsGiveTheirMemoryBackInATableWithoutEviction) {
  auto c = Config(proto::SPARSE, proto::SGD, 64);  // 16,384 rows a chunk
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.1f);
  c.set_init_seed(7);
  Table t(c, [](Key) { return true; });
  Table reference(c, [](Key) { return true; });
  std::vector<Key> keys(100000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(i);
  std::vector<float> grads(keys.size() * 64);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 13);
  ASSERT_TRUE(t.ApplyPush(keys, grads).ok());
  std::vector<Key> odd;
  std::vector<float> odd_grads;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] % 3 != 0) continue;
    odd.push_back(keys[i]);
    odd_grads.insert(odd_grads.end(), grads.begin() + 64 * i, grads.begin() + 64 * i + 64);
  }
  ASSERT_TRUE(reference.ApplyPush(odd, odd_grads).ok());
  const size_t chunks_full = t.chunks();
  EXPECT_EQ(t.EraseRows([](Key k) { return k % 3 != 0; }), keys.size() - odd.size());
  EXPECT_EQ(t.compactions(), 1u);
  EXPECT_EQ(t.row_slots(), odd.size());
  EXPECT_LT(t.chunks(), chunks_full);
  std::map<Key, std::vector<float>> got, want;
  for (auto& [k, row] : HeldRows(t)) got[k] = row;
  for (auto& [k, row] : HeldRows(reference)) want[k] = row;
  EXPECT_EQ(got, want);
  std::vector<float> a(odd.size() * 64), b(odd.size() * 64);
  ASSERT_TRUE(t.ReadRows(odd, a).ok());
  ASSERT_TRUE(reference.ReadRows(odd, b).ok());
  EXPECT_EQ(a, b);
}

// A row with a chunk of its own moves by its chunk: a view lent before
// keeps its bytes, and the table goes on with the row.
TEST(TableTest, AWideRowLentBeforeItMovesKeepsItsViewAndItsValues) {
  auto c = Config(proto::SPARSE, proto::ACCUMULATE, kLargeWidth);
  c.set_evict_after_clocks(1);
  Table t(c, [](Key) { return true; });
  for (Key k = 0; k < 8; ++k) ASSERT_TRUE(t.ApplyPush(std::vector<Key>{k}, std::vector<float>(kLargeWidth, 1.0f + k), 0).ok());
  // Key 7 (the last slot) is touched at clock 1 and lent.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{7}, std::vector<float>(kLargeWidth, 1.0f), 1).ok());
  auto lent = t.ReadRowsShared(std::vector<Key>{7}, nullptr);
  ASSERT_TRUE(lent.ok());
  // Clock 2: keys 0-6 are too old; key 7 moves to the first slot.
  ASSERT_TRUE(t.ApplyPush(std::vector<Key>{7}, std::vector<float>(kLargeWidth, 2.0f), 2).ok());
  EXPECT_EQ(t.compactions(), 1u);
  EXPECT_EQ(t.chunks(), 1u);
  EXPECT_EQ(t.num_rows(), 1u);
  for (float v : lent->As<float>()) ASSERT_EQ(v, 9.0f);
  std::vector<float> now(kLargeWidth);
  ASSERT_TRUE(t.ReadRows(std::vector<Key>{7}, now).ok());
  EXPECT_EQ(now, std::vector<float>(kLargeWidth, 11.0f));
}

}  // namespace
}  // namespace tessera
