#include "server/map_change.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"

namespace tessera {
namespace {

using parts_test::Nodes;
using parts_test::View;

TEST(MapChangeTest, OnlyANewerMapReplacesAndServersNeverGo) {
  const ShardMapView at2 = View(RoundRobinShardMap(2, 4, Nodes({10, 11})));
  EXPECT_FALSE(*ReplacesMap(at2, View(RoundRobinShardMap(2, 4, Nodes({10, 11}))), false));
  EXPECT_FALSE(*ReplacesMap(at2, View(RoundRobinShardMap(1, 4, Nodes({10, 11}))), false));
  EXPECT_TRUE(*ReplacesMap(at2, View(RoundRobinShardMap(1, 4, Nodes({10, 11}))), /*accept_old_epoch=*/true));
  EXPECT_TRUE(*ReplacesMap(at2, View(RoundRobinShardMap(3, 4, Nodes({10, 11, 12}))), false));
  auto fewer = ReplacesMap(at2, View(RoundRobinShardMap(3, 4, Nodes({10}))), false);
  EXPECT_EQ(fewer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fewer.status().message(), "shard map of epoch 3 has 1 servers, fewer than 2");
  // An equal epoch is not looked at further.
  EXPECT_FALSE(*ReplacesMap(at2, View(RoundRobinShardMap(2, 4, Nodes({10}))), false));
}

TEST(MapChangeTest, MovedShardsLeftThePrimaryAndReleasedOnesEveryCopy) {
  // 4 shards on 3 servers, replication 2: shard v on v mod 3, backed up by
  // the next server. Rank 0 leads 0 and 3 and backs up 2.
  const proto::ShardMap before = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  proto::ShardMap after = before;
  after.set_epoch(2);
  after.set_vshard_server_rank(3, 1);  // shard 3 now led by rank 1 ...
  BackupLists lists = BackupListsOf(before);
  lists[3] = {0};                      // ... and backed up by rank 0: moved, not released
  lists[2] = {1};                      // rank 0 no longer backs up shard 2: released
  SetBackupLists(&after, lists);
  const ShardsLost lost = ShardsLostIn(View(before), View(after), 0);
  EXPECT_EQ(lost.moved, (absl::flat_hash_set<uint32_t>{3}));
  EXPECT_EQ(lost.released, (absl::flat_hash_set<uint32_t>{2}));
  const ShardsLost none = ShardsLostIn(View(before), View(before), 0);
  EXPECT_TRUE(none.moved.empty());
  EXPECT_TRUE(none.released.empty());
}

TEST(MapChangeTest, AStreamKeepsTheShardsItsBackupStillBacksUpForThisPrimary) {
  const ShardMapView map = View(RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2));
  const auto kept = KeptFor(map, 0, 1);
  EXPECT_TRUE(kept(0));   // led by 0, backed up by 1
  EXPECT_TRUE(kept(3));
  EXPECT_FALSE(kept(1));  // led by 1
  EXPECT_FALSE(kept(2));  // led by 2
  EXPECT_FALSE(KeptFor(map, 0, 2)(0));  // rank 2 does not back up shard 0
}

TEST(MapChangeTest, CarriedPushesAreEveryPushWaitingOnTheStream) {
  BackupStream stream;
  stream.unacked.push_back(Forward{.position = 1, .push_id = 4, .message = {}, .sent = 0});
  stream.unacked.push_back(Forward{.position = 2, .push_id = 0, .message = {}, .sent = 0, .carried = {1, 2}});
  stream.unacked.push_back(Forward{.position = 3, .push_id = 6, .message = {}, .sent = 0});
  EXPECT_EQ(CarriedPushes(stream), (std::vector<uint64_t>{4, 1, 2, 6}));
  EXPECT_TRUE(CarriedPushes(BackupStream{}).empty());
}

TEST(MapChangeTest, AbortedAnswersGoToTheSenderAtTheNewEpoch) {
  PushAcks::Waiting waiting{.to = "tcp://w", .reply = {}};
  waiting.reply.header.set_request_id(9);
  waiting.reply.header.mutable_ack();
  std::vector<Outgoing> out;
  AnswerAborted(std::move(waiting), RemovedError(2, 5), 5, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, "tcp://w");
  EXPECT_EQ(out[0].message.header.request_id(), 9u);
  EXPECT_EQ(out[0].message.header.epoch(), 5u);
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(out[0].message.header.error().message(),
            "server 2 was removed from the job at map epoch 5 before its backups had the push");

  out.clear();
  AnswerAborted(PushAcks::Waiting{}, RemovedError(2, 5), 5, out);  // no sender: no answer
  EXPECT_TRUE(out.empty());

  ShardMoves::HeldReply held;
  held.to = "tcp://r";
  held.header.set_request_id(3);
  held.header.mutable_pull_reply()->set_num_keys(4);
  AnswerAborted(std::move(held), MovedBeforeReadError(1, 0, 6), 6, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, "tcp://r");
  EXPECT_EQ(out[0].message.header.request_id(), 3u);
  EXPECT_FALSE(out[0].message.header.has_pull_reply());
  EXPECT_EQ(out[0].message.header.epoch(), 6u);
  EXPECT_EQ(out[0].message.header.error().message(),
            "shard 1 moved from server 0 at map epoch 6 before its new primary had what this pull read");
  EXPECT_EQ(MovedBeforeBackupsError(3, 0, 1, 6).message(),
            "shard 3 moved from server 0 to server 1 at map epoch 6 before its backups had the push");
}

}  // namespace
}  // namespace tessera
