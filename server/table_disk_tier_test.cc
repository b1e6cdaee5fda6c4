// A table with a disk tier (server/table.h, "Disk tier") holds exactly what
// a table without a budget holds, whatever rows it moved to disk and back.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <malloc.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/memory.h"
#include "server/bucket_file_cold_rows.h"
#include "server/checkpoint.h"
#include "server/cold_rows.h"
#include "server/rocks_cold_rows.h"
#include "server/table.h"
#include "server/parts_test_tables.h"
#include "server/test_stores.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

proto::TableConfig SparseConfig(proto::OptimizerKind opt, uint32_t width) {
  proto::TableConfig c;
  c.set_table_id(5);
  c.set_width(width);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(opt);
  c.set_learning_rate(0.1f);
  c.set_init(proto::UNIFORM);
  c.set_init_scale(0.5f);
  c.set_init_seed(99);
  c.mutable_optimizer_params()->set_epsilon(1e-6f);
  c.mutable_optimizer_params()->set_initial_accumulator(0.1f);
  c.mutable_optimizer_params()->set_momentum(0.9f);
  return c;
}

using Store = StoreKind;

class TableDiskTierTest : public ::testing::TestWithParam<Store> {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "tessera-table-disk-XXXXXX").string();
    dir_ = mkdtemp(t.data());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<ColdRows> MakeStore(uint32_t row_floats) {
    return OpenTestStore(GetParam(), (dir_ / ("store-" + std::to_string(stores_++))).string(), row_floats);
  }
  // A table of `config` with a disk tier whose memory holds `rows_in_memory` rows.
  std::unique_ptr<Table> TieredTable(proto::TableConfig config, uint64_t rows_in_memory) {
    auto store = MakeStore(StoredRowFloats(config));
    // Memory holds at most rows_in_memory rows (fewer as the store's own
    // memory grows with the rows it holds).
    config.set_memory_budget_bytes(store->memory_bytes(0) + rows_in_memory * Table::RowBytes(config) +
                                   Table::RowBytes(config) / 2);
    EXPECT_TRUE(Table::CheckDiskTier(config, store->memory_bytes(0)).ok());
    return std::make_unique<Table>(config, [](Key) { return true; }, std::move(store));
  }
  fs::path dir_;
  int stores_ = 0;
};

// The same table with a budget it never reaches: it drops nothing, and,
// like every table with a budget, a pull does not create rows.
std::unique_ptr<Table> UnboundedTable(proto::TableConfig config) {
  config.set_memory_budget_bytes(uint64_t{1} << 50);
  return std::make_unique<Table>(config, [](Key) { return true; });
}

using Rows = std::map<Key, std::vector<float>>;

Rows AllRows(const Table& t) {
  Rows rows;
  t.ForEachRow([&](Key k, std::span<const float> row) {
    EXPECT_FALSE(rows.contains(k)) << "key " << k << " visited twice";
    rows[k].assign(row.begin(), row.end());
  });
  return rows;
}

void ExpectSameRows(const Rows& a, const Rows& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, row] : a) {
    auto it = b.find(k);
    ASSERT_NE(it, b.end()) << "key " << k;
    ASSERT_EQ(std::memcmp(row.data(), it->second.data(), row.size() * sizeof(float)), 0) << "key " << k;
  }
}

// Skewed keys over a range much larger than what memory holds, listed twice
// now and then (close together and far apart), in pushes of 1 to 300 keys.
std::vector<Key> SomeKeys(std::mt19937_64& rng, size_t n, uint64_t range) {
  std::vector<Key> keys(n);
  for (Key& k : keys) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    k = static_cast<Key>(std::pow(u, 3.0) * static_cast<double>(range)) * 0x9e3779b97f4a7c15ULL;
  }
  if (n > 2) keys[n - 1] = keys[0];
  return keys;
}

TEST_P(TableDiskTierTest, PushesAndPullsEndAsInATableWithoutABudget) {
  for (const auto opt : {proto::SGD, proto::ADAGRAD, proto::MOMENTUM, proto::ADAM}) {
    SCOPED_TRACE(proto::OptimizerKind_Name(opt));
    const proto::TableConfig config = SparseConfig(opt, 8);
    auto unbounded = UnboundedTable(config);
    Table& plain = *unbounded;
    auto tiered = TieredTable(config, 50);
    std::mt19937_64 rng(7);
    uint64_t clock = 0;
    for (int round = 0; round < 200; ++round) {
      const size_t n = 1 + rng() % 300;
      const std::vector<Key> keys = SomeKeys(rng, n, 2000);
      std::vector<float> grads(n * 8);
      for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
      ++clock;
      ASSERT_TRUE(plain.ApplyPush(keys, grads, clock).ok());
      ASSERT_TRUE(tiered->ApplyPush(keys, grads, clock).ok());
      if (round % 5 == 0) {  // pulls, which also bring rows back from disk
        const std::vector<Key> pulled = SomeKeys(rng, 1 + rng() % 100, 2500);
        std::vector<float> a(pulled.size() * 8), b(pulled.size() * 8);
        ASSERT_TRUE(plain.ReadRows(pulled, a).ok());
        ASSERT_TRUE(tiered->ReadRows(pulled, b).ok());
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "round " << round;
      }
      ASSERT_LE(tiered->rows_in_memory(), 50u);
    }
    EXPECT_EQ(tiered->num_rows(), plain.num_rows());
    EXPECT_GT(tiered->rows_on_disk(), 0u);
    EXPECT_EQ(tiered->rows_in_memory() + tiered->rows_on_disk(), tiered->num_rows());
    EXPECT_GT(tiered->counters().moved_to_disk, 0u);
    EXPECT_GT(tiered->counters().loaded_from_disk, 0u);
    EXPECT_EQ(tiered->counters().evicted_by_budget, 0u);  // nothing dropped
    ExpectSameRows(AllRows(plain), AllRows(*tiered));     // optimizer state included
  }
}

TEST_P(TableDiskTierTest, PiecesOfRowsAndAdmissionAgreeToo) {
  proto::TableConfig config = SparseConfig(proto::SGD, 8);
  config.set_admit_after(2);
  auto unbounded = UnboundedTable(config);
  Table& plain = *unbounded;
  auto tiered = TieredTable(config, 20);
  std::mt19937_64 rng(11);
  for (int round = 0; round < 150; ++round) {
    const std::vector<Key> keys = SomeKeys(rng, 1 + rng() % 60, 500);
    const bool piece = round % 2 == 1;
    const Columns columns = piece ? Columns{.first = 3, .count = 4} : Columns{};
    std::vector<float> grads(keys.size() * (piece ? 4 : 8));
    for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
    ASSERT_TRUE(plain.ApplyPush(keys, grads, round, columns).ok());
    ASSERT_TRUE(tiered->ApplyPush(keys, grads, round, columns).ok());
  }
  EXPECT_GT(tiered->rows_on_disk(), 0u);
  EXPECT_EQ(tiered->counters().admission_dropped, plain.counters().admission_dropped);
  EXPECT_EQ(tiered->counters().admitted, plain.counters().admitted);
  ExpectSameRows(AllRows(plain), AllRows(*tiered));
}

TEST_P(TableDiskTierTest, RestoreEraseAndCountSeeTheRowsOnDisk) {
  const proto::TableConfig config = SparseConfig(proto::ADAGRAD, 4);
  auto unbounded = UnboundedTable(config);
  Table& plain = *unbounded;
  auto tiered = TieredTable(config, 10);
  std::mt19937_64 rng(3);
  for (int round = 0; round < 40; ++round) {
    const std::vector<Key> keys = SomeKeys(rng, 1 + rng() % 30, 300);
    std::vector<float> grads(keys.size() * 4, 0.25f);
    ASSERT_TRUE(plain.ApplyPush(keys, grads, round).ok());
    ASSERT_TRUE(tiered->ApplyPush(keys, grads, round).ok());
  }
  ASSERT_GT(tiered->rows_on_disk(), 0u);
  // A checkpoint's snapshot holds every row, those on disk included (it
  // once kept pointers to the rows ForEachRow lends for one call only).
  const TableSnapshot a = SnapshotTable(plain), b = SnapshotTable(*tiered);
  EXPECT_EQ(a.keys, b.keys);
  ASSERT_EQ(a.values.size(), b.values.size());
  EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)), 0);
  // A checkpoint or a state transfer reads every row (ForEachRow); a copy
  // restored from it, with a disk tier of its own, holds the same rows.
  const Rows rows = AllRows(*tiered);
  std::vector<Key> keys;
  std::vector<float> values;
  for (const auto& [k, row] : rows) {
    keys.push_back(k);
    values.insert(values.end(), row.begin(), row.end());
  }
  auto copy = TieredTable(config, 7);
  ASSERT_TRUE(copy->RestoreRows(keys, values).ok());
  EXPECT_GT(copy->rows_on_disk(), 0u);
  ExpectSameRows(rows, AllRows(*copy));
  // Restoring again over rows on disk replaces them, never doubles them.
  ASSERT_TRUE(copy->RestoreRows(keys, values).ok());
  EXPECT_EQ(copy->num_rows(), rows.size());
  ExpectSameRows(rows, AllRows(*copy));
  // Rows on disk are held: a push of them creates nothing.
  std::vector<Key> on_disk;
  copy->ForEachRow([&](Key k, std::span<const float>) {
    if (on_disk.size() < 5) on_disk.push_back(k);  // the first rows visited are the ones on disk
  });
  on_disk.push_back(~Key{0});  // and one that is nowhere
  EXPECT_EQ(copy->CountAbsent(on_disk), 1u);
  // EraseRows drops rows wherever they are.
  const Key gone = on_disk[0];
  const size_t erased = copy->EraseRows([&](Key k) { return k == gone || k % 2 == 0; });
  size_t even = 0;
  for (Key k : keys) even += (k == gone || k % 2 == 0);
  EXPECT_EQ(erased, even);
  EXPECT_EQ(copy->num_rows(), rows.size() - even);
  const Rows left = AllRows(*copy);
  EXPECT_FALSE(left.contains(gone));
  for (const auto& [k, row] : left) EXPECT_NE(k % 2, 0u);
}

INSTANTIATE_TEST_SUITE_P(Stores, TableDiskTierTest,
                         ::testing::Values(Store::kMemory, Store::kRocks, Store::kBucketFile, Store::kLog),
                         [](const auto& info) { return StoreName(info.param); });

// The budget counts what the store keeps in memory for the rows it holds:
// the more rows on disk, the fewer in memory.
TEST(TableDiskTierBudgetTest, TheStoresMemoryPerRowComesOutOfTheRowsInMemory) {
  std::string t = (fs::temp_directory_path() / "tessera-table-budget-XXXXXX").string();
  const fs::path dir = mkdtemp(t.data());
  {
    proto::TableConfig c = SparseConfig(proto::SGD, 1);
    RocksColdRowsOptions o;
    o.directory = (dir / "store").string();
    o.write_buffer_bytes = 64 << 10;
    o.block_cache_bytes = 64 << 10;
    auto store = RocksColdRows::Open(o, StoredRowFloats(c));
    ASSERT_TRUE(store.ok()) << store.status();
    const uint64_t empty = (*store)->memory_bytes(0);
    c.set_memory_budget_bytes(empty + 1000 * Table::RowBytes(c));
    Table table(c, [](Key) { return true; }, std::move(*store));
    std::vector<Key> keys(5000);
    for (Key k = 0; k < keys.size(); ++k) keys[k] = k;
    ASSERT_TRUE(table.ApplyPush(keys, std::vector<float>(keys.size(), 1.0f)).ok());
    // About 4,200 rows on disk at 3 bytes each: 12,600 bytes less for rows in
    // memory, about 210 rows of 60 bytes (RowBytes of SGD dim 1 with a budget).
    const uint64_t on_disk = table.rows_on_disk();
    const uint64_t expected =
        (c.memory_budget_bytes() - empty - RocksColdRows::kBytesPerRow * on_disk) / Table::RowBytes(c);
    EXPECT_EQ(table.num_rows(), 5000u);
    EXPECT_LT(table.rows_in_memory(), 1000u);
    EXPECT_NEAR(static_cast<double>(table.rows_in_memory()), static_cast<double>(expected), 1.0);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// The budget holds in the process's real memory: while ten times the
// budget's worth of rows is written into a table with a disk tier, the
// anonymous resident memory it adds stays within the budget plus the stated
// overhead (docs/embeddings.md, "Disk tier": 10% of the budget plus 8 MiB,
// for the index's slack between 21 and 43 bytes an entry where the budget
// counts 32, the allocator's, and what the store allocates beyond its
// estimate). Runs in a fresh process (a death test re-executes the binary),
// with the server's malloc settings, so that earlier tests' memory does
// not count. Both file stores.
class TableDiskTierResidentTest : public ::testing::TestWithParam<Store> {};

TEST_P(TableDiskTierResidentTest, ResidentMemoryStaysWithinTheBudgetWhileTenTimesItIsWritten) {
  if (kSanitizedAllocator) GTEST_SKIP() << "built with a sanitizer, whose allocator changes what memory costs";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string t = (fs::temp_directory_path() / "tessera-table-rss-XXXXXX").string();
  const fs::path dir = mkdtemp(t.data());
  EXPECT_EXIT(
      {
        KeepLargeAllocationsMapped();
        proto::TableConfig c = SparseConfig(proto::ADAGRAD, 16);
        constexpr uint64_t kBudget = 48ull << 20;
        c.set_memory_budget_bytes(kBudget);
        malloc_trim(0);
        const uint64_t before = ResidentAnonymousBytes().value_or(0);
        std::unique_ptr<ColdRows> store =
            OpenTestStore(GetParam(), (dir / "store").string(), StoredRowFloats(c), /*small=*/false);
        if (store == nullptr) std::exit(3);
        Table table(c, [](Key) { return true; }, std::move(store));
        // Ten times the budget's rows. With the log store, whose index
        // grows by up to 22 bytes for each row on disk, this leaves room for
        // fewer and fewer rows in memory: it holds only because the table
        // gives the memory of those rows back (without that: 81 MiB against
        // a bound of 61).
        const uint64_t rows = 10 * kBudget / Table::RowBytes(c);
        std::vector<Key> keys(4096);
        std::vector<float> grads(keys.size() * 16, 0.01f);
        uint64_t peak = 0;
        for (uint64_t r = 0; r < rows; r += keys.size()) {
          for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(r + i + 1);
          if (!table.ApplyPush(keys, grads).ok()) std::exit(4);
          if ((r / keys.size()) % 32 == 0) peak = std::max(peak, ResidentAnonymousBytes().value_or(0) - before);
        }
        peak = std::max(peak, ResidentAnonymousBytes().value_or(0) - before);
        const uint64_t bound = kBudget + kBudget / 10 + (8ull << 20);
        std::fprintf(stderr, "resident growth %.1f MiB (bound %.1f MiB), %zu rows in memory, %zu on disk\n",
                     peak / 1048576.0, bound / 1048576.0, table.rows_in_memory(), table.rows_on_disk());
        std::exit(peak <= bound && table.rows_on_disk() > 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "resident growth")
      << "a table with a disk tier grew past its memory budget";
  std::error_code ec;
  fs::remove_all(dir, ec);
}

INSTANTIATE_TEST_SUITE_P(FileStores, TableDiskTierResidentTest,
                         ::testing::Values(Store::kRocks, Store::kBucketFile, Store::kLog),
                         [](const auto& info) { return StoreName(info.param); });

// A store whose own memory grows with the rows it holds leaves room for
// fewer rows in memory, and the table gives the memory of the rows it no
// longer has room for back (server/table.h, "Memory given back").
TEST(TableDiskTierBudgetTest, AStoreThatGrowsLeavesFewerRowsAndTheirMemoryGoesBack) {
  proto::TableConfig c = SparseConfig(proto::ADAGRAD, 16);
  const uint64_t row_bytes = Table::RowBytes(c);
  constexpr uint64_t kBudgetRows = 200000;
  c.set_memory_budget_bytes(kBudgetRows * row_bytes);
  // Each row on disk costs half a row in memory: with T rows in all, about
  // 2 * kBudgetRows - T stay in memory.
  Table table(c, [](Key) { return true; }, std::make_unique<parts_test::StoreWithMemoryPerRow>(StoredRowFloats(c), row_bytes / 2));
  auto reference = UnboundedTable(c);
  std::mt19937_64 rng(5);
  size_t max_chunks = 0;
  for (int push = 0; push < 40; ++push) {
    std::vector<Key> keys(10000);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(push * keys.size() + i);
    if (push > 0) {  // and some of the rows written before, on disk by now or not
      for (size_t i = 0; i < 1000; ++i) keys[i] = Mix64(rng() % (push * keys.size()));
    }
    std::vector<float> grads(keys.size() * 16);
    for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
    ASSERT_TRUE(table.ApplyPush(keys, grads).ok());
    ASSERT_TRUE(reference->ApplyPush(keys, grads).ok());
    max_chunks = std::max(max_chunks, table.chunks());
    // Never more than two chunks' worth of free slots after a call (the
    // third would have been given back), and the chunks hold the slots.
    ASSERT_LT(table.row_slots(), table.rows_in_memory() + 2 * table.rows_per_chunk()) << "push " << push;
    ASSERT_EQ(table.chunks(), (table.row_slots() + table.rows_per_chunk() - 1) / table.rows_per_chunk());
  }
  // The store's memory took most of the budget: far fewer rows in memory
  // than at the peak, and the chunks went with them.
  EXPECT_GT(table.compactions(), 0u);
  EXPECT_LT(table.rows_in_memory(), kBudgetRows / 2);
  EXPECT_LT(table.chunks(), max_chunks);
  EXPECT_EQ(table.num_rows(), reference->num_rows());
  ExpectSameRows(AllRows(table), AllRows(*reference));
}

TEST(TableDiskTierConfigTest, OnlySparseTablesWithABudgetThatLeavesRoom) {
  proto::TableConfig c = SparseConfig(proto::SGD, 16);
  const uint64_t store = 1000;
  EXPECT_FALSE(Table::CheckDiskTier(c, store).ok());  // no budget
  c.set_memory_budget_bytes(store + Table::RowBytes(c) - 1);
  auto s = Table::CheckDiskTier(c, store);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no room"), std::string::npos) << s;
  c.set_memory_budget_bytes(store + Table::RowBytes(c));
  EXPECT_TRUE(Table::CheckDiskTier(c, store).ok());
  c.set_evict_after_clocks(3);
  s = Table::CheckDiskTier(c, store);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("evict_after_clocks"), std::string::npos) << s;
  proto::TableConfig d = SparseConfig(proto::SGD, 16);
  d.set_kind(proto::DENSE);
  d.set_dense_rows(10);
  EXPECT_FALSE(Table::CheckDiskTier(d, 0).ok());
}

}  // namespace
}  // namespace tessera
