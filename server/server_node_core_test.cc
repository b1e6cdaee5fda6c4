#include "server/server_node_core.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/keys.h"

namespace tessera {
namespace {

proto::NodeInfo Server(uint32_t rank) {
  proto::NodeInfo n;
  n.set_rank(rank);
  n.set_node_id(rank + 1);
  n.set_role(proto::SERVER);
  n.set_address("sim://server-" + std::to_string(rank));
  return n;
}

proto::JobReady Ready(uint64_t epoch) {
  proto::JobReady ready;
  *ready.mutable_shard_map() = RoundRobinShardMap(epoch, 8, std::vector<proto::NodeInfo>{Server(0), Server(1)});
  proto::NodeInfo* w = ready.add_nodes();
  w->set_role(proto::WORKER);
  w->set_node_id(9);
  w->set_rank(0);
  return ready;
}

Message CreateTable(uint64_t request_id) {
  Message m;
  m.header.set_request_id(request_id);
  m.header.set_sender_address("sim://worker-0");
  auto* c = m.header.mutable_create_table()->mutable_config();
  c->set_table_id(1);
  c->set_width(1);
  c->set_kind(proto::SPARSE);
  c->set_optimizer(proto::ACCUMULATE);
  return m;
}

TEST(ServerNodeCoreTest, RequestsBeforeTheStartAreAnsweredAtTheStartInOrderAndTheQueueIsBounded) {
  ServerNodeCore node(ServerNodeCore::Options{.max_early = 2});
  EXPECT_TRUE(node.Receive(CreateTable(1), 0).sends.empty());
  EXPECT_TRUE(node.Receive(CreateTable(2), 0).sends.empty());
  ServerNodeCore::Output refused = node.Receive(CreateTable(3), 0);
  ASSERT_EQ(refused.sends.size(), 1u);
  EXPECT_EQ(refused.sends[0].to, "sim://worker-0");
  EXPECT_EQ(refused.sends[0].message.header.request_id(), 3u);
  EXPECT_EQ(refused.sends[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(node.early_requests(), 2u);
  EXPECT_EQ(node.core(), nullptr);

  auto out = node.Start(Ready(1), /*node_id=*/1, /*rank=*/0, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_NE(node.core(), nullptr);
  ASSERT_EQ(out->sends.size(), 2u);
  EXPECT_EQ(out->sends[0].message.header.request_id(), 1u);
  EXPECT_EQ(out->sends[1].message.header.request_id(), 2u);
  EXPECT_FALSE(out->sends[0].message.header.has_error()) << out->sends[0].message.header.error().message();
  EXPECT_EQ(node.early_requests(), 0u);
}

TEST(ServerNodeCoreTest, AMapThatCameBeforeTheStartIsAppliedAtItWhenNewer) {
  ServerNodeCore node(ServerNodeCore::Options{});
  proto::ShardMapUpdate update;
  *update.mutable_shard_map() = Ready(3).shard_map();
  EXPECT_TRUE(node.UpdateMap(update, 0, 0).kept);
  ASSERT_TRUE(node.Start(Ready(2), 1, 0, 0).ok());
  EXPECT_EQ(node.core()->epoch(), 3u);
  // Not newer: nothing changes.
  const ServerNodeCore::MapChange again = node.UpdateMap(update, 0, 0);
  EXPECT_FALSE(again.newer);
  EXPECT_FALSE(again.kept);
  EXPECT_TRUE(again.error.ok());
}

TEST(ServerNodeCoreTest, AMapThatCameBeforeTheStartAndIsRefusedIsReported) {
  ServerNodeCore node(ServerNodeCore::Options{});
  proto::ShardMapUpdate update;  // fewer servers than the job has: a map never shrinks
  *update.mutable_shard_map() = RoundRobinShardMap(3, 8, std::vector<proto::NodeInfo>{Server(0)});
  EXPECT_TRUE(node.UpdateMap(update, 0, 0).kept);
  auto out = node.Start(Ready(2), 1, 0, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->refused_map.ok());
  EXPECT_EQ(node.core()->epoch(), 2u);
}

TEST(ServerNodeCoreTest, ShardsThatLostEveryCopyAndThatThisServerLeadsAreRestored) {
  struct Call {
    std::vector<uint32_t> vshards;
    bool with_windows;
    std::map<uint32_t, uint64_t> last;
  };
  std::vector<Call> calls;
  ServerNodeCore::Options options;
  options.restore_lost = [&](ServerCore&, const std::vector<uint32_t>& vs, bool with_windows,
                             const std::map<uint32_t, uint64_t>& last) {
    calls.push_back(Call{vs, with_windows, last});
    return std::string("restored");
  };
  ServerNodeCore node(options);
  ASSERT_TRUE(node.Start(Ready(1), 1, 0, 0).ok());
  proto::ShardMapUpdate update;
  *update.mutable_shard_map() = Ready(2).shard_map();
  const ShardMapView view = *ShardMapView::Create(update.shard_map());
  std::vector<uint32_t> led, other;
  for (uint32_t v = 0; v < view.num_vshards(); ++v) (view.ServerRankOf(v) == 0 ? led : other).push_back(v);
  ASSERT_FALSE(led.empty());
  ASSERT_FALSE(other.empty());
  for (uint32_t v : {led[0], other[0]}) {
    proto::ShardRestore* r = update.add_restores();
    r->set_vshard(v);
    r->set_last_applied(40 + v);
  }
  const ServerNodeCore::MapChange change = node.UpdateMap(update, 0, 0);
  ASSERT_TRUE(change.newer);
  EXPECT_EQ(change.restore_line, "restored");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].vshards, std::vector<uint32_t>{led[0]}) << "only the shard this server leads";
  EXPECT_TRUE(calls[0].with_windows);
  EXPECT_EQ(calls[0].last, (std::map<uint32_t, uint64_t>{{led[0], 40 + led[0]}}));

  // Without checkpoints the shards start from their initial values, and the line says so.
  ServerNodeCore bare(ServerNodeCore::Options{});
  ASSERT_TRUE(bare.Start(Ready(1), 1, 0, 0).ok());
  const ServerNodeCore::MapChange none = bare.UpdateMap(update, 0, 0);
  EXPECT_NE(none.restore_line.find("start from their initial values"), std::string::npos) << none.restore_line;
}

TEST(ServerNodeCoreTest, ShardsToRestoreInAnUpdateThatCameBeforeTheStartAreRestoredAtIt) {
  std::vector<uint32_t> restored;
  ServerNodeCore::Options options;
  options.restore_lost = [&](ServerCore&, const std::vector<uint32_t>& vs, bool with_windows,
                             const std::map<uint32_t, uint64_t>&) {
    EXPECT_TRUE(with_windows);
    restored = vs;
    return std::string("restored from a checkpoint");
  };
  ServerNodeCore node(options);
  proto::ShardMapUpdate update;
  *update.mutable_shard_map() = Ready(3).shard_map();
  const ShardMapView view = *ShardMapView::Create(update.shard_map());
  uint32_t led = view.num_vshards();
  for (uint32_t v = 0; v < view.num_vshards() && led == view.num_vshards(); ++v)
    if (view.ServerRankOf(v) == 0) led = v;
  ASSERT_LT(led, view.num_vshards());
  update.add_restores()->set_vshard(led);
  EXPECT_TRUE(node.UpdateMap(update, 0, 0).kept);
  EXPECT_TRUE(restored.empty()) << "no core yet";
  auto out = node.Start(Ready(2), 1, 0, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(node.core()->epoch(), 3u);
  EXPECT_EQ(restored, std::vector<uint32_t>{led});
  EXPECT_EQ(out->restore_line, "restored from a checkpoint");
}

TEST(ServerNodeCoreTest, AStartFromACheckpointRestoresEveryShardThisServerHolds) {
  std::vector<uint32_t> restored;
  ServerNodeCore::Options options;
  options.restore_held = [&](ServerCore&, const std::vector<uint32_t>& vs, bool with_windows,
                             const std::map<uint32_t, uint64_t>&) {
    EXPECT_FALSE(with_windows) << "a new job numbers its pushes afresh";
    restored = vs;
    return std::string("from checkpoints");
  };
  ServerNodeCore node(options);
  std::string line;
  ASSERT_TRUE(node.Start(Ready(1), 2, 1, 0, &line).ok());
  EXPECT_EQ(line, "from checkpoints");
  const ShardMapView view = *ShardMapView::Create(Ready(1).shard_map());
  std::vector<uint32_t> held;
  for (uint32_t v = 0; v < view.num_vshards(); ++v)
    if (view.Holds(1, v)) held.push_back(v);
  EXPECT_EQ(restored, held);
}

}  // namespace
}  // namespace tessera
