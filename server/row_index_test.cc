#include "server/row_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <deque>
#include <list>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "server/table.h"

namespace tessera {
namespace {

constexpr Key kAllOnes = ~Key{0};

// Checks that the index holds exactly the model's entries.
void ExpectSameAs(const RowIndex& index, const std::unordered_map<Key, uint32_t>& model) {
  ASSERT_EQ(index.size(), model.size());
  size_t visited = 0;
  index.ForEach([&](Key k, uint32_t row) {
    ++visited;
    auto it = model.find(k);
    ASSERT_NE(it, model.end()) << "key " << k << " is not in the model";
    EXPECT_EQ(it->second, row) << "key " << k;
  });
  EXPECT_EQ(visited, model.size());
  for (const auto& [k, row] : model) {
    EXPECT_EQ(index.Find(k), row) << "key " << k;
    EXPECT_EQ(index.Find(k, RowIndex::Hash(k)), row) << "key " << k;
  }
  const size_t cap = index.capacity();
  EXPECT_EQ(cap & (cap - 1), 0u) << cap;
  EXPECT_LE(index.size() * RowIndex::kMaxLoadDenominator, cap * RowIndex::kMaxLoadNumerator);
}

// Keys whose home slot in an index of `capacity` slots is `home`.
std::vector<Key> KeysWithHome(size_t capacity, size_t home, size_t count, Key start = 1) {
  const int shift = 64 - std::countr_zero(capacity);
  std::vector<Key> keys;
  for (Key k = start; keys.size() < count; ++k)
    if ((RowIndex::Hash(k) >> shift) == home) keys.push_back(k);
  return keys;
}

TEST(RowIndexTest, AnEmptyIndexFindsNothingNotEvenTheEmptyMarkerValues) {
  RowIndex index;
  EXPECT_EQ(index.size(), 0u);
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.capacity(), RowIndex::kMinCapacity);
  for (Key k : {Key{0}, Key{1}, kAllOnes, kAllOnes - 1}) {
    EXPECT_EQ(index.Find(k), RowIndex::kNoRow) << k;
    EXPECT_FALSE(index.Contains(k)) << k;
    EXPECT_FALSE(index.Erase(k)) << k;
  }
  size_t visited = 0;
  index.ForEach([&](Key, uint32_t) { ++visited; });
  EXPECT_EQ(visited, 0u);
}

TEST(RowIndexTest, ZeroAndAllOnesAreOrdinaryKeys) {
  RowIndex index;
  EXPECT_TRUE(index.Insert(kAllOnes, 7));
  EXPECT_EQ(index.Find(kAllOnes), 7u);
  EXPECT_EQ(index.Find(0), RowIndex::kNoRow);
  EXPECT_TRUE(index.Insert(0, 0));  // row 0 is a row number like any other
  EXPECT_EQ(index.Find(0), 0u);
  EXPECT_TRUE(index.Insert(kAllOnes - 1, 9));
  EXPECT_EQ(index.size(), 3u);
  EXPECT_FALSE(index.Insert(kAllOnes, 8));  // present: keeps its row
  EXPECT_EQ(index.Find(kAllOnes), 7u);
  EXPECT_TRUE(index.Erase(kAllOnes));
  EXPECT_EQ(index.Find(kAllOnes), RowIndex::kNoRow);
  EXPECT_EQ(index.Find(0), 0u);
  EXPECT_EQ(index.Find(kAllOnes - 1), 9u);
  EXPECT_TRUE(index.Insert(kAllOnes, 3));  // back after its erase
  EXPECT_EQ(index.Find(kAllOnes), 3u);
  EXPECT_TRUE(index.Erase(0));
  EXPECT_FALSE(index.Erase(0));
  EXPECT_EQ(index.size(), 2u);
  // The largest row number there is.
  EXPECT_TRUE(index.Insert(12345, RowIndex::kNoRow - 1));
  EXPECT_EQ(index.Find(12345), RowIndex::kNoRow - 1);
}

TEST(RowIndexTest, InsertingKNoRowIsABrokenInvariant) {
  RowIndex index;
  EXPECT_DEATH(index.Insert(5, RowIndex::kNoRow), "kNoRow is not a row number");
}

TEST(RowIndexTest, GrowsAtThreeQuartersAndKeepsEveryEntry) {
  RowIndex index;
  std::unordered_map<Key, uint32_t> model;
  size_t last_capacity = index.capacity();
  for (uint32_t i = 0; i < 5000; ++i) {
    const Key k = i * 0x9e3779b97f4a7c15ULL;  // includes key 0
    ASSERT_TRUE(index.Insert(k, i));
    model.emplace(k, i);
    if (index.capacity() != last_capacity) {
      EXPECT_EQ(index.capacity(), last_capacity * 2);
      // It grew because the entry would have passed 3/4 of the old slots.
      EXPECT_GT(index.size() * 4, last_capacity * 3);
      last_capacity = index.capacity();
      ExpectSameAs(index, model);
    }
  }
  ExpectSameAs(index, model);
  EXPECT_EQ(index.capacity(), 8192u);  // 5000 <= 6144
}

TEST(RowIndexTest, ReserveMakesRoomOnceAndNeverShrinks) {
  RowIndex index;
  index.Reserve(3000);
  EXPECT_EQ(index.capacity(), 4096u);  // 3000 <= 3072
  for (uint32_t i = 0; i < 3000; ++i) ASSERT_TRUE(index.Insert(Mix64(i), i));
  EXPECT_EQ(index.capacity(), 4096u);
  index.Reserve(10);
  EXPECT_EQ(index.capacity(), 4096u);
  for (uint32_t i = 0; i < 3000; ++i) ASSERT_TRUE(index.Erase(Mix64(i)));
  EXPECT_EQ(index.capacity(), 4096u);
  EXPECT_TRUE(index.empty());
}

TEST(RowIndexTest, EraseKeepsTheRunsOfCollidingKeysFindable) {
  // Many keys with one home slot, some with the next: erasing any of them
  // must shift the later ones back without losing one.
  RowIndex index;
  index.Reserve(40);  // 64 slots: no growth below
  ASSERT_EQ(index.capacity(), 64u);
  std::vector<Key> same = KeysWithHome(64, 10, 8);
  std::vector<Key> next = KeysWithHome(64, 11, 4);
  std::unordered_map<Key, uint32_t> model;
  uint32_t row = 0;
  for (size_t i = 0; i < 8; ++i) {
    model[same[i]] = row;
    ASSERT_TRUE(index.Insert(same[i], row++));
    if (i < 4) {
      model[next[i]] = row;
      ASSERT_TRUE(index.Insert(next[i], row++));
    }
  }
  EXPECT_EQ(index.Probes().max_displacement, 11u);
  for (size_t victim : {0, 5, 3, 7}) {
    ASSERT_TRUE(index.Erase(same[victim]));
    model.erase(same[victim]);
    ExpectSameAs(index, model);
  }
  ASSERT_TRUE(index.Erase(next[0]));
  model.erase(next[0]);
  ExpectSameAs(index, model);
  // The run is packed again: 7 entries from slot 10, none further than that.
  EXPECT_LE(index.Probes().max_displacement, 6u);
}

TEST(RowIndexTest, RunsWrapAroundTheEndOfTheSlots) {
  RowIndex index;
  ASSERT_EQ(index.capacity(), 16u);
  std::vector<Key> last = KeysWithHome(16, 15, 5);
  std::vector<Key> first = KeysWithHome(16, 0, 3);
  std::unordered_map<Key, uint32_t> model;
  uint32_t row = 1;
  for (const auto& keys : {last, first}) {
    for (Key k : keys) {
      model[k] = row;
      ASSERT_TRUE(index.Insert(k, row++));
    }
  }
  ASSERT_EQ(index.capacity(), 16u);
  ExpectSameAs(index, model);
  // Erase from the part before the end of the slots and after it.
  for (Key k : {last[1], first[0], last[0], first[2]}) {
    ASSERT_TRUE(index.Erase(k));
    model.erase(k);
    ExpectSameAs(index, model);
  }
}

TEST(RowIndexTest, RandomOperationsAgreeWithAStdUnorderedMap) {
  for (uint64_t seed : {1, 2, 3, 4}) {
    std::mt19937_64 rng(seed);
    RowIndex index;
    std::unordered_map<Key, uint32_t> model;
    // A small key domain (so keys come back after their erase), with 0 and
    // ~0 in it; later, a wide one (so the index grows).
    std::vector<Key> domain = {0, kAllOnes, kAllOnes - 1, 1};
    for (int i = 0; i < 300; ++i) domain.push_back(rng());
    for (int step = 0; step < 60000; ++step) {
      const bool wide = step > 30000;
      const Key k = wide && rng() % 2 ? rng() : domain[rng() % domain.size()];
      const uint32_t row = static_cast<uint32_t>(rng() % (uint64_t{RowIndex::kNoRow}));
      switch (rng() % 5) {
        case 0:
        case 1: {
          const bool fresh = model.emplace(k, row).second;
          ASSERT_EQ(index.Insert(k, row), fresh) << "seed " << seed << " step " << step;
          break;
        }
        case 2:
        case 3:
          ASSERT_EQ(index.Erase(k), model.erase(k) == 1) << "seed " << seed << " step " << step;
          break;
        default: {
          auto it = model.find(k);
          ASSERT_EQ(index.Find(k), it == model.end() ? RowIndex::kNoRow : it->second)
              << "seed " << seed << " step " << step;
        }
      }
      ASSERT_EQ(index.size(), model.size());
      if (step % 5000 == 0) ExpectSameAs(index, model);
    }
    ExpectSameAs(index, model);
    // Empty it completely, then fill it again.
    std::vector<Key> keys;
    for (const auto& [k, row] : model) keys.push_back(k);
    for (Key k : keys) ASSERT_TRUE(index.Erase(k));
    model.clear();
    ExpectSameAs(index, model);
    for (Key k : domain) {
      ASSERT_TRUE(index.Insert(k, 1));
      model[k] = 1;
    }
    ExpectSameAs(index, model);
  }
}

TEST(RowIndexTest, EvictionChurnDoesNotDegradeTheProbes) {
  // The table at its memory budget: every new key drops the oldest one and
  // its row number is reused. Without tombstones the probes stay as short
  // as in a fresh index, and the index does not grow.
  constexpr size_t kLive = 20000;
  RowIndex index;
  std::deque<std::pair<Key, uint32_t>> lru;
  std::unordered_map<Key, uint32_t> model;
  std::mt19937_64 rng(7);
  for (uint32_t r = 0; r < kLive; ++r) {
    const Key k = rng();
    ASSERT_TRUE(index.Insert(k, r));
    model[k] = r;
    lru.emplace_back(k, r);
  }
  const size_t capacity = index.capacity();
  const double fresh = index.Probes().mean_displacement;
  for (int i = 0; i < 400000; ++i) {
    auto [old_key, row] = lru.front();
    lru.pop_front();
    ASSERT_TRUE(index.Erase(old_key));
    model.erase(old_key);
    const Key k = rng();
    ASSERT_TRUE(index.Insert(k, row));
    model[k] = row;
    lru.emplace_back(k, row);
  }
  ExpectSameAs(index, model);
  EXPECT_EQ(index.capacity(), capacity);
  EXPECT_LT(index.Probes().mean_displacement, 2 * fresh + 0.5);
}

TEST(RowIndexTest, TheKeysOfOneShardSpreadOverTheWholeIndex) {
  // A server holds the keys of a few virtual shards, chosen by a hash of the
  // key. The index's hash must not cluster them.
  RowIndex index;
  size_t n = 0;
  for (Key k = 0; n < 100000; ++k) {
    if (VirtualShardOf(0, k, 1024) != 7) continue;
    ASSERT_TRUE(index.Insert(k, static_cast<uint32_t>(n++)));
  }
  const RowIndex::ProbeStats stats = index.Probes();
  // Linear probing of random keys at this load (100000 / 262144 = 0.38):
  // a mean displacement of about 0.3, a longest run of a few tens.
  EXPECT_LT(stats.mean_displacement, 0.6);
  EXPECT_LT(stats.max_displacement, 64u);
  // Consecutive ids (DENSE tables) too.
  RowIndex dense;
  for (uint32_t k = 0; k < 100000; ++k) ASSERT_TRUE(dense.Insert(k, k));
  EXPECT_LT(dense.Probes().mean_displacement, 0.6);
  EXPECT_LT(dense.Probes().max_displacement, 64u);
}

TEST(RowIndexTest, TwoIndexesBuiltAlikeIterateAlike) {
  RowIndex a, b;
  for (uint32_t i = 0; i < 1000; ++i) {
    a.Insert(Mix64(i), i);
    b.Insert(Mix64(i), i);
    if (i % 3 == 0) {
      a.Erase(Mix64(i / 2));
      b.Erase(Mix64(i / 2));
    }
  }
  std::vector<std::pair<Key, uint32_t>> order_a, order_b;
  a.ForEach([&](Key k, uint32_t r) { order_a.emplace_back(k, r); });
  b.ForEach([&](Key k, uint32_t r) { order_b.emplace_back(k, r); });
  EXPECT_EQ(order_a, order_b);
}

TEST(RowIndexTest, ALargeIndexAgreesWithTheModel) {
  constexpr uint32_t kEntries = 3'000'000;
  RowIndex index;
  std::unordered_map<Key, uint32_t> model;
  model.reserve(kEntries);
  std::mt19937_64 rng(11);
  for (uint32_t i = 0; i < kEntries; ++i) {
    const Key k = rng();
    if (model.emplace(k, i).second) {
      ASSERT_TRUE(index.Insert(k, i));
    }
  }
  EXPECT_EQ(index.capacity(), size_t{1} << 22);  // 3M <= 3/4 of 4M
  ExpectSameAs(index, model);
  // Erase every other entry, then put half of them back with new rows.
  std::vector<Key> erased;
  for (auto it = model.begin(); it != model.end();) {
    if (it->second % 2 == 0) {
      ASSERT_TRUE(index.Erase(it->first));
      erased.push_back(it->first);
      it = model.erase(it);
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < erased.size(); i += 2) {
    ASSERT_TRUE(index.Insert(erased[i], static_cast<uint32_t>(i)));
    model[erased[i]] = static_cast<uint32_t>(i);
  }
  for (size_t i = 1; i < erased.size(); i += 2) ASSERT_EQ(index.Find(erased[i]), RowIndex::kNoRow);
  ExpectSameAs(index, model);
  // Keys never inserted are absent.
  std::mt19937_64 other(12);
  for (int i = 0; i < 100000; ++i) {
    const Key k = other();
    ASSERT_EQ(index.Find(k), model.count(k) ? model[k] : RowIndex::kNoRow);
  }
}

TEST(RowIndexTest, PrefetchIsHarmlessAtAnyHash) {
  RowIndex index;
  for (uint64_t h : {uint64_t{0}, ~uint64_t{0}, RowIndex::Hash(5)}) index.Prefetch(h);
  ASSERT_TRUE(index.Insert(5, 1));
  const uint64_t h = RowIndex::Hash(5);
  index.Prefetch(h);
  for (uint32_t i = 0; i < 100; ++i) index.Insert(1000 + i, i);  // grows; the hash stays valid
  EXPECT_EQ(index.Find(5, h), 1u);
}

// ---- The index inside a Table: batched pulls and eviction ----

proto::TableConfig SparseConfig(uint32_t width) {
  proto::TableConfig c;
  c.set_table_id(4);
  c.set_width(width);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(proto::SGD);
  c.set_learning_rate(1.0f);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(1.0f);
  c.set_init_seed(17);
  return c;
}

// The row a key should read: the restored values for a key in `restored`,
// else the initializer's.
std::vector<float> Expected(const proto::TableConfig& c, const std::unordered_map<Key, std::vector<float>>& restored,
                            Key k) {
  if (auto it = restored.find(k); it != restored.end()) return it->second;
  std::vector<float> row(c.width());
  for (uint32_t j = 0; j < c.width(); ++j) row[j] = InitialValue(c, k, j);
  return row;
}

TEST(TableRowIndexTest, BatchedPullsOfEveryLengthReadTheRightRows) {
  // Batches around the pipeline's distances and ring size, with keys held,
  // keys never seen (a pull creates them here), 0 and ~0, and a key listed
  // again near and far from its first listing.
  for (uint32_t width : {1u, 16u, 64u, 100u}) {
    const proto::TableConfig c = SparseConfig(width);
    Table t(c, [](Key) { return true; });
    ASSERT_TRUE(t.pull_creates_rows());
    std::mt19937_64 rng(width);
    std::unordered_map<Key, std::vector<float>> restored;
    std::vector<Key> held = {0, kAllOnes};
    for (int i = 0; i < 3000; ++i) held.push_back(rng());
    std::vector<float> values;
    for (Key k : held) {
      std::vector<float> row(width);
      for (float& v : row) v = static_cast<float>(rng() % 1000);
      restored[k] = row;
      values.insert(values.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(t.RestoreRows(held, values).ok());
    std::set<Key> has_row(held.begin(), held.end());
    for (size_t n : {0, 1, 2, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 129, 1000, 5000}) {
      std::vector<Key> keys(n);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t kind = rng() % 4;
        if (kind == 0) {
          keys[i] = rng();  // never seen
        } else if (kind == 1) {
          keys[i] = i > 0 ? keys[rng() % i] : held[0];  // listed again
        } else {
          keys[i] = held[rng() % held.size()];
        }
      }
      for (Key k : keys) has_row.insert(k);
      std::vector<float> out(n * width, -1.0f);
      ASSERT_TRUE(t.ReadRows(keys, out).ok());
      for (size_t i = 0; i < n; ++i) {
        const std::vector<float> want = Expected(c, restored, keys[i]);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin() + i * width))
            << "width " << width << " batch " << n << " key #" << i;
      }
      EXPECT_EQ(t.num_rows(), has_row.size()) << "width " << width << " batch " << n;
      EXPECT_EQ(t.CountAbsent(keys), 0u);
    }
  }
}

TEST(TableRowIndexTest, PullsOfATableWithEvictionCreateNothing) {
  proto::TableConfig c = SparseConfig(16);
  c.set_evict_after_clocks(1000);
  Table t(c, [](Key) { return true; });
  ASSERT_FALSE(t.pull_creates_rows());
  std::vector<Key> pushed;
  for (Key k = 0; k < 500; ++k) pushed.push_back(Mix64(k));
  pushed.push_back(kAllOnes);
  ASSERT_TRUE(t.ApplyPush(pushed, std::vector<float>(pushed.size() * 16, 1.0f)).ok());  // rows: initial - 1
  std::vector<Key> keys;
  for (int i = 0; i < 700; ++i) keys.push_back(i % 2 ? pushed[(i * 7) % pushed.size()] : Mix64(100000 + i));
  keys.push_back(0);  // pushed (Mix64(0) == 0)
  keys.push_back(1);  // never pushed
  const std::set<Key> pushed_set(pushed.begin(), pushed.end());
  std::vector<float> out(keys.size() * 16);
  ASSERT_TRUE(t.ReadRows(keys, out).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool held = pushed_set.count(keys[i]) == 1;
    for (uint32_t j = 0; j < 16; ++j)
      ASSERT_EQ(out[i * 16 + j], InitialValue(c, keys[i], j) - (held ? 1.0f : 0.0f)) << i;
  }
  EXPECT_EQ(t.num_rows(), pushed.size());
}

TEST(TableRowIndexTest, EvictionDropsAndReusesRowsWithTheIndexInStep) {
  // A table at its memory budget, pushed random keys (with 0 and ~0 among
  // them): it must hold exactly the most recently pushed keys, each with the
  // row the pushes gave it, while rows are dropped and their numbers reused.
  proto::TableConfig c = SparseConfig(4);
  c.set_optimizer(proto::ACCUMULATE);
  c.set_init(proto::ZEROS);
  constexpr size_t kRows = 300;
  c.set_memory_budget_bytes(1);  // (so that RowBytes counts the recency record)
  c.set_memory_budget_bytes(kRows * Table::RowBytes(c));
  Table t(c, [](Key) { return true; });
  std::mt19937_64 rng(5);
  std::vector<Key> domain = {0, kAllOnes};
  for (int i = 0; i < 600; ++i) domain.push_back(rng());
  std::list<Key> lru;  // least recently used first
  std::unordered_map<Key, std::pair<std::list<Key>::iterator, float>> model;  // key -> (place, sum)
  for (int push = 0; push < 4000; ++push) {
    const Key k = domain[rng() % domain.size()];
    const float g = static_cast<float>(push % 7 + 1);
    ASSERT_TRUE(t.ApplyPush(std::vector<Key>{k}, std::vector<float>(4, g)).ok());
    if (auto it = model.find(k); it != model.end()) {
      lru.erase(it->second.first);
      lru.push_back(k);
      it->second = {std::prev(lru.end()), it->second.second + g};
    } else {
      if (model.size() == kRows) {
        model.erase(lru.front());
        lru.pop_front();
      }
      lru.push_back(k);
      model[k] = {std::prev(lru.end()), g};
    }
    ASSERT_EQ(t.num_rows(), model.size());
  }
  std::vector<Key> held;
  t.ForEachRow([&](Key k, std::span<const float> row) {
    held.push_back(k);
    auto it = model.find(k);
    ASSERT_NE(it, model.end()) << k;
    EXPECT_EQ(row[0], it->second.second) << k;
  });
  EXPECT_EQ(held, std::vector<Key>(lru.begin(), lru.end()));  // least recently used first
  for (Key k : domain) {
    std::vector<float> out(4);
    ASSERT_TRUE(t.ReadRows(std::vector<Key>{k}, out).ok());
    EXPECT_EQ(out[0], model.count(k) ? model[k].second : 0.0f) << k;
  }
}

TEST(RowIndexTest, ShrinkToRehashesIntoFewerSlotsAndKeepsEveryEntry) {
  RowIndex index;
  std::unordered_map<Key, uint32_t> model;
  for (uint32_t i = 0; i < 5000; ++i) {
    ASSERT_TRUE(index.Insert(Mix64(i), i));
    model[Mix64(i)] = i;
  }
  ASSERT_EQ(index.capacity(), 8192u);
  EXPECT_FALSE(index.ShrinkTo(6000)) << "8192 slots are the least that hold 6000";
  EXPECT_EQ(index.capacity(), 8192u);
  for (uint32_t i = 1000; i < 5000; ++i) {
    ASSERT_TRUE(index.Erase(Mix64(i)));
    model.erase(Mix64(i));
  }
  EXPECT_EQ(index.capacity(), 8192u) << "erasing alone never shrinks";
  // Room asked for below what it holds counts what it holds: 1000 <= 1536.
  EXPECT_TRUE(index.ShrinkTo(10));
  EXPECT_EQ(index.capacity(), 2048u);
  ExpectSameAs(index, model);
  EXPECT_FALSE(index.ShrinkTo(1500));
  // It grows again as entries come, as before.
  for (uint32_t i = 5000; i < 7000; ++i) {
    ASSERT_TRUE(index.Insert(Mix64(i), i));
    model[Mix64(i)] = i;
  }
  ExpectSameAs(index, model);
  EXPECT_EQ(index.capacity(), 4096u);  // 3000 <= 3072
  // Emptied, it goes down to the least capacity.
  for (const auto& [k, row] : model) ASSERT_TRUE(index.Erase(k));
  EXPECT_TRUE(index.ShrinkTo(0));
  EXPECT_EQ(index.capacity(), RowIndex::kMinCapacity);
  EXPECT_EQ(index.Find(Mix64(1)), RowIndex::kNoRow);
}

TEST(RowIndexTest, ReassignChangesOnlyAPresentKeysRow) {
  RowIndex index;
  std::unordered_map<Key, uint32_t> model;
  // Colliding keys (one home), 0 and all ones among them.
  std::vector<Key> keys = KeysWithHome(RowIndex::kMinCapacity, 3, 5);
  keys.push_back(0);
  keys.push_back(kAllOnes);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(index.Insert(keys[i], static_cast<uint32_t>(i)));
    model[keys[i]] = static_cast<uint32_t>(i);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(index.Reassign(keys[i], static_cast<uint32_t>(100 + i)));
    model[keys[i]] = static_cast<uint32_t>(100 + i);
    ExpectSameAs(index, model);
  }
  EXPECT_FALSE(index.Reassign(KeysWithHome(RowIndex::kMinCapacity, 3, 1, keys[4] + 1)[0], 7));
  ASSERT_TRUE(index.Erase(kAllOnes));
  model.erase(kAllOnes);
  EXPECT_FALSE(index.Reassign(kAllOnes, 9)) << "an empty slot's marker is no entry";
  ExpectSameAs(index, model);
}

}  // namespace
}  // namespace tessera
