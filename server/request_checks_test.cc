#include "server/request_checks.h"

#include <gtest/gtest.h>

#include "server/parts_test_tables.h"
#include "server/request_clocks.h"

namespace tessera {
namespace {

using parts_test::Config;
using parts_test::Nodes;
using parts_test::View;
using parts_test::KeysBuffer;

// A key of `table` whose shard (of 4) is `vshard`.
Key KeyIn(const ShardMapView& map, uint32_t table, uint32_t vshard, Key from = 0) {
  for (Key k = from;; ++k)
    if (map.VShardOfKey(table, k) == vshard) return k;
}

TableMap OneTable(uint32_t id, uint32_t width) {
  TableMap tables;
  tables.emplace(id, std::make_unique<Table>(Config(id, width), [](Key) { return true; }));
  return tables;
}

// A push of `keys` to table 1 (width 2) with whole rows of value 1.
Message PushOf(const std::vector<Key>& keys, uint64_t epoch = 1) {
  Message m;
  m.header.set_epoch(epoch);
  proto::Push* p = m.header.mutable_push();
  p->set_table_id(1);
  p->set_num_keys(keys.size());
  m.frames.push_back(KeysBuffer(keys));
  Buffer values = Buffer::Allocate(keys.size() * 2 * sizeof(float));
  for (float& f : values.AsMutable<float>()) f = 1;
  m.frames.push_back(values);
  return m;
}

TEST(RequestChecksTest, SetErrorMakesAnErrorReplyWithoutFrames) {
  Message reply;
  reply.frames.push_back(Buffer::Allocate(8));
  SetError(reply, absl::NotFoundError("gone"));
  EXPECT_TRUE(reply.frames.empty());
  EXPECT_EQ(reply.header.error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(reply.header.error().message(), "gone");
}

TEST(RequestChecksTest, BusyIsEitherLimitAndTheErrorNamesBoth) {
  EXPECT_FALSE(IsBusy(PeerBacklog{.messages = 9, .bytes = 99}, 10, 100));
  EXPECT_TRUE(IsBusy(PeerBacklog{.messages = 10, .bytes = 0}, 10, 100));
  EXPECT_TRUE(IsBusy(PeerBacklog{.messages = 0, .bytes = 100}, 10, 100));
  const absl::Status s = BusyError(PeerBacklog{.messages = 10, .bytes = 5}, "tcp://w", 10, 100);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("10 answers (5 bytes) to tcp://w"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at most 10 answers and 100 bytes"), std::string::npos) << s;
  proto::Envelope h;
  h.mutable_pull();
  EXPECT_TRUE(IsWorkerRequest(h));
  h.mutable_replicate();
  EXPECT_FALSE(IsWorkerRequest(h));
}

TEST(RequestChecksTest, RefusalsBeforeRoutingComeInOrderAndCountAsTheySay) {
  proto::ShardMap m = RoundRobinShardMap(3, 4, Nodes({10, 11}));
  ClockTable clocks;
  clocks.Reset({{100, 0}, {101, 1}});
  clocks.Remove(101);
  proto::Envelope h;
  h.set_sender_id(100);
  h.mutable_push();
  EXPECT_FALSE(RefuseBeforeRouting(h, View(m), 0, clocks, kSeconds).has_value());

  h.set_epoch(4);  // a newer map than this server's
  auto r = RefuseBeforeRouting(h, View(m), 0, clocks, kSeconds);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(r->behind_epoch);
  EXPECT_FALSE(r->bad_request);
  EXPECT_NE(r->status.message().find("has shard map epoch 3, older than the request's 4"), std::string::npos);

  h.set_epoch(3);
  h.set_sender_id(101);  // left the job
  r = RefuseBeforeRouting(h, View(m), 0, clocks, kSeconds);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r->bad_request);

  h.mutable_push()->set_clock(kMaxClock);  // bad clock fields come before a left worker
  r = RefuseBeforeRouting(h, View(m), 0, clocks, kSeconds);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status.code(), absl::StatusCode::kInvalidArgument);

  m.add_servers()->set_node_id(12);  // rank 2, holding nothing, removed: deposed comes before everything else
  m.add_dead_server_ranks(2);
  proto::Envelope forward;
  forward.set_epoch(9);
  forward.mutable_replicate();
  r = RefuseBeforeRouting(forward, View(m), 2, clocks, kSeconds);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(r->replicate_rejected);
  EXPECT_FALSE(r->bad_request);
}

TEST(RequestChecksTest, KeysFrameMustHoldExactlyTheKeysWithinTheLimit) {
  const Buffer keys = KeysBuffer({1, 2, 3});
  auto ok = CheckKeysFrame(keys, 3, 3);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[2], 3u);
  EXPECT_EQ(CheckKeysFrame(keys, 3, 2).status().code(), absl::StatusCode::kResourceExhausted);
  auto short_frame = CheckKeysFrame(keys, 4, 10).status();
  EXPECT_EQ(short_frame.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_frame.message(), "keys frame has 24 bytes, expected 32 for 4 keys");
  EXPECT_EQ(CheckKeysFrame(Buffer::Allocate(7), 1, 10).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestChecksTest, PrimaryOfNamesTheFirstKeyOfAnotherServerAndFillsShards) {
  const ShardMapView map = View(RoundRobinShardMap(2, 4, Nodes({10, 11})));
  const Key a = KeyIn(map, 1, 0), b = KeyIn(map, 1, 2), c = KeyIn(map, 1, 1);
  std::vector<uint32_t> shards;
  const std::vector<Key> mine = {a, b};
  EXPECT_TRUE(CheckPrimaryOf(mine, 1, map, 0, &shards).ok());
  EXPECT_EQ(shards, (std::vector<uint32_t>{0, 2}));
  const std::vector<Key> mixed = {a, c};
  const absl::Status s = CheckPrimaryOf(mixed, 1, map, 0, nullptr);
  EXPECT_EQ(s, NotPrimaryError(1, c, 1, 0, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("belongs to server 1, not to server 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at map epoch 2"), std::string::npos) << s;
}

TEST(RequestChecksTest, GrowthPastTheLimitIsRefusedAndKnownRowsDoNotCount) {
  TableMap tables = OneTable(1, 2);
  Table& table = *tables.at(1);
  const uint64_t row = Table::RowBytes(table.config());
  const std::vector<Key> two = {1, 2};
  EXPECT_TRUE(CheckGrowth(table, two, 0).ok());  // no limit
  EXPECT_TRUE(CheckGrowth(table, two, 2 * row).ok());
  EXPECT_EQ(CheckGrowth(table, two, 2 * row - 1).code(), absl::StatusCode::kResourceExhausted);
  const std::vector<float> values = {1, 1, 1, 1};
  ASSERT_TRUE(table.ApplyPush(two, values, 0).ok());
  EXPECT_TRUE(CheckGrowth(table, two, 2 * row).ok());  // no new rows
  const std::vector<Key> three = {1, 2, 3};
  const absl::Status s = CheckGrowth(table, three, 2 * row);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("would grow to 3 rows"), std::string::npos) << s;
}

TEST(RequestChecksTest, ADenseTableMustFitItsShareAndASameConfigIsNoConflict) {
  proto::TableConfig dense = Config(2, 4);
  dense.set_kind(proto::DENSE);
  dense.set_dense_rows(10);
  const uint64_t row = Table::RowBytes(dense);
  auto half = [](Key k) { return k % 2 == 0; };
  EXPECT_TRUE(CheckDenseShare(dense, half, 5 * row).ok());
  EXPECT_EQ(CheckDenseShare(dense, half, 5 * row - 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckDenseShare(dense, half, 0).ok());
  EXPECT_TRUE(CheckDenseShare(Config(3, 4), half, 1).ok());  // sparse: rows come later

  EXPECT_TRUE(CheckSameTable(dense, dense).ok());
  proto::TableConfig other = dense;
  other.set_width(5);
  EXPECT_EQ(CheckSameTable(dense, other).code(), absl::StatusCode::kAlreadyExists);
}

TEST(RequestChecksTest, ADiskTierNeedsAFactory) {
  auto none = MakeDiskTier(Config(1, 2), ColdRowsFactory());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  proto::TableConfig c = Config(1, 2);
  c.set_disk_tier(true);
  auto refused = MakeDiskTier(c, ColdRowsFactory());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--disk_dir"), std::string::npos);
  ColdRowsFactory failing = [](uint32_t, uint32_t) -> absl::StatusOr<std::unique_ptr<ColdRows>> {
    return absl::PermissionDeniedError("no directory");
  };
  EXPECT_EQ(MakeDiskTier(c, failing).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RequestChecksTest, APushIsCheckedInOrderAndItsKeysOfOtherServersOnlyInAResend) {
  const ShardMapView map = View(RoundRobinShardMap(2, 4, Nodes({10, 11})));
  const TableMap tables = OneTable(1, 2);
  const RequestLimits limits{.max_keys_per_request = 100, .max_table_bytes = 0};
  const Key a = KeyIn(map, 1, 0), b = KeyIn(map, 1, 1);
  Message m = PushOf({a});
  auto c = CheckPush(m.header.push(), m, tables, map, 0, limits, false, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->table, tables.at(1).get());
  EXPECT_EQ(c->row_bytes, 2 * sizeof(float));
  EXPECT_EQ(c->vshard, std::vector<uint32_t>{0});
  EXPECT_TRUE(c->all_mine);

  m.header.mutable_push()->set_clock(3);  // behind what its live sender announced
  EXPECT_EQ(CheckPush(m.header.push(), m, tables, map, 0, limits, true, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  m.header.mutable_push()->set_resend(true);  // a resend may be older
  EXPECT_TRUE(CheckPush(m.header.push(), m, tables, map, 0, limits, true, 4).ok());

  Message bad = PushOf({a});
  bad.header.mutable_push()->set_seq(2);
  bad.header.mutable_push()->set_acked_below(3);
  EXPECT_EQ(CheckPush(bad.header.push(), bad, tables, map, 0, limits, false, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = PushOf({a});
  bad.frames[1] = Buffer::Allocate(4);
  auto s = CheckPush(bad.header.push(), bad, tables, map, 0, limits, false, 0).status();
  EXPECT_EQ(s.message(), "values frame has 4 bytes, expected 8 for 1 keys of width 2") << s;
  bad.frames.pop_back();
  EXPECT_EQ(CheckPush(bad.header.push(), bad, tables, map, 0, limits, false, 0).status().message(),
            "push needs 2 frames (keys, values), got 1");
  bad = PushOf({a});
  bad.header.mutable_push()->set_table_id(7);
  EXPECT_EQ(CheckPush(bad.header.push(), bad, tables, map, 0, limits, false, 0).status().code(),
            absl::StatusCode::kNotFound);

  Message mixed = PushOf({a, b}, 2);
  EXPECT_EQ(CheckPush(mixed.header.push(), mixed, tables, map, 0, limits, false, 0).status(),
            NotPrimaryError(1, b, 1, 0, 2));
  mixed.header.mutable_push()->set_resend(true);
  c = CheckPush(mixed.header.push(), mixed, tables, map, 0, limits, false, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->all_mine);
  EXPECT_EQ(c->vshard, (std::vector<uint32_t>{0, 1}));
  mixed.header.set_epoch(1);  // a resend of an older map: not split here
  EXPECT_EQ(CheckPush(mixed.header.push(), mixed, tables, map, 0, limits, false, 0).status().code(),
            absl::StatusCode::kAborted);
}

TEST(RequestChecksTest, AForwardMustCarryKeysThisServerBacksUpForItsSender) {
  // 4 shards on 2 servers, replication 2: rank 0 leads 0 and 2, rank 1
  // leads 1 and 3, each backs up the other's.
  const ShardMapView map = View(RoundRobinShardMap(2, 4, Nodes({10, 11}), 2));
  const TableMap tables = OneTable(1, 2);
  const Key of_1 = KeyIn(map, 1, 1), of_0 = KeyIn(map, 1, 0);
  Message m = PushOf({of_1});
  m.header.clear_push();
  proto::Replicate* r = m.header.mutable_replicate();
  r->set_table_id(1);
  r->set_num_keys(1);
  auto c = CheckForward(m, tables, map, 0, 1, true, 100);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vshard, std::vector<uint32_t>{1});
  // A key rank 0 leads itself is not one it backs up for rank 1.
  m.frames[0] = KeysBuffer({of_0});
  auto s = CheckForward(m, tables, map, 0, 1, true, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is not backed up here for server 1"), std::string::npos) << s;
  EXPECT_TRUE(CheckForward(m, tables, map, 0, 1, false, 100).ok());  // unchecked (test switch)
  m.frames[1] = Buffer::Allocate(4);
  EXPECT_EQ(CheckForward(m, tables, map, 0, 1, false, 100).status().message(),
            "forward values frame has 4 bytes, expected 8");
  m.frames.pop_back();
  EXPECT_EQ(CheckForward(m, tables, map, 0, 1, false, 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestChecksTest, ACompressedPushIsCheckedBeforeItIsDecoded) {
  const TableMap tables = OneTable(1, 2);
  proto::Push req;
  req.set_table_id(1);
  req.set_num_keys(1);
  req.set_value_parts(1);
  const std::vector<Buffer> too_few = {KeysBuffer({5})};
  EXPECT_EQ(DecodePushValues(req, too_few, tables, 10, nullptr).status().message(),
            "compressed push needs 1 + 1 frames (keys, parts), got 1");
  const std::vector<Buffer> garbage = {KeysBuffer({5}), Buffer::Allocate(3)};
  EXPECT_FALSE(DecodePushValues(req, garbage, tables, 10, nullptr).ok());
  req.set_table_id(2);
  EXPECT_EQ(DecodePushValues(req, garbage, tables, 10, nullptr).status().code(), absl::StatusCode::kNotFound);
}

TEST(RequestChecksTest, AForwardIsTakenOnlyFromAServerOfThisEpoch) {
  const ShardMapView map = View(RoundRobinShardMap(3, 4, Nodes({10, 11}), 2));
  EXPECT_EQ(RankOfNode(map, 11), 1u);
  EXPECT_EQ(RankOfNode(map, 99), kNoRank);
  proto::Envelope h;
  h.set_sender_id(11);
  h.set_epoch(3);
  ForwardSender s = CheckForwardSender(h, map, false);
  EXPECT_EQ(s.verdict, ForwardSender::Verdict::kTake);
  EXPECT_EQ(s.from, 1u);
  EXPECT_FALSE(s.old_epoch_accepted);

  h.set_epoch(4);  // this server's map is behind
  EXPECT_EQ(CheckForwardSender(h, map, false).verdict, ForwardSender::Verdict::kIgnore);
  h.set_epoch(2);
  s = CheckForwardSender(h, map, false);
  EXPECT_EQ(s.verdict, ForwardSender::Verdict::kReject);
  EXPECT_TRUE(s.stale);
  EXPECT_EQ(s.rejection.message(), "forward of map epoch 2 is older than this server's epoch 3");
  s = CheckForwardSender(h, map, /*accept_old_epoch=*/true);
  EXPECT_EQ(s.verdict, ForwardSender::Verdict::kTake);
  EXPECT_TRUE(s.old_epoch_accepted);

  h.set_epoch(3);
  h.set_sender_id(99);
  s = CheckForwardSender(h, map, false);
  EXPECT_EQ(s.verdict, ForwardSender::Verdict::kReject);
  EXPECT_FALSE(s.stale);
  EXPECT_EQ(s.rejection.message(), "node 99 is not a server of map epoch 3");
}

class NeverRead final : public RemoteBytes {
 public:
  absl::Status Read(std::span<const CopyRange>) const override { return absl::InternalError("read"); }
};

TEST(RequestChecksTest, LentFramesAreRefused) {
  Message m;
  m.frames.push_back(Buffer::Allocate(8));
  EXPECT_TRUE(CheckNotLent(m).ok());
  m.frames.push_back(Buffer::Remote(std::make_shared<NeverRead>(), 8));
  EXPECT_EQ(CheckNotLent(m).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
