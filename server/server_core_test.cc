#include "server/server_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

namespace tessera {
namespace {

proto::NodeInfo ServerInfo(uint32_t rank) {
  proto::NodeInfo n;
  n.set_rank(rank);
  n.set_role(proto::SERVER);
  n.set_address("inproc://server-" + std::to_string(rank));
  return n;
}

class ServerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<proto::NodeInfo> servers = {ServerInfo(0), ServerInfo(1)};
    map_ = RoundRobinShardMap(1, 16, servers);
    ASSERT_TRUE(core_.InstallShardMap(map_, 0).ok());
    view_.emplace(*ShardMapView::Create(map_));
  }

  Message Request(uint64_t id) {
    Message m;
    m.header.set_request_id(id);
    m.header.set_sender_address("inproc://worker");
    return m;
  }

  proto::Envelope StepOne(Message m, std::vector<Buffer>* frames = nullptr) {
    auto out = core_.Step(std::move(m));
    EXPECT_EQ(out.size(), 1u);
    if (out.empty()) return {};
    EXPECT_EQ(out[0].to, "inproc://worker");
    if (frames) *frames = out[0].message.frames;
    return out[0].message.header;
  }

  Message CreateRequest(uint32_t id, uint32_t width, proto::TableKind kind = proto::SPARSE, uint64_t rows = 0) {
    Message m = Request(100 + id);
    auto* c = m.header.mutable_create_table()->mutable_config();
    c->set_table_id(id);
    c->set_width(width);
    c->set_kind(kind);
    c->set_dense_rows(rows);
    c->set_optimizer(proto::ACCUMULATE);
    return m;
  }

  proto::Envelope Create(uint32_t id, uint32_t width, proto::TableKind kind = proto::SPARSE, uint64_t rows = 0) {
    return StepOne(CreateRequest(id, width, kind, rows));
  }

  // A core made by the test gets the map and a sparse ACCUMULATE table.
  void StartWithTable(ServerCore& core, uint32_t id, uint32_t width) {
    ASSERT_TRUE(core.InstallShardMap(map_, 0).ok());
    auto out = core.Step(CreateRequest(id, width));
    ASSERT_EQ(out.size(), 1u);
    ASSERT_FALSE(out[0].message.header.has_error()) << out[0].message.header.error().message();
  }

  // Keys of `table` that this server (rank 0) holds.
  std::vector<Key> OwnKeys(uint32_t table, size_t n) {
    std::vector<Key> keys;
    for (Key k = 0; keys.size() < n; ++k)
      if (view_->ServerRankOfKey(table, k) == 0) keys.push_back(k);
    return keys;
  }

  Message Push(uint64_t id, uint32_t table, const std::vector<Key>& keys, const std::vector<float>& values) {
    Message m = Request(id);
    m.header.mutable_push()->set_table_id(table);
    m.header.mutable_push()->set_num_keys(keys.size());
    m.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    m.frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
    return m;
  }

  Message Pull(uint64_t id, uint32_t table, const std::vector<Key>& keys) {
    Message m = Request(id);
    m.header.mutable_pull()->set_table_id(table);
    m.header.mutable_pull()->set_num_keys(keys.size());
    m.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    return m;
  }

  std::vector<float> PullValues(uint32_t table, const std::vector<Key>& keys) {
    std::vector<Buffer> frames;
    auto h = StepOne(Pull(999, table, keys), &frames);
    EXPECT_TRUE(h.has_pull_reply()) << h.ShortDebugString();
    if (frames.size() != 1) return {};
    auto span = frames[0].As<float>();
    return {span.begin(), span.end()};
  }

  ServerCore core_{7};
  proto::ShardMap map_;
  std::optional<ShardMapView> view_;
};

TEST_F(ServerCoreTest, PushThenPullReturnsTheSum) {
  ASSERT_TRUE(Create(1, 2).has_ack());
  auto keys = OwnKeys(1, 3);
  ASSERT_TRUE(StepOne(Push(1, 1, keys, {1, 2, 3, 4, 5, 6})).has_ack());
  ASSERT_TRUE(StepOne(Push(2, 1, keys, {1, 1, 1, 1, 1, 1})).has_ack());
  EXPECT_EQ(PullValues(1, keys), (std::vector<float>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(core_.stats().push_requests, 2u);
  EXPECT_EQ(core_.stats().pull_requests, 1u);
}

// A push of a piece of each row (Push.first_column, Push.columns) updates
// only those columns; a piece outside the rows, a values frame of the wrong
// size, or a piece for an ADAM table is refused and changes nothing.
TEST_F(ServerCoreTest, APushOfAPieceOfEachRowUpdatesOnlyThoseColumns) {
  ASSERT_TRUE(Create(1, 4).has_ack());
  const auto keys = OwnKeys(1, 2);
  auto piece = [&](uint64_t id, uint32_t table, uint32_t first, uint32_t columns, const std::vector<float>& values) {
    Message m = Push(id, table, keys, values);
    m.header.mutable_push()->set_first_column(first);
    m.header.mutable_push()->set_columns(columns);
    return m;
  };
  ASSERT_TRUE(StepOne(piece(1, 1, 1, 2, {1, 2, 3, 4})).has_ack());
  ASSERT_TRUE(StepOne(piece(2, 1, 3, 1, {5, 6})).has_ack());
  EXPECT_EQ(PullValues(1, keys), (std::vector<float>{0, 1, 2, 5, 0, 3, 4, 6}));

  auto refused = [&](Message m, const std::string& says) {
    const proto::Envelope h = StepOne(std::move(m));
    ASSERT_TRUE(h.has_error()) << h.ShortDebugString();
    EXPECT_EQ(h.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(h.error().message(), testing::HasSubstr(says));
  };
  refused(piece(3, 1, 3, 2, {1, 1, 1, 1}), "columns [3, 5) are outside rows of width 4");
  refused(piece(4, 1, 0, 2, {1, 1, 1, 1, 1, 1, 1, 1}), "(2 columns)");
  refused(piece(5, 1, 2, 0, {1, 1, 1, 1, 1, 1, 1, 1}), "has no columns");
  refused(piece(6, 1, 0xFFFFFFFFu, 2, {1, 1, 1, 1}), "are outside rows");
  Message adam = CreateRequest(2, 4);
  proto::TableConfig& adam_config = *adam.header.mutable_create_table()->mutable_config();
  adam_config.set_optimizer(proto::ADAM);
  adam_config.set_learning_rate(0.1f);
  adam_config.mutable_optimizer_params()->set_beta1(0.9f);
  adam_config.mutable_optimizer_params()->set_beta2(0.999f);
  adam_config.mutable_optimizer_params()->set_epsilon(1e-8f);
  ASSERT_TRUE(StepOne(std::move(adam)).has_ack());
  refused(piece(7, 2, 0, 2, {1, 1, 1, 1}), "ADAM updates whole rows only");
  EXPECT_EQ(PullValues(1, keys), (std::vector<float>{0, 1, 2, 5, 0, 3, 4, 6})) << "a refused piece changed rows";
}

// A table with a disk tier (server/table.h, "Disk tier") is refused by a
// core without a store factory (naming tessera-server --disk_dir) and when
// its budget leaves no room beside the store's own memory; with one, the
// rows over its budget go to the store and every row comes back exact.
TEST_F(ServerCoreTest, ATableWithADiskTierNeedsAStoreAndKeepsEveryRow) {
  Message create = CreateRequest(3, 2);
  proto::TableConfig* c = create.header.mutable_create_table()->mutable_config();
  c->set_memory_budget_bytes(1);  // (RowBytes counts recency once there is a budget)
  c->set_memory_budget_bytes(10 * Table::RowBytes(*c));
  c->set_disk_tier(true);
  const proto::Envelope refused = StepOne(create);
  ASSERT_TRUE(refused.has_error());
  EXPECT_THAT(refused.error().message(), ::testing::HasSubstr("--disk_dir"));

  ServerCoreOptions o;
  o.node_id = 7;
  MemoryColdRows* store = nullptr;
  uint64_t store_memory = 0;
  o.disk_tiers = [&](uint32_t, uint32_t floats) -> absl::StatusOr<std::unique_ptr<ColdRows>> {
    // A store that says it holds `store_memory` bytes itself.
    struct Sized final : MemoryColdRows {
      Sized(uint32_t f, uint64_t m) : MemoryColdRows(f), bytes(m) {}
      uint64_t memory_bytes(uint64_t) const override { return bytes; }
      uint64_t bytes;
    };
    auto made = std::make_unique<Sized>(floats, store_memory);
    store = made.get();
    return std::unique_ptr<ColdRows>(std::move(made));
  };
  ServerCore core(o);
  ASSERT_TRUE(core.InstallShardMap(map_, 0).ok());
  store_memory = 10 * Table::RowBytes(*c);  // the whole budget: no room for a row
  auto out = core.Step(create);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].message.header.has_error());
  EXPECT_THAT(out[0].message.header.error().message(), ::testing::HasSubstr("no room"));
  store_memory = 0;
  out = core.Step(create);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].message.header.has_ack()) << out[0].message.header.ShortDebugString();
  const std::vector<Key> keys = OwnKeys(3, 100);
  std::vector<float> ones(keys.size() * 2, 1.0f);
  for (uint64_t id : {1, 2}) {
    out = core.Step(Push(id, 3, keys, ones));
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].message.header.has_ack());
  }
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(core.table(3)->num_rows(), keys.size());
  EXPECT_LE(core.table(3)->rows_in_memory(), 10u);
  EXPECT_EQ(store->size(), core.table(3)->rows_on_disk());
  EXPECT_GE(store->size(), 90u);
  out = core.Step(Pull(3, 3, keys));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].message.frames.size(), 1u);
  auto values = out[0].message.frames[0].As<float>();
  EXPECT_EQ(std::vector<float>(values.begin(), values.end()), std::vector<float>(keys.size() * 2, 2.0f));
  const auto summaries = core.table_summaries();
  ASSERT_EQ(summaries.size(), 1u);
  EXPECT_TRUE(summaries[0].disk_tier);
  EXPECT_EQ(summaries[0].rows_on_disk, core.table(3)->rows_on_disk());
  EXPECT_GT(summaries[0].counters.moved_to_disk, 0u);
}

TEST_F(ServerCoreTest, RepliesEchoTheRequestId) {
  auto h = Create(1, 1);
  EXPECT_EQ(h.request_id(), 101u);
  EXPECT_EQ(h.sender_id(), 7u);
}

TEST_F(ServerCoreTest, NoReplyWithoutRequestId) {
  Create(1, 1);
  auto m = Push(0, 1, OwnKeys(1, 1), {1});
  EXPECT_TRUE(core_.Step(std::move(m)).empty());
}

TEST_F(ServerCoreTest, CreateIsIdempotentButConflictsAreErrors) {
  ASSERT_TRUE(Create(1, 2).has_ack());
  ASSERT_TRUE(Create(1, 2).has_ack());
  auto h = Create(1, 3);
  ASSERT_TRUE(h.has_error());
  EXPECT_EQ(h.error().code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(core_.table(1)->width(), 2u);
}

TEST_F(ServerCoreTest, DenseTableHoldsOnlyItsShardsRows) {
  ASSERT_TRUE(Create(2, 1, proto::DENSE, 100).has_ack());
  size_t own = 0;
  for (Key k = 0; k < 100; ++k) own += view_->ServerRankOfKey(2, k) == 0;
  EXPECT_EQ(core_.table(2)->num_rows(), own);
  EXPECT_GT(own, 20u);
  EXPECT_LT(own, 80u);
}

TEST_F(ServerCoreTest, BadRequestsGetErrorsAndChangeNothing) {
  ASSERT_TRUE(Create(1, 2).has_ack());
  auto keys = OwnKeys(1, 2);
  ASSERT_TRUE(StepOne(Push(1, 1, keys, {1, 2, 3, 4})).has_ack());
  Key foreign = 0;
  while (view_->ServerRankOfKey(1, foreign) == 0) ++foreign;

  std::vector<Message> bad;
  bad.push_back(Push(2, 1, keys, {1, 2, 3}));            // values too short
  bad.push_back(Push(3, 9, keys, {1, 2, 3, 4}));         // unknown table
  bad.push_back(Push(4, 1, {keys[0], foreign}, {1, 1, 1, 1}));  // key held elsewhere
  {
    Message m = Push(5, 1, keys, {1, 2, 3, 4});
    m.frames.pop_back();  // missing values frame
    bad.push_back(std::move(m));
  }
  {
    Message m = Push(6, 1, keys, {1, 2, 3, 4});
    m.header.mutable_push()->set_num_keys(1ull << 61);  // overflowing count
    bad.push_back(std::move(m));
  }
  {
    Message m = Pull(7, 1, keys);
    m.frames[0] = m.frames[0].Slice(0, 5);  // truncated keys
    bad.push_back(std::move(m));
  }
  {
    Message m = Request(8);
    m.header.mutable_heartbeat();  // not a server message
    bad.push_back(std::move(m));
  }
  for (Message& m : bad) {
    uint64_t id = m.header.request_id();
    auto h = StepOne(std::move(m));
    EXPECT_TRUE(h.has_error()) << "request " << id << ": " << h.ShortDebugString();
    EXPECT_FALSE(h.error().message().empty());
    // A key held elsewhere means the sender's map is stale: Aborted, retry with a newer map.
    if (id == 4) {
      EXPECT_EQ(h.error().code(), static_cast<int>(absl::StatusCode::kAborted));
    }
  }
  EXPECT_EQ(core_.stats().bad_requests, bad.size() - 1) << "the misdirected push is not counted as bad input";
  EXPECT_EQ(PullValues(1, keys), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ServerCoreTest, WithoutShardMapEverythingIsUnavailable) {
  ServerCore fresh(1);
  Message m = Request(1);
  m.header.mutable_create_table()->mutable_config()->set_width(1);
  auto out = fresh.Step(std::move(m));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(ServerCoreTest, PullRepliesComeFromThePool) {
  BufferPool pool;
  ServerCore core(1, &pool);
  StartWithTable(core, 1, 1 << 16);  // 256 KiB rows: replies of 512 KiB, pooled
  auto keys = OwnKeys(1, 2);  // two rows: copied into one reply (a single large row would be lent)
  for (int i = 0; i < 3; ++i) {
    auto out = core.Step(Pull(10 + i, 1, keys));
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].message.header.has_pull_reply());
  }  // each reply is dropped before the next pull: the block is reused
  EXPECT_EQ(pool.misses(), 1u);
  EXPECT_EQ(pool.hits(), 2u);
}

TEST_F(ServerCoreTest, LargeRowPullRepliesDoNotChangeWhenPushesFollow) {
  const uint32_t width = 1 << 15;  // 128 KiB rows: lent, not copied
  ASSERT_TRUE(Create(1, width).has_ack());
  auto keys = OwnKeys(1, 1);
  ASSERT_TRUE(StepOne(Push(1, 1, keys, std::vector<float>(width, 1.0f))).has_ack());
  std::vector<Buffer> first;
  ASSERT_TRUE(StepOne(Pull(2, 1, keys), &first).has_pull_reply());
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(first[0].size(), width * sizeof(float));
  EXPECT_EQ(core_.table(1)->rows_lent(), 1u);
  // The reply is still "in flight" (we hold it) when the next push lands.
  ASSERT_TRUE(StepOne(Push(3, 1, keys, std::vector<float>(width, 2.0f))).has_ack());
  for (float v : first[0].As<float>()) ASSERT_EQ(v, 1.0f);
  EXPECT_EQ(PullValues(1, keys), std::vector<float>(width, 3.0f));
  EXPECT_EQ(core_.table(1)->copies_on_write(), 1u);
}

TEST_F(ServerCoreTest, LargePullRepliesGoOutInPieces) {
  ServerCore core(ServerCoreOptions{.node_id = 7, .pull_reply_piece_bytes = 1000});
  StartWithTable(core, 1, 300);  // 1200-byte rows
  auto keys = OwnKeys(1, 2);
  std::vector<float> values(600);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  ASSERT_EQ(core.Step(Push(2, 1, keys, values)).size(), 1u);

  auto out = core.Step(Pull(3, 1, keys));  // 2400 bytes: pieces of 1000, 1000, 400
  ASSERT_EQ(out.size(), 3u);
  std::vector<float> joined(600);
  uint64_t expected_offset = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const Message& m = out[k].message;
    EXPECT_EQ(out[k].to, "inproc://worker");
    EXPECT_EQ(m.header.request_id(), 3u);
    EXPECT_EQ(m.header.sender_id(), 7u);
    EXPECT_EQ(m.header.has_pull_reply(), k == 0);  // later pieces carry no body
    if (k > 0) {
      EXPECT_EQ(m.header.body_case(), proto::Envelope::BODY_NOT_SET);
    }
    ASSERT_EQ(m.frames.size(), 2u);
    ASSERT_EQ(m.frames[1].size(), kPullPieceDescriptorBytes);
    uint64_t words[2];
    std::memcpy(words, m.frames[1].data(), sizeof(words));
    EXPECT_EQ(words[0], expected_offset);
    EXPECT_EQ(words[1], 2400u);
    EXPECT_EQ(m.frames[0].size(), k < 2 ? 1000u : 400u);
    std::memcpy(reinterpret_cast<std::byte*>(joined.data()) + words[0], m.frames[0].data(), m.frames[0].size());
    expected_offset += m.frames[0].size();
  }
  EXPECT_EQ(joined, values);
  for (const Outgoing& o : out) EXPECT_TRUE(o.message.lendable) << "pieces of plain values may be lent";
  // A pull that keeps its values as they arrive (Pull.whole) gets one message.
  Message whole = Pull(5, 1, keys);
  whole.header.mutable_pull()->set_whole(true);
  auto one = core.Step(std::move(whole));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].message.frames.size(), 1u);
  EXPECT_EQ(one[0].message.frames[0].size(), 2400u);
  EXPECT_TRUE(one[0].message.unsplit);
  // ...unless it would pass the largest whole reply (the message limit).
  ServerCore bounded(ServerCoreOptions{.node_id = 7, .pull_reply_piece_bytes = 1000, .max_whole_reply_bytes = 2000});
  StartWithTable(bounded, 1, 300);
  Message too_big = Pull(6, 1, keys);
  too_big.header.mutable_pull()->set_whole(true);
  EXPECT_EQ(bounded.Step(std::move(too_big)).size(), 3u) << "2400 bytes: pieces after all";
  // Errors and other replies are never split.
  auto bad = core.Step(Pull(4, 1, {keys[0], 1u << 30}));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_TRUE(bad[0].message.header.has_error());
}

// Bytes "lent" by a peer; reading them is never expected of the server.
class NeverRead final : public RemoteBytes {
 public:
  absl::Status Read(std::span<const CopyRange>) const override {
    ADD_FAILURE() << "the server read a lent frame";
    return absl::InternalError("read");
  }
};

TEST_F(ServerCoreTest, ARequestWithLentFramesIsRefused) {
  Message push = Push(2, 1, OwnKeys(1, 1), {1.0f, 2.0f});
  push.frames[1] = Buffer::Remote(std::make_shared<NeverRead>(), push.frames[1].size());
  auto out = core_.Step(std::move(push));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].message.header.has_error());
  EXPECT_NE(out[0].message.header.error().message().find("lent"), std::string::npos);
  EXPECT_EQ(core_.stats().bad_requests, 1u);
}

TEST_F(ServerCoreTest, RepliesReadInPlaceAreNotSplitAndPlainValuesAreLendable) {
  std::vector<std::string> asked;
  ServerCore core(ServerCoreOptions{.node_id = 7,
                                    .pull_reply_piece_bytes = 1000,
                                    .reads_in_place = [&](const std::string& to, size_t bytes) {
                                      asked.push_back(to);
                                      return bytes >= 2400;
                                    }});
  StartWithTable(core, 1, 300);
  auto keys = OwnKeys(1, 2);
  std::vector<float> values(600, 2.0f);
  auto ack = core.Step(Push(2, 1, keys, values));
  ASSERT_EQ(ack.size(), 1u);
  EXPECT_FALSE(ack[0].message.lendable) << "only pull replies";
  auto out = core.Step(Pull(3, 1, keys));
  ASSERT_EQ(out.size(), 1u) << "the reader reads in place: one message";
  EXPECT_TRUE(out[0].message.lendable);
  ASSERT_EQ(out[0].message.frames.size(), 1u);
  EXPECT_EQ(out[0].message.frames[0].size(), 2400u);
  EXPECT_EQ(asked, std::vector<std::string>{"inproc://worker"});
  EXPECT_EQ(core.Step(Pull(4, 1, {keys[0]})).size(), 2u) << "1200 bytes would not be lent: pieces";
}

class ApplyAfterAckTest : public ServerCoreTest {
 protected:
  void SetUp() override {
    ServerCoreTest::SetUp();
    late_.emplace(ServerCoreOptions{.node_id = 7, .apply_after_ack = true});
    ASSERT_TRUE(late_->InstallShardMap(map_, 0).ok());
    Message c = Request(1);
    auto* cfg = c.header.mutable_create_table()->mutable_config();
    cfg->set_table_id(1);
    cfg->set_width(2);
    cfg->set_kind(proto::SPARSE);
    cfg->set_optimizer(proto::ACCUMULATE);
    ASSERT_EQ(late_->Step(std::move(c)).size(), 1u);
    keys_ = OwnKeys(1, 2);
  }

  std::vector<float> LatePull(uint64_t id) {
    auto out = late_->Step(Pull(id, 1, keys_));
    if (out.size() != 1 || out[0].message.frames.size() != 1) return {};
    auto span = out[0].message.frames[0].As<float>();
    return {span.begin(), span.end()};
  }

  std::optional<ServerCore> late_;
  std::vector<Key> keys_;
};

TEST_F(ApplyAfterAckTest, APieceAcknowledgedFirstIsAppliedAsThatPiece) {
  Message m = Push(2, 1, keys_, {5, 6});
  m.header.mutable_push()->set_first_column(1);
  m.header.mutable_push()->set_columns(1);
  auto out = late_->Step(std::move(m));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_ack());
  EXPECT_EQ(late_->pending_pushes(), 1u);
  EXPECT_EQ(LatePull(3), (std::vector<float>{0, 5, 0, 6}));
}

TEST_F(ApplyAfterAckTest, AckComesFirstAndTheNextRequestSeesThePush) {
  auto out = late_->Step(Push(2, 1, keys_, {1, 2, 3, 4}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_ack());
  EXPECT_EQ(late_->pending_pushes(), 1u);  // acknowledged, not yet applied
  // Whatever is handled next (here a pull from the same sender) sees it.
  EXPECT_EQ(LatePull(3), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(late_->pending_pushes(), 0u);
}

TEST_F(ApplyAfterAckTest, ApplyPendingAppliesInArrivalOrderOnce) {
  ASSERT_EQ(late_->Step(Push(2, 1, keys_, {1, 1, 1, 1})).size(), 1u);
  late_->ApplyPending();
  late_->ApplyPending();  // nothing left: applying twice must not add twice
  ASSERT_EQ(late_->Step(Push(3, 1, keys_, {10, 10, 10, 10})).size(), 1u);
  late_->Tick(0);  // a tick applies what is pending too
  EXPECT_EQ(late_->pending_pushes(), 0u);
  EXPECT_EQ(LatePull(4), (std::vector<float>{11, 11, 11, 11}));
}

TEST_F(ApplyAfterAckTest, PushesOfBorrowedMemoryAreAppliedBeforeTheAck) {
  std::vector<float> values = {1, 2, 3, 4};
  Message m = Push(2, 1, keys_, {});
  m.frames[1] = Buffer::Borrow(values.data(), values.size() * sizeof(float));  // the sender's own memory
  auto out = late_->Step(std::move(m));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_ack());
  EXPECT_EQ(late_->pending_pushes(), 0u);
  values.assign(4, 100);  // the sender reuses its memory once it has the ack
  EXPECT_EQ(LatePull(3), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ApplyAfterAckTest, BadPushesGetErrorsAndAreNeverPending) {
  auto out = late_->Step(Push(2, 1, keys_, {1, 2, 3}));  // values too short
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
  EXPECT_EQ(late_->pending_pushes(), 0u);
  EXPECT_EQ(LatePull(3), (std::vector<float>{0, 0, 0, 0}));
}

TEST(ServerCoreMapTest, TheMapMayGrowByServersButNeverShrink) {
  std::vector<proto::NodeInfo> servers(3);
  for (uint32_t r = 0; r < 3; ++r) {
    servers[r].set_node_id(r + 1);
    servers[r].set_rank(r);
    servers[r].set_address("inproc://s" + std::to_string(r));
  }
  const proto::ShardMap two = RoundRobinShardMap(1, 8, std::span(servers).first(2), 1);
  ServerCore core(1);
  ASSERT_TRUE(core.InstallShardMap(two, 0).ok());
  absl::StatusOr<proto::ShardMap> three = WithServerAdded(two, servers[2]);
  ASSERT_TRUE(three.ok());
  auto grown = core.UpdateShardMap(*three);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(core.epoch(), 2u);
  proto::ShardMap smaller = two;
  smaller.set_epoch(3);
  auto shrunk = core.UpdateShardMap(smaller);
  EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core.epoch(), 2u);
}

}  // namespace
}  // namespace tessera
