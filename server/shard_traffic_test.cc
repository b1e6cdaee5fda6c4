#include "server/shard_traffic.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

ShardMapView Map(uint32_t num_vshards, uint32_t servers) {
  std::vector<proto::NodeInfo> nodes(servers);
  for (uint32_t i = 0; i < servers; ++i) nodes[i].set_node_id(100 + i);
  auto view = ShardMapView::Create(RoundRobinShardMap(1, num_vshards, nodes));
  EXPECT_TRUE(view.ok()) << view.status();
  return *view;
}

TEST(ShardTrafficTest, CountsEachRequestOncePerShardAndBytesPerKey) {
  const ShardMapView map = Map(4, 2);  // rank 0 is primary of shards 0 and 2
  ShardTrafficCounts c;
  EXPECT_TRUE(c.per_shard().empty());
  const std::vector<uint32_t> push_shards = {0, 0, 2, 1};  // four keys; shard 1 is rank 1's
  c.Note(map, 0, push_shards, 16, /*push=*/true);
  ASSERT_EQ(c.per_shard().size(), 4u);
  EXPECT_EQ(c.per_shard()[0].requests, 1u);
  EXPECT_EQ(c.per_shard()[0].bytes_in, 2 * (sizeof(Key) + 16));
  EXPECT_EQ(c.per_shard()[0].bytes_out, 0u);
  EXPECT_EQ(c.per_shard()[2].bytes_in, sizeof(Key) + 16);
  EXPECT_EQ(c.per_shard()[1].requests, 0u);  // not this server's: not counted
  const std::vector<uint32_t> pull_shards = {2, 2, 2};
  c.Note(map, 0, pull_shards, 8, /*push=*/false);
  EXPECT_EQ(c.per_shard()[2].requests, 2u);
  EXPECT_EQ(c.per_shard()[2].bytes_in, sizeof(Key) + 16 + 3 * sizeof(Key));
  EXPECT_EQ(c.per_shard()[2].bytes_out, 3 * 8u);
}

TEST(ShardTrafficTest, LoadsNameOnlyShardsThisServerIsPrimaryOfNow) {
  ShardTrafficCounts c;
  const std::vector<uint32_t> shards = {0, 2, 7};  // 7: past the map, ignored
  c.Note(Map(4, 2), 0, shards, 4, /*push=*/true);
  proto::Heartbeat hb;
  c.AddLoads(Map(4, 2), 0, &hb);
  ASSERT_EQ(hb.shard_loads_size(), 2);
  EXPECT_EQ(hb.shard_loads(0).vshard(), 0u);
  EXPECT_EQ(hb.shard_loads(1).vshard(), 2u);
  EXPECT_EQ(hb.shard_loads(1).requests(), 1u);
  EXPECT_EQ(hb.shard_loads(1).bytes_in(), sizeof(Key) + 4);
  proto::Heartbeat other;
  c.AddLoads(Map(4, 2), 1, &other);  // as rank 1: none of the counted shards is its own
  EXPECT_EQ(other.shard_loads_size(), 0);
}

}  // namespace
}  // namespace tessera
