#include "server/snapshot_restore.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"

namespace tessera {
namespace {

using parts_test::Config;

ShardMapView Map() {
  std::vector<proto::NodeInfo> nodes(2);
  nodes[0].set_node_id(10);
  nodes[1].set_node_id(11);
  auto view = ShardMapView::Create(RoundRobinShardMap(1, 4, nodes));
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

// Table 1 of width 2, keys 0..9, row k = (k, -k).
ShardSnapshot Snapshot() {
  ShardSnapshot snap;
  snap.server_rank = 1;
  snap.epoch = 3;
  snap.vshards = {1, 3};
  TableSnapshot t{.config = Config(1, 2)};
  for (Key k = 0; k < 10; ++k) {
    t.keys.push_back(k);
    t.values.push_back(static_cast<float>(k));
    t.values.push_back(-static_cast<float>(k));
  }
  snap.tables.push_back(t);
  return snap;
}

TEST(SnapshotRestoreTest, AShardTheCheckpointLacksIsNamed) {
  const ShardSnapshot snap = Snapshot();
  EXPECT_TRUE(CheckHasShards(snap, std::vector<uint32_t>{1, 3}).ok());
  auto s = CheckHasShards(snap, std::vector<uint32_t>{1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "the checkpoint of server 1 (epoch 3) has no shard 2");
}

TEST(SnapshotRestoreTest, TablesMustFitTheTablesHereAndHoldTheirValues) {
  ShardSnapshot snap = Snapshot();
  TableMap tables;
  EXPECT_TRUE(CheckTablesFit(snap, tables).ok());
  tables.emplace(1, std::make_unique<Table>(Config(1, 2), [](Key) { return true; }));
  EXPECT_TRUE(CheckTablesFit(snap, tables).ok());
  TableMap wider;
  wider.emplace(1, std::make_unique<Table>(Config(1, 3), [](Key) { return true; }));
  EXPECT_EQ(CheckTablesFit(snap, wider).code(), absl::StatusCode::kFailedPrecondition);
  snap.tables[0].values.pop_back();
  auto s = CheckTablesFit(snap, tables);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("has 19 values for 10 rows"), std::string::npos) << s;
  ShardSnapshot bad = Snapshot();
  bad.tables[0].config.set_width(0);
  EXPECT_FALSE(CheckTablesFit(bad, TableMap()).ok());
}

TEST(SnapshotRestoreTest, PicksExactlyTheRowsOfTheWantedShardsWithTheirValues) {
  const ShardMapView map = Map();
  const ShardSnapshot snap = Snapshot();
  std::vector<Key> keys = {99};  // replaced
  std::vector<float> values = {99};
  RowsOfShards(snap.tables[0], std::vector<uint32_t>{3}, map, &keys, &values);
  ASSERT_EQ(values.size(), 2 * keys.size());
  size_t expected = 0;
  for (Key k = 0; k < 10; ++k) expected += map.VShardOfKey(1, k) == 3;
  EXPECT_EQ(keys.size(), expected);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(map.VShardOfKey(1, keys[i]), 3u);
    EXPECT_EQ(values[2 * i], static_cast<float>(keys[i]));
    EXPECT_EQ(values[2 * i + 1], -static_cast<float>(keys[i]));
  }
}

TEST(SnapshotRestoreTest, ASnapshotHoldsTheRowsAndCountsOfTheShardsNamed) {
  const ShardMapView map = Map();
  TableMap tables;
  for (uint32_t id : {2u, 1u}) {
    auto t = std::make_unique<Table>(Config(id, 1), [](Key) { return true; });
    for (Key k = 0; k < 10; ++k) EXPECT_TRUE(t->ApplyPush(std::vector<Key>{k}, std::vector<float>{1.0f}).ok());
    tables.emplace(id, std::move(t));
  }
  const std::vector<std::pair<uint32_t, uint64_t>> applied = {{1, 4}, {3, 0}};
  const ShardSnapshot snap = SnapshotShards(tables, map, 1, applied);
  EXPECT_EQ(snap.server_rank, 1u);
  EXPECT_EQ(snap.epoch, map.epoch());
  EXPECT_EQ(snap.vshards, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(snap.applied_pushes_by_vshard, (std::map<uint32_t, uint64_t>{{1, 4}, {3, 0}}));
  EXPECT_TRUE(snap.core_state.empty());
  ASSERT_EQ(snap.tables.size(), 2u);
  EXPECT_EQ(snap.tables[0].config.table_id(), 1u);  // id order
  for (const TableSnapshot& t : snap.tables) {
    for (Key k : t.keys) EXPECT_TRUE(map.VShardOfKey(t.config.table_id(), k) % 2 == 1) << k;
    size_t expected = 0;
    for (Key k = 0; k < 10; ++k) expected += map.VShardOfKey(t.config.table_id(), k) % 2 == 1;
    EXPECT_EQ(t.keys.size(), expected);
  }
}

TEST(SnapshotRestoreTest, RestoringCreatesMissingTablesAndSetsTheWantedRows) {
  const ShardMapView map = Map();
  const ShardSnapshot snap = Snapshot();
  TableMap tables;
  std::vector<uint32_t> created;
  auto create = [&](const proto::TableConfig& c) {
    created.push_back(c.table_id());
    tables.emplace(c.table_id(), std::make_unique<Table>(c, [](Key) { return true; }));
    return absl::OkStatus();
  };
  auto rows = RestoreShardRows(snap, std::vector<uint32_t>{3}, map, tables, create);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(created, std::vector<uint32_t>{1});
  size_t expected = 0;
  for (Key k = 0; k < 10; ++k) expected += map.VShardOfKey(1, k) == 3;
  EXPECT_EQ(*rows, expected);
  EXPECT_EQ(tables.at(1)->num_rows(), expected);
  rows = RestoreShardRows(snap, std::vector<uint32_t>{1, 3}, map, tables, create);  // exists now: not created
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(created.size(), 1u);
  TableMap none;
  auto refused = RestoreShardRows(snap, std::vector<uint32_t>{3}, map, none,
                                  [](const proto::TableConfig&) { return absl::ResourceExhaustedError("full"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  absl::flat_hash_map<uint32_t, uint64_t> applied = {{1, 9}, {2, 9}};
  ShardSnapshot counted = snap;
  counted.applied_pushes_by_vshard = {{1, 5}};
  RestoreAppliedCounts(counted, std::vector<uint32_t>{1, 3}, applied);
  EXPECT_EQ(applied[1], 5u);
  EXPECT_EQ(applied[3], 0u);  // none in the snapshot
  EXPECT_EQ(applied[2], 9u);  // not wanted: unchanged
}

}  // namespace
}  // namespace tessera
