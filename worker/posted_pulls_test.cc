// PostedPulls driven with a real WorkerCore: what it offers to post (the
// core's pull ranges), replies placed into their posting, and the postings
// it hands back to cancel when operations end or requests go again.
#include "worker/posted_pulls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace tessera {
namespace {

constexpr uint32_t kTable = 3;
constexpr uint32_t kWidth = 16 * 1024;  // 64 KiB a row: every pull of a run is placeable

proto::ShardMap MakeMap(uint32_t servers) {
  std::vector<proto::NodeInfo> nodes;
  for (uint32_t r = 0; r < servers; ++r) {
    proto::NodeInfo n;
    n.set_node_id(r + 1);
    n.set_rank(r);
    n.set_role(proto::SERVER);
    n.set_address("inproc://server-" + std::to_string(r));
    nodes.push_back(n);
  }
  return RoundRobinShardMap(1, 12, nodes, 1);
}

std::vector<Key> KeysOn(const proto::ShardMap& map, uint32_t server, size_t n) {
  const ShardMapView view = *ShardMapView::Create(map);
  std::vector<Key> keys;
  for (Key k = 0; keys.size() < n; ++k)
    if (view.ServerRankOfKey(kTable, k) == server) keys.push_back(k);
  return keys;
}

std::unique_ptr<WorkerCore> MakeCore(const proto::ShardMap& map, Nanos resend_after = 0) {
  WorkerCoreOptions o;
  o.node_id = 50;
  o.address = "inproc://worker";
  o.resend_after = resend_after;
  o.resend_floor = 1;
  o.resend_ceiling = std::max<Nanos>(64 * resend_after, 1);
  o.resend_bytes_per_second = 0;
  auto core = WorkerCore::Create(std::move(o), map);
  EXPECT_TRUE(core.ok()) << core.status();
  return std::move(*core);
}

// A reply to `request` whose values frame is `frame`.
Message Reply(const Message& request, Buffer frame) {
  Message m;
  m.header.set_request_id(request.header.request_id());
  m.header.mutable_pull_reply()->set_num_keys(request.header.pull().num_keys());
  m.header.mutable_pull_reply()->set_width(kWidth);
  m.frames.push_back(std::move(frame));
  return m;
}

TEST(PostedPullsTest, OffersTheCoresRunForLargePullsOnly) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = KeysOn(map, 1, 2);
  std::vector<float> out(keys.size() * kWidth, -1);
  auto pull = core->Pull(std::make_shared<int>(0), kTable, keys, out, kWidth, 0, 0);
  ASSERT_EQ(pull.sends.size(), 1u);
  const auto range = PostedPulls::Placeable(pull.sends[0].message, *core);
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->values.data(), out.data());
  EXPECT_EQ(range->values.size(), out.size());
  // Under kMinPlacedBytes: not worth it.
  std::vector<float> small(keys.size() * 4);
  auto small_pull = core->Pull(std::make_shared<int>(1), kTable, keys, small, 4, 0, 0);
  EXPECT_FALSE(PostedPulls::Placeable(small_pull.sends[0].message, *core).has_value());
  // A push is no pull.
  auto push = core->Push(std::make_shared<int>(2), kTable, keys, out, kWidth, 0, nullptr, 0);
  ASSERT_TRUE(push.ok());
  EXPECT_FALSE(PostedPulls::Placeable(push->sends[0].message, *core).has_value());
}

TEST(PostedPullsTest, APlacedReplyUsesItsPostingAndCopiesNothing) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map);
  const std::vector<Key> keys = KeysOn(map, 0, 2);
  std::vector<float> out(keys.size() * kWidth, -1);
  auto handle = std::make_shared<int>(0);
  auto pull = core->Pull(handle, kTable, keys, out, kWidth, 0, 0);
  ASSERT_EQ(pull.sends.size(), 1u);
  const Message& request = pull.sends[0].message;
  PostedPulls book;
  book.Posted(*PostedPulls::Placeable(request, *core), pull.sends[0].to, request.header.request_id());
  EXPECT_EQ(book.size(), 1u);
  // Came another way (a copy elsewhere): not placed, still posted.
  std::vector<float> elsewhere(out.size(), 7);
  Message copied = Reply(request, Buffer::CopyOf(elsewhere.data(), elsewhere.size() * sizeof(float)));
  EXPECT_FALSE(book.TakePlaced(copied, *core));
  EXPECT_EQ(book.size(), 1u);
  // Written into `out` by the transport: the frame views that memory.
  for (float& v : out) v = 5;
  Message placed = Reply(request, Buffer::Borrow(out.data(), out.size() * sizeof(float)));
  ASSERT_TRUE(book.TakePlaced(placed, *core));
  EXPECT_EQ(book.size(), 0u);
  EXPECT_TRUE(placed.frames[0].remote());
  auto done = core->OnReply(std::move(placed)).done;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, std::vector<float>(out.size(), 5));
  EXPECT_TRUE(book.Withdraw(done, 0, *core).empty()) << "used up: nothing to cancel";
}

TEST(PostedPullsTest, PostingsAreWithdrawnWhenTheirOperationEndsOrTheirRequestGoesAgain) {
  const proto::ShardMap map = MakeMap(2);
  auto core = MakeCore(map, /*resend_after=*/kSeconds);
  const std::vector<Key> keys0 = KeysOn(map, 0, 2), keys1 = KeysOn(map, 1, 2);
  std::vector<float> out0(2 * kWidth), out1(2 * kWidth);
  auto h0 = std::make_shared<int>(0), h1 = std::make_shared<int>(1);
  auto p0 = core->Pull(h0, kTable, keys0, out0, kWidth, 0, 0);
  auto p1 = core->Pull(h1, kTable, keys1, out1, kWidth, 0, kSeconds / 2);
  PostedPulls book;
  for (const auto* sends : {&p0.sends, &p1.sends}) {
    const Outgoing& o = sends->at(0);
    book.Posted(*PostedPulls::Placeable(o.message, *core), o.to, o.message.header.request_id());
  }
  EXPECT_EQ(book.size(), 2u);
  // Pull 0 goes again for silence: its old posting is withdrawn, pull 1's stays.
  auto t = core->Tick(kSeconds);
  ASSERT_EQ(t.resent_parts, 1u);
  EXPECT_TRUE(book.Withdraw(t.done, 0, *core).empty()) << "nothing resent, nothing ended: nothing to look at";
  auto cancels = book.Withdraw(t.done, t.resent_parts, *core);
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].request_id, p0.sends[0].message.header.request_id());
  EXPECT_EQ(cancels[0].to, p0.sends[0].to);
  // The resend is posted; both postings of what ends go before the callers get their memory back.
  book.Posted(*PostedPulls::Placeable(t.sends[0].message, *core), t.sends[0].to, t.sends[0].message.header.request_id());
  auto all = core->FailAll(absl::CancelledError("closed"));
  cancels = book.Withdraw(all.done, all.resent_parts, *core);
  EXPECT_EQ(cancels.size(), 2u);
  EXPECT_EQ(book.size(), 0u);
}

}  // namespace
}  // namespace tessera
