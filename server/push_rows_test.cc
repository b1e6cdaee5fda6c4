#include "server/push_rows.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"

namespace tessera {
namespace {

using parts_test::Config;
using parts_test::Nodes;
using parts_test::View;
using parts_test::KeysBuffer;

// One float per row: row i holds 10 * (i + 1).
Buffer ValuesBuffer(size_t rows) {
  Buffer b = Buffer::Allocate(rows * sizeof(float));
  for (size_t i = 0; i < rows; ++i) b.AsMutable<float>()[i] = 10.0f * static_cast<float>(i + 1);
  return b;
}

std::vector<Key> KeysOf(const Buffer& b) { return std::vector<Key>(b.As<Key>().begin(), b.As<Key>().end()); }
std::vector<float> FloatsOf(const Buffer& b) {
  return std::vector<float>(b.As<float>().begin(), b.As<float>().end());
}

PushOrigin Origin(uint64_t seq, uint32_t incarnation = 1) {
  return PushOrigin{.worker = 7, .incarnation = incarnation, .seq = seq, .acked_below = seq};
}

TEST(PushRowsTest, AllRowsOfAFreshPushAreTheFramesThemselves) {
  PushDedup dedup;
  const Buffer keys = KeysBuffer({1, 2, 3}), values = ValuesBuffer(3);
  const std::vector<uint32_t> vshard = {0, 1, 0}, shards = {0, 1};
  auto rows = SelectRowsToApply(dedup, Origin(5), shards, false, keys, values, vshard, sizeof(float), nullptr);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->duplicate.empty());
  EXPECT_EQ(rows->keys.data(), keys.data());  // not copied
  EXPECT_EQ(rows->values.data(), values.data());
}

TEST(PushRowsTest, ShardsThatHadThePushAndShardsNotTakenAreLeftOut) {
  PushDedup dedup;
  dedup.RecordApplied(1, Origin(5));
  const Buffer keys = KeysBuffer({1, 2, 3, 4}), values = ValuesBuffer(4);
  const std::vector<uint32_t> vshard = {0, 1, 2, 0}, shards = {0, 1, 2};
  auto rows = SelectRowsToApply(dedup, Origin(5), shards, false, keys, values, vshard, sizeof(float), nullptr);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->duplicate, (absl::flat_hash_set<uint32_t>{1}));
  EXPECT_EQ(KeysOf(rows->keys), (std::vector<Key>{1, 3, 4}));
  EXPECT_EQ(FloatsOf(rows->values), (std::vector<float>{10, 30, 40}));

  // Shard 2 is not this server's (a resend spanning servers).
  rows = SelectRowsToApply(dedup, Origin(5), shards, false, keys, values, vshard, sizeof(float),
                           [](uint32_t v) { return v != 2; });
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(KeysOf(rows->keys), (std::vector<Key>{1, 4}));
  EXPECT_EQ(FloatsOf(rows->values), (std::vector<float>{10, 40}));

  // The test switch applies duplicates again.
  rows = SelectRowsToApply(dedup, Origin(5), shards, true, keys, values, vshard, sizeof(float), nullptr);
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->duplicate.empty());
  EXPECT_EQ(rows->keys.size(), keys.size());
}

TEST(PushRowsTest, AnOlderIncarnationIsRefusedAndNothingIsSelected) {
  PushDedup dedup;
  dedup.RecordApplied(0, Origin(1, /*incarnation=*/2));
  const Buffer keys = KeysBuffer({1}), values = ValuesBuffer(1);
  auto rows = SelectRowsToApply(dedup, Origin(9, /*incarnation=*/1), std::vector<uint32_t>{0}, false, keys, values,
                                std::vector<uint32_t>{0}, sizeof(float), nullptr);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PushRowsTest, RecordingSkipsDuplicatesAndCountsTheRest) {
  PushDedup dedup;
  absl::flat_hash_map<uint32_t, uint64_t> applied = {{0, 4}};
  RecordApplied(dedup, applied, std::vector<uint32_t>{0, 1, 2}, absl::flat_hash_set<uint32_t>{1}, Origin(5));
  EXPECT_EQ(applied[0], 5u);
  EXPECT_FALSE(applied.contains(1));
  EXPECT_EQ(applied[2], 1u);
  EXPECT_TRUE(dedup.IsDuplicate(0, Origin(5)));
  EXPECT_FALSE(dedup.IsDuplicate(1, Origin(5)));
  EXPECT_TRUE(dedup.IsDuplicate(2, Origin(5)));
}

TEST(PushRowsTest, TheForwardHeaderCarriesOriginClockAndPiece) {
  const proto::Replicate r = ForwardOf(Origin(5), 3, 11, Columns{2, 4});
  EXPECT_EQ(r.worker_id(), 7u);
  EXPECT_EQ(r.incarnation(), 1u);
  EXPECT_EQ(r.seq(), 5u);
  EXPECT_EQ(r.acked_below(), 5u);
  EXPECT_EQ(r.table_id(), 3u);
  EXPECT_EQ(r.clock(), 11u);
  EXPECT_EQ(r.first_column(), 2u);
  EXPECT_EQ(r.columns(), 4u);
  EXPECT_EQ(r.num_keys(), 0u);
}

// 4 shards on 3 servers with replication 2: shard v on v mod 3, backed up
// by the next server. Rank 0 leads shards 0 and 3, both backed up by rank 1.
TEST(PushRowsTest, EachBackupGetsTheRowsOfTheShardsItBacksUp) {
  proto::ShardMap m = RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2);
  BackupLists lists = BackupListsOf(m);
  lists[3] = {2};  // shard 3 backed up by rank 2 instead
  SetBackupLists(&m, lists);
  const ShardMapView map = View(m);
  const Buffer keys = KeysBuffer({1, 2, 3}), values = ValuesBuffer(3);
  const std::vector<uint32_t> vshard = {0, 3, 0}, shards = {0, 3};
  const proto::Replicate header = ForwardOf(Origin(5), 1, 0, Columns{});
  std::vector<BackupForward> forwards =
      ForwardsOfPush(map, 0, keys, values, vshard, shards, header, sizeof(float), 10);
  ASSERT_EQ(forwards.size(), 2u);
  EXPECT_EQ(forwards[0].rank, 1u);
  EXPECT_EQ(forwards[0].message.header.sender_id(), 10u);
  EXPECT_EQ(forwards[0].message.header.replicate().num_keys(), 2u);
  EXPECT_EQ(forwards[0].message.header.replicate().seq(), 5u);
  EXPECT_EQ(KeysOf(forwards[0].message.frames[0]), (std::vector<Key>{1, 3}));
  EXPECT_EQ(FloatsOf(forwards[0].message.frames[1]), (std::vector<float>{10, 30}));
  EXPECT_EQ(forwards[1].rank, 2u);
  EXPECT_EQ(KeysOf(forwards[1].message.frames[0]), (std::vector<Key>{2}));

  // One backup of every row: the frames themselves.
  forwards = ForwardsOfPush(View(RoundRobinShardMap(1, 4, Nodes({10, 11, 12}), 2)), 0, keys, values, vshard,
                            shards, header, sizeof(float), 10);
  ASSERT_EQ(forwards.size(), 1u);
  EXPECT_EQ(forwards[0].message.frames[0].data(), keys.data());
  // No backups: no forwards.
  EXPECT_TRUE(ForwardsOfPush(View(RoundRobinShardMap(1, 4, Nodes({10, 11, 12}))), 0, keys, values, vshard, shards,
                             header, sizeof(float), 10)
                  .empty());
}

TEST(PushRowsTest, AnUnacknowledgedForwardKeepsOnlyTheRowsOfShardsKept) {
  const ShardMapView map = View(RoundRobinShardMap(1, 4, Nodes({10, 11})));
  TableMap tables;
  tables.emplace(1, std::make_unique<Table>(Config(1, 1), [](Key) { return true; }));
  std::vector<Key> keys;
  for (Key k = 0; keys.size() < 4; ++k) keys.push_back(k);
  Message forward;
  *forward.header.mutable_replicate() = ForwardOf(Origin(5), 1, 0, Columns{});
  forward.header.mutable_replicate()->set_num_keys(keys.size());
  forward.frames = {KeysBuffer(keys), ValuesBuffer(keys.size())};
  auto kept = [&](uint32_t v) { return v == map.VShardOfKey(1, keys[1]); };
  RescopeForward(forward, kept, map, tables);
  std::vector<Key> left;
  for (Key k : keys)
    if (kept(map.VShardOfKey(1, k))) left.push_back(k);
  EXPECT_EQ(KeysOf(forward.frames[0]), left);
  EXPECT_EQ(forward.header.replicate().num_keys(), left.size());
  EXPECT_EQ(forward.frames[1].size(), left.size() * sizeof(float));

  RescopeForward(forward, [](uint32_t) { return false; }, map, tables);  // nothing kept: it still goes
  EXPECT_EQ(forward.header.replicate().num_keys(), 0u);
  EXPECT_EQ(forward.frames.size(), 2u);

  Message unknown;
  *unknown.header.mutable_replicate() = ForwardOf(Origin(5), 9, 0, Columns{});
  unknown.header.mutable_replicate()->set_num_keys(1);
  unknown.frames = {KeysBuffer({1}), ValuesBuffer(1)};
  RescopeForward(unknown, [](uint32_t) { return false; }, map, tables);  // unknown table: as it was
  EXPECT_EQ(unknown.header.replicate().num_keys(), 1u);
}

}  // namespace
}  // namespace tessera
