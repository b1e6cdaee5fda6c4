#include "coordinator/rebalancer.h"

#include <cmath>

#include "common/keys.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

std::vector<proto::NodeInfo> Servers(uint32_t n) {
  std::vector<proto::NodeInfo> s(n);
  for (uint32_t r = 0; r < n; ++r) {
    s[r].set_node_id(r + 1);
    s[r].set_rank(r);
    s[r].set_role(proto::SERVER);
  }
  return s;
}

// The cost of each shard when the keys 0..keys-1 of table 1 are touched
// with Zipf(s) probabilities (key k with weight 1 / (k + 1)^s).
std::vector<double> ZipfShardCost(uint32_t vshards, uint32_t keys, double s) {
  std::vector<double> cost(vshards, 0);
  for (uint32_t k = 0; k < keys; ++k) cost[VirtualShardOf(1, k, vshards)] += 1.0 / std::pow(k + 1.0, s);
  return cost;
}

// Carries a plan out the way the coordinator does: the move starts, and finishes.
proto::ShardMap Apply(const proto::ShardMap& map, const MovePlan& plan) {
  absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, plan.vshard, plan.to);
  EXPECT_TRUE(started.ok()) << started.status();
  absl::StatusOr<proto::ShardMap> finished = WithMoveFinished(*started, plan.vshard);
  EXPECT_TRUE(finished.ok()) << finished.status();
  return *finished;
}

TEST(RebalancerTest, ZipfSkewIsBroughtWithinTheThresholdOneShardAtATime) {
  constexpr double kThreshold = 1.1;
  for (uint32_t replication : {1u, 2u}) {
    SCOPED_TRACE(replication);
    const std::vector<double> cost = ZipfShardCost(64, 100000, 1.3);
    proto::ShardMap map = RoundRobinShardMap(1, 64, Servers(3), replication);
    const double before = Imbalance(map, cost);
    ASSERT_GT(before, kThreshold) << "the workload must start out of balance for this test to mean anything";
    int moves = 0;
    for (; moves < 64; ++moves) {
      const MovePlan plan = PlanMove(map, cost, kThreshold);
      if (!plan.move) break;
      EXPECT_LT(plan.imbalance_after, plan.imbalance + 1e-12) << plan.why;
      EXPECT_EQ(plan.from, map.vshard_server_rank(plan.vshard));
      map = Apply(map, plan);
    }
    EXPECT_GT(moves, 0);
    EXPECT_LT(moves, 64) << "the rebalancer must settle";
    EXPECT_LE(Imbalance(map, cost), kThreshold) << "started at " << before << " after " << moves << " moves";
  }
}

TEST(RebalancerTest, WeightsCountAsCapacity) {
  // Equal shard costs on a map weighted 1, 1, 2: balanced as it is.
  const std::vector<float> weights = {1, 1, 2};
  absl::StatusOr<proto::ShardMap> map = WeightedShardMap(1, 64, Servers(3), 1, weights);
  ASSERT_TRUE(map.ok()) << map.status();
  const std::vector<double> equal(64, 1.0);
  EXPECT_NEAR(Imbalance(*map, equal), 1.0, 0.05);
  EXPECT_FALSE(PlanMove(*map, equal, 1.1).move);
  // The same costs on a round-robin map with those weights: server 2 has
  // half its share, so moves go to it.
  proto::ShardMap unweighted = RoundRobinShardMap(1, 64, Servers(3), 1);
  for (float w : weights) unweighted.add_server_weights(w);
  const MovePlan plan = PlanMove(unweighted, equal, 1.1);
  ASSERT_TRUE(plan.move) << plan.why;
  EXPECT_EQ(plan.to, 2u);
  proto::ShardMap m = unweighted;
  for (int i = 0; i < 64; ++i) {
    const MovePlan p = PlanMove(m, equal, 1.1);
    if (!p.move) break;
    m = Apply(m, p);
  }
  const std::vector<double> per_weight = LoadPerWeight(m, equal);
  EXPECT_NEAR(per_weight[2] * 2 / (per_weight[0] + per_weight[1]), 1.0, 0.15);
  int on_2 = 0;
  for (uint32_t v = 0; v < 64; ++v) on_2 += m.vshard_server_rank(v) == 2;
  EXPECT_GE(on_2, 29) << "server 2 ends with about twice the shards of each other one";
  EXPECT_LE(on_2, 35);
}

TEST(RebalancerTest, WithinTheThresholdOrWithNoLoadNothingMoves) {
  const proto::ShardMap map = RoundRobinShardMap(1, 30, Servers(3), 1);
  EXPECT_FALSE(PlanMove(map, std::vector<double>(30, 0.0), 1.25).move);
  std::vector<double> cost(30, 1.0);
  cost[0] = 3;  // server 0: 12, 1.125x the mean 10.67
  const MovePlan plan = PlanMove(map, cost, 1.25);
  EXPECT_FALSE(plan.move);
  EXPECT_NE(plan.why.find("within the threshold"), std::string::npos) << plan.why;
  // The same skew is acted on with a threshold below it.
  EXPECT_TRUE(PlanMove(map, cost, 1.1).move);
}

TEST(RebalancerTest, OneShardHotterThanTheGapStaysWhereItIs) {
  const proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 1);  // server 0: shards 0 and 3
  std::vector<double> cost = {100, 1, 1, 0, 1, 1};
  const MovePlan plan = PlanMove(map, cost, 1.25);
  EXPECT_FALSE(plan.move) << "moving shard 0 would only make server 1 the busiest";
  EXPECT_NE(plan.why.find("no shard of it would lower"), std::string::npos) << plan.why;
}

TEST(RebalancerTest, ServersInAMoveSitOut) {
  proto::ShardMap map = RoundRobinShardMap(1, 6, Servers(3), 1);
  const std::vector<double> cost = {10, 1, 1, 10, 1, 1};
  const MovePlan first = PlanMove(map, cost, 1.25);
  ASSERT_TRUE(first.move) << first.why;
  absl::StatusOr<proto::ShardMap> moving = WithMoveStarted(map, first.vshard, first.to);
  ASSERT_TRUE(moving.ok());
  const MovePlan second = PlanMove(*moving, cost, 1.25);
  EXPECT_FALSE(second.move);
  EXPECT_NE(second.why.find("under way"), std::string::npos) << second.why;
}

// Drains `rank` the way the coordinator does: plan, start, finish, until the
// plan says it is drained. Returns the map, with the rank still listed.
proto::ShardMap DrainAll(proto::ShardMap map, uint32_t rank, const std::vector<double>& cost, int* moves) {
  map = *WithServerDraining(map, rank);
  *moves = 0;
  for (int step = 0; step < 1000; ++step) {
    const DrainPlan plan = PlanDrain(map, cost);
    if (!plan.move) {
      EXPECT_EQ(plan.drained, std::vector<uint32_t>{rank}) << plan.why;
      return map;
    }
    EXPECT_EQ(plan.from, rank);
    absl::StatusOr<proto::ShardMap> started = WithMoveStarted(map, plan.vshard, plan.to, plan.from);
    EXPECT_TRUE(started.ok()) << started.status();
    absl::StatusOr<proto::ShardMap> finished = WithMoveFinished(*started, plan.vshard);
    EXPECT_TRUE(finished.ok()) << finished.status();
    map = *finished;
    ++*moves;
  }
  ADD_FAILURE() << "the drain did not end";
  return map;
}

TEST(RebalancerTest, DrainingMovesEveryCopyAwayAndKeepsTheCopyCount) {
  for (uint32_t replication : {1u, 2u, 3u}) {
    SCOPED_TRACE(replication);
    const proto::ShardMap map = RoundRobinShardMap(1, 24, Servers(4), replication);
    for (bool zipf : {false, true}) {
      SCOPED_TRACE(zipf ? "Zipf(1.3) shard costs" : "equal shard costs");
      const std::vector<double> cost = zipf ? ZipfShardCost(24, 5000, 1.3) : std::vector<double>(24, 1.0);
      const uint32_t held = CopiesHeldBy(map, 1);
      int moves = 0;
      const proto::ShardMap drained = DrainAll(map, 1, cost, &moves);
      EXPECT_EQ(moves, static_cast<int>(held)) << "one move per copy it held";
      EXPECT_EQ(CopiesHeldBy(drained, 1), 0u);
      auto view = ShardMapView::Create(drained);
      ASSERT_TRUE(view.ok()) << view.status();
      for (uint32_t v = 0; v < 24; ++v) EXPECT_EQ(view->BackupsOf(v).size() + 1, replication) << v;
      if (zipf) {
        // Each primary goes where the load is least (greedy): a server that
        // got one ends at most one hot shard above the mean, the others
        // keep their load.
        double hottest = 0, total = 0;
        for (double c : cost) hottest = std::max(hottest, c), total += c;
        const std::vector<double> before = LoadPerWeight(map, cost), after = LoadPerWeight(drained, cost);
        const double bound = std::max({before[0], before[2], before[3], total / 3 + hottest});
        for (uint32_t r : {0u, 2u, 3u}) EXPECT_LE(after[r], bound + 1e-9) << r;
        EXPECT_DOUBLE_EQ(after[0] + after[2] + after[3], total);
      } else {
        // The rest are left about even: 24 * r copies over 3 servers.
        for (uint32_t r : {0u, 2u, 3u}) {
          EXPECT_GE(CopiesHeldBy(drained, r), 8 * replication - 1) << r;
          EXPECT_LE(CopiesHeldBy(drained, r), 8 * replication + 1) << r;
        }
      }
    }
  }
}

TEST(RebalancerTest, ADrainMovesTheHottestPrimaryFirstToTheLightestServer) {
  const proto::ShardMap map = *WithServerDraining(RoundRobinShardMap(1, 8, Servers(4), 2), 0);
  // Server 0 is primary of shards 0 and 4, backup of 3 and 7.
  std::vector<double> cost(8, 1.0);
  cost[4] = 10;
  cost[1] = 5;  // server 1 is the busiest of the rest; server 2 and 3 tie
  cost[2] = 3;
  DrainPlan plan = PlanDrain(map, cost);
  ASSERT_TRUE(plan.move) << plan.why;
  EXPECT_EQ(plan.vshard, 4u) << "the hottest primary first";
  EXPECT_EQ(plan.from, 0u);
  EXPECT_EQ(plan.to, 3u) << "shard 4's backup is server 1; server 3 (load 2) is lighter than server 2 (load 4)";
  EXPECT_NE(plan.why.find("primary copy of shard 4"), std::string::npos) << plan.why;
  EXPECT_TRUE(plan.drained.empty());
  // With only its backup copies left, the lowest shard goes first, to the fewest copies.
  proto::ShardMap rest = map;
  rest.set_vshard_server_rank(0, 2);
  rest.set_vshard_server_rank(4, 3);
  SetBackupLists(&rest, {{1}, {2}, {3}, {0}, {1}, {2}, {3}, {0}});
  plan = PlanDrain(rest, cost);
  ASSERT_TRUE(plan.move) << plan.why;
  EXPECT_EQ(plan.vshard, 3u);
  EXPECT_NE(plan.why.find("backup copy of shard 3"), std::string::npos) << plan.why;
  EXPECT_EQ(plan.to, 1u) << "server 3 holds shard 3; server 1 has 4 copies, server 2 has 5";
}

TEST(RebalancerTest, ADrainWithNowhereToGoSaysSo) {
  // Three servers, three copies of every shard: a draining server's copy has nowhere to go.
  proto::ShardMap map = RoundRobinShardMap(1, 4, Servers(3), 3);
  map.add_draining_server_ranks(2);
  const DrainPlan plan = PlanDrain(map, std::vector<double>(4, 1.0));
  EXPECT_FALSE(plan.move);
  EXPECT_NE(plan.why.find("every server left (live, not draining) already holds shard"), std::string::npos)
      << plan.why;
  // The rebalancer never moves a shard to a draining server.
  proto::ShardMap skew = *WithServerDraining(RoundRobinShardMap(1, 6, Servers(3), 1), 2);
  std::vector<double> cost = {10, 10, 0, 10, 1, 0};  // server 0 busiest; server 2 (draining) lightest
  const MovePlan move = PlanMove(skew, cost, 1.05);
  if (move.move) {
    EXPECT_NE(move.to, 2u);
  }
}

}  // namespace
}  // namespace tessera
