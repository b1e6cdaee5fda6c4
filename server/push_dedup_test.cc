#include "server/push_dedup.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

PushOrigin Push(uint32_t worker, uint32_t incarnation, uint64_t seq, uint64_t acked_below = 0) {
  return PushOrigin{.worker = worker, .incarnation = incarnation, .seq = seq, .acked_below = acked_below};
}

TEST(PushDedupTest, APushIsADuplicateOnlyInTheShardThatAppliedIt) {
  PushDedup d;
  EXPECT_FALSE(d.IsDuplicate(3, Push(7, 1, 5)));
  d.RecordApplied(3, Push(7, 1, 5));
  EXPECT_TRUE(d.IsDuplicate(3, Push(7, 1, 5)));
  EXPECT_FALSE(d.IsDuplicate(4, Push(7, 1, 5)));  // another shard
  EXPECT_FALSE(d.IsDuplicate(3, Push(8, 1, 5)));  // another worker
  EXPECT_FALSE(d.IsDuplicate(3, Push(7, 1, 6)));  // another push
  EXPECT_FALSE(d.IsDuplicate(3, Push(7, 2, 5)));  // a newer incarnation numbers afresh
}

TEST(PushDedupTest, UnsequencedPushesAreNeverDuplicatesNorRecorded) {
  PushDedup d;
  d.RecordApplied(0, Push(7, 1, 0));
  EXPECT_FALSE(d.IsDuplicate(0, Push(7, 1, 0)));
  EXPECT_EQ(d.windows(), 0u);
  d.RecordApplied(0, Push(7, 3, 1));
  EXPECT_TRUE(d.CheckIncarnation(Push(7, 1, 0), std::vector<uint32_t>{0}).ok());  // seq 0: not checked
}

TEST(PushDedupTest, TheFloorForgetsAcknowledgedPushesButStillCountsThemApplied) {
  PushDedup d;
  d.RecordApplied(0, Push(7, 1, 1));
  d.RecordApplied(0, Push(7, 1, 2));
  d.RecordApplied(0, Push(7, 1, 4, /*acked_below=*/3));  // 1 and 2 acknowledged
  EXPECT_TRUE(d.IsDuplicate(0, Push(7, 1, 1)));
  EXPECT_TRUE(d.IsDuplicate(0, Push(7, 1, 2)));
  EXPECT_FALSE(d.IsDuplicate(0, Push(7, 1, 3)));  // in flight, not applied here
  EXPECT_TRUE(d.IsDuplicate(0, Push(7, 1, 4)));
  // The floor never falls: a late push naming a lower acked_below keeps it.
  d.RecordApplied(0, Push(7, 1, 3, /*acked_below=*/1));
  proto::ShardTransfer t;
  d.Export({0}, &t);
  ASSERT_EQ(t.dedup_size(), 1);
  EXPECT_EQ(t.dedup(0).floor(), 3u);
  EXPECT_EQ(std::vector<uint64_t>(t.dedup(0).seqs().begin(), t.dedup(0).seqs().end()), (std::vector<uint64_t>{3, 4}));
}

TEST(PushDedupTest, ANewerIncarnationReplacesTheWindowAndOlderOnesAreRefused) {
  PushDedup d;
  d.RecordApplied(2, Push(7, 1, 9));
  d.RecordApplied(2, Push(7, 2, 1));
  EXPECT_FALSE(d.IsDuplicate(2, Push(7, 1, 9)));  // the old window is gone
  const std::vector<uint32_t> shards = {1, 2};
  auto s = d.CheckIncarnation(Push(7, 1, 10), shards);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("incarnation 1 of worker node 7, which incarnation 2 has replaced"), std::string::npos)
      << s;
  EXPECT_TRUE(d.CheckIncarnation(Push(7, 2, 2), shards).ok());
  EXPECT_TRUE(d.CheckIncarnation(Push(7, 3, 1), shards).ok());
  EXPECT_TRUE(d.CheckIncarnation(Push(7, 1, 10), std::vector<uint32_t>{1}).ok());  // shard 1 never saw 7
}

TEST(PushDedupTest, ExportIsSortedAndImportRestoresTheSameWindows) {
  PushDedup a;
  a.RecordApplied(5, Push(9, 1, 3));
  a.RecordApplied(5, Push(2, 1, 8));
  a.RecordApplied(5, Push(2, 1, 6));
  a.RecordApplied(1, Push(9, 4, 2, 2));
  a.RecordApplied(7, Push(9, 1, 1));  // not exported
  proto::ShardTransfer t;
  a.Export({1, 5}, &t);
  ASSERT_EQ(t.dedup_size(), 3);
  EXPECT_EQ(t.dedup(0).vshard(), 1u);
  EXPECT_EQ(t.dedup(1).vshard(), 5u);
  EXPECT_EQ(t.dedup(1).worker_id(), 2u);
  EXPECT_EQ(t.dedup(2).worker_id(), 9u);
  EXPECT_EQ(std::vector<uint64_t>(t.dedup(1).seqs().begin(), t.dedup(1).seqs().end()), (std::vector<uint64_t>{6, 8}));

  PushDedup b;
  b.RecordApplied(5, Push(2, 1, 100));  // replaced by the import
  b.Import(t, [](uint32_t v) { return v == 5; });
  EXPECT_EQ(b.windows(), 2u);  // shard 1's window was not kept
  EXPECT_TRUE(b.IsDuplicate(5, Push(2, 1, 6)));
  EXPECT_TRUE(b.IsDuplicate(5, Push(9, 1, 3)));
  EXPECT_FALSE(b.IsDuplicate(5, Push(2, 1, 100)));
  EXPECT_FALSE(b.IsDuplicate(1, Push(9, 4, 1)));
  proto::ShardTransfer again;
  b.Export({5}, &again);
  proto::ShardTransfer only5;
  a.Export({5}, &only5);
  EXPECT_EQ(again.SerializeAsString(), only5.SerializeAsString());
}

TEST(PushDedupTest, ForgetDropsOnlyTheGivenShards) {
  PushDedup d;
  d.RecordApplied(1, Push(7, 1, 1));
  d.RecordApplied(2, Push(7, 1, 1));
  d.Forget({1});
  EXPECT_FALSE(d.IsDuplicate(1, Push(7, 1, 1)));
  EXPECT_TRUE(d.IsDuplicate(2, Push(7, 1, 1)));
  EXPECT_EQ(d.windows(), 1u);
}

}  // namespace
}  // namespace tessera
