#include "worker/request_tracker.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "server/server_core.h"

namespace tessera {
namespace {

// A resend timer fixed at `initial` (no samples are fed in these tests
// unless they say so), doubling per resend, no allowance for bytes.
RetransmitOptions Fixed(Nanos initial) {
  return RetransmitOptions{.initial = initial, .floor = 1, .ceiling = Nanos{1} << 50, .bytes_per_second = 0};
}

Message Ack(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_ack();
  return m;
}

Message Values(uint64_t id, std::vector<float> v) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_pull_reply()->set_num_keys(v.size());
  m.frames.push_back(Buffer::CopyOf(v.data(), v.size() * sizeof(float)));
  return m;
}

Message Error(uint64_t id, const std::string& text) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
  m.header.mutable_error()->set_message(text);
  return m;
}

// Piece `k` of a pull reply split by the server: `bytes` of the values at
// byte `offset` of `total` (see server/server_core.h).
Message Piece(uint64_t id, const std::vector<float>& all, uint64_t offset, uint64_t bytes, bool first) {
  Message m;
  m.header.set_request_id(id);
  if (first) m.header.mutable_pull_reply()->set_num_keys(1);
  const uint64_t total = all.size() * sizeof(float);
  m.frames.push_back(Buffer::CopyOf(reinterpret_cast<const std::byte*>(all.data()) + offset, bytes));
  const uint64_t words[2] = {offset, total};
  m.frames.push_back(Buffer::CopyOf(words, sizeof(words)));
  return m;
}

TEST(RequestTrackerTest, PullInPiecesIsPlacedAsItArrives) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(10, -1);
  // Server 0 holds keys 0 and 2 (rows of width 2), sent as pieces of 6, 4 and
  // 6 bytes (pieces need not end on a row or float boundary); server 1 holds
  // key 1, whole.
  RequestTracker::Scatter s0{0, {0, 2}, 2};
  RequestTracker::Scatter s1{0, {1}, 1};
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, s0}, {11, 1, s1}}, 100, std::span<float>(out.data(), 6), 2);
  const std::vector<float> rows0 = {0, 1, 20, 21};
  EXPECT_TRUE(t.OnReply(Piece(10, rows0, 0, 6, true)).empty());
  EXPECT_EQ(out[0], 0.0f);  // placed before the reply is complete
  EXPECT_TRUE(t.OnReply(Piece(10, rows0, 6, 4, false)).empty());
  EXPECT_TRUE(t.OnReply(Values(11, {10, 11})).empty());
  auto done = t.OnReply(Piece(10, rows0, 10, 6, false));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{0, 1, 10, 11, 20, 21, -1, -1, -1, -1}));
  EXPECT_EQ(t.in_flight(), 0u);
  EXPECT_EQ(t.ignored_replies(), 0u);
}

TEST(RequestTrackerTest, ExpectedValuesAreWhatEachPullPartAskedFor) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(6);
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {0, 2}, 2}}, {11, 1, {0, {1}, 1}}}, 100, out, 2);
  t.Begin(std::make_shared<int>(1), "push", {{12, 0, {}}}, 100);
  EXPECT_EQ(t.ExpectedValues(10), 4u);
  EXPECT_EQ(t.ExpectedValues(11), 2u);
  EXPECT_EQ(t.ExpectedValues(12), 0u);  // not a pull
  EXPECT_EQ(t.ExpectedValues(99), 0u);  // unknown
  t.OnReply(Values(11, {5, 6}));
  EXPECT_EQ(t.ExpectedValues(11), 0u);  // answered
}

TEST(RequestTrackerTest, PiecesOutOfOrderOrTooLongFailWithoutWritingOutside) {
  const std::vector<float> row = {1, 2, 3, 4};
  {
    RequestTracker t({"a"});
    std::vector<float> out(9, -1);  // the op's output is out[0, 8): row 1 of width 4 is out[4, 8)
    t.Begin(std::make_shared<int>(0), "pull", {{1, 0, {1, {}, 1}}}, 100, std::span<float>(out.data(), 8), 4);
    EXPECT_TRUE(t.OnReply(Piece(1, row, 0, 8, true)).empty());
    EXPECT_EQ(out[4], 1.0f);
    EXPECT_EQ(out[5], 2.0f);
    auto done = t.OnReply(Piece(1, row, 12, 4, false));  // skips bytes 8..11
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status.code(), absl::StatusCode::kInternal);
    EXPECT_NE(done[0].status.message().find("offset"), std::string::npos) << done[0].status;
    // A piece after the failure belongs to no request any more.
    EXPECT_TRUE(t.OnReply(Piece(1, row, 8, 4, false)).empty());
    EXPECT_EQ(t.ignored_replies(), 1u);
    EXPECT_EQ(out[6], -1.0f);  // neither the bad piece nor the late one was placed
    EXPECT_EQ(out[7], -1.0f);
    EXPECT_EQ(out[8], -1.0f);
  }
  {
    RequestTracker t({"a"});
    std::vector<float> out(4, -1);
    t.Begin(std::make_shared<int>(0), "pull", {{1, 0, {0, {}, 1}}}, 100, out, 4);
    std::vector<float> longer = {1, 2, 3, 4, 5};  // claims 20 bytes for a 16-byte row
    auto done = t.OnReply(Piece(1, longer, 0, 20, true));
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].status.ok());
    EXPECT_EQ(out, (std::vector<float>{-1, -1, -1, -1}));
  }
  {
    RequestTracker t({"a"});
    std::vector<float> out(4, -1);
    t.Begin(std::make_shared<int>(0), "pull", {{1, 0, {0, {}, 1}}}, 100, out, 4);
    Message second = Piece(1, row, 0, 8, true);
    second.header.clear_pull_reply();  // the first piece must carry the PullReply
    auto done = t.OnReply(second);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].status.ok());
  }
}

// The server's way of splitting replies and the tracker's way of placing
// pieces agree: a row pulled from a ServerCore that sends pieces of 1000
// bytes lands whole in the caller's buffer.
TEST(RequestTrackerTest, PlacesPiecesAsServerCoreSplitsThem) {
  proto::NodeInfo server;
  server.set_rank(0);
  server.set_role(proto::SERVER);
  server.set_address("inproc://server-0");
  ServerCore core(ServerCoreOptions{.node_id = 1, .pull_reply_piece_bytes = 1000});
  const std::vector<proto::NodeInfo> servers = {server};
  ASSERT_TRUE(core.InstallShardMap(RoundRobinShardMap(1, 4, servers), 0).ok());
  const uint32_t width = 1001;  // 4004-byte rows: pieces do not end on row or float boundaries
  Message create;
  create.header.set_request_id(1);
  create.header.set_sender_address("inproc://worker");
  auto* cfg = create.header.mutable_create_table()->mutable_config();
  cfg->set_table_id(5);
  cfg->set_width(width);
  cfg->set_kind(proto::SPARSE);
  cfg->set_optimizer(proto::ACCUMULATE);
  ASSERT_EQ(core.Step(std::move(create)).size(), 1u);

  const std::vector<Key> keys = {9, 4};
  std::vector<float> values(2 * width);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  Message push;
  push.header.set_request_id(2);
  push.header.set_sender_address("inproc://worker");
  push.header.mutable_push()->set_table_id(5);
  push.header.mutable_push()->set_num_keys(keys.size());
  push.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
  push.frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
  ASSERT_EQ(core.Step(std::move(push)).size(), 1u);

  Message pull;
  pull.header.set_request_id(3);
  pull.header.set_sender_address("inproc://worker");
  pull.header.mutable_pull()->set_table_id(5);
  pull.header.mutable_pull()->set_num_keys(keys.size());
  pull.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
  auto replies = core.Step(std::move(pull));
  ASSERT_EQ(replies.size(), 9u);  // 8008 bytes in pieces of 1000

  RequestTracker t({"server-0"});
  std::vector<float> out(3 * width, -1);  // rows go to output rows 2 and 0
  t.Begin(std::make_shared<int>(0), "pull", {{3, 0, {0, {2, 0}, 2}}}, 100, out, width);
  std::vector<RequestTracker::Completion> done;
  for (Outgoing& o : replies) {
    EXPECT_TRUE(done.empty());
    done = t.OnReply(o.message);
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  for (uint32_t j = 0; j < width; ++j) {
    ASSERT_EQ(out[2 * width + j], values[j]);
    ASSERT_EQ(out[j], values[width + j]);
    ASSERT_EQ(out[width + j], -1.0f);
  }
}

TEST(RequestTrackerTest, PushCompletesWhenEveryPartAcked) {
  RequestTracker t({"a", "b"});
  auto h = std::make_shared<int>(1);
  t.Begin(h, "push to table 1", {{1, 0, {}}, {2, 1, {}}}, 100);
  EXPECT_TRUE(t.OnReply(Ack(2)).empty());
  auto done = t.OnReply(Ack(1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].handle, h);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(t.in_flight(), 0u);
}

TEST(RequestTrackerTest, PullScattersRowsIntoTheCallersBuffer) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(8, -1);
  RequestTracker::Scatter s0{0, {0, 3}, 2};  // keys 0 and 3 on server 0
  RequestTracker::Scatter s1{0, {1, 2}, 2};  // keys 1 and 2 on server 1
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, s0}, {11, 1, s1}}, 100, out, 2);
  EXPECT_TRUE(t.OnReply(Values(11, {10, 11, 20, 21})).empty());
  auto done = t.OnReply(Values(10, {0, 1, 30, 31}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}));
}

// Values lent by a same-host server (Buffer::remote()), read through the
// interface; `gone` makes every read fail as when the server has exited.
class LentValues final : public RemoteBytes {
 public:
  explicit LentValues(std::vector<float> v) : values_(std::move(v)) {}
  absl::Status Read(std::span<const CopyRange> ranges) const override {
    ++reads;
    last_ranges = ranges.size();
    if (gone) return absl::UnavailableError("server process gone");
    for (const CopyRange& r : ranges) {
      std::memcpy(r.dst, reinterpret_cast<const std::byte*>(values_.data()) + r.offset, r.length);
    }
    return absl::OkStatus();
  }
  mutable int reads = 0;
  mutable size_t last_ranges = 0;
  bool gone = false;

 private:
  std::vector<float> values_;
};

Message Lent(uint64_t id, std::shared_ptr<LentValues> values, size_t count) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_pull_reply()->set_num_keys(count);
  m.frames.push_back(Buffer::Remote(std::move(values), count * sizeof(float)));
  return m;
}

TEST(RequestTrackerTest, LentValuesAreScatteredInOneRead) {
  RequestTracker t({"a"});
  std::vector<float> out(6, -1);
  RequestTracker::Scatter s0{0, {2, 0, 1}, 3};
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, s0}}, 100, out, 2);
  auto lent = std::make_shared<LentValues>(std::vector<float>{20, 21, 0, 1, 10, 11});
  auto done = t.OnReply(Lent(10, lent, 6));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{0, 1, 10, 11, 20, 21}));
  EXPECT_EQ(lent->reads, 1);
  EXPECT_EQ(lent->last_ranges, 1u) << "small rows: the frame is read whole, then scattered";
}

TEST(RequestTrackerTest, LentRowsThatLandTogetherAreReadAsOneRangeAndLargeOnesDirectly) {
  RequestTracker t({"a"});
  const size_t width = 8192;  // 32 KiB rows: read straight into out, one range each
  std::vector<float> out(4 * width, -1);
  std::vector<float> values(4 * width);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  // Reply rows 0..3 go to out rows 1, 2, 0, 3: rows 1-2 are one range.
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {1, 2, 0, 3}, 4}}}, 100, out, width);
  auto lent = std::make_shared<LentValues>(values);
  auto done = t.OnReply(Lent(10, lent, values.size()));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(lent->reads, 1);
  EXPECT_EQ(lent->last_ranges, 3u);
  for (size_t r = 0; r < 4; ++r) {
    const size_t from = std::vector<size_t>{2, 0, 1, 3}[r];  // out row r holds reply row from
    ASSERT_EQ(out[r * width], values[from * width]) << r;
    ASSERT_EQ(out[r * width + width - 1], values[from * width + width - 1]) << r;
  }
}

TEST(RequestTrackerTest, LentValuesOfAServerThatIsGoneAreAsIfNeverReceived) {
  RequestTracker t({"a"}, Fixed(100));
  std::vector<float> out(2, -1);
  Message pull;
  pull.header.mutable_pull();
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {}, 1}, pull}}, 1'000'000, out, 2, /*now=*/0);
  auto lent = std::make_shared<LentValues>(std::vector<float>{5, 6});
  lent->gone = true;
  EXPECT_TRUE(t.OnReply(Lent(10, lent, 2)).empty()) << "not an error: the part is still awaited";
  EXPECT_EQ(t.lost_lent_replies(), 1u);
  EXPECT_EQ(t.in_flight(), 1u);
  // Sent again when it stays silent, and the answer to that completes it.
  auto never_dead = [](uint32_t) { return false; };
  std::vector<RequestTracker::Completion> done;
  auto again = t.TakeResends(1, never_dead, &done, 100, true);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(t.Reissue(again[0], {{11, 0, {0, {}, 1}, pull}}, 100).empty());
  done = t.OnReply(Values(11, {7, 8}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{7, 8}));
}

// A server that cannot serve a part now (busy) answers Unavailable: the part
// is still awaited and goes again on its timer; an operation that times out
// meanwhile says what the server answered.
TEST(RequestTrackerTest, AnUnavailableAnswerIsNoAnswerAndTheTimeoutNamesIt) {
  RequestTracker t({"a"}, Fixed(100));
  std::vector<float> out(2, -1);
  Message pull;
  pull.header.mutable_pull();
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {}, 1}, pull}}, 1'000, out, 2, /*now=*/0);
  Message busy = Error(10, "busy: 70000 answers to you are not sent yet (--max-requests-in-flight-per-peer)");
  busy.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(t.OnReply(busy, 5).empty()) << "not an error: the part is still awaited";
  EXPECT_EQ(t.unavailable_replies(), 1u);
  EXPECT_EQ(t.in_flight(), 1u);
  auto never_dead = [](uint32_t) { return false; };
  std::vector<RequestTracker::Completion> done;
  auto again = t.TakeResends(1, never_dead, &done, 200, true);
  ASSERT_EQ(again.size(), 1u) << "sent again once its timer ran out";
  EXPECT_TRUE(t.Reissue(again[0], {{11, 0, {0, {}, 1}, pull}}, 200).empty());
  busy.header.set_request_id(11);
  EXPECT_TRUE(t.OnReply(busy, 210).empty());
  done = t.Tick(1'000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(done[0].status.message().find("server 0 (a)"), std::string::npos) << done[0].status;
  EXPECT_NE(done[0].status.message().find("--max-requests-in-flight-per-peer"), std::string::npos) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{-1, -1}));
}

TEST(RequestTrackerTest, MalformedReplyFailsWithoutWritingOutside) {
  RequestTracker t({"a"});
  std::vector<float> out(2, -1);
  t.Begin(std::make_shared<int>(0), "pull", {{1, 0, {0, {}, 2}}}, 100, out, 1);
  auto done = t.OnReply(Values(1, {1, 2, 3, 4, 5}));  // too many values
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(done[0].status.message().find("server 0 (a)"), std::string::npos) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{-1, -1}));
}

TEST(RequestTrackerTest, ServerErrorIsReportedWithItsName) {
  RequestTracker t({"a", "b"});
  t.Begin(std::make_shared<int>(0), "push to table 9", {{1, 0, {}}, {2, 1, {}}}, 100);
  EXPECT_TRUE(t.OnReply(Error(2, "no table 9 on this server")).empty());
  auto done = t.OnReply(Ack(1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(done[0].status.message(), "push to table 9: server 1 (b): no table 9 on this server");
}

TEST(RequestTrackerTest, TimeoutNamesTheSilentServersAndLateRepliesAreIgnored) {
  RequestTracker t({"a", "b", "c"});
  t.Begin(std::make_shared<int>(0), "pull from table 2", {{1, 0, {}}, {2, 1, {}}, {3, 2, {}}}, 100);
  t.OnReply(Ack(2));
  EXPECT_TRUE(t.Tick(99).empty());
  auto done = t.Tick(100);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(done[0].status.message().find("server 0 (a), server 2 (c)"), std::string::npos) << done[0].status;
  EXPECT_TRUE(t.OnReply(Ack(1)).empty());
  EXPECT_EQ(t.ignored_replies(), 1u);
}

TEST(RequestTrackerTest, FailAllCompletesEverything) {
  RequestTracker t({"a"});
  t.Begin(std::make_shared<int>(0), "push", {{1, 0, {}}}, 100);
  t.Begin(std::make_shared<int>(0), "pull", {{2, 0, {}}}, 100);
  auto done = t.FailAll(absl::UnavailableError("lost the coordinator"));
  EXPECT_EQ(done.size(), 2u);
  for (auto& c : done) EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.in_flight(), 0u);
}

Message Aborted(uint64_t id, uint64_t epoch) {
  Message m;
  m.header.set_request_id(id);
  m.header.set_epoch(epoch);
  m.header.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kAborted));
  m.header.mutable_error()->set_message("not the primary");
  return m;
}

Message PullRequest(uint64_t epoch) {
  Message m;
  m.header.set_epoch(epoch);
  m.header.mutable_pull()->set_table_id(1);
  return m;
}

TEST(RequestTrackerTest, PartsOfALostServerAreHandedBackAndReissuedInTheSameOp) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(3, -1);
  auto handle = std::make_shared<int>(0);
  // A pull of 3 keys: rows 0 and 2 on server 0, row 1 on server 1, plus a
  // clock-like part (no request kept) to server 1.
  t.Begin(handle, "pull", {{10, 0, {0, {0, 2}, 2}, PullRequest(1)}, {11, 1, {0, {1}, 1}, PullRequest(1)}}, 100,
          std::span<float>(out), 1);
  t.Begin(std::make_shared<int>(1), "clock", {{12, 1, {}, {}}, {13, 0, {}, {}}}, 100);
  EXPECT_TRUE(t.OnReply(Values(10, {0, 2})).empty());
  EXPECT_TRUE(t.OnReply(Ack(13)).empty());
  // Server 1 is lost: its pull part comes back for a resend; the clock part
  // to it counts as answered, which completes the clock.
  std::vector<RequestTracker::Completion> done;
  auto resends = t.TakeResends(2, [](uint32_t rank) { return rank == 1; }, &done);
  ASSERT_EQ(resends.size(), 1u);
  EXPECT_EQ(resends[0].request_id, 11u);
  EXPECT_EQ(resends[0].scatter.rows, std::vector<uint32_t>{1});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
  // The pull goes again to server 0 under a new id; the old id is gone.
  EXPECT_TRUE(t.Reissue(resends[0], {{20, 0, resends[0].scatter, PullRequest(2)}}).empty());
  EXPECT_TRUE(t.OnReply(Values(11, {99})).empty());
  EXPECT_EQ(t.ignored_replies(), 1u);
  done = t.OnReply(Values(20, {1}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2}));
}

TEST(RequestTrackerTest, APullRangeIsTheRunOfOutItsReplyFills) {
  RequestTracker t({"a", "b"}, Fixed(kSeconds));
  std::vector<float> out(10, -1);
  auto handle = std::make_shared<int>(0);
  // Rows of width 2: part 10 is rows [1, 3) of out (contiguous), part 11 row 0,
  // part 12 rows 3 and 4 scattered.
  t.Begin(handle, "pull",
          {{10, 0, {1, {}, 2}, PullRequest(1)}, {11, 1, {0, {}, 1}, PullRequest(1)},
           {12, 1, {0, {4, 3}, 2}, PullRequest(1)}},
          100, std::span<float>(out), 2);
  const auto r10 = t.PullRange(10);
  ASSERT_TRUE(r10.has_value());
  EXPECT_EQ(r10->op, handle.get());
  EXPECT_EQ(r10->first_row, 1u);
  EXPECT_EQ(r10->rows, 2u);
  EXPECT_EQ(r10->values.data(), out.data() + 2);
  EXPECT_EQ(r10->values.size(), 4u);
  ASSERT_TRUE(t.PullRange(11).has_value());
  EXPECT_EQ(t.PullRange(11)->values.data(), out.data());
  EXPECT_EQ(t.PullRange(11)->values.size(), 2u);
  EXPECT_FALSE(t.PullRange(12).has_value()) << "scattered rows are no one run";
  EXPECT_FALSE(t.PullRange(99).has_value()) << "unknown";
  // The reply lands in exactly that run, and nowhere else.
  EXPECT_TRUE(t.OnReply(Values(10, {1, 2, 3, 4})).empty());
  EXPECT_EQ(out, (std::vector<float>{-1, -1, 1, 2, 3, 4, -1, -1, -1, -1}));
  EXPECT_FALSE(t.PullRange(10).has_value()) << "answered";
  // Sent again under a new id (a silence): the old id names nothing, the new one the same run.
  std::vector<RequestTracker::Completion> done;
  auto resends = t.TakeResends(1, [](uint32_t) { return false; }, &done, 10 * kSeconds, /*silence=*/true);
  ASSERT_EQ(resends.size(), 2u);
  const RequestTracker::Resend& r = resends[0].request_id == 11 ? resends[0] : resends[1];
  EXPECT_FALSE(t.PullRange(11).has_value()) << "taken out for a resend";
  EXPECT_TRUE(t.Reissue(r, {{20, 1, r.scatter, PullRequest(1)}}, 10 * kSeconds).empty());
  ASSERT_TRUE(t.PullRange(20).has_value());
  EXPECT_EQ(t.PullRange(20)->values.data(), out.data());
  EXPECT_EQ(t.PullRange(20)->op, handle.get());
  // Pushes and views name none; an ended operation names none.
  t.Begin(std::make_shared<int>(1), "push", {{30, 0, {0, {}, 1}, {}}}, 100);
  EXPECT_FALSE(t.PullRange(30).has_value());
  PulledRows view;
  t.Begin(std::make_shared<int>(2), "view", {{31, 0, {0, {}, 1}, PullRequest(1)}}, 100, &view, 2);
  EXPECT_FALSE(t.PullRange(31).has_value());
  t.FailAll(absl::CancelledError("closed"));
  EXPECT_FALSE(t.PullRange(20).has_value());
}

TEST(RequestTrackerTest, AbortedFromANewerEpochParksThePartUntilThatMap) {
  RequestTracker t({"a", "b"});
  std::vector<float> out(1, -1);
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {}, 1}, PullRequest(3)}}, 100, std::span<float>(out), 1);
  EXPECT_TRUE(t.OnReply(Aborted(10, 5)).empty()) << "a stale map is not an error";
  EXPECT_EQ(t.parked(), 1u);
  std::vector<RequestTracker::Completion> done;
  EXPECT_TRUE(t.TakeResends(4, [](uint32_t) { return false; }, &done).empty()) << "epoch 5 has not come";
  auto resends = t.TakeResends(5, [](uint32_t) { return false; }, &done);
  ASSERT_EQ(resends.size(), 1u);
  EXPECT_TRUE(t.Reissue(resends[0], {{11, 1, resends[0].scatter, PullRequest(5)}}).empty());
  done = t.OnReply(Values(11, {7}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(out[0], 7.0f);
}

TEST(RequestTrackerTest, AbortedAtThePartsOwnEpochIsAnError) {
  RequestTracker t({"a"});
  std::vector<float> out(1, -1);
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {}, 1}, PullRequest(3)}}, 100, std::span<float>(out), 1);
  auto done = t.OnReply(Aborted(10, 3));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kAborted);
  // A part that kept no request (a clock, a table) fails on Aborted too.
  t.Begin(std::make_shared<int>(1), "clock", {{11, 0, {}, {}}}, 100);
  done = t.OnReply(Aborted(11, 9));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kAborted);
}

TEST(RequestTrackerTest, AReissuedOpThatTimedOutMeanwhileIsNotRevived) {
  RequestTracker t({"a", "b"});
  t.Begin(std::make_shared<int>(0), "push", {{10, 0, {}, PullRequest(1)}}, 100);
  std::vector<RequestTracker::Completion> done;
  auto resends = t.TakeResends(2, [](uint32_t rank) { return rank == 0; }, &done);
  ASSERT_EQ(resends.size(), 1u);
  done = t.Tick(200);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(t.Reissue(resends[0], {{11, 1, {}, PullRequest(2)}}).empty());
  EXPECT_EQ(t.in_flight(), 0u);
  EXPECT_TRUE(t.OnReply(Ack(11)).empty());
}

TEST(RequestTrackerTest, SilentPartsAreSentAgainWithBackoff) {
  RequestTracker t({"a"}, Fixed(100));
  Message clock;
  clock.header.mutable_clock_advance()->set_clock(3);
  t.Begin(std::make_shared<int>(0), "clock", {{10, 0, {}, clock}}, 1'000'000, {}, 0, /*now=*/0);
  auto never_dead = [](uint32_t) { return false; };
  std::vector<RequestTracker::Completion> done;
  EXPECT_TRUE(t.TakeResends(1, never_dead, &done, 99, true).empty());
  EXPECT_TRUE(t.TakeResends(1, never_dead, &done, 5000, false).empty()) << "without silence: never";
  auto first = t.TakeResends(1, never_dead, &done, 100, true);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].resends, 1u);
  EXPECT_TRUE(first[0].request.header.has_clock_advance());
  EXPECT_TRUE(t.Reissue(first[0], {{11, 0, {}, clock}}, /*now=*/100).empty());
  EXPECT_TRUE(t.TakeResends(1, never_dead, &done, 299, true).empty()) << "the second wait is twice as long";
  auto second = t.TakeResends(1, never_dead, &done, 300, true);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].resends, 2u);
  EXPECT_TRUE(t.Reissue(second[0], {{12, 0, {}, clock}}, 300).empty());
  done = t.OnReply(Ack(12));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_TRUE(done.empty() || t.in_flight() == 0);
}

// What a waiting worker reports: per server, its oldest unanswered part and
// how many it owes, the longest wait first; answered parts and young
// operations are not reported.
TEST(RequestTrackerTest, OwedByNamesEachSilentServerAndItsOldestRequest) {
  RequestTracker t({"tcp://a:1", "tcp://b:2"}, Fixed(2 * kSeconds));
  Message clock;
  clock.header.mutable_clock_advance()->set_clock(3);
  t.Begin(std::make_shared<int>(0), "clock 3", {{10, 0, {}, clock}, {11, 1, {}, clock}}, 60 * kSeconds, {}, 0,
          /*now=*/1 * kSeconds);
  t.Begin(std::make_shared<int>(1), "push to table 0 at clock 3", {{12, 1, {}, clock}}, 62 * kSeconds, {}, 0,
          2 * kSeconds);
  t.Begin(std::make_shared<int>(2), "pull from table 0 at clock 3", {{13, 1, {}, clock}}, 70 * kSeconds, {}, 0,
          9 * kSeconds);
  EXPECT_TRUE(t.OnReply(Ack(10)).empty());  // server 0 answered its part
  auto owed = t.OwedBy(10 * kSeconds, 5 * kSeconds);
  ASSERT_EQ(owed.size(), 1u) << "server 0 owes nothing; the pull is too young to report";
  EXPECT_EQ(owed[0].server_rank, 1u);
  EXPECT_EQ(owed[0].server, "server 1 (tcp://b:2)");
  EXPECT_EQ(owed[0].what, "clock 3");
  EXPECT_EQ(owed[0].request_id, 11u);
  EXPECT_EQ(owed[0].waited, 9 * kSeconds);
  EXPECT_EQ(owed[0].left, 50 * kSeconds);
  EXPECT_EQ(owed[0].parts, 2u) << "the clock and the push; not the young pull";
  // A resend keeps the operation's start: the wait goes on counting.
  auto never_dead = [](uint32_t) { return false; };
  std::vector<RequestTracker::Completion> done;
  auto resends = t.TakeResends(1, never_dead, &done, 10 * kSeconds, true);
  ASSERT_FALSE(resends.empty());
  for (const auto& r : resends) {
    EXPECT_TRUE(t.Reissue(r, {{100 + r.request_id, r.server_rank, {}, clock}}, 10 * kSeconds).empty());
  }
  owed = t.OwedBy(20 * kSeconds, 5 * kSeconds);
  ASSERT_EQ(owed.size(), 1u);
  EXPECT_EQ(owed[0].request_id, 111u);
  EXPECT_EQ(owed[0].waited, 19 * kSeconds);
  EXPECT_EQ(owed[0].resends, 1u);
  EXPECT_EQ(owed[0].parts, 3u);
  EXPECT_TRUE(t.OwedBy(20 * kSeconds, 30 * kSeconds).empty());
}

TEST(RequestTrackerTest, QueuedPartsAreTimedFromWhenTheyAreSent) {
  RequestTracker t({"a", "b"}, Fixed(100));
  RequestTracker::PartSpec sent{10, 0, {}, PullRequest(1), {2, 10, 8}};
  RequestTracker::PartSpec queued{11, 0, {}, PullRequest(1), {2, 11, 8}, /*queued=*/true};
  std::vector<RequestTracker::PartSpec> parts;
  parts.push_back(sent);
  parts.push_back(queued);
  t.Begin(std::make_shared<int>(0), "push", std::move(parts), /*deadline=*/10'000, {}, 0, /*now=*/0);
  EXPECT_EQ(t.queued(), 1u);
  EXPECT_TRUE(t.Queued(11));
  EXPECT_FALSE(t.Awaiting(11));
  EXPECT_TRUE(t.Awaiting(10));
  EXPECT_FALSE(t.Queued(10));
  auto never_dead = [](uint32_t) { return false; };
  std::vector<RequestTracker::Completion> done;
  // Silent for resend_after: only the part that was sent goes again.
  auto resends = t.TakeResends(1, never_dead, &done, 100, true);
  ASSERT_EQ(resends.size(), 1u);
  EXPECT_EQ(resends[0].request_id, 10u);
  EXPECT_EQ(resends[0].transfer.priority, 2);
  EXPECT_EQ(resends[0].transfer.order, 10u);
  EXPECT_EQ(resends[0].transfer.bytes, 8u);
  EXPECT_TRUE(t.Reissue(resends[0], {{12, 0, {}, PullRequest(1), resends[0].transfer}}, 100).empty());
  // Sent at 500: silent from then on.
  t.MarkSent(11, 500);
  EXPECT_FALSE(t.Queued(11));
  EXPECT_TRUE(t.Awaiting(11));
  EXPECT_EQ(t.queued(), 0u);
  for (const auto& r : t.TakeResends(1, never_dead, &done, 599, true)) EXPECT_NE(r.request_id, 11u);
  resends = t.TakeResends(1, never_dead, &done, 600, true);
  ASSERT_FALSE(resends.empty());
  EXPECT_EQ(resends.back().request_id, 11u);
}

TEST(RequestTrackerTest, TakeQueuedHandsBackTheQueuedPartsItIsAskedFor) {
  RequestTracker t({"a", "b"});
  std::vector<RequestTracker::PartSpec> parts;
  parts.push_back({10, 0, {}, PullRequest(1), {0, 10, 4}, true});
  parts.push_back({11, 1, {}, PullRequest(1), {0, 11, 4}, true});
  parts.push_back({12, 1, {}, PullRequest(1), {0, 12, 4}, false});
  t.Begin(std::make_shared<int>(0), "push", std::move(parts), 10'000);
  auto taken = t.TakeQueued([](uint32_t rank, const Message&) { return rank == 1; });
  ASSERT_EQ(taken.size(), 1u);  // 12 was sent: not queued
  EXPECT_EQ(taken[0].request_id, 11u);
  EXPECT_EQ(t.queued(), 1u);
  // Reissued queued elsewhere; the op completes once every part answered.
  EXPECT_TRUE(t.Reissue(taken[0], {{13, 0, {}, PullRequest(2), taken[0].transfer, true}}).empty());
  EXPECT_EQ(t.queued(), 2u);
  t.MarkSent(10, 1);
  t.MarkSent(13, 1);
  EXPECT_TRUE(t.OnReply(Ack(10)).empty());
  EXPECT_TRUE(t.OnReply(Ack(12)).empty());
  auto done = t.OnReply(Ack(13));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok());
}

// The floats of a view's rows, in row order.
std::vector<float> ViewFloats(const PulledRows& v) {
  std::vector<float> all(v.size() * v.width());
  v.CopyTo(all);
  return all;
}

bool PointsInto(const PulledRows& v, size_t row, const Buffer& frame) {
  const auto* p = reinterpret_cast<const std::byte*>(v.row(row).data());
  return p >= frame.data() && p < frame.data() + frame.size();
}

TEST(RequestTrackerTest, AViewLeavesWholeRepliesInTheirFramesAndHoldsThem) {
  RequestTracker t({"a", "b"});
  PulledRows view;
  // Server 0 holds keys 0 and 2 (scattered), server 1 keys 1 and 3 (as a
  // contiguous run would be: rows 1.. would not be; use first_row for a run).
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {0, 2}, 2}}, {11, 1, {3, {}, 1}}, {12, 1, {0, {1}, 1}}}, 100,
          &view, 2);
  EXPECT_EQ(view.size(), 4u);
  EXPECT_EQ(view.width(), 2u);
  Message a = Values(10, {0, 1, 20, 21});
  const Buffer frame_a = a.frames[0];
  EXPECT_TRUE(t.OnReply(a).empty());
  EXPECT_TRUE(t.OnReply(Values(11, {30, 31})).empty());
  auto done = t.OnReply(Values(12, {10, 11}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(ViewFloats(view), (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}));
  EXPECT_TRUE(PointsInto(view, 0, frame_a)) << "read in place, not copied";
  EXPECT_TRUE(PointsInto(view, 2, frame_a));
  EXPECT_EQ(view.held_bytes(), 32u);  // the three frames, nothing more
  a = Message();  // the reply is gone; the view still holds its frame
  EXPECT_EQ(view.row(2)[1], 21.0f);
  view.Clear();
  EXPECT_EQ(view.size(), 0u);
  EXPECT_EQ(view.held_bytes(), 0u);
}

TEST(RequestTrackerTest, AViewAssemblesPiecesTransientLentAndMisalignedFrames) {
  RequestTracker t({"a", "b", "c", "d"});
  PulledRows view;
  // Part 10: pieces (server 0); 11: a transient frame (a ring, server 1);
  // 12: lent by a same-host server; 13: a frame not aligned for floats.
  t.Begin(std::make_shared<int>(0), "pull",
          {{10, 0, {0, {}, 2}}, {11, 1, {2, {}, 1}}, {12, 2, {0, {4, 3}, 2}}, {13, 3, {5, {}, 1}}}, 100, &view, 2);
  const std::vector<float> rows0 = {0, 1, 10, 11};
  Message p0 = Piece(10, rows0, 0, 6, true);
  const Buffer piece = p0.frames[0];
  EXPECT_TRUE(t.OnReply(p0).empty());
  EXPECT_TRUE(t.OnReply(Piece(10, rows0, 6, 10, false)).empty());
  Message ring = Values(11, {20, 21});
  ring.frames[0] = Buffer(ring.frames[0]).MarkTransient();
  const Buffer ring_frame = ring.frames[0];
  EXPECT_TRUE(t.OnReply(ring).empty());
  auto lent = std::make_shared<LentValues>(std::vector<float>{40, 41, 30, 31});
  EXPECT_TRUE(t.OnReply(Lent(12, lent, 4)).empty());
  Message odd;
  odd.header.set_request_id(13);
  odd.header.mutable_pull_reply()->set_num_keys(1);
  Buffer block = Buffer::Allocate(9);
  const float row5[2] = {50, 51};
  std::memcpy(block.mutable_data() + 1, row5, sizeof(row5));
  odd.frames.push_back(block.Slice(1, 8));
  auto done = t.OnReply(odd);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(ViewFloats(view), (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51}));
  EXPECT_FALSE(PointsInto(view, 0, piece));
  EXPECT_FALSE(PointsInto(view, 2, ring_frame)) << "a transient frame is copied, not held";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view.row(5).data()) % alignof(float), 0u);
  EXPECT_EQ(lent->reads, 1);
}

TEST(RequestTrackerTest, AViewPartParkedAndResentStartsItsPiecesAgain) {
  RequestTracker t({"a", "b"});
  PulledRows view;
  t.Begin(std::make_shared<int>(0), "pull", {{10, 0, {0, {}, 1}, PullRequest(3)}}, 100, &view, 2);
  const std::vector<float> stale = {-5, -6};
  EXPECT_TRUE(t.OnReply(Piece(10, stale, 0, 4, true)).empty());
  EXPECT_TRUE(t.OnReply(Aborted(10, 5)).empty());
  std::vector<RequestTracker::Completion> done;
  auto resends = t.TakeResends(5, [](uint32_t) { return false; }, &done);
  ASSERT_EQ(resends.size(), 1u);
  EXPECT_TRUE(t.Reissue(resends[0], {{11, 1, resends[0].scatter, PullRequest(5)}}).empty());
  done = t.OnReply(Values(11, {7, 8}));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(ViewFloats(view), (std::vector<float>{7, 8}));
  EXPECT_EQ(view.held_bytes(), 8u) << "nothing of the abandoned pieces is kept";
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// --- Resend timers from round trips (issue: requests that recover at network speed) ---

RetransmitOptions Learned() {
  return RetransmitOptions{.initial = 200 * kMillis, .floor = 1 * kMillis, .ceiling = 1 * kSeconds,
                           .bytes_per_second = 0};
}

Message Clock(uint64_t c) {
  Message m;
  m.header.mutable_clock_advance()->set_clock(c);
  return m;
}

Message ClockAck(uint64_t id, uint64_t held_us) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_clock_ack()->set_held_us(held_us);
  return m;
}

const auto kNeverDead = [](uint32_t) { return false; };

TEST(RequestTrackerTimerTest, TheTimerFollowsTheRoundTripsItSees) {
  RequestTracker t({"a"}, Learned());
  EXPECT_EQ(t.ShortestTimer(), 200 * kMillis) << "the initial timer before any answer";
  std::vector<RequestTracker::Completion> done;
  uint64_t id = 10;
  Nanos now = 0;
  // Answers that take 4 ms each: the timer comes down from 200 ms to a few round trips.
  for (int i = 0; i < 40; ++i) {
    t.Begin(std::make_shared<int>(i), "clock", {{id, 0, {}, Clock(1)}}, now + kSeconds, {}, 0, now);
    now += 4 * kMillis;
    ASSERT_EQ(t.OnReply(ClockAck(id++, 0), now).size(), 1u);
  }
  auto timers = t.Timers();
  ASSERT_EQ(timers.size(), 1u);
  EXPECT_EQ(timers[0].samples, 40u);
  EXPECT_NEAR(static_cast<double>(timers[0].smoothed), 4.0 * kMillis, 0.01 * kMillis);
  EXPECT_GE(timers[0].rto, 4 * kMillis);
  EXPECT_LT(timers[0].rto, 6 * kMillis);
  // A part that goes unanswered is due after that timer, not after 200 ms.
  t.Begin(std::make_shared<int>(99), "clock", {{id, 0, {}, Clock(2)}}, now + kSeconds, {}, 0, now);
  const Nanos due = t.NextDue();
  EXPECT_EQ(due, now + timers[0].rto);
  EXPECT_TRUE(t.TakeResends(1, kNeverDead, &done, due - 1, true).empty());
  auto again = t.TakeResends(1, kNeverDead, &done, due, true);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(t.Timers()[0].resends, 1u);
  // Round trips that grow (a loaded server) raise the timer again.
  EXPECT_TRUE(t.Reissue(again[0], {{id + 1, 0, {}, Clock(2)}}, due).empty());
  EXPECT_EQ(t.OnReply(ClockAck(id + 1, 0), due + 300 * kMillis).size(), 1u);
  EXPECT_GT(t.Timers()[0].rto, 100 * kMillis);
}

TEST(RequestTrackerTimerTest, TimeTheServerHeldARequestIsNoRoundTrip) {
  RequestTracker t({"a"}, Learned());
  // Held 500 ms for a slower worker, answered 2 ms after that: a 2 ms round trip.
  t.Begin(std::make_shared<int>(0), "clock", {{10, 0, {}, Clock(1)}}, 10 * kSeconds, {}, 0, 0);
  ASSERT_EQ(t.OnReply(ClockAck(10, 500'000), 502 * kMillis).size(), 1u);
  EXPECT_EQ(t.Timers()[0].smoothed, 2 * kMillis);
  // The same for a pull reply's held_us.
  std::vector<float> out(1);
  Message pull;
  pull.header.mutable_pull();
  t.Begin(std::make_shared<int>(1), "pull", {{11, 0, {0, {}, 1}, pull}}, 10 * kSeconds, out, 1, 1 * kSeconds);
  Message reply = Values(11, {3});
  reply.header.mutable_pull_reply()->set_held_us(700'000);
  ASSERT_EQ(t.OnReply(reply, 1702 * kMillis).size(), 1u);
  EXPECT_EQ(t.Timers()[0].smoothed, 2 * kMillis);
  EXPECT_EQ(t.Timers()[0].samples, 2u);
}

TEST(RequestTrackerTimerTest, BackoffStopsAtTheCeiling) {
  RequestTracker t({"a"}, Learned());
  std::vector<RequestTracker::Completion> done;
  t.Begin(std::make_shared<int>(0), "clock", {{10, 0, {}, Clock(1)}}, 600 * kSeconds, {}, 0, 0);
  Nanos now = 0;
  uint64_t id = 10;
  std::vector<Nanos> waits;
  for (int i = 0; i < 10; ++i) {
    const Nanos due = t.NextDue();
    waits.push_back(due - now);
    auto again = t.TakeResends(1, kNeverDead, &done, due, true);
    ASSERT_EQ(again.size(), 1u);
    now = due;
    EXPECT_TRUE(t.Reissue(again[0], {{++id, 0, {}, Clock(1)}}, now).empty());
  }
  EXPECT_EQ(waits[0], 200 * kMillis);
  EXPECT_EQ(waits[1], 400 * kMillis);
  EXPECT_EQ(waits[2], 800 * kMillis);
  for (size_t i = 3; i < waits.size(); ++i) EXPECT_EQ(waits[i], 1 * kSeconds) << i;
}

TEST(RequestTrackerTimerTest, BytesOnTheWireToTheServerLengthenTheTimer) {
  RetransmitOptions o = Learned();
  o.bytes_per_second = 1e9;  // 1 ms per MB
  RequestTracker t({"a", "b"}, o);
  Message big;
  big.header.mutable_push();
  big.frames.push_back(Buffer::Allocate(8));
  big.frames.push_back(Buffer::Allocate(50'000'000));  // 50 ms at 1 GB/s
  t.Begin(std::make_shared<int>(0), "push", {{10, 0, {}, big}}, 10 * kSeconds, {}, 0, 0);
  EXPECT_EQ(t.NextDue(), 250 * kMillis + 8);
  // A small request to the same server waits behind it; to another server, not.
  t.Begin(std::make_shared<int>(1), "clock", {{11, 0, {}, Clock(1)}, {12, 1, {}, Clock(1)}}, 10 * kSeconds, {}, 0, 0);
  std::vector<RequestTracker::Completion> done;
  auto due = t.TakeResends(1, kNeverDead, &done, 200 * kMillis, true);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].request_id, 12u);
  // Once the big one is answered, its bytes no longer count for new parts.
  EXPECT_EQ(t.OnReply(Ack(10)).size(), 1u);
  t.Begin(std::make_shared<int>(2), "clock", {{13, 0, {}, Clock(2)}}, 10 * kSeconds, {}, 0, 300 * kMillis);
  EXPECT_EQ(t.TakeResends(1, kNeverDead, &done, 500 * kMillis, true).size(), 2u) << "11 (behind 50 MB) and 13";
}

TEST(RequestTrackerTimerTest, ARestoredLinkMakesItsServersPartsDueAtOnce) {
  RequestTracker t({"a", "b"}, Learned());
  std::vector<float> all = {1, 2, 3, 4};
  std::vector<float> out(4, -1);
  Message pull;
  pull.header.mutable_pull();
  t.Begin(std::make_shared<int>(0), "pull", {{10, 1, {0, {}, 1}, pull}}, 10 * kSeconds, out, 4, 0);
  t.Begin(std::make_shared<int>(1), "clock", {{11, 0, {}, Clock(1)}, {12, 1, {}, Clock(1)}}, 10 * kSeconds, {}, 0, 0);
  // Half of the pull's reply came on the old connection.
  EXPECT_TRUE(t.OnReply(Piece(10, all, 0, 8, true), 1 * kMillis).empty());
  std::vector<RequestTracker::Completion> done;
  EXPECT_TRUE(t.TakeResends(1, kNeverDead, &done, 2 * kMillis, true).empty()) << "not due yet";
  EXPECT_EQ(t.LinkRestored(1), 2u);
  EXPECT_EQ(t.NextDue(), std::numeric_limits<Nanos>::min());
  // Due without silence being asked for (the link event), only server 1's.
  auto again = t.TakeResends(1, kNeverDead, &done, 2 * kMillis, false);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].request_id, 10u);
  EXPECT_EQ(again[1].request_id, 12u);
  EXPECT_EQ(t.Timers()[1].resends, 2u);
  EXPECT_TRUE(t.Reissue(again[0], {{20, 1, {0, {}, 1}, pull}}, 2 * kMillis).empty());
  EXPECT_TRUE(t.Reissue(again[1], {{21, 1, {}, Clock(1)}}, 2 * kMillis).empty());
  // A late piece of the old id is ignored; the new reply starts at offset 0.
  EXPECT_TRUE(t.OnReply(Piece(10, all, 8, 8, false)).empty());
  EXPECT_TRUE(t.OnReply(Piece(20, all, 0, 8, true)).empty());
  done = t.OnReply(Piece(20, all, 8, 8, false));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(out, all);
}

TEST(RequestTrackerTimerTest, PushesAndOtherRequestsLearnTheirOwnTimers) {
  // A push answered after its backups (8 ms) and clocks answered at once
  // (1 ms) by the same server: each lane learns its own round trip, so a
  // lost clock is resent after about a millisecond, not after a timer
  // learned from the mixture (mean 4.5 ms, variation as wide as the gap).
  RequestTracker t({"a"}, Learned());
  Nanos now = 0;
  uint64_t id = 10;
  Message push;
  push.header.mutable_push();
  for (int i = 0; i < 40; ++i) {
    t.Begin(std::make_shared<int>(i), "push", {{id, 0, {}, push}}, now + kSeconds, {}, 0, now);
    ASSERT_EQ(t.OnReply(Ack(id++), now + 8 * kMillis).size(), 1u);
    now += 8 * kMillis;
    t.Begin(std::make_shared<int>(i), "clock", {{id, 0, {}, Clock(1)}}, now + kSeconds, {}, 0, now);
    ASSERT_EQ(t.OnReply(ClockAck(id++, 0), now + 1 * kMillis).size(), 1u);
    now += 1 * kMillis;
  }
  auto timers = t.Timers();
  ASSERT_EQ(timers.size(), 2u) << "one entry per lane";
  EXPECT_EQ(timers[0].lane, TimerLane::kRequests);
  EXPECT_EQ(timers[1].lane, TimerLane::kPushes);
  EXPECT_EQ(timers[0].samples, 40u);
  EXPECT_EQ(timers[1].samples, 40u);
  EXPECT_NEAR(static_cast<double>(timers[0].smoothed), 1.0 * kMillis, 0.01 * kMillis);
  EXPECT_NEAR(static_cast<double>(timers[1].smoothed), 8.0 * kMillis, 0.01 * kMillis);
  EXPECT_LT(timers[0].rto, 2 * kMillis);
  EXPECT_GE(timers[1].rto, 8 * kMillis);
  // An unanswered clock is due after the clocks' timer; a push after the pushes'.
  t.Begin(std::make_shared<int>(98), "clock", {{id, 0, {}, Clock(2)}}, now + kSeconds, {}, 0, now);
  EXPECT_EQ(t.NextDue(), now + timers[0].rto);
  std::vector<RequestTracker::Completion> done;
  ASSERT_EQ(t.TakeResends(1, kNeverDead, &done, now + timers[0].rto, true).size(), 1u);
  t.Begin(std::make_shared<int>(99), "push", {{id + 1, 0, {}, push}}, now + kSeconds, {}, 0, now);
  EXPECT_EQ(t.NextDue(), now + timers[1].rto);
  EXPECT_TRUE(t.TakeResends(1, kNeverDead, &done, now + timers[1].rto - 1, true).empty());
  // Resends are counted on their lane.
  timers = t.Timers();
  EXPECT_EQ(timers[0].resends, 1u);
  EXPECT_EQ(timers[1].resends, 0u);
}

TEST(RequestTrackerTimerTest, NothingIsResentIntoALinkThatIsDown) {
  RequestTracker t({"a"}, Learned());
  t.Begin(std::make_shared<int>(0), "clock", {{10, 0, {}, Clock(1)}}, 600 * kSeconds, {}, 0, 0);
  t.LinkDown(0, true);
  EXPECT_TRUE(t.Timers()[0].link_down);
  std::vector<RequestTracker::Completion> done;
  EXPECT_EQ(t.NextDue(), std::numeric_limits<Nanos>::max());
  EXPECT_TRUE(t.TakeResends(1, kNeverDead, &done, 60 * kSeconds, true).empty());
  EXPECT_EQ(t.LinkRestored(0), 1u);
  EXPECT_FALSE(t.Timers()[0].link_down);
  EXPECT_EQ(t.TakeResends(1, kNeverDead, &done, 60 * kSeconds, false).size(), 1u);
}

}  // namespace
}  // namespace tessera
