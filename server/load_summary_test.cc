#include "server/load_summary.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"

namespace tessera {
namespace {

using parts_test::Config;
using parts_test::StoreWithMemoryPerRow;

TEST(LoadSummaryTest, TablesAreSummarizedInIdOrderWithTheirRowsAndBytes) {
  TableMap tables;
  EXPECT_TRUE(SummarizeTables(tables).empty());
  EXPECT_EQ(TotalRows(tables), 0u);
  proto::TableConfig named = Config(5, 2);
  named.set_name("users");
  tables.emplace(5, std::make_unique<Table>(named, [](Key) { return true; }));
  tables.emplace(2, std::make_unique<Table>(Config(2, 3), [](Key) { return true; }));
  const std::vector<Key> keys = {1, 2, 3};
  const std::vector<float> values(6, 1.0f);
  ASSERT_TRUE(tables.at(5)->ApplyPush(keys, values, 0).ok());
  const std::vector<TableSummary> s = SummarizeTables(tables);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].id, 2u);
  EXPECT_EQ(s[0].rows, 0u);
  EXPECT_EQ(s[1].id, 5u);
  EXPECT_EQ(s[1].name, "users");
  EXPECT_EQ(s[1].rows, 3u);
  EXPECT_EQ(s[1].bytes, 3 * Table::RowBytes(named));
  EXPECT_FALSE(s[1].disk_tier);
  EXPECT_EQ(s[1].rows_on_disk, 0u);
  EXPECT_EQ(TotalRows(tables), 3u);
  EXPECT_EQ(TotalRowBytes(tables), 3 * Table::RowBytes(named));
}

TEST(LoadSummaryTest, AppliedCountsArePerShardThisServerLeads) {
  std::vector<proto::NodeInfo> nodes(2);
  nodes[0].set_node_id(10);
  nodes[1].set_node_id(11);
  auto map = ShardMapView::Create(RoundRobinShardMap(1, 4, nodes));
  ASSERT_TRUE(map.ok());
  const absl::flat_hash_map<uint32_t, uint64_t> applied = {{0, 3}, {1, 9}};
  using Counts = std::vector<std::pair<uint32_t, uint64_t>>;
  EXPECT_EQ(AppliedByPrimary(*map, 0, applied), (Counts{{0, 3}, {2, 0}}));
  EXPECT_EQ(AppliedByPrimary(*map, 1, applied), (Counts{{1, 9}, {3, 0}}));
}

TEST(LoadSummaryTest, AStoreWhoseOwnMemoryTakesTheBudgetIsSaidSo) {
  proto::TableConfig c = Config(4, 2);
  c.set_memory_budget_bytes(100 * Table::RowBytes(c));
  TableMap tables;
  tables.emplace(4, std::make_unique<Table>(c, [](Key) { return true; },
                                            std::make_unique<StoreWithMemoryPerRow>(StoredRowFloats(c),
                                                                                    Table::RowBytes(c) / 4)));
  tables.emplace(6, std::make_unique<Table>(Config(6, 2), [](Key) { return true; }));
  auto push = [&](Key from, Key to) {
    std::vector<Key> keys;
    for (Key k = from; k < to; ++k) keys.push_back(k);
    ASSERT_TRUE(tables.at(4)->ApplyPush(keys, std::vector<float>(keys.size() * 2, 1.0f), 0).ok());
  };
  push(0, 150);  // about 66 rows on disk, 84 in memory: room left
  std::vector<TableSummary> s = SummarizeTables(tables);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(s[0].disk_tier);
  EXPECT_EQ(s[0].memory_budget_bytes, c.memory_budget_bytes());
  EXPECT_EQ(s[0].row_bytes, Table::RowBytes(c));
  EXPECT_EQ(s[0].store_memory_bytes, s[0].rows_on_disk * (Table::RowBytes(c) / 4));
  EXPECT_GT(s[0].rows_on_disk, 0u);
  EXPECT_FALSE(StoreTakesBudget(s[0]));
  EXPECT_FALSE(StoreTakesBudget(s[1])) << "no disk tier";
  push(150, 600);  // 400 rows on disk would take the whole budget
  s = SummarizeTables(tables);
  EXPECT_TRUE(StoreTakesBudget(s[0])) << s[0].store_memory_bytes << " of " << s[0].memory_budget_bytes;
  EXPECT_EQ(tables.at(4)->rows_in_memory(), 1u) << "one row is kept in memory anyway";
}

}  // namespace
}  // namespace tessera
