#include "server/audit_log.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

std::string Entries(const AuditLog& log, uint32_t table, Key key) {
  std::string out;
  log.AppendEntries(table, key, &out);
  return out;
}

TEST(AuditLogTest, RecordsEveryPushAppliedToARowInOrder) {
  AuditLog log;
  const std::vector<Key> keys = {5, 9};
  log.Applied(1, keys, PushOrigin{.worker = 7, .incarnation = 1, .seq = 3}, Columns{});
  log.Applied(1, std::vector<Key>{9}, PushOrigin{.worker = 8, .incarnation = 2, .seq = 1}, Columns{4, 2});
  EXPECT_EQ(Entries(log, 1, 5), " 7:1:3");
  EXPECT_EQ(Entries(log, 1, 9), " 7:1:3 8:2:1:4:2");  // a piece names its columns
  EXPECT_EQ(Entries(log, 2, 5), "");                  // another table
  EXPECT_EQ(log.rows(), 2u);
}

TEST(AuditLogTest, ExportThenImportKeepsTheRecordsOfTheRowsKept) {
  AuditLog a;
  a.Applied(1, std::vector<Key>{3, 1}, PushOrigin{.worker = 7, .incarnation = 1, .seq = 3}, Columns{0, 2});
  a.Applied(2, std::vector<Key>{1}, PushOrigin{.worker = 8, .incarnation = 1, .seq = 4}, Columns{});
  proto::ShardTransfer t;
  a.Export([](uint32_t table, Key) { return table == 1; }, &t);
  ASSERT_EQ(t.audit_size(), 2);
  EXPECT_EQ(t.audit(0).key(), 1u);  // sorted
  EXPECT_EQ(t.audit(1).key(), 3u);

  AuditLog b;
  b.Applied(1, std::vector<Key>{1}, PushOrigin{.worker = 9, .incarnation = 1, .seq = 1}, Columns{});  // replaced
  b.Import(t, [](uint32_t, Key k) { return k == 1; });
  EXPECT_EQ(Entries(b, 1, 1), " 7:1:3:0:2");
  EXPECT_EQ(Entries(b, 1, 3), "");  // not kept

  // A sender without per-entry columns: whole rows.
  proto::ShardTransfer old = t;
  old.mutable_audit(0)->clear_first_columns();
  old.mutable_audit(0)->clear_columns();
  AuditLog c;
  c.Import(old, [](uint32_t, Key) { return true; });
  EXPECT_EQ(Entries(c, 1, 1), " 7:1:3");
}

TEST(AuditLogTest, ForgetDropsTheRowsItIsTold) {
  AuditLog log;
  log.Applied(1, std::vector<Key>{1, 2, 3}, PushOrigin{.worker = 7, .incarnation = 1, .seq = 1}, Columns{});
  log.Forget([](uint32_t, Key k) { return k != 2; });
  EXPECT_EQ(log.rows(), 1u);
  EXPECT_EQ(Entries(log, 1, 2), " 7:1:1");
}

TEST(AuditLogTest, RestoredNamesEachShardAndTheWindowsItsCheckpointHeld) {
  proto::ShardTransfer state;
  auto* d = state.add_dedup();
  d->set_vshard(4);
  d->set_worker_id(7);
  d->set_incarnation(2);
  d->set_floor(10);
  d->add_seqs(12);
  d->add_seqs(11);
  auto* other = state.add_dedup();  // a shard not restored
  other->set_vshard(5);
  other->set_worker_id(7);
  AuditLog log;
  log.Restored(state, std::vector<uint32_t>{6, 4}, 8);
  ASSERT_EQ(log.RestoreLines().size(), 2u);
  EXPECT_EQ(log.RestoreLines()[0], "restored 4 of 8 7:2:10:11/12");
  EXPECT_EQ(log.RestoreLines()[1], "restored 6 of 8");
}

TEST(AuditLogTest, TheDumpNamesTheServerThenItsRestoresThenTheRowsItHolds) {
  std::vector<proto::NodeInfo> nodes(2);
  nodes[0].set_node_id(10);
  nodes[1].set_node_id(11);
  proto::ShardMap m = RoundRobinShardMap(4, 4, nodes, 2);  // every server holds every shard
  auto map = ShardMapView::Create(m);
  ASSERT_TRUE(map.ok());
  proto::TableConfig c;
  c.set_table_id(1);
  c.set_width(2);
  c.set_kind(proto::SPARSE);
  c.set_optimizer(proto::ACCUMULATE);
  c.set_learning_rate(1.0f);
  TableMap tables;
  tables.emplace(1, std::make_unique<Table>(c, [](Key) { return true; }));
  Key mine = 0, theirs = 0;
  while (map->ServerRankOfKey(1, mine) != 0) ++mine;
  while (map->ServerRankOfKey(1, theirs) != 1) ++theirs;
  const std::vector<Key> keys = {mine, theirs};
  ASSERT_TRUE(tables.at(1)->ApplyPush(keys, std::vector<float>{1, 2, 3, 4}, 0).ok());
  AuditLog log;
  log.Applied(1, std::vector<Key>{mine}, PushOrigin{.worker = 7, .incarnation = 1, .seq = 3}, Columns{});
  const std::string dump = AuditDump(log, tables, *map, 0);
  const Key first = std::min(mine, theirs);
  const std::string mine_line = absl::StrCat("row 1 ", mine, " primary 1,2 7:1:3\n");
  const std::string theirs_line = absl::StrCat("row 1 ", theirs, " backup 3,4\n");
  EXPECT_EQ(dump, absl::StrCat("# tessera audit server 0 epoch 4\n", first == mine ? mine_line : theirs_line,
                               first == mine ? theirs_line : mine_line));
  m.add_servers()->set_node_id(12);  // rank 2, holding nothing, removed
  m.add_dead_server_ranks(2);
  auto deposed = ShardMapView::Create(m);
  ASSERT_TRUE(deposed.ok()) << deposed.status();
  EXPECT_EQ(AuditDump(log, tables, *deposed, 2), "# tessera audit server 2 epoch 4 deposed\n");
}

}  // namespace
}  // namespace tessera
