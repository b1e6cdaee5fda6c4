#include "common/keys.h"

#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr uint32_t kShards = 64;

// Asserts that every shard got within ±20% of the mean.
void ExpectEvenSpread(const std::vector<int>& counts, int total, const std::string& what) {
  const double mean = static_cast<double>(total) / counts.size();
  for (size_t s = 0; s < counts.size(); ++s) {
    EXPECT_GE(counts[s], 0.8 * mean) << what << ": shard " << s;
    EXPECT_LE(counts[s], 1.2 * mean) << what << ": shard " << s;
  }
}

TEST(KeysTest, VirtualShardOfSpreadsConsecutiveKeys) {
  std::vector<int> counts(kShards, 0);
  const int n = 100'000;
  for (Key k = 0; k < static_cast<Key>(n); ++k) {
    uint32_t v = VirtualShardOf(/*table_id=*/1, k, kShards);
    ASSERT_LT(v, kShards);
    counts[v]++;
  }
  ExpectEvenSpread(counts, n, "keys 0..99999");
}

TEST(KeysTest, VirtualShardOfSpreadsStridedAndHighKeys) {
  // Embedding ids often share low bits (multiples of a power of two) or carry
  // a feature id in the high bits.
  for (Key stride : {Key{64}, Key{1024}, Key{1} << 32}) {
    std::vector<int> counts(kShards, 0);
    const int n = 100'000;
    for (int i = 0; i < n; ++i) counts[VirtualShardOf(7, static_cast<Key>(i) * stride, kShards)]++;
    ExpectEvenSpread(counts, n, "stride " + std::to_string(stride));
  }
}

TEST(KeysTest, VirtualShardOfIsDeterministicAndMixesTheTable) {
  int same = 0;
  for (Key k = 0; k < 10'000; ++k) {
    EXPECT_EQ(VirtualShardOf(3, k, kShards), VirtualShardOf(3, k, kShards));
    if (VirtualShardOf(3, k, kShards) == VirtualShardOf(4, k, kShards)) same++;
  }
  // Independent placement agrees about 1/64 of the time.
  EXPECT_LT(same, 10'000 / 16);
  EXPECT_EQ(VirtualShardOf(1, 12345, 1), 0u);
}

proto::NodeInfo Server(uint32_t rank) {
  proto::NodeInfo n;
  n.set_node_id(100 + rank);
  n.set_role(proto::SERVER);
  n.set_rank(rank);
  n.set_address("tcp://127.0.0.1:" + std::to_string(6000 + rank));
  return n;
}

TEST(KeysTest, ShardMapViewAcceptsRoundRobinMap) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1), Server(2)};
  proto::ShardMap map = RoundRobinShardMap(/*epoch=*/5, /*num_vshards=*/kShards, servers);
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(map);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->epoch(), 5u);
  EXPECT_EQ(view->num_vshards(), kShards);
  EXPECT_EQ(view->num_servers(), 3u);
  for (uint32_t v = 0; v < kShards; ++v) EXPECT_EQ(view->ServerRankOf(v), v % 3);
  EXPECT_EQ(view->server(2).address(), "tcp://127.0.0.1:6002");
  for (Key k = 0; k < 1000; ++k) {
    EXPECT_EQ(view->ServerRankOfKey(9, k), VirtualShardOf(9, k, kShards) % 3);
  }
}

TEST(KeysTest, ShardMapViewRejectsMapWithoutServers) {
  proto::ShardMap map = RoundRobinShardMap(1, kShards, {});
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(map);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KeysTest, ShardMapViewRejectsZeroShards) {
  std::vector<proto::NodeInfo> servers = {Server(0)};
  EXPECT_EQ(ShardMapView::Create(RoundRobinShardMap(1, 0, servers)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KeysTest, ShardMapViewRejectsWrongOwnerCount) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1)};
  proto::ShardMap map = RoundRobinShardMap(1, 8, servers);
  map.add_vshard_server_rank(0);  // 9 owners for 8 shards
  EXPECT_EQ(ShardMapView::Create(map).status().code(), absl::StatusCode::kInvalidArgument);
  map.mutable_vshard_server_rank()->Truncate(7);  // 7 owners for 8 shards
  EXPECT_EQ(ShardMapView::Create(map).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KeysTest, ShardMapViewRejectsUnknownServerRank) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1)};
  proto::ShardMap map = RoundRobinShardMap(1, 8, servers);
  map.set_vshard_server_rank(3, 2);  // only ranks 0 and 1 exist
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(map);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("rank 2"), std::string::npos) << view.status();
}

}  // namespace
}  // namespace tessera
