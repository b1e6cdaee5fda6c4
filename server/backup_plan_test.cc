#include "server/backup_plan.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"

namespace tessera {
namespace {

using parts_test::Nodes;
using parts_test::View;

// 4 shards on 3 servers with replication 2: shard v on v mod 3, backed up
// by the next server. Rank 0 is primary of shards 0 and 3, backed up by 1.
TEST(BackupPlanTest, AnUnchangedMapOwesNoTransfers) {
  const proto::ShardMap map = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  const std::vector<uint32_t> streamed = {1};
  const auto plans = PlanBackups(View(map), View(map), 0, streamed);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].rank, 1u);
  EXPECT_EQ(plans[0].held, (std::vector<uint32_t>{0, 3}));
  EXPECT_TRUE(plans[0].fresh.empty());
}

TEST(BackupPlanTest, ANewProcessAtARankGetsEveryShardByTransfer) {
  const proto::ShardMap before = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  proto::ShardMap after = RoundRobinShardMap(2, 4, Nodes({10, 21, 12}), 2);  // rank 1 restarted
  const auto plans = PlanBackups(View(before), View(after), 0, std::vector<uint32_t>{1});
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].fresh, (std::vector<uint32_t>{0, 3}));
}

TEST(BackupPlanTest, ANewBackupGetsTheShardsItDidNotHoldAndAnOldStreamWithNoneEnds) {
  const proto::ShardMap before = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  proto::ShardMap after = before;
  after.set_epoch(2);
  BackupLists lists = BackupListsOf(before);
  lists[3] = {2};  // shard 3 (rank 0's) is now backed up by rank 2 instead of rank 1
  SetBackupLists(&after, lists);
  const auto plans = PlanBackups(View(before), View(after), 0, std::vector<uint32_t>{1});
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].rank, 1u);
  EXPECT_EQ(plans[0].held, std::vector<uint32_t>{0});
  EXPECT_TRUE(plans[0].fresh.empty());
  EXPECT_EQ(plans[1].rank, 2u);
  EXPECT_EQ(plans[1].held, std::vector<uint32_t>{3});
  EXPECT_EQ(plans[1].fresh, std::vector<uint32_t>{3});

  lists[0] = {2};  // now rank 1 backs up nothing of rank 0's: its stream ends
  SetBackupLists(&after, lists);
  const auto ended = PlanBackups(View(before), View(after), 0, std::vector<uint32_t>{1});
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].rank, 1u);
  EXPECT_TRUE(ended[0].held.empty());
}

TEST(BackupPlanTest, ShardsTakenOverFromAnotherPrimaryAreTransferredAndNewServersAreNew) {
  const proto::ShardMap before = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  // Rank 1 died: rank 2 (its backup) leads shard 1, backed up by rank 0; and
  // a fourth server (rank 3) joined and backs up shard 2 of rank 2.
  proto::ShardMap after = RoundRobinShardMap(2, 4, Nodes({10, 11, 12, 13}), 2);
  after.clear_vshard_server_rank();
  for (uint32_t owner : {0u, 2u, 2u, 0u}) after.add_vshard_server_rank(owner);
  after.add_dead_server_ranks(1);
  SetBackupLists(&after, {{2}, {0}, {3}, {2}});
  const auto plans = PlanBackups(View(before), View(after), 2, std::vector<uint32_t>{0});
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].rank, 0u);
  EXPECT_EQ(plans[0].held, std::vector<uint32_t>{1});
  EXPECT_EQ(plans[0].fresh, std::vector<uint32_t>{1});  // rank 2 was not shard 1's primary before
  EXPECT_EQ(plans[1].rank, 3u);
  EXPECT_EQ(plans[1].fresh, std::vector<uint32_t>{2});  // not in the old map at all
}

TEST(BackupPlanTest, TransfersAgainGoToEachBackupOfTheShardsThisServerLeads) {
  // Rank 0 leads 0 and 3 (backed up by 1); rank 1 leads 1 (backed up by 2).
  const ShardMapView map = View(RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2));
  const std::vector<uint32_t> asked = {3, 1, 0, 9};  // 1: not rank 0's; 9: not a shard
  const auto targets = TransferTargets(map, 0, asked);
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].first, 1u);
  EXPECT_EQ(targets[0].second, (std::vector<uint32_t>{3, 0}));
  EXPECT_TRUE(TransferTargets(map, 2, asked).empty());  // rank 2 leads none of them
  EXPECT_EQ(BackupsOfLed(map, 0), std::vector<uint32_t>{1});
  EXPECT_EQ(BackupsOfLed(map, 2), std::vector<uint32_t>{0});
  EXPECT_TRUE(BackupsOfLed(View(RoundRobinShardMap(1, 4, Nodes({10, 11, 12}))), 0).empty());
}

}  // namespace
}  // namespace tessera
