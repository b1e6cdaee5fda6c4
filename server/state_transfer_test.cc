#include "server/state_transfer.h"

#include <gtest/gtest.h>

#include "server/cold_rows.h"
#include "server/parts_test_tables.h"

#include <set>

namespace tessera {
namespace {

using parts_test::Config;

ShardMapView Map() {  // 4 shards on 2 servers, each backed up by the other
  std::vector<proto::NodeInfo> nodes(2);
  nodes[0].set_node_id(100);
  nodes[1].set_node_id(101);
  auto view = ShardMapView::Create(RoundRobinShardMap(1, 4, nodes, 2));
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

// Table 1 (width 2) and table 2 (width 1), rows 0..19 set to their key.
TableMap Tables() {
  TableMap tables;
  for (uint32_t id : {1u, 2u}) {
    auto t = std::make_unique<Table>(Config(id, id == 1 ? 2 : 1), [](Key) { return true; });
    for (Key k = 0; k < 20; ++k) {
      std::vector<float> row(t->width(), static_cast<float>(k));
      EXPECT_TRUE(t->ApplyPush(std::vector<Key>{k}, row).ok());
    }
    tables.emplace(id, std::move(t));
  }
  return tables;
}

// The (table, key) rows a transfer carries, over all its messages.
std::set<std::pair<uint32_t, Key>> RowsOf(const std::vector<Message>& messages) {
  std::set<std::pair<uint32_t, Key>> rows;
  for (const Message& m : messages) {
    const proto::ShardTransfer& t = m.header.replicate().transfer();
    for (int i = 0; i < t.tables_size(); ++i)
      for (Key k : m.frames[2 * i].As<Key>()) rows.emplace(t.tables(i).table_id(), k);
  }
  return rows;
}

std::set<std::pair<uint32_t, Key>> RowsOfShards(const ShardMapView& map, std::set<uint32_t> shards) {
  std::set<std::pair<uint32_t, Key>> rows;
  for (uint32_t id : {1u, 2u})
    for (Key k = 0; k < 20; ++k)
      if (shards.contains(map.VShardOfKey(id, k))) rows.emplace(id, k);
  return rows;
}

TEST(StateTransferTest, CarriesExactlyTheRowsOfTheShardsAndEveryTableConfig) {
  const ShardMapView map = Map();
  const TableMap tables = Tables();
  const std::vector<uint32_t> shards = {0, 2};  // rank 0's
  const std::vector<uint64_t> applied = {5, 7};
  BuiltTransfer built = BuildTransfer(tables, map, shards, applied, 1 << 20, 100);
  ASSERT_EQ(built.messages.size(), 1u);
  const proto::ShardTransfer& t = built.messages[0].header.replicate().transfer();
  EXPECT_FALSE(t.continued());
  ASSERT_EQ(t.tables_size(), 2);
  EXPECT_EQ(t.tables(0).table_id(), 1u);
  EXPECT_EQ(t.tables(1).table_id(), 2u);
  EXPECT_EQ(std::vector<uint64_t>(t.applied().begin(), t.applied().end()), applied);
  const auto expected = RowsOfShards(map, {0, 2});
  EXPECT_EQ(RowsOf(built.messages), expected);
  EXPECT_EQ(built.rows, expected.size());
  EXPECT_EQ(built.messages[0].header.sender_id(), 100u);
  // A row carries its values.
  const auto keys = built.messages[0].frames[0].As<Key>();
  const auto values = built.messages[0].frames[1].As<float>();
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(values[1], static_cast<float>(keys[0]));

  // No shards: the configs alone.
  BuiltTransfer configs = BuildTransfer(tables, map, {}, {}, 1 << 20, 100);
  ASSERT_EQ(configs.messages.size(), 1u);
  EXPECT_EQ(configs.messages[0].header.replicate().transfer().tables_size(), 2);
  EXPECT_EQ(configs.rows, 0u);
}

// A transfer of no shards (the configs a new table sends its backups)
// walks no table's rows: it walked every row, those on disk too, and with
// 10^8 rows that held a server (and a job's table creation) for minutes.
TEST(StateTransferTest, ATransferOfNoShardsWalksNoRows) {
  struct CountingStore : MemoryColdRows {
    using MemoryColdRows::MemoryColdRows;
    void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override {
      ++walks;
      MemoryColdRows::ForEach(fn);
    }
    int walks = 0;
  };
  proto::TableConfig c = Config(1, 2);
  c.set_memory_budget_bytes(4 * Table::RowBytes(c) + 1);
  c.set_disk_tier(true);
  auto store = std::make_unique<CountingStore>(StoredRowFloats(c));
  CountingStore* counting = store.get();
  auto table = std::make_unique<Table>(c, [](Key) { return true; }, std::move(store));
  for (Key k = 0; k < 20; ++k) ASSERT_TRUE(table->ApplyPush(std::vector<Key>{k}, std::vector<float>{1, 2}).ok());
  ASSERT_GT(table->rows_on_disk(), 0u);
  TableMap tables;
  tables.emplace(1, std::move(table));
  BuiltTransfer configs = BuildTransfer(tables, Map(), {}, {}, 1 << 20, 100);
  EXPECT_EQ(configs.messages[0].header.replicate().transfer().tables_size(), 1);
  EXPECT_EQ(counting->walks, 0);
  // The control: a transfer of shards walks them.
  BuiltTransfer rows = BuildTransfer(tables, Map(), std::vector<uint32_t>{0, 1, 2, 3},
                                     std::vector<uint64_t>{0, 0, 0, 0}, 1 << 20, 100);
  EXPECT_EQ(rows.rows, 20u);
  EXPECT_EQ(counting->walks, 1);
}

TEST(StateTransferTest, SplitsRowsOverMessagesOfBoundedSize) {
  const ShardMapView map = Map();
  const TableMap tables = Tables();
  const std::vector<uint32_t> shards = {0, 2};
  // 2 rows of table 1 (8 + 8 bytes each) per message.
  BuiltTransfer built = BuildTransfer(tables, map, shards, std::vector<uint64_t>{0, 0}, 64, 100);
  ASSERT_GT(built.messages.size(), 2u);
  for (size_t i = 0; i < built.messages.size(); ++i) {
    const Message& m = built.messages[i];
    EXPECT_EQ(m.header.replicate().transfer().continued(), i > 0);
    size_t bytes = 0;
    for (const Buffer& f : m.frames) bytes += f.size();
    EXPECT_LE(bytes, 32u) << "message " << i;
  }
  EXPECT_EQ(RowsOf(built.messages), RowsOfShards(map, {0, 2}));
  EXPECT_EQ(built.messages[0].header.replicate().transfer().tables_size(), 2);  // every config first
}

TEST(StateTransferTest, ABackupAcceptsOnlyATransferOfShardsItBacksUpFromTheirPrimary) {
  const ShardMapView map = Map();
  const TableMap tables = Tables();
  const std::vector<uint32_t> shards = {0, 2};
  BuiltTransfer built = BuildTransfer(tables, map, shards, std::vector<uint64_t>{0, 0}, 1 << 20, 100);
  const Message& m = built.messages[0];
  const TableMap none;
  auto ok = CheckTransfer(m, map, /*my_rank=*/1, /*from=*/0, none);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (absl::flat_hash_set<uint32_t>{0, 2}));
  EXPECT_TRUE(CheckTransfer(m, map, 1, 0, tables).ok());  // the same tables here

  auto wrong_from = CheckTransfer(m, map, 1, 1, none);
  EXPECT_EQ(wrong_from.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_from.status().message().find("transfer of shard 0 from server 1"), std::string::npos);

  Message short_frames = m;
  short_frames.frames.pop_back();
  EXPECT_EQ(CheckTransfer(short_frames, map, 1, 0, none).status().code(), absl::StatusCode::kInvalidArgument);

  TableMap other;
  other.emplace(1, std::make_unique<Table>(Config(1, 3), [](Key) { return true; }));
  EXPECT_EQ(CheckTransfer(m, map, 1, 0, other).status().code(), absl::StatusCode::kAlreadyExists);

  Message stray = m;  // a key of shard 1, not transferred
  proto::ShardTransfer* t = stray.header.mutable_replicate()->mutable_transfer();
  Key k = 0;
  while (map.VShardOfKey(t->tables(0).table_id(), k) != 1) ++k;
  std::vector<Key> keys(stray.frames[0].As<Key>().begin(), stray.frames[0].As<Key>().end());
  keys[0] = k;
  stray.frames[0] = Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key));
  auto s = CheckTransfer(stray, map, 1, 0, none);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("is not in the shards transferred"), std::string::npos) << s.status();

  Message window = m;  // a window of a shard not transferred
  window.header.mutable_replicate()->mutable_transfer()->add_dedup()->set_vshard(1);
  EXPECT_EQ(CheckTransfer(window, map, 1, 0, none).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateTransferTest, RescopeKeepsOnlyTheShardsKept) {
  const ShardMapView map = Map();
  const TableMap tables = Tables();
  const std::vector<uint32_t> shards = {0, 2};
  BuiltTransfer built = BuildTransfer(tables, map, shards, std::vector<uint64_t>{3, 4}, 1 << 20, 100);
  Message m = built.messages[0];
  auto* t = m.header.mutable_replicate()->mutable_transfer();
  t->add_dedup()->set_vshard(0);
  t->add_dedup()->set_vshard(2);
  t->add_clocks()->set_worker_id(9);
  RescopeTransfer(m, [](uint32_t v) { return v == 2; }, map);
  const proto::ShardTransfer& r = m.header.replicate().transfer();
  EXPECT_EQ(std::vector<uint32_t>(r.vshards().begin(), r.vshards().end()), std::vector<uint32_t>{2});
  EXPECT_EQ(std::vector<uint64_t>(r.applied().begin(), r.applied().end()), std::vector<uint64_t>{4});
  ASSERT_EQ(r.dedup_size(), 1);
  EXPECT_EQ(r.dedup(0).vshard(), 2u);
  EXPECT_EQ(r.clocks_size(), 1);
  EXPECT_EQ(r.tables_size(), 2);
  EXPECT_EQ(RowsOf({m}), RowsOfShards(map, {2}));
  EXPECT_TRUE(CheckTransfer(m, map, 1, 0, TableMap()).ok());  // still a well-formed transfer

  Message whole = built.messages[0];
  RescopeTransfer(whole, [](uint32_t) { return true; }, map);
  EXPECT_EQ(RowsOf({whole}), RowsOfShards(map, {0, 2}));
}

TEST(StateTransferTest, ABackupSetsTheRowsOfATransferAfterCreatingItsTables) {
  const ShardMapView map = Map();
  BuiltTransfer built = BuildTransfer(Tables(), map, std::vector<uint32_t>{1}, std::vector<uint64_t>{0}, 1 << 20, 101);
  ASSERT_EQ(built.messages.size(), 1u);
  TableMap backup;
  std::vector<uint32_t> created;
  auto create = [&](const proto::TableConfig& c) {
    created.push_back(c.table_id());
    backup.emplace(c.table_id(), std::make_unique<Table>(c, [](Key) { return true; }));
    return absl::OkStatus();
  };
  ASSERT_TRUE(SetTransferRows(built.messages[0], backup, create).ok());
  EXPECT_EQ(created, (std::vector<uint32_t>{1, 2}));
  for (uint32_t id : {1u, 2u}) {
    size_t expected = 0;
    for (Key k = 0; k < 20; ++k) expected += map.VShardOfKey(id, k) == 1;
    EXPECT_EQ(backup.at(id)->num_rows(), expected) << id;
    backup.at(id)->ForEachRow([&](Key k, std::span<const float> row) {
      EXPECT_EQ(map.VShardOfKey(id, k), 1u);
      EXPECT_EQ(row[0], static_cast<float>(k));
    });
  }
  TableMap none;
  auto refuse = [](const proto::TableConfig&) { return absl::FailedPreconditionError("no"); };
  EXPECT_EQ(SetTransferRows(built.messages[0], none, refuse).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StateTransferTest, ClocksTravelWithTheTransferAndNeverGoBack) {
  ClockTable primary;
  primary.Reset({{100, 0}, {101, 1}, {102, 2}});
  ASSERT_TRUE(primary.Advance(100, 5).ok());
  primary.Remove(101);
  proto::ShardTransfer t;
  AddClocks(primary, &t);
  ASSERT_EQ(t.clocks_size(), 3);
  ClockTable backup;
  backup.Reset({{100, 0}, {101, 1}, {102, 2}});
  ASSERT_TRUE(backup.Advance(102, 9).ok());
  TakeClocks(t, backup);
  EXPECT_EQ(backup.ClockOf(100), 5u);
  EXPECT_FALSE(backup.IsLive(101));
  EXPECT_EQ(backup.ClockOf(102), 9u);  // never back
  ClockTable stranger;
  stranger.Reset({{200, 0}});
  TakeClocks(t, stranger);  // workers it does not know are skipped
  EXPECT_FALSE(stranger.IsKnown(100));
}

TEST(StateTransferTest, OnlyTheLastMessageOfATransferOfShardsPutsThemInSync) {
  BuiltTransfer built = BuildTransfer(Tables(), Map(), std::vector<uint32_t>{0, 2},
                                      std::vector<uint64_t>{0, 0}, 1 << 20, 100);
  ASSERT_EQ(built.messages.size(), 1u);
  auto in_sync = ShardsInSyncOf(built.messages[0], /*more=*/false, 1);
  ASSERT_TRUE(in_sync.has_value());
  EXPECT_EQ(in_sync->backup_rank(), 1u);
  EXPECT_EQ(std::vector<uint32_t>(in_sync->vshards().begin(), in_sync->vshards().end()),
            (std::vector<uint32_t>{0, 2}));
  EXPECT_FALSE(ShardsInSyncOf(built.messages[0], /*more=*/true, 1).has_value());
  BuiltTransfer configs = BuildTransfer(Tables(), Map(), {}, {}, 1 << 20, 100);  // a table config only
  EXPECT_FALSE(ShardsInSyncOf(configs.messages[0], false, 1).has_value());
  Message forward;
  forward.header.mutable_replicate()->set_table_id(1);
  EXPECT_FALSE(ShardsInSyncOf(forward, false, 1).has_value());
}

}  // namespace
}  // namespace tessera
