// WorkerCore driven message by message: the requests it builds (slicing,
// numbering, borrowing), the replies it merges back, its resends after a new
// map or a silence, and its deadlines. The last tests wire it to real
// ServerCores (server/server_core.h).
#include "worker/worker_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <set>

#include "compress/row_compressor.h"
#include "server/server_core.h"

namespace tessera {
namespace {

constexpr uint32_t kTable = 3;
constexpr uint32_t kNode = 50;
const char* const kAddress = "inproc://worker";
constexpr Nanos kTimeout = 10 * kSeconds;
constexpr Nanos kHold = 20 * kSeconds;

std::string ServerAddress(uint32_t rank) { return "inproc://server-" + std::to_string(rank); }

proto::ShardMap MakeMap(uint32_t servers, uint32_t replication = 1, uint64_t epoch = 1) {
  std::vector<proto::NodeInfo> nodes;
  for (uint32_t r = 0; r < servers; ++r) {
    proto::NodeInfo n;
    n.set_node_id(r + 1);
    n.set_rank(r);
    n.set_role(proto::SERVER);
    n.set_address(ServerAddress(r));
    nodes.push_back(n);
  }
  return RoundRobinShardMap(epoch, 12, nodes, replication);
}

WorkerCoreOptions Options(Nanos resend_after = 0) {
  WorkerCoreOptions o;
  o.node_id = kNode;
  o.incarnation = 2;
  o.address = kAddress;
  o.request_timeout = kTimeout;
  o.hold_timeout = kHold;
  o.resend_after = resend_after;
  // A timer of resend_after until answers are timed, doubling per resend
  // without a ceiling in reach, no allowance for bytes.
  o.resend_floor = 1;
  o.resend_ceiling = std::max<Nanos>(64 * resend_after, 1);
  o.resend_bytes_per_second = 0;
  return o;
}

std::unique_ptr<WorkerCore> MakeCore(const proto::ShardMap& map, WorkerCoreOptions options = Options()) {
  auto core = WorkerCore::Create(std::move(options), map);
  EXPECT_TRUE(core.ok()) << core.status();
  return std::move(*core);
}

// `n` keys of kTable whose primary is `server` in `map`, from `from` on.
std::vector<Key> KeysOn(const proto::ShardMap& map, uint32_t server, size_t n, Key from = 0) {
  const ShardMapView view = *ShardMapView::Create(map);
  std::vector<Key> keys;
  for (Key k = from; keys.size() < n; ++k)
    if (view.ServerRankOfKey(kTable, k) == server) keys.push_back(k);
  return keys;
}

uint32_t RankOf(const std::string& address) {
  return static_cast<uint32_t>(std::stoul(address.substr(address.rfind('-') + 1)));
}

Message Ack(const Message& request) {
  Message m;
  m.header.set_request_id(request.header.request_id());
  m.header.set_epoch(request.header.epoch());
  m.header.mutable_ack();
  return m;
}

Message ClockAck(const Message& request, uint64_t worker_clock) {
  Message m;
  m.header.set_request_id(request.header.request_id());
  m.header.mutable_clock_ack()->set_worker_clock(worker_clock);
  return m;
}

// A pull reply to `request` whose row for key k is {k * 10, k * 10 + 1, ...}.
Message RowsReply(const Message& request, uint32_t width) {
  const auto keys = request.frames[0].As<Key>();
  std::vector<float> v;
  for (Key k : keys)
    for (uint32_t j = 0; j < width; ++j) v.push_back(static_cast<float>(k * 10 + j));
  Message m;
  m.header.set_request_id(request.header.request_id());
  m.header.mutable_pull_reply()->set_num_keys(keys.size());
  m.header.mutable_pull_reply()->set_width(width);
  m.frames.push_back(Buffer::CopyOf(v.data(), v.size() * sizeof(float)));
  return m;
}

std::shared_ptr<int> NewHandle() { return std::make_shared<int>(0); }

// Answers every pull part in `sends` (last first: the parts may come back
// in any order), checks that the pull completes once, OK, with every row of
// `keys` in `out` (RowsReply's values).
// Answers every request with RowsReply, last first; expects the operation
// to complete OK with the last answer.
void AnswerInReverse(WorkerCore& core, const std::vector<Outgoing>& sends, uint32_t width) {
  std::vector<RequestTracker::Completion> done;
  for (auto it = sends.rbegin(); it != sends.rend(); ++it) {
    EXPECT_TRUE(done.empty());
    done = core.OnReply(RowsReply(it->message, width)).done;
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
}

void AnswerInReverseAndCheckRows(WorkerCore& core, const std::vector<Outgoing>& sends, std::span<const Key> keys,
                                 std::span<const float> out, uint32_t width) {
  AnswerInReverse(core, sends, width);
  for (size_t i = 0; i < keys.size(); ++i)
    for (uint32_t j = 0; j < width; ++j) ASSERT_EQ(out[i * width + j], static_cast<float>(keys[i] * 10 + j)) << i;
}


// The request ids of every send.
std::set<uint64_t> Ids(const std::vector<Outgoing>& sends) {
  std::set<uint64_t> ids;
  for (const Outgoing& o : sends) ids.insert(o.message.header.request_id());
  return ids;
}

TEST(WorkerCoreTest, CreateRejectsABadMap) {
  proto::ShardMap bad = MakeMap(2);
  bad.mutable_vshard_server_rank()->Set(0, 7);  // no server 7
  EXPECT_FALSE(WorkerCore::Create(Options(), bad).ok());
}

TEST(WorkerCoreTest, PushOverTwoServersSplitsIntoOneRequestEachWithOneNumber) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const ShardMapView& view = *core->map();
  const uint32_t width = 2;
  std::vector<Key> keys = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 2};  // a duplicate too
  std::vector<float> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    values.push_back(static_cast<float>(100 * i));
    values.push_back(static_cast<float>(100 * i + 1));
  }
  auto e = core->Push(NewHandle(), kTable, keys, values, width, /*clock=*/4, nullptr, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 2u);
  EXPECT_TRUE(e->done.empty());
  EXPECT_EQ(Ids(e->sends).size(), 2u);  // fresh request ids
  std::multiset<std::pair<Key, std::pair<float, float>>> seen;
  std::set<std::string> to;
  for (const Outgoing& o : e->sends) {
    const proto::Envelope& h = o.message.header;
    ASSERT_TRUE(h.has_push());
    to.insert(o.to);
    EXPECT_EQ(h.sender_id(), kNode);
    EXPECT_EQ(h.sender_address(), kAddress);
    EXPECT_EQ(h.epoch(), 1u);
    EXPECT_EQ(h.push().table_id(), kTable);
    EXPECT_EQ(h.push().seq(), 1u);
    EXPECT_EQ(h.push().acked_below(), 1u);
    EXPECT_EQ(h.push().clock(), 4u);
    EXPECT_EQ(h.push().incarnation(), 2u);
    EXPECT_FALSE(h.push().resend());
    ASSERT_EQ(o.message.frames.size(), 2u);
    const auto k = o.message.frames[0].As<Key>();
    const auto v = o.message.frames[1].As<float>();
    ASSERT_EQ(h.push().num_keys(), k.size());
    ASSERT_EQ(v.size(), k.size() * width);
    EXPECT_NE(static_cast<const void*>(k.data()), static_cast<const void*>(keys.data()));  // a copy
    for (size_t i = 0; i < k.size(); ++i) {
      EXPECT_EQ(view.ServerRankOfKey(kTable, k[i]), RankOf(o.to)) << "key " << k[i];
      seen.insert({k[i], {v[2 * i], v[2 * i + 1]}});
    }
  }
  EXPECT_EQ(to, (std::set<std::string>{ServerAddress(0), ServerAddress(1)}));
  std::multiset<std::pair<Key, std::pair<float, float>>> want;
  for (size_t i = 0; i < keys.size(); ++i) want.insert({keys[i], {values[2 * i], values[2 * i + 1]}});
  EXPECT_EQ(seen, want);
  EXPECT_EQ(core->last_push_seq(), 1u);
  EXPECT_EQ(core->pushes_in_flight(), 1u);
  EXPECT_EQ(core->tracker().in_flight(), 1u);
}

TEST(WorkerCoreTest, PushesAreNumberedAndCarryTheLowestInFlight) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = {0, 1, 2, 3, 4, 5};
  const std::vector<float> values(keys.size(), 1.0f);
  auto first = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  auto second = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(first.ok() && second.ok());
  for (const Outgoing& o : second->sends) {
    EXPECT_EQ(o.message.header.push().seq(), 2u);
    EXPECT_EQ(o.message.header.push().acked_below(), 1u);  // push 1 still in flight
  }
  EXPECT_FALSE(core->PushesCompleteThrough(1));
  // Push 1 acknowledged by its first server only: still in flight.
  EXPECT_TRUE(core->OnReply(Ack(first->sends[0].message)).done.empty());
  EXPECT_FALSE(core->PushesCompleteThrough(1));
  auto done = core->OnReply(Ack(first->sends[1].message)).done;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_TRUE(core->PushesCompleteThrough(1));
  EXPECT_FALSE(core->PushesCompleteThrough(2));
  auto third = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(third.ok());
  for (const Outgoing& o : third->sends) {
    EXPECT_EQ(o.message.header.push().seq(), 3u);
    EXPECT_EQ(o.message.header.push().acked_below(), 2u);
  }
}

TEST(WorkerCoreTest, AllKeysOnOneServerGoAsTheCallersOwnMemory) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = KeysOn(map, 1, 5);
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto e = core->Push(NewHandle(), kTable, keys, values, 2, 0, nullptr, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 1u);
  EXPECT_EQ(e->sends[0].to, ServerAddress(1));
  const Message& m = e->sends[0].message;
  ASSERT_EQ(m.frames.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(m.frames[0].data()), static_cast<const void*>(keys.data()));
  EXPECT_EQ(static_cast<const void*>(m.frames[1].data()), static_cast<const void*>(values.data()));
  EXPECT_EQ(m.frames[0].size(), keys.size() * sizeof(Key));
  EXPECT_EQ(m.frames[1].size(), values.size() * sizeof(float));
  EXPECT_EQ(m.frames[0].owner(), nullptr);  // borrowed

  std::vector<float> out(10);
  auto p = core->Pull(NewHandle(), kTable, keys, out, 2, 0, 0);
  ASSERT_EQ(p.sends.size(), 1u);
  EXPECT_EQ(static_cast<const void*>(p.sends[0].message.frames[0].data()), static_cast<const void*>(keys.data()));
}

TEST(WorkerCoreTest, PullRowsLandInTheCallersOrderWhateverOrderRepliesCome) {
  const proto::ShardMap map = MakeMap(3);
  auto core = MakeCore(map);
  const uint32_t width = 3;
  const std::vector<Key> keys = {11, 2, 7, 5, 2, 40, 1, 9};
  std::vector<float> out(keys.size() * width, -1);
  auto e = core->Pull(NewHandle(), kTable, keys, out, width, /*clock=*/6, 0);
  ASSERT_GE(e.sends.size(), 2u);
  for (const Outgoing& o : e.sends) {
    EXPECT_EQ(o.message.header.pull().clock(), 6u);
    EXPECT_EQ(o.message.header.pull().hold_timeout_ms(), static_cast<uint64_t>(kHold / kMillis));
    EXPECT_EQ(o.message.header.pull().num_keys(), o.message.frames[0].As<Key>().size());
  }
  AnswerInReverseAndCheckRows(*core, e.sends, keys, out, width);
  EXPECT_EQ(core->tracker().in_flight(), 0u);
}

TEST(WorkerCoreTest, AViewPullAsksForWholeRepliesAndGetsItsRowsInOrder) {
  const proto::ShardMap map = MakeMap(3);
  auto core = MakeCore(map);
  const uint32_t width = 3;
  const std::vector<Key> keys = {11, 2, 7, 5, 2, 40, 1, 9};
  PulledRows view;
  auto e = core->Pull(NewHandle(), kTable, keys, &view, width, /*clock=*/6, 0);
  ASSERT_GE(e.sends.size(), 2u);
  for (const Outgoing& o : e.sends) EXPECT_TRUE(o.message.header.pull().whole());
  AnswerInReverse(*core, e.sends, width);
  ASSERT_EQ(view.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    for (uint32_t j = 0; j < width; ++j) ASSERT_EQ(view.row(i)[j], static_cast<float>(keys[i] * 10 + j)) << i;
  // A plain pull does not ask for whole replies.
  std::vector<float> out(keys.size() * width);
  for (const Outgoing& o : core->Pull(NewHandle(), kTable, keys, out, width, 6, 0).sends) {
    EXPECT_FALSE(o.message.header.pull().whole());
  }
}

TEST(WorkerCoreTest, PushNumbersAreForgottenOnEveryWayOut) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = {0, 1, 2, 3};
  const std::vector<float> values(4, 1.0f);
  std::vector<WorkerCore::Effects> pushes;
  for (int i = 0; i < 3; ++i) pushes.push_back(*core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0));
  // Push 2 answered: 1 and 3 still in flight.
  for (const Outgoing& o : pushes[1].sends) core->OnReply(Ack(o.message));
  EXPECT_EQ(core->pushes_in_flight(), 2u);
  EXPECT_FALSE(core->PushesCompleteThrough(1));
  EXPECT_FALSE(core->PushesCompleteThrough(2));
  // FailAll completes the rest.
  auto failed = core->FailAll(absl::CancelledError("closing"));
  ASSERT_EQ(failed.done.size(), 2u);
  for (const auto& c : failed.done) EXPECT_EQ(c.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(core->pushes_in_flight(), 0u);
  EXPECT_TRUE(core->PushesCompleteThrough(3));

  // A deadline: the push is failed by Tick (no resends: resend_after is 0).
  auto late = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, /*now=*/1000);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(core->PushesCompleteThrough(4));
  auto t = core->Tick(1000 + kTimeout - 1);
  EXPECT_TRUE(t.done.empty());
  EXPECT_TRUE(t.sends.empty());
  EXPECT_FALSE(core->PushesCompleteThrough(4));
  t = core->Tick(1000 + kTimeout);
  ASSERT_EQ(t.done.size(), 1u);
  EXPECT_EQ(t.done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(t.done[0].status.message().find("push to table 3"), std::string::npos) << t.done[0].status;
  EXPECT_TRUE(core->PushesCompleteThrough(4));
  EXPECT_EQ(core->pushes_in_flight(), 0u);
  // A reply for the failed push is ignored, and numbers go on.
  EXPECT_TRUE(core->OnReply(Ack(late->sends[0].message)).done.empty());
  auto next = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  EXPECT_EQ(next->sends[0].message.header.push().seq(), 5u);
  EXPECT_EQ(next->sends[0].message.header.push().acked_below(), 5u);
}

TEST(WorkerCoreTest, PullsAndClocksMayBeHeldOnTopOfTheRequestTimeout) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = {0, 1, 2};
  std::vector<float> out(3);
  core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0);
  auto clock = core->ClockAdvance(NewHandle(), 1, 0);
  ASSERT_EQ(clock.sends.size(), 2u);
  for (const Outgoing& o : clock.sends) {
    EXPECT_EQ(o.message.header.clock_advance().clock(), 1u);
    EXPECT_EQ(o.message.header.clock_advance().hold_timeout_ms(), static_cast<uint64_t>(kHold / kMillis));
  }
  EXPECT_TRUE(core->Tick(kTimeout).done.empty());
  EXPECT_TRUE(core->Tick(kTimeout + kHold - 1).done.empty());
  auto t = core->Tick(kTimeout + kHold);
  EXPECT_EQ(t.done.size(), 2u);
  for (const auto& c : t.done) EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded);
}

// Nobody holds a pull of an ASP table: it fails after the request timeout
// alone, and says so to the server.
TEST(WorkerCoreTest, APullOfAnAspTableIsNotHeld) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  proto::TableConfig config;
  config.set_table_id(kTable);
  config.set_width(1);
  config.set_consistency(proto::ASP);
  core->CreateTable(NewHandle(), config, 0);
  const std::vector<Key> keys = {0, 1, 2};
  std::vector<float> out(3);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0);
  ASSERT_FALSE(pull.sends.empty());
  for (const Outgoing& o : pull.sends) EXPECT_EQ(o.message.header.pull().hold_timeout_ms(), 0u);
  auto t = core->Tick(kTimeout);
  ASSERT_EQ(t.done.size(), 2u) << "the table creation and the pull";
  for (const auto& c : t.done) EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded);
  // A BSP table's pull keeps its hold.
  config.set_table_id(kTable + 1);
  config.set_consistency(proto::BSP);
  core->CreateTable(NewHandle(), config, kTimeout);
  pull = core->Pull(NewHandle(), kTable + 1, keys, out, 1, 0, kTimeout);
  for (const Outgoing& o : pull.sends) {
    EXPECT_EQ(o.message.header.pull().hold_timeout_ms(), static_cast<uint64_t>(kHold / kMillis));
  }
  EXPECT_EQ(core->Tick(2 * kTimeout).done.size(), 1u) << "only the table creation";
  EXPECT_EQ(core->Tick(2 * kTimeout + kHold).done.size(), 1u);
}

TEST(WorkerCoreTest, ClockAndTableRequestsGoToEveryLiveServer) {
  const proto::ShardMap map = *WithoutServer(MakeMap(3, 2), 1);  // server 1 dead
  auto core = MakeCore(map);
  const std::set<std::string> live = {ServerAddress(0), ServerAddress(2)};
  auto addresses = [](const std::vector<Outgoing>& sends) {
    std::set<std::string> to;
    for (const Outgoing& o : sends) to.insert(o.to);
    return to;
  };
  proto::TableConfig config;
  config.set_table_id(kTable);
  config.set_width(4);
  auto create = core->CreateTable(NewHandle(), config, 0);
  EXPECT_EQ(addresses(create.sends), live);
  for (const Outgoing& o : create.sends) {
    EXPECT_EQ(o.message.header.create_table().config().width(), 4u);
    EXPECT_EQ(o.message.header.epoch(), map.epoch());
    EXPECT_EQ(o.message.header.sender_id(), kNode);
  }
  auto query = core->ClockQuery(NewHandle(), 0);
  EXPECT_EQ(addresses(query.sends), live);
  for (const Outgoing& o : query.sends) EXPECT_TRUE(o.message.header.has_clock_query());
  EXPECT_EQ(addresses(core->ClockAdvance(NewHandle(), 2, 0).sends), live);
  const std::vector<Outgoing> notice = core->ClockNotice(5);
  EXPECT_EQ(addresses(notice), live);
  for (const Outgoing& o : notice) {
    EXPECT_EQ(o.message.header.request_id(), 0u);
    EXPECT_EQ(o.message.header.clock_advance().clock(), 5u);
    EXPECT_EQ(o.message.header.sender_address(), kAddress);
  }
  EXPECT_EQ(core->tracker().in_flight(), 3u);  // the notice registers nothing
}

TEST(WorkerCoreTest, AClockAckRaisesTheKnownClock) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  EXPECT_EQ(core->known_clock(), 0u);
  auto q = core->ClockQuery(NewHandle(), 0);
  ASSERT_EQ(q.sends.size(), 2u);
  EXPECT_TRUE(core->OnReply(ClockAck(q.sends[0].message, 5)).done.empty());
  EXPECT_EQ(core->known_clock(), 5u);
  auto done = core->OnReply(ClockAck(q.sends[1].message, 3)).done;  // lower: the highest stays
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(core->known_clock(), 5u);
  // A late ClockAck (its request is gone) still tells what a server knows.
  core->OnReply(ClockAck(q.sends[1].message, 7));
  EXPECT_EQ(core->known_clock(), 7u);
}

// Found by the simulator (seed 160843): a server that joined after a
// worker's last Clock() never heard that clock, and held the worker's pulls
// for it forever. A worker tells every server new in a map the clock it has
// announced, before anything else it sends there.
TEST(WorkerCoreTest, ANewServerInTheMapHearsTheAnnouncedClockFirst) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  proto::NodeInfo added;
  added.set_node_id(9);
  added.set_rank(2);
  added.set_role(proto::SERVER);
  added.set_address(ServerAddress(2));
  auto grown = WithServerAdded(map, added);
  ASSERT_TRUE(grown.ok()) << grown.status();
  grown->set_epoch(map.epoch() + 1);
  // Nothing announced yet: nothing to tell.
  EXPECT_TRUE(core->OnMapUpdate(*grown, 1).sends.empty());

  ASSERT_EQ(core->ClockAdvance(NewHandle(), 4, 2).sends.size(), 3u);
  core->ClockNotice(6);  // a notice counts as announced too
  proto::NodeInfo another = added;
  another.set_node_id(10);
  another.set_rank(3);
  another.set_address(ServerAddress(3));
  auto again = WithServerAdded(*grown, another);
  ASSERT_TRUE(again.ok()) << again.status();
  again->set_epoch(grown->epoch() + 1);
  auto e = core->OnMapUpdate(*again, 3);
  ASSERT_EQ(e.sends.size(), 1u) << "only the new server, not the three that heard it";
  EXPECT_EQ(e.sends[0].to, ServerAddress(3));
  EXPECT_EQ(e.sends[0].message.header.request_id(), 0u) << "a notice: nothing waits for it";
  EXPECT_EQ(e.sends[0].message.header.clock_advance().clock(), 6u);

  // A rank taken over by another process (a new node id) is new too.
  proto::ShardMap replaced = *again;
  replaced.mutable_servers(1)->set_node_id(77);
  replaced.set_epoch(again->epoch() + 1);
  e = core->OnMapUpdate(replaced, 4);
  ASSERT_EQ(e.sends.size(), 1u);
  EXPECT_EQ(e.sends[0].to, ServerAddress(1));
  EXPECT_EQ(e.sends[0].message.header.clock_advance().clock(), 6u);
}

// Found by the simulator (seed 30783: out of memory): a push sent whole to
// every new primary of its keys after a failover, refused by a primary whose
// map was behind ("send it again"), went whole to every primary again, and
// so at every resend; with two lagging primaries the copies doubled each
// time. Sent under the map the worker still has, it goes again only where
// it went.
TEST(WorkerCoreTest, APartRefusedByALaggingServerGoesAgainOnlyThere) {
  const proto::ShardMap map = MakeMap(3);
  auto core = MakeCore(map);
  std::vector<Key> keys = KeysOn(map, 1, 4);
  std::vector<float> values(keys.size(), 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 1u);
  // Server 1 is lost; its shards go to servers 0 and 2 in turn.
  proto::ShardMap next = map;
  next.set_epoch(map.epoch() + 1);
  next.add_dead_server_ranks(1);
  bool to_zero = true;
  for (int v = 0; v < next.vshard_server_rank_size(); ++v) {
    if (next.vshard_server_rank(v) != 1) continue;
    next.set_vshard_server_rank(v, to_zero ? 0 : 2);
    to_zero = !to_zero;
  }
  auto e = core->OnMapUpdate(next, 5);
  ASSERT_EQ(e.sends.size(), 2u) << "whole, to each new primary of its keys";
  for (const Outgoing& o : e.sends) EXPECT_EQ(o.message.header.push().num_keys(), keys.size());
  // Server 0 takes its keys; server 2's map is behind: Aborted at its epoch.
  Message to2 = (e.sends[0].to == ServerAddress(2) ? e.sends[0] : e.sends[1]).message;
  const Message& to0 = (e.sends[0].to == ServerAddress(0) ? e.sends[0] : e.sends[1]).message;
  EXPECT_TRUE(core->OnReply(Ack(to0)).done.empty());
  for (int round = 0; round < 3; ++round) {
    Message refused;
    refused.header.set_request_id(to2.header.request_id());
    refused.header.set_epoch(map.epoch());
    refused.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kAborted));
    refused.header.mutable_error()->set_message("server 2 has shard map epoch 1, older than the request's 2");
    EXPECT_TRUE(core->OnReply(refused).done.empty());
    auto t = core->Tick(10 + round);
    ASSERT_EQ(t.sends.size(), 1u) << "round " << round << ": only to the server that refused it";
    EXPECT_EQ(t.sends[0].to, ServerAddress(2));
    EXPECT_TRUE(t.sends[0].message.header.push().resend());
    EXPECT_EQ(t.sends[0].message.header.epoch(), next.epoch());
    to2 = t.sends[0].message;
    if (round == 2) {
      auto done = core->OnReply(Ack(t.sends[0].message)).done;
      ASSERT_EQ(done.size(), 1u);
      EXPECT_TRUE(done[0].status.ok()) << done[0].status;
    }
  }
}

// Found by the simulator (seed 296058): a table creation that reached a
// server just removed from the job (drained) was refused, Aborted at the
// newer map, and failed the worker. It now waits for that map, under which
// the server is gone and its part is done.
TEST(WorkerCoreTest, ATableCreationRefusedByARemovedServerEndsWithTheNewerMap) {
  const proto::ShardMap map = MakeMap(3, 2);
  auto core = MakeCore(map);
  proto::TableConfig config;
  config.set_table_id(kTable);
  config.set_width(1);
  auto create = core->CreateTable(NewHandle(), config, 0);
  ASSERT_EQ(create.sends.size(), 3u);
  for (const Outgoing& o : create.sends) {
    if (o.to != ServerAddress(1)) {
      EXPECT_TRUE(core->OnReply(Ack(o.message)).done.empty());
      continue;
    }
    Message refused;
    refused.header.set_request_id(o.message.header.request_id());
    refused.header.set_epoch(map.epoch() + 1);
    refused.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kAborted));
    refused.header.mutable_error()->set_message("server 1 was removed from the job at map epoch 2; it holds nothing");
    EXPECT_TRUE(core->OnReply(refused).done.empty()) << "not an error: the worker's map is behind";
  }
  EXPECT_TRUE(core->Tick(1).done.empty()) << "still waiting for the map";
  auto e = core->OnMapUpdate(*WithoutServer(map, 1), 2);
  ASSERT_EQ(e.done.size(), 1u);
  EXPECT_TRUE(e.done[0].status.ok()) << e.done[0].status;
  EXPECT_TRUE(e.sends.empty()) << "nothing goes to the removed server again";
}

TEST(WorkerCoreTest, ANewerMapSendsThePartsOfTheLostServerToTheNewPrimaries) {
  const proto::ShardMap map = MakeMap(3, 2);
  auto core = MakeCore(map);
  std::vector<Key> keys;
  for (uint32_t s = 0; s < 3; ++s)
    for (Key k : KeysOn(map, s, 3)) keys.push_back(k);
  std::vector<float> values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values[i] = static_cast<float>(i);
  auto push = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 3u);
  const Message* lost = nullptr;
  for (const Outgoing& o : push->sends) {
    if (o.to == ServerAddress(1)) lost = &o.message;
    else EXPECT_TRUE(core->OnReply(Ack(o.message)).done.empty());  // the others answered
  }
  ASSERT_NE(lost, nullptr);
  std::vector<float> out(keys.size(), -1);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0);
  ASSERT_EQ(pull.sends.size(), 3u);
  for (const Outgoing& o : pull.sends)
    if (o.to != ServerAddress(1)) core->OnReply(RowsReply(o.message, 1));

  // An older or equal map changes nothing.
  bool changed = true;
  auto same = core->OnMapUpdate(map, 5, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(same.sends.empty() && same.done.empty());
  EXPECT_EQ(same.resent_parts, 0u);
  EXPECT_EQ(core->map()->epoch(), 1u);

  const proto::ShardMap next = *WithoutServer(map, 1);
  ASSERT_EQ(next.epoch(), 2u);
  const std::set<uint64_t> old_ids = Ids(push->sends);
  auto e = core->OnMapUpdate(next, 5, &changed);
  EXPECT_TRUE(changed);
  EXPECT_EQ(core->map()->epoch(), 2u);
  EXPECT_TRUE(e.done.empty());
  EXPECT_EQ(e.resent_parts, 2u);  // the push part and the pull part of server 1
  const ShardMapView& view = *core->map();
  std::vector<const Outgoing*> push_resends, pull_resends;
  for (const Outgoing& o : e.sends) (o.message.header.has_push() ? push_resends : pull_resends).push_back(&o);
  // The push goes whole, marked as a resend, with its number, to each new primary of its keys.
  std::set<std::string> primaries;
  for (Key k : lost->frames[0].As<Key>()) primaries.insert(ServerAddress(view.ServerRankOfKey(kTable, k)));
  std::set<std::string> push_to;
  for (const Outgoing* o : push_resends) {
    const proto::Envelope& h = o->message.header;
    EXPECT_TRUE(o->message.at_once);
    push_to.insert(o->to);
    EXPECT_NE(o->to, ServerAddress(1));
    EXPECT_TRUE(h.push().resend());
    EXPECT_EQ(h.push().seq(), 1u);
    EXPECT_EQ(h.epoch(), 2u);
    EXPECT_FALSE(old_ids.contains(h.request_id()));
    EXPECT_EQ(o->message.frames[0].data(), lost->frames[0].data());  // the same bytes
    EXPECT_EQ(o->message.frames[1].data(), lost->frames[1].data());
  }
  EXPECT_EQ(push_to, primaries);
  // The same map again: nothing more.
  EXPECT_TRUE(core->OnMapUpdate(next, 6, &changed).sends.empty());
  EXPECT_FALSE(changed);

  std::vector<RequestTracker::Completion> done;
  for (const Outgoing* o : push_resends)
    for (auto& c : core->OnReply(Ack(o->message)).done) done.push_back(std::move(c));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_TRUE(core->PushesCompleteThrough(1));
  // The pull part is split by the new primaries; its rows land where they belong.
  ASSERT_FALSE(pull_resends.empty());
  done.clear();
  for (const Outgoing* o : pull_resends) {
    EXPECT_NE(o->to, ServerAddress(1));
    EXPECT_EQ(o->message.header.epoch(), 2u);
    EXPECT_FALSE(old_ids.contains(o->message.header.request_id()));
    for (Key k : o->message.frames[0].As<Key>()) EXPECT_EQ(ServerAddress(view.ServerRankOfKey(kTable, k)), o->to);
    for (auto& c : core->OnReply(RowsReply(o->message, 1)).done) done.push_back(std::move(c));
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(keys[i] * 10)) << i;
}

TEST(WorkerCoreTest, ADeadServersClockPartIsDoneAfterANewMap) {
  const proto::ShardMap map = MakeMap(3, 2);
  auto core = MakeCore(map);
  auto clock = core->ClockAdvance(NewHandle(), 1, 0);
  ASSERT_EQ(clock.sends.size(), 3u);
  for (const Outgoing& o : clock.sends)
    if (o.to != ServerAddress(1)) core->OnReply(ClockAck(o.message, 1));
  auto e = core->OnMapUpdate(*WithoutServer(map, 1), 0);
  EXPECT_TRUE(e.sends.empty());
  ASSERT_EQ(e.done.size(), 1u);  // a lost server needs nothing more from us
  EXPECT_TRUE(e.done[0].status.ok()) << e.done[0].status;
}

TEST(WorkerCoreTest, ASilentPartGoesAgainUnderANewIdWithBackoff) {
  const Nanos after = 2 * kSeconds;
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map, Options(after));
  const std::vector<Key> keys = {0, 1, 2, 3, 4, 5};
  const std::vector<float> values(keys.size(), 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 2u);
  core->OnReply(Ack(push->sends[0].message));
  const Outgoing& silent = push->sends[1];
  EXPECT_TRUE(core->Tick(after - 1).sends.empty());
  auto t = core->Tick(after);
  EXPECT_EQ(t.resent_parts, 1u);
  ASSERT_EQ(t.sends.size(), 1u);
  const Message& again = t.sends[0].message;
  EXPECT_EQ(t.sends[0].to, silent.to);
  EXPECT_GT(again.header.request_id(), *Ids(push->sends).rbegin());
  EXPECT_EQ(again.header.first_request_id(), silent.message.header.request_id()) << "names the first send";
  EXPECT_FALSE(silent.message.at_once) << "a first send may be held with others";
  EXPECT_TRUE(again.at_once) << "a resend goes to a server that did not answer: it must not wait for that answer";
  EXPECT_EQ(again.header.push().seq(), silent.message.header.push().seq());
  EXPECT_EQ(again.frames[0].data(), silent.message.frames[0].data());
  // The next one waits twice as long.
  EXPECT_TRUE(core->Tick(after + 2 * after - 1).sends.empty());
  auto t2 = core->Tick(after + 2 * after);
  ASSERT_EQ(t2.sends.size(), 1u);
  EXPECT_GT(t2.sends[0].message.header.request_id(), again.header.request_id());
  EXPECT_EQ(t2.sends[0].message.header.first_request_id(), silent.message.header.request_id());
  // A late answer to an old id is ignored; the current one completes the push.
  EXPECT_TRUE(core->OnReply(Ack(silent.message)).done.empty());
  EXPECT_TRUE(core->OnReply(Ack(again)).done.empty());
  EXPECT_FALSE(core->PushesCompleteThrough(1));
  auto done = core->OnReply(Ack(t2.sends[0].message)).done;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_TRUE(core->PushesCompleteThrough(1));
}

TEST(WorkerCoreTest, ARestoredLinkSendsThatServersPartsAgainAtOnce) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map, Options(2 * kSeconds));
  const std::vector<Key> keys = {0, 1, 2, 3, 4, 5};
  const std::vector<float> values(keys.size(), 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, values, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 2u);
  const Message to1 = push->sends[RankOf(push->sends[0].to) == 1 ? 0 : 1].message;
  EXPECT_TRUE(core->OnLinkRestored("tcp://nobody:1", 1 * kMillis).sends.empty()) << "not a server of the map";
  auto e = core->OnLinkRestored(ServerAddress(1), 1 * kMillis);
  EXPECT_EQ(e.resent_parts, 1u);
  ASSERT_EQ(e.sends.size(), 1u);
  EXPECT_EQ(e.sends[0].to, ServerAddress(1));
  EXPECT_EQ(e.sends[0].message.header.push().seq(), to1.header.push().seq());
  EXPECT_EQ(e.sends[0].message.header.first_request_id(), to1.header.request_id());
  EXPECT_TRUE(e.sends[0].message.header.push().resend());
  // A link that is down gets no resends for silence; server 0's part does.
  core->OnLinkDown(ServerAddress(1));
  auto t = core->Tick(2 * kSeconds);
  ASSERT_EQ(t.sends.size(), 1u);
  EXPECT_EQ(t.sends[0].to, ServerAddress(0));
  EXPECT_TRUE(core->Tick(kTimeout - 1).sends.size() == 1u) << "only server 0's, again";
}

TEST(WorkerCoreTest, ABadCompressedPullReplyFailsItsPullWithDataLoss) {
  const proto::ShardMap map = MakeMap(1);
  auto core = MakeCore(map);
  const std::vector<Key> keys = {1, 2};
  std::vector<float> out(2, -1);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0);
  ASSERT_EQ(pull.sends.size(), 1u);
  Message reply = RowsReply(pull.sends[0].message, 1);
  reply.header.mutable_pull_reply()->set_value_parts(2);  // announces 2 parts, has 1 frame
  auto done = core->OnReply(std::move(reply)).done;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDataLoss) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{-1, -1}));
}

TEST(WorkerCoreTest, ACompressedPushCarriesEncodedParts) {
  const proto::ShardMap map = MakeMap(1);
  auto core = MakeCore(map);
  auto spec = compress::ParseCodecSpec("fp16:raw_below=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto compressor = compress::RowCompressor::Create(*spec, 4, 1);
  ASSERT_TRUE(compressor.ok());
  const std::vector<Key> keys = {1, 2};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  auto e = core->Push(NewHandle(), kTable, keys, values, 4, 0, compressor->get(), 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 1u);
  const Message& m = e->sends[0].message;
  ASSERT_GE(m.header.push().value_parts(), 1u);
  ASSERT_EQ(m.frames.size(), 1 + m.header.push().value_parts());
  std::vector<float> decoded(values.size());
  ASSERT_TRUE(compress::DecodeRowParts(std::span<const Buffer>(m.frames).subspan(1), decoded).ok());
  EXPECT_EQ(decoded, values);  // fp16 holds these exactly
}

// --- Transfer scheduling (part_bytes, max_bytes_in_flight_per_server) ---

WorkerCoreOptions TransferOptions(uint64_t part_bytes, uint64_t bound, Nanos resend_after = 0) {
  WorkerCoreOptions o = Options(resend_after);
  o.part_bytes = part_bytes;
  o.max_bytes_in_flight_per_server = bound;
  return o;
}

TEST(WorkerCoreTransferTest, PartBytesSplitsEachServersShareAndNumbersEveryPart) {
  const proto::ShardMap map = MakeMap(2);
  const uint32_t width = 2;  // 8 value bytes a row
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/24, 0));  // 3 rows a part
  std::vector<Key> keys = KeysOn(map, 0, 7);
  for (Key k : KeysOn(map, 1, 5)) keys.push_back(k);
  std::rotate(keys.begin(), keys.begin() + 4, keys.end());  // servers interleaved in the caller's order
  std::vector<float> values;
  for (size_t i = 0; i < keys.size() * width; ++i) values.push_back(static_cast<float>(i));
  auto e = core->Push(NewHandle(), kTable, keys, values, width, 0, nullptr, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 5u);  // server 0: 3 + 3 + 1 rows, server 1: 3 + 2
  std::set<uint64_t> seqs;
  std::multiset<std::pair<Key, std::pair<float, float>>> seen, want;
  std::map<std::string, std::vector<uint64_t>> rows_to;
  for (const Outgoing& o : e->sends) {
    const proto::Push& p = o.message.header.push();
    EXPECT_LE(p.num_keys(), 3u);
    EXPECT_EQ(p.acked_below(), 1u);
    seqs.insert(p.seq());
    rows_to[o.to].push_back(p.num_keys());
    const auto k = o.message.frames[0].As<Key>();
    const auto v = o.message.frames[1].As<float>();
    ASSERT_EQ(k.size(), p.num_keys());
    ASSERT_EQ(v.size(), k.size() * width);
    for (size_t i = 0; i < k.size(); ++i) {
      EXPECT_EQ(ServerAddress(core->map()->ServerRankOfKey(kTable, k[i])), o.to);
      seen.insert({k[i], {v[2 * i], v[2 * i + 1]}});
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) want.insert({keys[i], {values[2 * i], values[2 * i + 1]}});
  EXPECT_EQ(seen, want);
  EXPECT_EQ(rows_to[ServerAddress(0)], (std::vector<uint64_t>{3, 3, 1}));
  EXPECT_EQ(rows_to[ServerAddress(1)], (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(seqs, (std::set<uint64_t>{1, 2, 3, 4, 5}));  // every part its own number
  EXPECT_EQ(core->last_push_seq(), 5u);
  EXPECT_EQ(core->pushes_in_flight(), 5u);

  // Keys all on one server: the parts are slices of the caller's memory.
  const std::vector<Key> one = KeysOn(map, 1, 4);
  const std::vector<float> one_values = {1, 2, 3, 4, 5, 6, 7, 8};
  auto second = core->Push(NewHandle(), kTable, one, one_values, width, 0, nullptr, 0);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->sends.size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    const Message& m = second->sends[j].message;
    EXPECT_EQ(m.header.push().seq(), 6 + j);
    EXPECT_EQ(m.header.push().acked_below(), 1u);  // push 1 (numbers 1-5) is in flight
    EXPECT_EQ(m.frames[0].owner(), nullptr);       // borrowed
    EXPECT_EQ(static_cast<const void*>(m.frames[0].data()), static_cast<const void*>(one.data() + 3 * j));
    EXPECT_EQ(static_cast<const void*>(m.frames[1].data()), static_cast<const void*>(one_values.data() + 6 * j));
    EXPECT_EQ(m.frames[0].size(), (j == 0 ? 3 : 1) * sizeof(Key));
  }
  EXPECT_EQ(core->last_push_seq(), 7u);

  // Push 1 completes when its last part is answered; its numbers are then forgotten.
  for (size_t i = 0; i + 1 < e->sends.size(); ++i) EXPECT_TRUE(core->OnReply(Ack(e->sends[i].message)).done.empty());
  EXPECT_FALSE(core->PushesCompleteThrough(1));
  EXPECT_EQ(core->OnReply(Ack(e->sends.back().message)).done.size(), 1u);
  EXPECT_TRUE(core->PushesCompleteThrough(5));
  EXPECT_FALSE(core->PushesCompleteThrough(6));
  EXPECT_EQ(core->pushes_in_flight(), 2u);
  auto third = core->Push(NewHandle(), kTable, one, one_values, width, 0, nullptr, 0);
  ASSERT_TRUE(third.ok());
  for (const Outgoing& o : third->sends) EXPECT_EQ(o.message.header.push().acked_below(), 6u);

  // A part is at least one row, however small part_bytes is.
  auto tiny = MakeCore(map, TransferOptions(/*part_bytes=*/1, 0));
  auto t = tiny->Push(NewHandle(), kTable, one, one_values, width, 0, nullptr, 0);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->sends.size(), one.size());
  EXPECT_EQ(tiny->last_push_seq(), one.size());
}

// Every request fits the servers' largest message: a share that would not
// fit goes in parts (each numbered on its own), a row that would not fit
// alone in pieces where allowed, else the push is refused naming the limit.
TEST(WorkerCoreTransferTest, EveryRequestFitsTheServersLargestMessage) {
  const proto::ShardMap map = MakeMap(1);
  WorkerCoreOptions o = Options();
  o.max_message_bytes = 640;  // 320 bytes of keys and rows a part, the rest for the header
  auto core = MakeCore(map, o);
  auto message_bytes = [](const Message& m) {
    size_t n = m.header.ByteSizeLong();
    for (const Buffer& f : m.frames) n += f.size();
    return n;
  };
  const uint32_t width = 2;  // 16 bytes a row with its key: 20 rows a part
  std::vector<Key> keys(50);
  std::iota(keys.begin(), keys.end(), 1);
  std::vector<float> values(keys.size() * width);
  std::iota(values.begin(), values.end(), 0.0f);
  auto e = core->Push(NewHandle(), kTable, keys, values, width, 0, nullptr, 0);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 3u);
  std::vector<uint64_t> rows, seqs;
  for (const Outgoing& s : e->sends) {
    EXPECT_LE(message_bytes(s.message), 640u);
    rows.push_back(s.message.header.push().num_keys());
    seqs.push_back(s.message.header.push().seq());
  }
  EXPECT_EQ(rows, (std::vector<uint64_t>{20, 20, 10}));
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 2, 3}));  // one number a part: the server applies each
  // A push that fits keeps one part and one number.
  auto small = core->Push(NewHandle(), kTable, std::span<const Key>(keys).first(20),
                          std::span<const float>(values).first(40), width, 0, nullptr, 0);
  ASSERT_TRUE(small.ok());
  ASSERT_EQ(small->sends.size(), 1u);
  EXPECT_EQ(small->sends[0].message.header.push().seq(), 4u);
  // Pulls too.
  std::vector<float> out(keys.size() * width);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, width, 0, 0);
  ASSERT_EQ(pull.sends.size(), 3u);
  for (const Outgoing& s : pull.sends) EXPECT_LE(message_bytes(s.message), 640u);

  // A row of 800 bytes fits no part: in pieces of 78 columns where allowed ...
  const uint32_t wide = 200;
  std::vector<float> row(wide, 1.0f);
  const std::vector<Key> one = {7};
  auto pieces = core->Push(NewHandle(), kTable, one, row, wide, 0, nullptr, 0, {}, 0, /*row_pieces=*/true);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->sends.size(), 3u);
  uint32_t columns = 0;
  for (const Outgoing& s : pieces->sends) {
    EXPECT_LE(message_bytes(s.message), 640u);
    EXPECT_EQ(s.message.header.push().first_column(), columns);
    columns += s.message.header.push().columns();
  }
  EXPECT_EQ(columns, wide);
  // ... and refused, with nothing sent and no number spent, where not.
  const uint64_t before = core->last_push_seq();
  auto refused = core->Push(NewHandle(), kTable, one, row, wide, 0, nullptr, 0, {}, 0, /*row_pieces=*/false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string why(refused.status().message());
  EXPECT_NE(why.find("a row of 800 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("at most 640 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("--transfer_max_message_mb"), std::string::npos) << why;
  EXPECT_EQ(core->last_push_seq(), before);
}

// Rows wider than part_bytes go in pieces of columns (with row_pieces):
// each piece a slice of the caller's row, numbered on its own, in column
// order; compressed pushes and tables without row_pieces keep whole rows.
TEST(WorkerCoreTransferTest, RowsWiderThanAPartGoInPiecesOfColumns) {
  const proto::ShardMap map = MakeMap(2);
  const uint32_t width = 5;  // 20 value bytes a row: pieces of 2, 2 and 1 columns
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, 0));
  std::vector<Key> keys = KeysOn(map, 0, 1);
  for (Key k : KeysOn(map, 1, 2)) keys.push_back(k);
  std::vector<float> values(keys.size() * width);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  auto e = core->Push(NewHandle(), kTable, keys, values, width, 0, nullptr, 0, {}, 0, /*row_pieces=*/true);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->sends.size(), 3 * keys.size());
  std::map<Key, std::vector<float>> rebuilt;
  std::map<Key, std::vector<uint32_t>> firsts;
  std::set<uint64_t> seqs;
  for (const Outgoing& o : e->sends) {
    const proto::Push& p = o.message.header.push();
    const auto k = o.message.frames[0].As<Key>();
    const auto v = o.message.frames[1].As<float>();
    ASSERT_EQ(p.num_keys(), 1u);
    ASSERT_EQ(k.size(), 1u);
    ASSERT_GT(p.columns(), 0u);
    ASSERT_EQ(v.size(), p.columns());
    EXPECT_LE(p.columns() * sizeof(float), 8u);
    EXPECT_EQ(ServerAddress(core->map()->ServerRankOfKey(kTable, k[0])), o.to);
    // A slice of the caller's row, not a copy.
    const size_t i = static_cast<size_t>(std::find(keys.begin(), keys.end(), k[0]) - keys.begin());
    EXPECT_EQ(static_cast<const void*>(v.data()), static_cast<const void*>(values.data() + i * width + p.first_column()));
    std::vector<float>& row = rebuilt[k[0]];
    row.resize(width, -1);
    for (size_t j = 0; j < v.size(); ++j) row[p.first_column() + j] = v[j];
    firsts[k[0]].push_back(p.first_column());
    seqs.insert(p.seq());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(rebuilt[keys[i]], std::vector<float>(values.begin() + i * width, values.begin() + (i + 1) * width));
    EXPECT_EQ(firsts[keys[i]], (std::vector<uint32_t>{0, 2, 4}));  // in column order
  }
  EXPECT_EQ(seqs.size(), e->sends.size());  // every piece its own number
  EXPECT_EQ(core->last_push_seq(), e->sends.size());
  // The push completes with its last piece.
  for (size_t i = 0; i + 1 < e->sends.size(); ++i) EXPECT_TRUE(core->OnReply(Ack(e->sends[i].message)).done.empty());
  EXPECT_EQ(core->OnReply(Ack(e->sends.back().message)).done.size(), 1u);

  // Without row_pieces (an ADAM table), or with rows no wider than a part: whole rows.
  auto whole = core->Push(NewHandle(), kTable, keys, values, width, 0, nullptr, 0, {}, 0, /*row_pieces=*/false);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->sends.size(), keys.size());
  auto wide_parts = MakeCore(map, TransferOptions(/*part_bytes=*/20, 0));
  auto fits = wide_parts->Push(NewHandle(), kTable, keys, values, width, 0, nullptr, 0, {}, 0, true);
  ASSERT_TRUE(fits.ok());
  for (const Outgoing& o : fits->sends) EXPECT_EQ(o.message.header.push().columns(), 0u);
  // A compressed push encodes whole rows (a codec's state is per row).
  auto spec = compress::ParseCodecSpec("fp16:raw_below=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto compressor = compress::RowCompressor::Create(*spec, width, 1);
  ASSERT_TRUE(compressor.ok());
  auto encoded = core->Push(NewHandle(), kTable, keys, values, width, 0, compressor->get(), 0, {}, 0, true);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(encoded->sends.size(), keys.size());
  for (const Outgoing& o : encoded->sends) {
    EXPECT_EQ(o.message.header.push().columns(), 0u);
    EXPECT_GE(o.message.header.push().value_parts(), 1u);
  }
}

// By default (part_bytes 0) only rows wider than row_piece_bytes go in
// pieces of that many bytes; narrower rows, and every row with
// row_piece_bytes 0, go whole; part_bytes, where set, decides instead.
TEST(WorkerCoreTransferTest, ByDefaultOnlyRowsWiderThanRowPieceBytesGoInPieces) {
  const proto::ShardMap map = MakeMap(1);
  const std::vector<Key> key = KeysOn(map, 0, 1);
  auto pieces_of = [&](WorkerCoreOptions o, uint32_t width) {
    auto core = MakeCore(map, std::move(o));
    std::vector<float> values(width, 1.0f);
    auto e = core->Push(NewHandle(), kTable, key, values, width, 0, nullptr, 0, {}, 0, /*row_pieces=*/true);
    EXPECT_TRUE(e.ok()) << e.status();
    std::vector<uint32_t> columns;
    if (e.ok()) {
      for (const Outgoing& o : e->sends) columns.push_back(o.message.header.push().columns());
    }
    return columns;
  };
  EXPECT_EQ(WorkerCoreOptions{}.row_piece_bytes, kDefaultRowPieceBytes);
  EXPECT_EQ(kDefaultRowPieceBytes, size_t{2} << 20);
  constexpr uint32_t kMiB = (1u << 20) / sizeof(float);  // columns in 1 MiB
  // 2 MiB: whole. 3 MiB: a 2 MiB piece and a 1 MiB one. 16 MiB: 8 pieces.
  EXPECT_EQ(pieces_of(Options(), 2 * kMiB), std::vector<uint32_t>{0});
  EXPECT_EQ(pieces_of(Options(), 3 * kMiB), (std::vector<uint32_t>{2 * kMiB, kMiB}));
  EXPECT_EQ(pieces_of(Options(), 16 * kMiB), std::vector<uint32_t>(8, 2 * kMiB));
  WorkerCoreOptions whole = Options();
  whole.row_piece_bytes = 0;
  EXPECT_EQ(pieces_of(whole, 16 * kMiB), std::vector<uint32_t>{0});
  WorkerCoreOptions small = Options();
  small.row_piece_bytes = 1 << 20;
  EXPECT_EQ(pieces_of(small, 3 * kMiB), std::vector<uint32_t>(3, kMiB));
  // part_bytes decides where it is set: 4 MiB parts leave a 3 MiB row whole.
  WorkerCoreOptions parts = Options();
  parts.part_bytes = 4 << 20;
  EXPECT_EQ(pieces_of(parts, 3 * kMiB), std::vector<uint32_t>{0});
  // A server reached over the same-host path (whole_rows_to) gets whole
  // rows; not where part_bytes asks for pieces, nor where a row does not
  // fit one message.
  WorkerCoreOptions local = Options();
  std::vector<std::string> asked;
  local.whole_rows_to = [&](const std::string& address) {
    asked.push_back(address);
    return address == ServerAddress(0);
  };
  EXPECT_EQ(pieces_of(local, 16 * kMiB), std::vector<uint32_t>{0});
  EXPECT_EQ(asked, std::vector<std::string>{ServerAddress(0)});
  WorkerCoreOptions local_parts = local;
  local_parts.part_bytes = 2 << 20;
  EXPECT_EQ(pieces_of(local_parts, 16 * kMiB), std::vector<uint32_t>(8, 2 * kMiB));
  WorkerCoreOptions local_small = local;
  local_small.max_message_bytes = 8 << 20;  // a 16 MiB row must be cut
  EXPECT_EQ(pieces_of(local_small, 16 * kMiB), std::vector<uint32_t>(8, 2 * kMiB));
  WorkerCoreOptions remote = Options();
  remote.whole_rows_to = [](const std::string&) { return false; };
  EXPECT_EQ(pieces_of(remote, 16 * kMiB), std::vector<uint32_t>(8, 2 * kMiB));
}

TEST(WorkerCoreTransferTest, PulledPartsLandInTheCallersRows) {
  const proto::ShardMap map = MakeMap(3);
  const uint32_t width = 3;
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/2 * width * sizeof(float), 0));
  const std::vector<Key> keys = {11, 2, 7, 5, 2, 40, 1, 9, 13, 21, 8, 2};
  std::vector<float> out(keys.size() * width, -1);
  auto e = core->Pull(NewHandle(), kTable, keys, out, width, 0, 0);
  ASSERT_GE(e.sends.size(), keys.size() / 2);
  for (const Outgoing& o : e.sends) {
    EXPECT_LE(o.message.header.pull().num_keys(), 2u);
    EXPECT_EQ(o.message.header.pull().num_keys(), o.message.frames[0].As<Key>().size());
  }
  AnswerInReverseAndCheckRows(*core, e.sends, keys, out, width);

  // Keys all on one server: contiguous slices, each placed at its offset.
  const std::vector<Key> one = KeysOn(map, 2, 5);
  std::vector<float> out1(one.size() * width, -1);
  auto p = core->Pull(NewHandle(), kTable, one, out1, width, 0, 0);
  ASSERT_EQ(p.sends.size(), 3u);
  EXPECT_EQ(static_cast<const void*>(p.sends[1].message.frames[0].data()), static_cast<const void*>(one.data() + 2));
  AnswerInReverseAndCheckRows(*core, p.sends, one, out1, width);
}

// The pull-range rule (worker/worker_core.h, "Pull ranges"): a pull request
// whose keys frame is a run of the caller's keys, keys[b, b + n), names
// out[b * width, (b + n) * width) of operation `op`; any other names none.
void ExpectPullRangeRule(const WorkerCore& core, const Outgoing& o, std::span<const Key> keys,
                         std::span<const float> out, uint32_t width, const void* op) {
  ASSERT_TRUE(o.message.header.has_pull());
  const auto request_keys = o.message.frames[0].As<Key>();
  const auto range = core.PullRange(o.message.header.request_id());
  const bool borrowed = request_keys.data() >= keys.data() && request_keys.data() < keys.data() + keys.size();
  if (!borrowed) {
    EXPECT_FALSE(range.has_value()) << "keys of its own: rows scattered";
    return;
  }
  ASSERT_TRUE(range.has_value()) << "keys borrowed from the caller";
  const size_t b = static_cast<size_t>(request_keys.data() - keys.data());
  EXPECT_EQ(range->op, op);
  EXPECT_EQ(range->first_row, b);
  EXPECT_EQ(range->rows, request_keys.size());
  EXPECT_EQ(range->values.data(), out.data() + b * width);
  EXPECT_EQ(range->values.size(), request_keys.size() * width);
}

TEST(WorkerCoreTransferTest, APullRangeIsTheRunOfOutWhoseKeysTheRequestBorrows) {
  const proto::ShardMap map = MakeMap(3, 2);
  const uint32_t width = 3;
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/2 * width * sizeof(float), 0, /*resend_after=*/kSeconds));
  // Keys all on server 2, in parts of 2 rows: keys[0, 2), [2, 4), [4, 5).
  const std::vector<Key> keys = KeysOn(map, 2, 5);
  std::vector<float> out(keys.size() * width, -1);
  auto handle = NewHandle();
  auto p = core->Pull(handle, kTable, keys, out, width, 0, 0);
  ASSERT_EQ(p.sends.size(), 3u);
  std::map<uint64_t, std::span<float>> runs;  // request id -> its run
  for (const Outgoing& o : p.sends) {
    ExpectPullRangeRule(*core, o, keys, out, width, handle.get());
    runs[o.message.header.request_id()] = core->PullRange(o.message.header.request_id())->values;
  }
  EXPECT_EQ(core->PullRange(p.sends[1].message.header.request_id())->first_row, 2u);
  // A reply fills its request's run and nothing else.
  const Message& middle = p.sends[1].message;
  const Message reply = RowsReply(middle, width);
  std::vector<float> expect(out.size(), -1);
  std::memcpy(expect.data() + 2 * width, reply.frames[0].data(), reply.frames[0].size());
  EXPECT_TRUE(core->OnReply(reply).done.empty());
  EXPECT_EQ(out, expect);
  EXPECT_FALSE(core->PullRange(middle.header.request_id()).has_value()) << "answered";
  // Silent parts go again whole to the same server: the same run, under the new id only.
  auto t = core->Tick(kSeconds);
  ASSERT_EQ(t.sends.size(), 2u);
  for (const Outgoing& o : t.sends) {
    ExpectPullRangeRule(*core, o, keys, out, width, handle.get());
    const uint64_t first = o.message.header.first_request_id();
    EXPECT_FALSE(core->PullRange(first).has_value()) << "sent again under a new id";
    EXPECT_EQ(core->PullRange(o.message.header.request_id())->values.data(), runs.at(first).data());
  }
  // Keys on two servers: rows scattered, no run.
  std::vector<Key> spread = KeysOn(map, 0, 2);
  for (Key k : KeysOn(map, 1, 2)) spread.push_back(k);
  std::vector<float> out2(spread.size() * width);
  auto h2 = NewHandle();
  const auto p2 = core->Pull(h2, kTable, spread, out2, width, 0, 0);
  ASSERT_GE(p2.sends.size(), 2u);
  for (const Outgoing& o : p2.sends) ExpectPullRangeRule(*core, o, spread, out2, width, h2.get());
  // A view: no run of any `out`.
  PulledRows view;
  for (const Outgoing& o : core->Pull(NewHandle(), kTable, keys, &view, width, 0, 0).sends) {
    EXPECT_FALSE(core->PullRange(o.message.header.request_id()).has_value());
  }
  // Its operation ended: nothing.
  core->FailAll(absl::CancelledError("closed"));
  for (const Outgoing& o : t.sends) EXPECT_FALSE(core->PullRange(o.message.header.request_id()).has_value());
}

TEST(WorkerCoreTest, APullRangeFollowsTheRuleAfterANewerMap) {
  const proto::ShardMap map = MakeMap(3, 2);
  auto core = MakeCore(map);
  const uint32_t width = 2;
  // Keys all on server 1: one request borrowing them all.
  const std::vector<Key> keys = KeysOn(map, 1, 12);
  std::vector<float> out(keys.size() * width, -1);
  auto handle = NewHandle();
  auto p = core->Pull(handle, kTable, keys, out, width, 0, 0);
  ASSERT_EQ(p.sends.size(), 1u);
  ExpectPullRangeRule(*core, p.sends[0], keys, out, width, handle.get());
  // Server 1 is lost: the part goes again by the new primaries, whole to
  // one (the same run) or split (scattered: none).
  auto e = core->OnMapUpdate(*WithoutServer(map, 1), 5);
  ASSERT_FALSE(e.sends.empty());
  EXPECT_FALSE(core->PullRange(p.sends[0].message.header.request_id()).has_value());
  for (const Outgoing& o : e.sends) ExpectPullRangeRule(*core, o, keys, out, width, handle.get());
  AnswerInReverseAndCheckRows(*core, e.sends, keys, out, width);
}

TEST(WorkerCoreTransferTest, HigherPriorityPartsGoFirstOnceTheBudgetFrees) {
  const proto::ShardMap map = MakeMap(1);
  // Rows of 4 bytes, parts of 2 rows, one part in flight.
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, /*bound=*/8));
  const std::vector<Key> low_keys = {1, 2, 3, 4, 5, 6}, high_keys = {11, 12, 13, 14, 15, 16};
  const std::vector<float> ones(6, 1.0f);
  auto low_push = NewHandle(), high_push = NewHandle();
  auto low = core->Push(low_push, kTable, low_keys, ones, 1, 0, nullptr, 0, "low", /*priority=*/5);
  ASSERT_TRUE(low.ok());
  ASSERT_EQ(low->sends.size(), 1u);  // the rest waits
  EXPECT_EQ(core->queued_parts(), 2u);
  auto high = core->Push(high_push, kTable, high_keys, ones, 1, 0, nullptr, 0, "high", /*priority=*/1);
  ASSERT_TRUE(high.ok());
  EXPECT_TRUE(high->sends.empty());  // the budget is taken
  EXPECT_EQ(core->queued_parts(), 5u);
  // Answer whatever is in flight, one part at a time, and note what goes next.
  std::vector<Key> first_keys_sent = {low->sends[0].message.frames[0].As<Key>()[0]};
  Message in_flight = low->sends[0].message;
  std::vector<const void*> completed;
  for (int step = 0; step < 6; ++step) {
    auto r = core->OnReply(Ack(in_flight), 1000);
    for (const auto& c : r.done) {
      EXPECT_TRUE(c.status.ok());
      completed.push_back(c.handle.get());
    }
    if (step < 5) {
      ASSERT_EQ(r.sends.size(), 1u) << "step " << step;
      in_flight = r.sends[0].message;
      first_keys_sent.push_back(in_flight.frames[0].As<Key>()[0]);
      EXPECT_EQ(core->bytes_in_flight(0), 8u);
    } else {
      EXPECT_TRUE(r.sends.empty());
    }
    if (step == 3) {
      EXPECT_EQ(completed.size(), 1u) << "the high push completes with its third part";
    }
  }
  // low part 1 was already in flight; then all of the high push, then the rest of the low one.
  EXPECT_EQ(first_keys_sent, (std::vector<Key>{1, 11, 13, 15, 3, 5}));
  EXPECT_EQ(completed, (std::vector<const void*>{high_push.get(), low_push.get()}));
  EXPECT_EQ(core->queued_parts(), 0u);
  EXPECT_EQ(core->bytes_in_flight(0), 0u);
  EXPECT_TRUE(core->PushesCompleteThrough(core->last_push_seq()));

  // Pulls the same; and the high one's handle completes before the low one's.
  std::vector<float> low_out(6), high_out(6);
  auto low_handle = NewHandle(), high_handle = NewHandle();
  auto lp = core->Pull(low_handle, kTable, low_keys, low_out, 1, 0, 0, "low", 5);
  auto hp = core->Pull(high_handle, kTable, high_keys, high_out, 1, 0, 0, "high", 1);
  ASSERT_EQ(lp.sends.size(), 1u);
  EXPECT_TRUE(hp.sends.empty());
  std::vector<const void*> order;
  in_flight = lp.sends[0].message;
  while (true) {
    auto r = core->OnReply(RowsReply(in_flight, 1), 2000);
    for (const auto& c : r.done) order.push_back(c.handle.get());
    if (r.sends.empty()) break;
    ASSERT_EQ(r.sends.size(), 1u);
    in_flight = r.sends[0].message;
  }
  EXPECT_EQ(order, (std::vector<const void*>{high_handle.get(), low_handle.get()}));
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(low_out[i], static_cast<float>(low_keys[i] * 10));
    EXPECT_EQ(high_out[i], static_cast<float>(high_keys[i] * 10));
  }
}

TEST(WorkerCoreTransferTest, APullDoesNotOvertakeAnEarlierPushToTheSameServer) {
  const proto::ShardMap map = MakeMap(1);
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, /*bound=*/8));
  const std::vector<Key> keys = {1, 2, 3, 4};
  const std::vector<float> ones(4, 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, ones, 1, 0, nullptr, 0, "", /*priority=*/9);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 1u);
  std::vector<float> out(4);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0, "", /*priority=*/0);
  EXPECT_TRUE(pull.sends.empty());
  auto r = core->OnReply(Ack(push->sends[0].message), 1);
  ASSERT_EQ(r.sends.size(), 1u);
  EXPECT_TRUE(r.sends[0].message.header.has_push()) << "the push's second part goes before the pull";
  r = core->OnReply(Ack(r.sends[0].message), 2);
  ASSERT_EQ(r.sends.size(), 1u);
  EXPECT_TRUE(r.sends[0].message.header.has_pull());
  // A later push of lower priority does not hold the pull back.
  auto later = core->Push(NewHandle(), kTable, keys, ones, 1, 0, nullptr, 3, "", /*priority=*/9);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->sends.empty());
  r = core->OnReply(RowsReply(r.sends[0].message, 1), 4);
  ASSERT_EQ(r.sends.size(), 1u);
  EXPECT_TRUE(r.sends[0].message.header.has_pull());
}

TEST(WorkerCoreTransferTest, NeverMoreThanTheBoundInFlightPerServer) {
  const proto::ShardMap map = MakeMap(2);
  const uint64_t bound = 20;  // two parts of 8 bytes fit, not three
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, bound));
  std::vector<std::vector<Key>> keys;
  std::vector<float> ones(8, 1.0f);
  std::vector<std::vector<float>> outs(4, std::vector<float>(8));
  std::map<uint64_t, Message> in_flight;  // request id -> request
  std::map<std::string, uint64_t> bytes;
  auto take = [&](std::vector<Outgoing>& sends) {
    for (Outgoing& o : sends) {
      const uint64_t n = o.message.header.has_push() ? o.message.header.push().num_keys()
                                                     : o.message.header.pull().num_keys();
      bytes[o.to] += n * sizeof(float);
      EXPECT_LE(bytes[o.to], bound) << o.to;
      in_flight.emplace(o.message.header.request_id(), std::move(o.message));
    }
  };
  for (uint32_t i = 0; i < 4; ++i) {
    std::vector<Key> k;
    for (Key x = 0; x < 8; ++x) k.push_back(i * 100 + x);
    keys.push_back(k);
  }
  size_t completed = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    if (i % 2 == 0) {
      auto e = core->Push(NewHandle(), kTable, keys[i], ones, 1, 0, nullptr, 0, "", static_cast<int32_t>(i % 3));
      ASSERT_TRUE(e.ok());
      take(e->sends);
    } else {
      auto e = core->Pull(NewHandle(), kTable, keys[i], outs[i], 1, 0, 0, "", static_cast<int32_t>(i % 3));
      take(e.sends);
    }
  }
  EXPECT_GT(core->queued_parts(), 0u);
  uint64_t answered = 0;
  while (!in_flight.empty()) {
    for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ(core->bytes_in_flight(r), bytes[ServerAddress(r)]);
    // Answer the parts in flight in a scrambled order.
    auto it = std::next(in_flight.begin(), static_cast<long>((answered * 7) % in_flight.size()));
    Message m = std::move(it->second);
    in_flight.erase(it);
    const uint64_t n = m.header.has_push() ? m.header.push().num_keys() : m.header.pull().num_keys();
    const std::string to = ServerAddress(core->map()->ServerRankOfKey(kTable, m.frames[0].As<Key>()[0]));
    bytes[to] -= n * sizeof(float);
    auto e = core->OnReply(m.header.has_push() ? Ack(m) : RowsReply(m, 1), static_cast<Nanos>(++answered));
    completed += e.done.size();
    take(e.sends);
  }
  EXPECT_EQ(completed, 4u);
  EXPECT_EQ(core->queued_parts(), 0u);

  // One part bigger than the bound still goes, alone.
  auto big = MakeCore(MakeMap(1), TransferOptions(/*part_bytes=*/0, /*bound=*/8));
  const std::vector<Key> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<float> ten_ones(10, 1.0f);
  auto first = big->Push(NewHandle(), kTable, ten, ten_ones, 1, 0, nullptr, 0);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->sends.size(), 1u);
  EXPECT_EQ(big->bytes_in_flight(0), 40u);
  auto second = big->Push(NewHandle(), kTable, ten, ten_ones, 1, 0, nullptr, 0);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->sends.empty());
  auto r = big->OnReply(Ack(first->sends[0].message), 1);
  EXPECT_EQ(r.done.size(), 1u);
  ASSERT_EQ(r.sends.size(), 1u);
  EXPECT_EQ(r.sends[0].message.header.push().seq(), 2u);
}

TEST(WorkerCoreTransferTest, AQueuedPartIsTimedFromWhenItIsSent) {
  const Nanos after = 2 * kSeconds;
  const proto::ShardMap map = MakeMap(1);
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, /*bound=*/8, after));
  const std::vector<Key> keys = {1, 2, 3, 4, 5, 6};
  const std::vector<float> ones(6, 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, ones, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 1u);
  // Only the part that was sent goes again; the queued ones are not timed.
  auto t = core->Tick(after);
  EXPECT_EQ(t.resent_parts, 1u);
  ASSERT_EQ(t.sends.size(), 1u);
  EXPECT_EQ(t.sends[0].message.header.push().seq(), push->sends[0].message.header.push().seq());
  EXPECT_EQ(core->queued_parts(), 2u);
  EXPECT_EQ(core->bytes_in_flight(0), 8u);  // the resend replaces the part, no more
  // Its answer at 3 s sends the second part, whose timer starts then.
  const Nanos sent = 3 * kSeconds;
  auto r = core->OnReply(Ack(t.sends[0].message), sent);
  ASSERT_EQ(r.sends.size(), 1u);
  const Message second = r.sends[0].message;
  // (That answer was a round trip of 1 s: the server's timer follows it.)
  const Nanos wait = core->tracker().Timers().at(0).rto;
  EXPECT_EQ(core->NextResendDue(), sent + wait);
  EXPECT_TRUE(core->Tick(sent + wait - 1).sends.empty());
  auto t2 = core->Tick(sent + wait);
  ASSERT_EQ(t2.sends.size(), 1u);
  EXPECT_EQ(t2.sends[0].message.header.push().seq(), second.header.push().seq());
  EXPECT_EQ(core->queued_parts(), 1u);
  // The operation's deadline counts from the push, queued parts or not.
  auto late = core->Tick(kTimeout);
  ASSERT_EQ(late.done.size(), 1u);
  EXPECT_EQ(late.done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(core->queued_parts(), 0u);
  EXPECT_EQ(core->bytes_in_flight(0), 0u);
  EXPECT_TRUE(core->PushesCompleteThrough(core->last_push_seq()));
}

TEST(WorkerCoreTransferTest, QueuedPartsFollowAFailover) {
  const proto::ShardMap map = MakeMap(3, 2);
  auto core = MakeCore(map, TransferOptions(/*part_bytes=*/8, /*bound=*/8));
  const std::vector<Key> keys = KeysOn(map, 1, 6);
  const std::vector<float> ones(keys.size(), 1.0f);
  auto push = core->Push(NewHandle(), kTable, keys, ones, 1, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  ASSERT_EQ(push->sends.size(), 1u);
  std::vector<float> out(keys.size(), -1);
  auto pull = core->Pull(NewHandle(), kTable, keys, out, 1, 0, 0);
  EXPECT_TRUE(pull.sends.empty());
  EXPECT_EQ(core->queued_parts(), 5u);  // 2 push parts, 3 pull parts
  std::set<uint64_t> seqs = {push->sends[0].message.header.push().seq()};

  const proto::ShardMap next = *WithoutServer(map, 1);
  auto e = core->OnMapUpdate(next, 5);
  const ShardMapView& view = *core->map();
  // Whatever went or waited for server 1 goes by the new map, queued there
  // with its place; answer everything until nothing is left.
  std::deque<Outgoing> pending(e.sends.begin(), e.sends.end());
  std::vector<RequestTracker::Completion> done = e.done;
  while (!pending.empty()) {
    Outgoing o = std::move(pending.front());
    pending.pop_front();
    EXPECT_NE(o.to, ServerAddress(1));
    EXPECT_EQ(o.message.header.epoch(), 2u);
    const auto k = o.message.frames[0].As<Key>();
    Message reply;
    if (o.message.header.has_push()) {
      EXPECT_TRUE(o.message.header.push().resend());
      seqs.insert(o.message.header.push().seq());
      reply = Ack(o.message);
    } else {
      for (Key key : k) EXPECT_EQ(ServerAddress(view.ServerRankOfKey(kTable, key)), o.to);
      reply = RowsReply(o.message, 1);
    }
    auto r = core->OnReply(std::move(reply), 6);
    for (auto& c : r.done) done.push_back(std::move(c));
    for (auto& s : r.sends) pending.push_back(std::move(s));
  }
  ASSERT_EQ(done.size(), 2u);
  for (const auto& c : done) EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(seqs, (std::set<uint64_t>{1, 2, 3}));  // the parts kept their numbers
  EXPECT_TRUE(core->PushesCompleteThrough(3));
  EXPECT_EQ(core->queued_parts(), 0u);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(keys[i] * 10)) << i;
}

// The core against real servers: messages are delivered by hand, so a test
// can cut a server off.
class WorkerCoreClusterTest : public ::testing::Test {
 protected:
  void Init(uint32_t servers, uint32_t replication, const std::string& pull_compression = "",
            WorkerCoreOptions options = Options()) {
    map_ = MakeMap(servers, replication);
    for (uint32_t r = 0; r < servers; ++r) {
      servers_.push_back(std::make_unique<ServerCore>(ServerCoreOptions{.node_id = r + 1}));
      ASSERT_TRUE(servers_[r]->InstallShardMap(map_, r).ok());
      servers_[r]->SetWorkers({{kNode, 0}});
    }
    core_ = MakeCore(map_, options);
    proto::TableConfig config;
    config.set_table_id(kTable);
    config.set_width(kWidth);
    config.set_kind(proto::SPARSE);
    config.set_optimizer(proto::ACCUMULATE);
    config.set_pull_compression(pull_compression);
    ASSERT_TRUE(Run(core_->CreateTable(NewHandle(), config, 0)).ok());
  }

  // Delivers the sends and everything they cause until nothing moves;
  // returns the operations completed.
  std::vector<RequestTracker::Completion> Deliver(WorkerCore::Effects e) {
    std::vector<RequestTracker::Completion> done = std::move(e.done);
    std::deque<Outgoing> queue(std::make_move_iterator(e.sends.begin()), std::make_move_iterator(e.sends.end()));
    while (!queue.empty()) {
      Outgoing o = std::move(queue.front());
      queue.pop_front();
      if (o.to == kAddress) {
        WorkerCore::Effects r = core_->OnReply(std::move(o.message));
        for (auto& c : r.done) done.push_back(std::move(c));
        for (auto& s : r.sends) queue.push_back(std::move(s));
        continue;
      }
      const uint32_t rank = RankOf(o.to);
      for (Outgoing& out : servers_[rank]->Step(std::move(o.message))) {
        if (out.to == kAddress && mute_.contains(rank)) continue;  // lost on its way to the worker
        // The sender's address, as a transport stamps it (backups answer forwards by it).
        if (out.message.header.sender_address().empty()) out.message.header.set_sender_address(ServerAddress(rank));
        queue.push_back(std::move(out));
      }
    }
    return done;
  }
  // The same for effects that complete exactly one operation: its status.
  absl::Status Run(WorkerCore::Effects e) {
    std::vector<RequestTracker::Completion> done = Deliver(std::move(e));
    if (done.size() != 1) return absl::InternalError(absl::StrCat(done.size(), " operations completed"));
    return done[0].status;
  }

  // Server 1 of three is lost: the survivors and the worker take the next
  // map; returns the worker's effects with what the servers sent on it
  // (answers they released) appended.
  WorkerCore::Effects LoseServer1() {
    const proto::ShardMap next = *WithoutServer(map_, 1);
    std::vector<Outgoing> released;
    for (uint32_t r : {0u, 2u}) {
      auto out = servers_[r]->UpdateShardMap(next, 0);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) continue;
      for (auto& o : *out) {
        if (o.message.header.sender_address().empty()) o.message.header.set_sender_address(ServerAddress(r));
        released.push_back(std::move(o));
      }
    }
    WorkerCore::Effects e = core_->OnMapUpdate(next, 0);
    for (auto& o : released) e.sends.push_back(std::move(o));
    return e;
  }

  static constexpr uint32_t kWidth = 2;
  proto::ShardMap map_;
  std::vector<std::unique_ptr<ServerCore>> servers_;
  std::set<uint32_t> mute_;  // servers whose replies to the worker are lost
  std::unique_ptr<WorkerCore> core_;
};

TEST_F(WorkerCoreClusterTest, PushThenPullThroughServers) {
  Init(3, 1);
  const std::vector<Key> keys = {5, 17, 2, 8, 5, 31};
  std::vector<float> values;
  for (size_t i = 0; i < keys.size() * kWidth; ++i) values.push_back(static_cast<float>(i));
  ASSERT_TRUE(Run(*core_->Push(NewHandle(), kTable, keys, values, kWidth, 0, nullptr, 0)).ok());
  EXPECT_TRUE(core_->PushesCompleteThrough(1));
  std::vector<float> out(keys.size() * kWidth, -1);
  ASSERT_TRUE(Run(core_->Pull(NewHandle(), kTable, keys, out, kWidth, 0, 0)).ok());
  // Key 5 was pushed twice (rows 0 and 4).
  std::map<Key, std::vector<float>> want;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto& row = want[keys[i]];
    row.resize(kWidth);
    for (uint32_t j = 0; j < kWidth; ++j) row[j] += values[i * kWidth + j];
  }
  for (size_t i = 0; i < keys.size(); ++i)
    for (uint32_t j = 0; j < kWidth; ++j) EXPECT_EQ(out[i * kWidth + j], want[keys[i]][j]) << "key " << keys[i];
  // Clocks: the ClockAck names this worker's clock.
  ASSERT_TRUE(Run(core_->ClockAdvance(NewHandle(), 1, 0)).ok());
  EXPECT_EQ(core_->known_clock(), 1u);
  ASSERT_TRUE(Run(core_->ClockQuery(NewHandle(), 0)).ok());
  EXPECT_EQ(core_->known_clock(), 1u);
}

TEST_F(WorkerCoreClusterTest, CompressedPullRepliesAreDecoded) {
  Init(2, 1, "fp16:raw_below=1");
  const std::vector<Key> keys = {1, 2, 3, 4, 5, 6};
  std::vector<float> values;
  for (size_t i = 0; i < keys.size() * kWidth; ++i) values.push_back(static_cast<float>(i) * 0.5f);
  ASSERT_TRUE(Run(*core_->Push(NewHandle(), kTable, keys, values, kWidth, 0, nullptr, 0)).ok());
  std::vector<float> out(keys.size() * kWidth, -1);
  ASSERT_TRUE(Run(core_->Pull(NewHandle(), kTable, keys, out, kWidth, 0, 0)).ok());
  EXPECT_EQ(out, values);  // fp16 holds these exactly
}

TEST_F(WorkerCoreClusterTest, AFailoverAppliesEveryPushOnce) {
  Init(3, 2);
  std::vector<Key> keys;
  for (uint32_t s = 0; s < 3; ++s)
    for (Key k : KeysOn(map_, s, 2)) keys.push_back(k);
  const std::vector<float> ones(keys.size() * kWidth, 1.0f);
  // Server 1 applies its part of the push and forwards it to its backup,
  // but its Ack is lost (with server 1).
  mute_.insert(1);
  auto push = core_->Push(NewHandle(), kTable, keys, ones, kWidth, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  EXPECT_TRUE(Deliver(std::move(*push)).empty());
  EXPECT_FALSE(core_->PushesCompleteThrough(1));
  EXPECT_EQ(servers_[1]->stats().push_requests, 1u);
  // Server 1 is lost: servers and worker take the new map.
  WorkerCore::Effects e = LoseServer1();
  EXPECT_EQ(e.resent_parts, 1u);
  const absl::Status s = Run(std::move(e));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(core_->PushesCompleteThrough(1));
  EXPECT_GE(servers_[2]->stats().duplicate_pushes, 1u);  // the promoted backup had it already
  std::vector<float> out(keys.size() * kWidth, -1);
  ASSERT_TRUE(Run(core_->Pull(NewHandle(), kTable, keys, out, kWidth, 0, 0)).ok());
  EXPECT_EQ(out, ones);  // each key once, not twice
}

TEST_F(WorkerCoreClusterTest, PartsOfOnePushToTheSameShardAreEachApplied) {
  Init(1, 1, "", TransferOptions(/*part_bytes=*/1, /*bound=*/0));  // one row a part
  const ShardMapView view = *ShardMapView::Create(map_);
  std::vector<Key> keys;
  for (Key k = 0; keys.size() < 4; ++k)
    if (view.VShardOfKey(kTable, k) == view.VShardOfKey(kTable, 0)) keys.push_back(k);
  std::vector<float> values;
  for (size_t i = 0; i < keys.size() * kWidth; ++i) values.push_back(static_cast<float>(i + 1));
  ASSERT_TRUE(Run(*core_->Push(NewHandle(), kTable, keys, values, kWidth, 0, nullptr, 0)).ok());
  EXPECT_EQ(core_->last_push_seq(), keys.size());
  EXPECT_EQ(servers_[0]->stats().duplicate_pushes, 0u);
  std::vector<float> out(keys.size() * kWidth, -1);
  ASSERT_TRUE(Run(core_->Pull(NewHandle(), kTable, keys, out, kWidth, 0, 0)).ok());
  EXPECT_EQ(out, values);  // every part applied, none taken for a repeat of another
}

TEST_F(WorkerCoreClusterTest, AFailoverWithQueuedPartsAppliesEveryPartOnce) {
  // Parts of two rows, one part in flight per server.
  Init(3, 2, "", TransferOptions(/*part_bytes=*/2 * kWidth * sizeof(float), /*bound=*/2 * kWidth * sizeof(float)));
  std::vector<Key> keys;
  for (uint32_t s = 0; s < 3; ++s)
    for (Key k : KeysOn(map_, s, 6)) keys.push_back(k);
  const std::vector<float> ones(keys.size() * kWidth, 1.0f);
  // Server 1 applies its first part and forwards it to its backup, but its
  // Ack is lost; its other parts wait in the queue.
  mute_.insert(1);
  auto push = core_->Push(NewHandle(), kTable, keys, ones, kWidth, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  EXPECT_TRUE(Deliver(std::move(*push)).empty());
  EXPECT_EQ(servers_[1]->stats().push_requests, 1u);
  EXPECT_EQ(core_->queued_parts(), 2u);
  WorkerCore::Effects e = LoseServer1();
  const absl::Status s = Run(std::move(e));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(core_->PushesCompleteThrough(core_->last_push_seq()));
  EXPECT_EQ(core_->queued_parts(), 0u);
  EXPECT_GE(servers_[2]->stats().duplicate_pushes + servers_[0]->stats().duplicate_pushes, 1u);
  std::vector<float> out(keys.size() * kWidth, -1);
  ASSERT_TRUE(Run(core_->Pull(NewHandle(), kTable, keys, out, kWidth, 0, 0)).ok());
  EXPECT_EQ(out, ones);  // each key once, not twice, none lost
}

}  // namespace
}  // namespace tessera
