#include "coordinator/load_tracker.h"

#include <cmath>

#include <gtest/gtest.h>

namespace tessera {
namespace {

proto::Heartbeat Beat(double cpu, uint64_t net_in, uint64_t net_out,
                      std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t>> shards = {}) {
  proto::Heartbeat hb;
  hb.set_cpu_seconds(cpu);
  hb.set_net_bytes_in(net_in);
  hb.set_net_bytes_out(net_out);
  for (auto [v, requests, in, out] : shards) {
    proto::ShardLoad* l = hb.add_shard_loads();
    l->set_vshard(v);
    l->set_requests(requests);
    l->set_bytes_in(in);
    l->set_bytes_out(out);
  }
  return hb;
}

auto PrimaryOf(uint32_t rank) {
  return [rank](uint32_t v) { return v % 2 == rank; };  // shards 0, 2, ... on server 0
}

// With tau -> 0 every heartbeat sets the rates to the last interval's.
TEST(LoadTrackerTest, RatesAreCounterDeltasOverTime) {
  LoadTracker t(0);
  t.OnHeartbeat(0, 10, Beat(1.0, 1000, 500, {{0, 5, 100, 50}}), 1 * kSeconds, PrimaryOf(0));
  EXPECT_EQ(t.servers().at(0).cpu_cores, 0) << "the first heartbeat is only the baseline";
  t.OnHeartbeat(0, 10, Beat(1.5, 3000, 1500, {{0, 25, 300, 250}, {2, 4, 40, 0}}), 3 * kSeconds, PrimaryOf(0));
  const auto& s = t.servers().at(0);
  EXPECT_DOUBLE_EQ(s.cpu_cores, 0.25);
  EXPECT_DOUBLE_EQ(s.net_in_bytes_per_s, 1000);
  EXPECT_DOUBLE_EQ(s.net_out_bytes_per_s, 500);
  const auto& shard0 = t.shards().at(0);
  EXPECT_DOUBLE_EQ(shard0.requests_per_s, 10);
  EXPECT_DOUBLE_EQ(shard0.bytes_in_per_s, 100);
  EXPECT_DOUBLE_EQ(shard0.bytes_out_per_s, 100);
  EXPECT_EQ(t.shards().at(2).requests_per_s, 0) << "shard 2's first report is its baseline";
  EXPECT_DOUBLE_EQ(s.requests_per_s, 10);
}

TEST(LoadTrackerTest, RatesAreSmoothedWithTheTimeConstant) {
  LoadTracker t(10 * kSeconds);
  t.OnHeartbeat(1, 7, Beat(0, 0, 0), 0, PrimaryOf(1));
  // A steady 1,000 B/s for 1 s: the average moves 1 - e^-0.1 of the way.
  t.OnHeartbeat(1, 7, Beat(0, 1000, 0), 1 * kSeconds, PrimaryOf(1));
  EXPECT_NEAR(t.servers().at(1).net_in_bytes_per_s, 1000 * (1 - std::exp(-0.1)), 1e-9);
  // After 60 s of it, within 0.3% of the rate.
  for (int i = 2; i <= 60; ++i) t.OnHeartbeat(1, 7, Beat(0, 1000u * i, 0), i * kSeconds, PrimaryOf(1));
  EXPECT_NEAR(t.servers().at(1).net_in_bytes_per_s, 1000, 3);
  EXPECT_GT(t.servers().at(1).last_at, 0);
}

TEST(LoadTrackerTest, ARestartedServerOrAMovedShardStartsANewBaseline) {
  LoadTracker t(0);
  t.OnHeartbeat(0, 10, Beat(5, 5000, 0, {{0, 100, 0, 0}}), 1 * kSeconds, PrimaryOf(0));
  t.OnHeartbeat(0, 10, Beat(6, 6000, 0, {{0, 200, 0, 0}}), 2 * kSeconds, PrimaryOf(0));
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 100);
  // A new process for rank 0 (node 11) starts its counters at zero: no
  // negative rates, the old rates kept until the next interval.
  t.OnHeartbeat(0, 11, Beat(0.1, 10, 0, {{0, 3, 0, 0}}), 3 * kSeconds, PrimaryOf(0));
  EXPECT_DOUBLE_EQ(t.servers().at(0).cpu_cores, 1.0);
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 100);
  t.OnHeartbeat(0, 11, Beat(0.6, 20, 0, {{0, 53, 0, 0}}), 4 * kSeconds, PrimaryOf(0));
  EXPECT_DOUBLE_EQ(t.servers().at(0).cpu_cores, 0.5);
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 50);
  // Shard 0 reported by server 1, which is not its primary: ignored.
  t.OnHeartbeat(1, 12, Beat(0, 0, 0, {{0, 1000000, 0, 0}}), 4 * kSeconds, PrimaryOf(1));
  EXPECT_EQ(t.shards().at(0).primary, 0u);
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 50);
  // Shard 0 moves to server 1: its counters there are a new baseline.
  auto everything = [](uint32_t) { return true; };
  t.OnHeartbeat(1, 12, Beat(0, 0, 0, {{0, 7, 0, 0}}), 5 * kSeconds, everything);
  EXPECT_EQ(t.shards().at(0).primary, 1u);
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 50);
  t.OnHeartbeat(1, 12, Beat(0, 0, 0, {{0, 17, 0, 0}}), 6 * kSeconds, everything);
  EXPECT_DOUBLE_EQ(t.shards().at(0).requests_per_s, 10);
  EXPECT_NE(t.Describe().find("server 0: 0.50 cores"), std::string::npos) << t.Describe();
}

}  // namespace
}  // namespace tessera
