#include "common/keys.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

// Fixed values: the placement is part of the wire contract (checkpoints,
// shard maps) and tests/audit/audit_check.py computes it too (its
// test_vshard_of_matches_the_servers expects the same numbers).
TEST(KeysTest, VirtualShardOfKeepsItsKnownValues) {
  EXPECT_EQ(VirtualShardOf(5, 0, 64), 6u);
  EXPECT_EQ(VirtualShardOf(5, 1, 64), 45u);
  EXPECT_EQ(VirtualShardOf(5, 10, 64), 31u);
  EXPECT_EQ(VirtualShardOf(5, 11, 64), 36u);
  EXPECT_EQ(VirtualShardOf(5, 12345, 64), 54u);
  EXPECT_EQ(VirtualShardOf(3, (Key{1} << 63) + 7, 1000), 370u);
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

TEST(KeysTest, ReplicatedMapPutsBackupsOnTheNextServers) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1), Server(2)};
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(RoundRobinShardMap(1, 6, servers, 2));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->replication(), 2u);
  for (uint32_t v = 0; v < 6; ++v) {
    EXPECT_EQ(view->ServerRankOf(v), v % 3);
    ASSERT_EQ(view->BackupsOf(v).size(), 1u);
    EXPECT_EQ(view->BackupsOf(v)[0], (v + 1) % 3);
    EXPECT_TRUE(view->Holds((v + 1) % 3, v));
    EXPECT_FALSE(view->Holds((v + 2) % 3, v));
  }
  // Replication is capped at the number of servers.
  absl::StatusOr<ShardMapView> capped = ShardMapView::Create(RoundRobinShardMap(1, 4, servers, 5));
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->replication(), 3u);
  EXPECT_EQ(capped->BackupsOf(0).size(), 2u);
}

TEST(KeysTest, LosingAServerPromotesItsBackupsAndBumpsTheEpoch) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1), Server(2)};
  const proto::ShardMap map = RoundRobinShardMap(4, 6, servers, 3);
  absl::StatusOr<proto::ShardMap> next = WithoutServer(map, 1);
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(*next);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->epoch(), 5u);
  EXPECT_TRUE(view->IsDead(1));
  EXPECT_EQ(view->LiveServers(), (std::vector<uint32_t>{0, 2}));
  for (uint32_t v = 0; v < 6; ++v) {
    EXPECT_FALSE(view->Holds(1, v)) << v;
    // Shards 1 and 4 had primary 1 and backups 2, 0: 2 takes over.
    EXPECT_EQ(view->ServerRankOf(v), v % 3 == 1 ? 2u : v % 3) << v;
    EXPECT_EQ(view->BackupsOf(v).size(), 1u) << v;
  }
  // Losing a second server leaves one copy of everything; a third loses data.
  absl::StatusOr<proto::ShardMap> two = WithoutServer(*next, 0);
  ASSERT_TRUE(two.ok()) << two.status();
  absl::StatusOr<ShardMapView> view2 = ShardMapView::Create(*two);
  ASSERT_TRUE(view2.ok()) << view2.status();
  for (uint32_t v = 0; v < 6; ++v) EXPECT_EQ(view2->ServerRankOf(v), 2u);
  absl::StatusOr<proto::ShardMap> none = WithoutServer(*two, 2);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("last copy of virtual shards 0, 1, 2, 3, 4, 5"), std::string::npos)
      << none.status();
}

TEST(KeysTest, WithoutReplicationLosingAServerLosesItsShards) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1)};
  absl::StatusOr<proto::ShardMap> next = WithoutServer(RoundRobinShardMap(1, 4, servers), 0);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(next.status().message().find("virtual shards 0, 2"), std::string::npos) << next.status();
}

TEST(KeysTest, ShardMapViewRejectsADeadPrimaryOrDuplicateReplicas) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1), Server(2)};
  proto::ShardMap map = RoundRobinShardMap(1, 3, servers, 2);
  proto::ShardMap dead_primary = map;
  dead_primary.add_dead_server_ranks(0);
  EXPECT_EQ(ShardMapView::Create(dead_primary).status().code(), absl::StatusCode::kInvalidArgument);
  proto::ShardMap twice = map;
  twice.set_backup_ranks(0, 0);  // shard 0: primary 0, backup 0
  EXPECT_EQ(ShardMapView::Create(twice).status().code(), absl::StatusCode::kInvalidArgument);
  // The flat lists must add up, and cover every shard or none.
  proto::ShardMap short_ranks = map;
  short_ranks.mutable_backup_ranks()->RemoveLast();
  EXPECT_THAT(ShardMapView::Create(short_ranks).status().message(), HasSubstr("add up to 3 but it lists 2"));
  proto::ShardMap short_counts = map;
  short_counts.mutable_backup_counts()->RemoveLast();
  EXPECT_THAT(ShardMapView::Create(short_counts).status().message(), HasSubstr("backup counts for 2 of 3"));
}

TEST(KeysTest, BackupListsRoundTripThroughTheFlatFields) {
  proto::ShardMap map;
  map.set_num_vshards(4);
  const BackupLists lists = {{2, 1}, {}, {0}, {3, 0, 1}};
  SetBackupLists(&map, lists);
  EXPECT_THAT(map.backup_counts(), ElementsAre(2, 0, 1, 3));
  EXPECT_THAT(map.backup_ranks(), ElementsAre(2, 1, 0, 3, 0, 1));
  EXPECT_EQ(BackupListsOf(map), lists);
  SetBackupLists(&map, {});
  EXPECT_EQ(map.backup_counts_size(), 0);
  EXPECT_EQ(map.backup_ranks_size(), 0);
  EXPECT_TRUE(BackupListsOf(map).empty());
}

TEST(KeysTest, LostCopiesAreRecruitedOnTheLeastLoadedLiveServers) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1), Server(2), Server(3)};
  absl::StatusOr<proto::ShardMap> lost = WithoutServer(RoundRobinShardMap(1, 8, servers, 2), 1);
  ASSERT_TRUE(lost.ok()) << lost.status();
  uint32_t added = 0;
  const proto::ShardMap filled = WithBackupsFilled(*lost, &added);
  EXPECT_EQ(added, 4u);  // shards 0, 4 (backup was 1) and 1, 5 (primary was 1, its backup promoted)
  EXPECT_EQ(filled.epoch(), lost->epoch());
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(filled);
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<uint32_t> load(4, 0);
  for (uint32_t v = 0; v < 8; ++v) {
    ASSERT_EQ(view->BackupsOf(v).size(), 1u) << v;
    EXPECT_FALSE(view->Holds(1, v));
    load[view->ServerRankOf(v)]++;
    load[view->BackupsOf(v)[0]]++;
  }
  EXPECT_EQ(load, (std::vector<uint32_t>{6, 0, 5, 5}));  // 16 copies over 3 live servers, as even as can be
  // Already full: nothing changes.
  uint32_t again = 0;
  WithBackupsFilled(filled, &again);
  EXPECT_EQ(again, 0u);
}

TEST(KeysTest, ARestartedServerComesBackEmptyAndIsRecruitedWhereCopiesAreMissing) {
  std::vector<proto::NodeInfo> servers = {Server(0), Server(1)};
  absl::StatusOr<proto::ShardMap> lost = WithoutServer(RoundRobinShardMap(1, 4, servers, 2), 0);
  ASSERT_TRUE(lost.ok());
  EXPECT_TRUE(BackupListsOf(WithBackupsFilled(*lost)).at(0).empty()) << "no live server left to copy to";
  proto::NodeInfo back = Server(0);
  back.set_node_id(99);
  back.set_address("tcp://new:1");
  absl::StatusOr<proto::ShardMap> returned = WithServerBack(*lost, back);
  ASSERT_TRUE(returned.ok()) << returned.status();
  EXPECT_EQ(returned->servers(0).address(), "tcp://new:1");
  EXPECT_EQ(returned->dead_server_ranks_size(), 0);
  uint32_t added = 0;
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(WithBackupsFilled(*returned, &added));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(added, 4u);
  for (uint32_t v = 0; v < 4; ++v) {
    EXPECT_EQ(view->ServerRankOf(v), 1u);
    EXPECT_TRUE(view->Holds(0, v));
  }
  // Only a dead rank can come back.
  EXPECT_EQ(WithServerBack(*returned, back).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Primaries per server rank.
std::vector<uint32_t> PrimaryCounts(const proto::ShardMap& map) {
  std::vector<uint32_t> counts(static_cast<size_t>(map.servers_size()), 0);
  for (uint32_t rank : map.vshard_server_rank()) counts[rank]++;
  return counts;
}

// Copies (primaries and backups) per server rank.
std::vector<uint32_t> CopyCounts(const proto::ShardMap& map) {
  std::vector<uint32_t> counts = PrimaryCounts(map);
  for (uint32_t rank : map.backup_ranks()) counts[rank]++;
  return counts;
}

std::vector<proto::NodeInfo> Servers(uint32_t n) {
  std::vector<proto::NodeInfo> servers;
  for (uint32_t r = 0; r < n; ++r) servers.push_back(Server(r));
  return servers;
}

TEST(KeysTest, WeightedMapGivesTheHeavierServerTwiceThePrimaries) {
  const std::vector<float> weights = {1, 1, 2};
  absl::StatusOr<proto::ShardMap> map = WeightedShardMap(1, kShards, Servers(3), 1, weights);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_TRUE(ShardMapView::Create(*map).ok()) << ShardMapView::Create(*map).status();
  EXPECT_THAT(map->server_weights(), ElementsAre(1, 1, 2));
  // The bound: each count within 1 of 64 * w / 4 = 16, 16, 32; these quotas
  // are whole numbers, so the counts are exactly them.
  EXPECT_EQ(PrimaryCounts(*map), (std::vector<uint32_t>{16, 16, 32}));
  EXPECT_THAT(std::vector<uint32_t>(map->vshard_server_rank().begin(), map->vshard_server_rank().begin() + 8),
              ElementsAre(2, 0, 1, 2, 2, 0, 1, 2));
  // Interleaved, not in blocks: every prefix of the shards is within 1 of
  // its share too (rank 2 takes two of every four shards).
  std::vector<uint32_t> taken(3, 0);
  for (uint32_t v = 0; v < kShards; ++v) {
    taken[map->vshard_server_rank(static_cast<int>(v))]++;
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_LT(std::abs(taken[r] - (v + 1) * weights[r] / 4.0), 1.0) << "shards 0.." << v << ", rank " << r;
    }
  }
}

TEST(KeysTest, WeightedMapPrimaryCountsAreWithinOneOfTheirShare) {
  const std::vector<std::vector<float>> weight_sets = {
      {1, 3}, {3, 1}, {1, 2, 3, 4}, {1, 1, 1, 5}, {0.5f, 1.5f, 7}, {3, 1, 2}, {1, 1, 2, 1, 1},
      {19, 2, 19, 7, 19, 15}, {4, 1, 13, 16, 1, 10, 16, 16}, {1e-3f, 1, 1e3f},
      // Smooth weighted round robin over the weights themselves ends 1 off
      // the share here (13 shards: 4, 1, 4, 1, 3 for 4, 0.5, 4, 0.5, 4; 35
      // shards: rank 6 gets 6 for 7).
      {8, 1, 8, 1, 8}, {15, 3, 1, 13, 3, 17, 13}};
  for (const auto& weights : weight_sets) {
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    const uint32_t n = static_cast<uint32_t>(weights.size());
    for (uint32_t shards : {n, 7u, 13u, 16u, 35u, 64u, 100u, 1000u}) {
      for (uint32_t replication : {1u, 2u, 3u}) {
        const std::string what =
            absl::StrCat("weights ", absl::StrJoin(weights, ","), ", ", shards, " shards, replication ", replication);
        absl::StatusOr<proto::ShardMap> map = WeightedShardMap(1, shards, Servers(n), replication, weights);
        ASSERT_TRUE(map.ok()) << what << ": " << map.status();
        // Valid: every shard's copies are on distinct servers.
        absl::StatusOr<ShardMapView> view = ShardMapView::Create(*map);
        ASSERT_TRUE(view.ok()) << what << ": " << view.status();
        const std::vector<uint32_t> counts = PrimaryCounts(*map);
        for (uint32_t r = 0; r < n; ++r) {
          EXPECT_LT(std::abs(counts[r] - shards * weights[r] / total), 1.0) << what << ", rank " << r;
        }
        for (uint32_t v = 0; v < shards; ++v) {
          EXPECT_EQ(view->BackupsOf(v).size() + 1, std::min(replication, n)) << what << ", shard " << v;
        }
        // Deterministic.
        EXPECT_EQ(ShardMapDigest(*map), ShardMapDigest(*WeightedShardMap(1, shards, Servers(n), replication, weights)));
      }
    }
  }
}

TEST(KeysTest, WeightedMapKeepsEachServersCopiesInProportion) {
  const std::vector<float> weights = {1, 1, 2};
  absl::StatusOr<proto::ShardMap> map = WeightedShardMap(1, kShards, Servers(3), 2, weights);
  ASSERT_TRUE(map.ok()) << map.status();
  absl::StatusOr<ShardMapView> view = ShardMapView::Create(*map);
  ASSERT_TRUE(view.ok()) << view.status();  // each shard's two copies are on distinct servers
  EXPECT_EQ(view->replication(), 2u);
  for (uint32_t v = 0; v < kShards; ++v) {
    ASSERT_EQ(view->BackupsOf(v).size(), 1u) << v;
    EXPECT_NE(view->BackupsOf(v)[0], view->ServerRankOf(v)) << v;
  }
  EXPECT_EQ(PrimaryCounts(*map), (std::vector<uint32_t>{16, 16, 32}));
  const std::vector<uint32_t> copies = CopyCounts(*map);
  EXPECT_EQ(copies[0] + copies[1] + copies[2], 2 * kShards);
  // Rank 2 holds twice the copies of each other server, within 2.
  for (uint32_t other : {0u, 1u}) {
    EXPECT_LE(std::abs(static_cast<int>(copies[2]) - 2 * static_cast<int>(copies[other])), 2)
        << copies[2] << " copies on rank 2, " << copies[other] << " on rank " << other;
  }
  EXPECT_EQ(copies, (std::vector<uint32_t>{32, 32, 64}));  // here exactly (docs/design.md, "Placement")

  // Weights 1 and 3 over two servers: a quarter of the primaries; with
  // replication 2 both servers hold every shard, whatever the weights.
  absl::StatusOr<proto::ShardMap> two = WeightedShardMap(1, kShards, Servers(2), 1, std::vector<float>{1, 3});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(PrimaryCounts(*two), (std::vector<uint32_t>{16, 48}));
  two = WeightedShardMap(1, kShards, Servers(2), 2, std::vector<float>{1, 3});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(PrimaryCounts(*two), (std::vector<uint32_t>{16, 48}));
  EXPECT_EQ(CopyCounts(*two), (std::vector<uint32_t>{kShards, kShards}));
}

TEST(KeysTest, EqualOrNoWeightsGiveTheRoundRobinMap) {
  for (uint32_t replication : {1u, 2u, 3u}) {
    const proto::ShardMap round_robin = RoundRobinShardMap(7, kShards, Servers(3), replication);
    for (const std::vector<float>& weights :
         {std::vector<float>{}, std::vector<float>{1, 1, 1}, std::vector<float>{2.5f, 2.5f, 2.5f}}) {
      absl::StatusOr<proto::ShardMap> map = WeightedShardMap(7, kShards, Servers(3), replication, weights);
      ASSERT_TRUE(map.ok()) << map.status();
      EXPECT_EQ(map->SerializeAsString(), round_robin.SerializeAsString())
          << "weights " << absl::StrJoin(weights, ",") << ", replication " << replication;
      EXPECT_EQ(map->server_weights_size(), 0);
    }
  }
}

TEST(KeysTest, CopiesReMadeAfterALossGoWhereCopiesPerWeightAreFewest) {
  // Four servers, rank 3 weighing 3; one copy each of shards 0-3 per server:
  //   shard 0: 0, 1   shard 1: 1, 0   shard 2: 2, 3   shard 3: 3, 2
  proto::ShardMap map = RoundRobinShardMap(1, 4, Servers(4), 2);
  SetBackupLists(&map, {{1}, {0}, {3}, {2}});
  for (float w : {1.0f, 1.0f, 1.0f, 3.0f}) map.add_server_weights(w);
  ASSERT_TRUE(ShardMapView::Create(map).ok()) << ShardMapView::Create(map).status();
  // Losing 0: shard 0 goes to 1 (its backup) and shards 0 and 1 each need a
  // backup, on 2 or 3 (loads 2 and 2). Shard 0: 2 would hold (2+1)/1 = 3
  // copies per unit of weight, 3 (2+1)/3 = 1: 3. Shard 1: 2 still 3, 3
  // (3+1)/3 = 1.33: 3 again. (Without weights: 2, then 3.)
  absl::StatusOr<proto::ShardMap> lost = WithoutServer(map, 0);
  ASSERT_TRUE(lost.ok()) << lost.status();
  uint32_t added = 0;
  const proto::ShardMap filled = WithBackupsFilled(*lost, &added);
  EXPECT_EQ(added, 2u);
  ASSERT_TRUE(ShardMapView::Create(filled).ok()) << ShardMapView::Create(filled).status();
  EXPECT_EQ(BackupListsOf(filled), (BackupLists{{3}, {3}, {3}, {2}}));
  EXPECT_THAT(filled.server_weights(), ElementsAre(1, 1, 1, 3));
  EXPECT_EQ(CopyCounts(filled), (std::vector<uint32_t>{0, 2, 2, 4}));
  // The same map without weights: the fewest copies, ties to the lowest rank.
  proto::ShardMap unweighted = *lost;
  unweighted.clear_server_weights();
  EXPECT_EQ(BackupListsOf(WithBackupsFilled(unweighted)), (BackupLists{{2}, {3}, {3}, {2}}));

  // A shard that lost its only copy (orphans) goes by weight too: ranks 1
  // and 2 hold 1 and 2 primaries; 2 weighs 4: (1+1)/1 = 2 > (2+1)/4.
  proto::ShardMap single = RoundRobinShardMap(1, 4, Servers(3), 1);
  single.set_vshard_server_rank(3, 2);  // shards: 0, 1, 2, 2
  for (float w : {1.0f, 1.0f, 4.0f}) single.add_server_weights(w);
  std::vector<uint32_t> orphans;
  absl::StatusOr<proto::ShardMap> restored = WithoutServer(single, 0, &orphans);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(orphans, (std::vector<uint32_t>{0}));
  EXPECT_EQ(restored->vshard_server_rank(0), 2u);
  single.clear_server_weights();
  orphans.clear();
  restored = WithoutServer(single, 0, &orphans);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->vshard_server_rank(0), 1u);  // without weights: the fewest primaries
}

TEST(KeysTest, BadServerWeightsAreRefused) {
  const proto::ShardMap good = *WeightedShardMap(1, 8, Servers(3), 2, std::vector<float>{1, 1, 2});
  ASSERT_TRUE(ShardMapView::Create(good).ok());
  auto with_weights = [&](std::vector<float> weights) {
    proto::ShardMap map = good;
    map.clear_server_weights();
    for (float w : weights) map.add_server_weights(w);
    return ShardMapView::Create(map).status();
  };
  EXPECT_TRUE(with_weights({}).ok());
  EXPECT_EQ(with_weights({1, 2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(with_weights({1, 2}).message(), HasSubstr("2 server weights for 3 servers"));
  EXPECT_THAT(with_weights({1, 1, 1, 1}).message(), HasSubstr("4 server weights for 3 servers"));
  EXPECT_THAT(with_weights({1, 0, 2}).message(), HasSubstr("server weight 0 (server rank 1) must be a positive"));
  EXPECT_THAT(with_weights({1, 1, -2}).message(), HasSubstr("server weight -2 (server rank 2)"));
  EXPECT_THAT(with_weights({std::nanf(""), 1, 1}).message(), HasSubstr("server weight nan (server rank 0)"));
  EXPECT_THAT(with_weights({1, std::numeric_limits<float>::infinity(), 1}).message(),
              HasSubstr("server weight inf (server rank 1)"));
  EXPECT_EQ(with_weights({1, 0, 2}).code(), absl::StatusCode::kInvalidArgument);
  // The map maker refuses them the same way.
  absl::StatusOr<proto::ShardMap> bad = WeightedShardMap(1, 8, Servers(3), 1, std::vector<float>{1, 0, 2});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("server weight 0 (server rank 1)"));
  EXPECT_THAT(WeightedShardMap(1, 8, Servers(3), 1, std::vector<float>{1, 1}).status().message(),
              HasSubstr("2 server weights for 3 servers"));
  EXPECT_TRUE(ValidateServerWeights({}, 3).ok());
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(KeysTest, AShardMapDigestNamesItsContent) {
  std::vector<proto::NodeInfo> servers(3);
  for (int i = 0; i < 3; ++i) servers[i].set_address(absl::StrCat("tcp://s", i));
  const proto::ShardMap map = RoundRobinShardMap(3, 16, servers, 2);
  EXPECT_EQ(ShardMapDigest(map), ShardMapDigest(RoundRobinShardMap(3, 16, servers, 2)));
  EXPECT_EQ(ShardMapDigest(map).size(), 8u);
  proto::ShardMap later = map;
  later.set_epoch(4);
  EXPECT_NE(ShardMapDigest(map), ShardMapDigest(later));
  proto::ShardMap moved = map;
  moved.set_vshard_server_rank(0, (moved.vshard_server_rank(0) + 1) % 3);
  EXPECT_NE(ShardMapDigest(map), ShardMapDigest(moved));
}

TEST(KeysTest, AMoveAddsTheDestinationAsAnExtraCopyThenMakesItPrimary) {
  for (uint32_t replication : {1u, 2u}) {
    SCOPED_TRACE(replication);
    const proto::ShardMap map = RoundRobinShardMap(4, 8, Servers(4), replication);
    // Shard 1: primary 1 (backup 2 with replication 2); move it to server 3.
    absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, 1, 3);
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_EQ(started->epoch(), 5u);
    auto view = ShardMapView::Create(*started);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->ServerRankOf(1), 1u);
    EXPECT_EQ(view->MovingTo(1), 3u);
    EXPECT_TRUE(view->Holds(3, 1));
    for (uint32_t v = 0; v < 8; ++v) {
      if (v != 1) {
        EXPECT_EQ(view->MovingTo(v), ShardMapView::kNotMoving) << v;
      }
    }
    EXPECT_EQ(view->BackupsOf(1).back(), 3u) << "the destination is the last backup";
    // A second move of the same shard waits for this one.
    EXPECT_EQ(WithMoveStarted(*started, 1, 0).status().code(), absl::StatusCode::kFailedPrecondition);

    absl::StatusOr<proto::ShardMap> finished = WithMoveFinished(*started, 1);
    ASSERT_TRUE(finished.ok()) << finished.status();
    EXPECT_EQ(finished->epoch(), 6u);
    view = ShardMapView::Create(*finished);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->ServerRankOf(1), 3u);
    EXPECT_FALSE(view->Holds(1, 1)) << "the old primary lets the shard go";
    EXPECT_EQ(view->MovingTo(1), ShardMapView::kNotMoving);
    if (replication == 2) {
      EXPECT_EQ(std::vector<uint32_t>(view->BackupsOf(1).begin(), view->BackupsOf(1).end()),
                std::vector<uint32_t>{2});
    } else {
      EXPECT_EQ(finished->backup_counts_size(), 0) << "no backups stored without replication";
    }
    // Every other shard is as it was.
    for (uint32_t v = 0; v < 8; ++v) {
      if (v == 1) continue;
      EXPECT_EQ(finished->vshard_server_rank(v), map.vshard_server_rank(v));
    }
    EXPECT_EQ(WithMoveFinished(*finished, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(KeysTest, AMoveToABackupSwapsTheRolesWhenItFinishes) {
  const proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 2);  // shard 0: primary 0, backup 1
  absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, 0, 1);
  ASSERT_TRUE(started.ok()) << started.status();
  auto view = ShardMapView::Create(*started);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->ServerRankOf(0), 0u);
  EXPECT_EQ(view->MovingTo(0), 1u);
  EXPECT_EQ(view->BackupsOf(0).size(), 1u) << "no copy to add";
  absl::StatusOr<proto::ShardMap> finished = WithMoveFinished(*started, 0);
  ASSERT_TRUE(finished.ok()) << finished.status();
  view = ShardMapView::Create(*finished);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->ServerRankOf(0), 1u);
  EXPECT_EQ(std::vector<uint32_t>(view->BackupsOf(0).begin(), view->BackupsOf(0).end()), std::vector<uint32_t>{0})
      << "the old primary keeps a copy: replication 2";
  EXPECT_EQ(view->MovingTo(0), ShardMapView::kNotMoving);
  // Cancelled instead, it leaves the backup where it was.
  absl::StatusOr<proto::ShardMap> cancelled = WithMoveCancelled(*started, 0);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  proto::ShardMap expected = map;
  expected.set_epoch(3);
  EXPECT_EQ(ShardMapDigest(*cancelled), ShardMapDigest(expected));
}

TEST(KeysTest, LosingTheSourceOrTheDestinationEndsTheMove) {
  const proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 2);  // shard 0: primary 0, backup 1
  absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, 0, 2);
  ASSERT_TRUE(started.ok()) << started.status();
  for (uint32_t lost : {0u, 2u}) {
    absl::StatusOr<proto::ShardMap> next = WithoutServer(*started, lost);
    ASSERT_TRUE(next.ok()) << next.status();
    auto view = ShardMapView::Create(*next);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->MovingTo(0), ShardMapView::kNotMoving) << lost;
  }
  // A map that names a destination holding no copy is refused.
  proto::ShardMap bad = map;
  bad.add_moving_vshards(0);
  bad.add_moving_to(2);
  EXPECT_FALSE(ShardMapView::Create(bad).ok());
}

TEST(KeysTest, ACancelledMoveDropsOnlyTheDestination) {
  const proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 2);
  absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, 0, 2);
  ASSERT_TRUE(started.ok()) << started.status();
  absl::StatusOr<proto::ShardMap> cancelled = WithMoveCancelled(*started, 0);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->epoch(), 3u);
  proto::ShardMap expected = map;
  expected.set_epoch(3);
  EXPECT_EQ(ShardMapDigest(*cancelled), ShardMapDigest(expected));
}

TEST(KeysTest, MovesRefuseBadShardsAndServers) {
  proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 1);
  EXPECT_EQ(WithMoveStarted(map, 6, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WithMoveStarted(map, 0, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(WithMoveStarted(map, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  map.add_dead_server_ranks(2);
  map.set_vshard_server_rank(2, 0);
  map.set_vshard_server_rank(5, 1);
  absl::Status dead = WithMoveStarted(map, 0, 2).status();
  EXPECT_EQ(dead.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dead.message().find("no such live server"), std::string::npos) << dead;
  EXPECT_EQ(WithMoveCancelled(map, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KeysTest, AServerAddedToTheMapHoldsNothingAndWeighsTheMean) {
  const std::vector<float> weights = {1, 3};
  absl::StatusOr<proto::ShardMap> map = WeightedShardMap(1, 8, Servers(2), 2, weights);
  ASSERT_TRUE(map.ok());
  proto::NodeInfo added = Servers(3)[2];
  absl::StatusOr<proto::ShardMap> next = WithServerAdded(*map, added);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch(), 2u);
  auto view = ShardMapView::Create(*next);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_servers(), 3u);
  for (uint32_t v = 0; v < 8; ++v) EXPECT_FALSE(view->Holds(2, v));
  ASSERT_EQ(next->server_weights_size(), 3);
  EXPECT_FLOAT_EQ(next->server_weights(2), 2.0f);
  EXPECT_FALSE(WithServerAdded(*map, Servers(4)[3]).ok()) << "only the next rank";
}

TEST(KeysTest, AMoveFromABackupPutsTheDestinationInItsPlace) {
  // 4 servers, replication 3: shard 0 is on 0 (primary), 1 and 2 (backups).
  const proto::ShardMap map = RoundRobinShardMap(1, 8, Servers(4), 3);
  absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, 0, 3, /*from=*/1);
  ASSERT_TRUE(started.ok()) << started.status();
  auto view = ShardMapView::Create(*started);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->MovingTo(0), 3u);
  EXPECT_EQ(view->MovingFrom(0), 1u);
  EXPECT_EQ(view->BackupsOf(0).size(), 3u) << "the destination is an extra copy while the move runs";
  absl::StatusOr<proto::ShardMap> finished = WithMoveFinished(*started, 0);
  ASSERT_TRUE(finished.ok()) << finished.status();
  view = ShardMapView::Create(*finished);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->ServerRankOf(0), 0u) << "the primary stays";
  EXPECT_EQ(std::vector<uint32_t>(view->BackupsOf(0).begin(), view->BackupsOf(0).end()),
            (std::vector<uint32_t>{3, 2}))
      << "the destination takes the backup's place in the promotion order";
  EXPECT_EQ(view->MovingTo(0), ShardMapView::kNotMoving);
  EXPECT_EQ(view->MovingFrom(0), ShardMapView::kNotMoving);
  // A move from the primary names it as the source.
  absl::StatusOr<proto::ShardMap> primary_move = WithMoveStarted(map, 0, 3);
  ASSERT_TRUE(primary_move.ok());
  EXPECT_EQ(MovingFrom(*primary_move, 0), 0u);
  // A backup's copy goes only to a server that holds none, and only from a holder.
  EXPECT_EQ(WithMoveStarted(map, 0, 2, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(WithMoveStarted(map, 0, 1, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  // Losing the backup ends its move (the destination stays a copy); so does losing the primary.
  for (uint32_t lost : {0u, 1u, 3u}) {
    absl::StatusOr<proto::ShardMap> next = WithoutServer(*started, lost);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(MovingTo(*next, 0), ShardMapView::kNotMoving) << lost;
    EXPECT_TRUE(ShardMapView::Create(*next).ok()) << lost;
  }
  // A map whose source holds no copy, or whose sources do not match its moves, is refused.
  proto::ShardMap bad = *started;
  bad.set_moving_from(0, 3);
  EXPECT_FALSE(ShardMapView::Create(bad).ok());
  bad.set_moving_from(0, 2);
  bad.add_moving_from(1);
  EXPECT_FALSE(ShardMapView::Create(bad).ok());
  // A map from before moves had sources: the primary.
  proto::ShardMap old = *primary_move;
  old.clear_moving_from();
  EXPECT_EQ(MovingFrom(old, 0), 0u);
  EXPECT_EQ(ShardMapView::Create(old)->MovingFrom(0), 0u);
}

TEST(KeysTest, ADrainingServerGetsNoNewCopies) {
  const proto::ShardMap map = RoundRobinShardMap(1, 12, Servers(4), 2);
  absl::StatusOr<proto::ShardMap> draining = WithServerDraining(map, 3);
  ASSERT_TRUE(draining.ok()) << draining.status();
  EXPECT_EQ(draining->epoch(), 2u);
  EXPECT_TRUE(IsDraining(*draining, 3));
  EXPECT_FALSE(IsDraining(*draining, 2));
  EXPECT_TRUE(ShardMapView::Create(*draining).ok());
  // Again: the same map.
  absl::StatusOr<proto::ShardMap> again = WithServerDraining(*draining, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->epoch(), 2u);
  // Server 0 is lost: the copies re-made go anywhere but the draining server.
  absl::StatusOr<proto::ShardMap> lost = WithoutServer(*draining, 0);
  ASSERT_TRUE(lost.ok()) << lost.status();
  const uint32_t before = CopiesHeldBy(*lost, 3);
  uint32_t added = 0;
  const proto::ShardMap filled = WithBackupsFilled(*lost, &added);
  EXPECT_GT(added, 0u);
  EXPECT_EQ(CopiesHeldBy(filled, 3), before);
  // It cannot be a move's destination.
  EXPECT_EQ(WithMoveStarted(*draining, 0, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  // Removed (WithoutServer), it drains no more.
  absl::StatusOr<proto::ShardMap> removed = WithoutServer(*draining, 3);
  ASSERT_TRUE(removed.ok());
  EXPECT_FALSE(IsDraining(*removed, 3));
}

TEST(KeysTest, OrphansGoToADrainingServerOnlyIfNoOtherIsLeft) {
  proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 1);
  absl::StatusOr<proto::ShardMap> draining = WithServerDraining(map, 2);
  ASSERT_TRUE(draining.ok());
  std::vector<uint32_t> orphans;
  absl::StatusOr<proto::ShardMap> lost = WithoutServer(*draining, 0, &orphans);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(orphans, (std::vector<uint32_t>{0, 3}));
  for (uint32_t v : orphans) EXPECT_EQ(lost->vshard_server_rank(v), 1u) << v;
  orphans.clear();
  absl::StatusOr<proto::ShardMap> last = WithoutServer(*lost, 1, &orphans);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(orphans.size(), 4u);
  for (uint32_t v : orphans) EXPECT_EQ(last->vshard_server_rank(v), 2u) << "the only server left";
}

TEST(KeysTest, ADrainThatWouldLeaveTooFewServersIsRefused) {
  const proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 2);
  absl::StatusOr<proto::ShardMap> one = WithServerDraining(map, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  absl::Status two = WithServerDraining(*one, 1).status();
  EXPECT_EQ(two.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(two.message(), HasSubstr("1 server would be left (live, not draining) for 2 copies"));
  EXPECT_EQ(WithServerDraining(map, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  proto::ShardMap dead = *WithoutServer(map, 2);
  EXPECT_THAT(std::string(WithServerDraining(dead, 2).status().message()), HasSubstr("no such live server"));
  const proto::ShardMap single = RoundRobinShardMap(1, 6, Servers(1), 1);
  EXPECT_EQ(WithServerDraining(single, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
