// WorkerNodeCore alone: the start kinds, the requests each one's clock
// resume issues (the query, then the announcement of the clock found, only
// above 0, to every live server) and the map updates (newer, older, bad).
#include "worker/worker_node_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/keys.h"

namespace tessera {
namespace {

constexpr uint32_t kServers = 3;
constexpr uint32_t kWorkers = 2;
constexpr uint32_t kWorkerNode = 40;
constexpr uint32_t kRank = 1;
const char* const kAddress = "inproc://worker-1";

std::string ServerAddress(uint32_t rank) { return "inproc://server-" + std::to_string(rank); }

proto::ShardMap MakeMap(uint64_t epoch) {
  std::vector<proto::NodeInfo> nodes;
  for (uint32_t r = 0; r < kServers; ++r) {
    proto::NodeInfo n;
    n.set_node_id(r + 1);
    n.set_rank(r);
    n.set_role(proto::SERVER);
    n.set_address(ServerAddress(r));
    nodes.push_back(n);
  }
  return RoundRobinShardMap(epoch, 12, nodes, 1);
}

// MakeMap with server `dead` lost: its shards led by server 0.
proto::ShardMap MapWithout(uint32_t dead, uint64_t epoch) {
  proto::ShardMap map = MakeMap(epoch);
  for (int v = 0; v < map.vshard_server_rank_size(); ++v)
    if (map.vshard_server_rank(v) == dead) map.set_vshard_server_rank(v, 0);
  map.add_dead_server_ranks(dead);
  return map;
}

proto::JobReady Ready(const proto::ShardMap& map) {
  proto::JobReady ready;
  *ready.mutable_shard_map() = map;
  for (uint32_t r = 0; r < kServers; ++r) {
    proto::NodeInfo* n = ready.add_nodes();
    n->set_node_id(r + 1);
    n->set_rank(r);
    n->set_role(proto::SERVER);
  }
  for (uint32_t r = 0; r < kWorkers; ++r) {
    proto::NodeInfo* n = ready.add_nodes();
    n->set_node_id(kWorkerNode + r);
    n->set_rank(r);
    n->set_role(proto::WORKER);
  }
  return ready;
}

proto::NodeInfo Self(uint32_t incarnation) {
  proto::NodeInfo self;
  self.set_node_id(kWorkerNode + kRank);
  self.set_rank(kRank);
  self.set_role(proto::WORKER);
  self.set_incarnation(incarnation);
  return self;
}

WorkerCoreOptions Options() {
  WorkerCoreOptions o;
  o.request_timeout = 10 * kSeconds;
  o.resend_after = 0;  // no resends: the tests see each request once
  return o;
}

std::unique_ptr<WorkerNodeCore> Started(uint32_t incarnation, bool joined_running_job,
                                        const proto::ShardMap& map = MakeMap(1)) {
  auto node = std::make_unique<WorkerNodeCore>(Options());
  absl::Status s = node->Start(Ready(map), Self(incarnation), joined_running_job, kAddress);
  EXPECT_TRUE(s.ok()) << s;
  return node;
}

Message ClockAck(const Message& request, uint64_t worker_clock) {
  Message m;
  m.header.set_request_id(request.header.request_id());
  m.header.set_epoch(request.header.epoch());
  m.header.mutable_clock_ack()->set_worker_clock(worker_clock);
  return m;
}

// The addresses `sends` go to.
std::set<std::string> Destinations(const std::vector<Outgoing>& sends) {
  std::set<std::string> to;
  for (const Outgoing& o : sends) to.insert(o.to);
  return to;
}

std::set<std::string> Servers(std::vector<uint32_t> ranks) {
  std::set<std::string> to;
  for (uint32_t r : ranks) to.insert(ServerAddress(r));
  return to;
}

// Answers each request in `sends` with a ClockAck of the clock given for
// its server's rank (in rank order); returns the completions of the last.
std::vector<WorkerCore::Completion> AnswerClocks(WorkerNodeCore& node, const std::vector<Outgoing>& sends,
                                                 const std::vector<uint64_t>& clocks) {
  std::vector<WorkerCore::Completion> done;
  for (const Outgoing& o : sends) {
    EXPECT_TRUE(done.empty()) << "completed before every server answered";
    const uint32_t rank = static_cast<uint32_t>(std::stoul(o.to.substr(o.to.rfind('-') + 1)));
    done = node.core()->OnReply(ClockAck(o.message, clocks.at(rank)), 0).done;
  }
  return done;
}

TEST(WorkerNodeCore, StartMakesTheCoreFromTheReadyMap) {
  WorkerNodeCore node(Options());
  EXPECT_EQ(node.core(), nullptr);
  ASSERT_TRUE(node.Start(Ready(MakeMap(4)), Self(0), false, kAddress).ok());
  ASSERT_NE(node.core(), nullptr);
  EXPECT_EQ(node.core()->map()->epoch(), 4u);
  EXPECT_EQ(node.core()->options().node_id, kWorkerNode + kRank);
  EXPECT_EQ(node.core()->options().incarnation, 0u);
  EXPECT_EQ(node.core()->options().address, kAddress);
  EXPECT_EQ(node.core()->options().request_timeout, 10 * kSeconds);  // the rest from the options
  EXPECT_EQ(node.num_workers(), kWorkers);
  EXPECT_EQ(node.start_kind(), WorkerNodeCore::StartKind::kFresh);
}

TEST(WorkerNodeCore, ABadFirstMapIsAnErrorAndLeavesNoCore) {
  proto::ShardMap bad = MakeMap(1);
  bad.add_vshard_server_rank(0);  // one owner too many
  WorkerNodeCore node(Options());
  absl::Status s = node.Start(Ready(bad), Self(0), false, kAddress);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(node.core(), nullptr);
}

TEST(WorkerNodeCore, StartKinds) {
  EXPECT_EQ(Started(0, false)->start_kind(), WorkerNodeCore::StartKind::kFresh);
  EXPECT_EQ(Started(2, false)->start_kind(), WorkerNodeCore::StartKind::kReplacement);
  EXPECT_EQ(Started(0, true)->start_kind(), WorkerNodeCore::StartKind::kJoin);
  // Joining the running job decides, whatever the incarnation.
  EXPECT_EQ(Started(1, true)->start_kind(), WorkerNodeCore::StartKind::kJoin);
}

TEST(WorkerNodeCore, AFreshStartHasNoClockToQuery) {
  auto node = Started(0, false);
  auto handle = std::make_shared<int>(0);
  WorkerCore::Effects e = node->QueryClock(handle, 0);
  EXPECT_TRUE(e.sends.empty());
  ASSERT_EQ(e.done.size(), 1u);
  EXPECT_EQ(e.done[0].handle, handle);
  EXPECT_EQ(e.done[0].status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(WorkerNodeCore, AJoiningWorkerQueriesAsJoiningThenAnnouncesTheHighestClock) {
  auto node = Started(0, true);
  WorkerCore::Effects query = node->QueryClock(std::make_shared<int>(0), 0);
  EXPECT_TRUE(query.done.empty());
  EXPECT_EQ(Destinations(query.sends), Servers({0, 1, 2}));
  for (const Outgoing& o : query.sends) {
    ASSERT_TRUE(o.message.header.has_clock_query());
    EXPECT_TRUE(o.message.header.clock_query().join());
    EXPECT_EQ(o.message.header.clock_query().rank(), kRank);
  }
  std::vector<WorkerCore::Completion> done = AnswerClocks(*node, query.sends, {3, 5, 4});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(node->resume_clock(), 5u);

  auto announce_handle = std::make_shared<int>(0);
  WorkerCore::Effects announce = node->AnnounceClock(announce_handle, 0);
  EXPECT_TRUE(announce.done.empty());
  EXPECT_EQ(Destinations(announce.sends), Servers({0, 1, 2}));  // every server, also those that knew it
  for (const Outgoing& o : announce.sends) {
    ASSERT_TRUE(o.message.header.has_clock_advance());
    EXPECT_EQ(o.message.header.clock_advance().clock(), 5u);
  }
  done = AnswerClocks(*node, announce.sends, {5, 5, 5});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].handle, announce_handle);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
}

TEST(WorkerNodeCore, AReplacementQueriesItsClockAndAnnouncesItToEveryLiveServer) {
  auto node = Started(1, false, MapWithout(2, 1));
  WorkerCore::Effects query = node->QueryClock(std::make_shared<int>(0), 0);
  EXPECT_EQ(Destinations(query.sends), Servers({0, 1}));  // not the lost server
  for (const Outgoing& o : query.sends) {
    ASSERT_TRUE(o.message.header.has_clock_query());
    EXPECT_FALSE(o.message.header.clock_query().join());
  }
  // The predecessor died inside Clock(): only server 1 heard clock 7.
  ASSERT_EQ(AnswerClocks(*node, query.sends, {6, 7, 0}).size(), 1u);
  EXPECT_EQ(node->resume_clock(), 7u);
  WorkerCore::Effects announce = node->AnnounceClock(std::make_shared<int>(0), 0);
  EXPECT_EQ(Destinations(announce.sends), Servers({0, 1}));
  for (const Outgoing& o : announce.sends) EXPECT_EQ(o.message.header.clock_advance().clock(), 7u);
}

TEST(WorkerNodeCore, NothingIsAnnouncedAtClockZero) {
  auto node = Started(1, false);
  WorkerCore::Effects query = node->QueryClock(std::make_shared<int>(0), 0);
  ASSERT_EQ(AnswerClocks(*node, query.sends, {0, 0, 0}).size(), 1u);
  EXPECT_EQ(node->resume_clock(), 0u);
  auto handle = std::make_shared<int>(0);
  WorkerCore::Effects announce = node->AnnounceClock(handle, 0);
  EXPECT_TRUE(announce.sends.empty());
  ASSERT_EQ(announce.done.size(), 1u);  // done at once
  EXPECT_EQ(announce.done[0].handle, handle);
  EXPECT_TRUE(announce.done[0].status.ok());
}

TEST(WorkerNodeCore, AFailedQueryCompletesWithItsError) {
  WorkerCoreOptions options = Options();
  options.request_timeout = 1 * kSeconds;
  WorkerNodeCore node(options);
  ASSERT_TRUE(node.Start(Ready(MakeMap(1)), Self(1), false, kAddress).ok());
  (void)node.QueryClock(std::make_shared<int>(0), 0);
  std::vector<WorkerCore::Completion> done = node.core()->Tick(2 * kSeconds).done;  // nobody answered
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDeadlineExceeded) << done[0].status;
}

proto::ShardMapUpdate Update(const proto::ShardMap& map) {
  proto::ShardMapUpdate u;
  *u.mutable_shard_map() = map;
  return u;
}

TEST(WorkerNodeCore, ClockWaitsOnceABspOrSspTableWasCreated) {
  WorkerNodeCore node(Options());
  EXPECT_FALSE(node.ClockWaits()) << "no table yet";
  node.TableCreated(proto::ASP);
  EXPECT_FALSE(node.ClockWaits()) << "ASP tables only";
  node.TableCreated(proto::SSP);
  EXPECT_TRUE(node.ClockWaits());
  WorkerNodeCore bsp(Options());
  bsp.TableCreated(proto::BSP);
  EXPECT_TRUE(bsp.ClockWaits());
}

TEST(WorkerNodeCore, AMapBeforeTheStartChangesNothing) {
  WorkerNodeCore node(Options());
  WorkerNodeCore::MapChange change = node.UpdateMap(Update(MakeMap(2)), 0);
  EXPECT_FALSE(change.newer);
  EXPECT_TRUE(change.error.ok());
  EXPECT_EQ(node.core(), nullptr);
}

TEST(WorkerNodeCore, ANewerMapIsAppliedAndGivesTheEpoch) {
  auto node = Started(0, false, MakeMap(3));
  // A pull to the server about to be lost goes again by the new map.
  const std::vector<Key> keys = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> out(keys.size());
  WorkerCore::Effects pull = node->core()->Pull(std::make_shared<int>(0), 9, keys, out, 1, 0, 0);
  ASSERT_TRUE(Destinations(pull.sends).contains(ServerAddress(2)));
  WorkerNodeCore::MapChange change = node->UpdateMap(Update(MapWithout(2, 5)), 0);
  EXPECT_TRUE(change.newer);
  EXPECT_TRUE(change.error.ok());
  EXPECT_EQ(change.epoch, 5u);
  EXPECT_EQ(node->core()->map()->epoch(), 5u);
  EXPECT_GT(change.effects.resent_parts, 0u);
  EXPECT_FALSE(change.effects.sends.empty());
  EXPECT_FALSE(Destinations(change.effects.sends).contains(ServerAddress(2)));
  EXPECT_EQ(change.gone_servers, std::vector<std::string>{ServerAddress(2)});
}

TEST(WorkerNodeCore, AServerReplacedAtItsAddressIsGoneAndOneThatStaysIsNot) {
  auto node = Started(0, false, MakeMap(3));
  proto::ShardMap map = MakeMap(4);
  map.mutable_servers(1)->set_incarnation(1);  // a new process for rank 1, same address
  WorkerNodeCore::MapChange change = node->UpdateMap(Update(map), 0);
  ASSERT_TRUE(change.newer);
  EXPECT_EQ(change.gone_servers, std::vector<std::string>{ServerAddress(1)});
  change = node->UpdateMap(Update(MakeMap(5)), 0);  // the same servers again (rank 1 as incarnation 0)
  ASSERT_TRUE(change.newer);
  EXPECT_EQ(change.gone_servers, std::vector<std::string>{ServerAddress(1)});
  change = node->UpdateMap(Update(MakeMap(6)), 0);  // nothing changed but the epoch
  ASSERT_TRUE(change.newer);
  EXPECT_TRUE(change.gone_servers.empty());
}

TEST(WorkerNodeCore, AnOlderOrEqualMapChangesNothing) {
  auto node = Started(0, false, MakeMap(3));
  for (uint64_t epoch : {2, 3}) {
    WorkerNodeCore::MapChange change = node->UpdateMap(Update(MapWithout(2, epoch)), 0);
    EXPECT_FALSE(change.newer) << epoch;
    EXPECT_TRUE(change.error.ok()) << epoch;
    EXPECT_TRUE(change.effects.sends.empty()) << epoch;
    EXPECT_TRUE(change.gone_servers.empty()) << epoch;
    EXPECT_EQ(change.epoch, 3u);
    EXPECT_EQ(node->core()->map()->epoch(), 3u);
    EXPECT_EQ(node->core()->map()->LiveServers().size(), kServers);
  }
}

TEST(WorkerNodeCore, ABadMapIsReportedAndChangesNothing) {
  auto node = Started(0, false, MakeMap(3));
  proto::ShardMap bad = MakeMap(4);
  bad.set_vshard_server_rank(0, 17);  // no such server
  WorkerNodeCore::MapChange change = node->UpdateMap(Update(bad), 0);
  EXPECT_FALSE(change.newer);
  EXPECT_EQ(change.error.code(), absl::StatusCode::kInvalidArgument) << change.error;
  EXPECT_NE(change.error.message().find("17"), std::string::npos) << change.error;
  EXPECT_TRUE(change.effects.sends.empty());
  EXPECT_EQ(node->core()->map()->epoch(), 3u);
}

}  // namespace
}  // namespace tessera
