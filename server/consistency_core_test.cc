// ServerCore under BSP, SSP and ASP, message by message.
#include <gtest/gtest.h>

#include <map>

#include "server/server_core.h"

namespace tessera {
namespace {

constexpr uint32_t kW0 = 100, kW1 = 101;  // worker node ids

class ConsistencyCoreTest : public ::testing::Test {
 protected:
  void Init(proto::ConsistencyKind kind, uint32_t staleness, bool early = false,
            ServerCoreOptions options = {.node_id = 1}) {
    options.testing.answer_early = early;
    core_ = std::make_unique<ServerCore>(options);
    proto::NodeInfo s;
    s.set_address("inproc://s0");
    std::vector<proto::NodeInfo> servers = {s};
    ASSERT_TRUE(core_->InstallShardMap(RoundRobinShardMap(1, 4, servers), 0).ok());
    core_->SetWorkers({{kW0, 0}, {kW1, 1}});
    Message m = From(kW0, 1);
    auto* c = m.header.mutable_create_table()->mutable_config();
    c->set_table_id(1);
    c->set_width(1);
    c->set_kind(proto::SPARSE);
    c->set_optimizer(proto::ACCUMULATE);
    c->set_consistency(kind);
    c->set_staleness(staleness);
    ASSERT_EQ(core_->Step(std::move(m), 0).size(), 1u);
  }

  // A SPARSE table `id` that drops rows no push touched for `ttl` clocks.
  void CreateEvictingTable(uint32_t id, proto::ConsistencyKind kind, uint64_t ttl) {
    Message m = From(kW0, next_id_++);
    auto* c = m.header.mutable_create_table()->mutable_config();
    c->set_table_id(id);
    c->set_width(1);
    c->set_kind(proto::SPARSE);
    c->set_optimizer(proto::ACCUMULATE);
    c->set_consistency(kind);
    c->set_evict_after_clocks(ttl);
    auto out = core_->Step(std::move(m), 0);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].message.header.has_ack()) << out[0].message.header.ShortDebugString();
  }

  static bool Acked(const std::vector<Outgoing>& out) {
    return out.size() == 1 && out[0].message.header.has_ack();
  }

  static Message From(uint32_t worker, uint64_t id) {
    Message m;
    m.header.set_request_id(id);
    m.header.set_sender_id(worker);
    m.header.set_sender_address("inproc://w" + std::to_string(worker));
    return m;
  }

  std::vector<Outgoing> Push(uint32_t w, uint64_t clock, float v, Nanos now = 0) {
    return PushKeys(w, clock, {42}, v, now);
  }

  std::vector<Outgoing> PushKeys(uint32_t w, uint64_t clock, const std::vector<Key>& keys, float v, Nanos now = 0,
                                 uint32_t table = 1) {
    Message m = From(w, next_id_++);
    m.header.mutable_push()->set_table_id(table);
    m.header.mutable_push()->set_num_keys(keys.size());
    m.header.mutable_push()->set_clock(clock);
    const std::vector<float> values(keys.size(), v);
    m.frames.push_back(Buffer::CopyOf(keys.data(), keys.size() * sizeof(Key)));
    m.frames.push_back(Buffer::CopyOf(values.data(), values.size() * sizeof(float)));
    return core_->Step(std::move(m), now);
  }

  static std::string ErrorOf(const std::vector<Outgoing>& out) {
    return out.size() == 1 && out[0].message.header.has_error() ? out[0].message.header.error().message() : "";
  }

  std::vector<Outgoing> Pull(uint32_t w, uint64_t clock, uint64_t id, Nanos now = 0, uint64_t timeout_ms = 0) {
    Message m = From(w, id);
    m.header.mutable_pull()->set_table_id(1);
    m.header.mutable_pull()->set_num_keys(1);
    m.header.mutable_pull()->set_clock(clock);
    m.header.mutable_pull()->set_hold_timeout_ms(timeout_ms);
    Key k = 42;
    m.frames.push_back(Buffer::CopyOf(&k, sizeof k));
    return core_->Step(std::move(m), now);
  }

  std::vector<Outgoing> Clock(uint32_t w, uint64_t clock, uint64_t id, Nanos now = 0) {
    Message m = From(w, id);
    m.header.mutable_clock_advance()->set_clock(clock);
    return core_->Step(std::move(m), now);
  }

  static float Value(const Outgoing& o) {
    EXPECT_TRUE(o.message.header.has_pull_reply()) << o.message.header.ShortDebugString();
    return o.message.frames.empty() ? -1 : o.message.frames[0].As<float>()[0];
  }

  std::unique_ptr<ServerCore> core_;
  uint64_t next_id_ = 1000;
};

TEST_F(ConsistencyCoreTest, AClockNoticeAdvancesWithoutAReplyAndReleasesHeldPulls) {
  Init(proto::BSP, 0);
  Push(kW0, 0, 1);
  ASSERT_EQ(Clock(kW0, 1, 1).size(), 0u);  // w0 waits for w1
  ASSERT_EQ(Pull(kW0, 1, 2).size(), 0u);
  auto out = Clock(kW1, 1, 0);  // a notice from w1: request id 0
  // The notice itself gets no answer; w0's clock ack and pull are released.
  ASSERT_EQ(out.size(), 2u);
  for (const auto& o : out) EXPECT_EQ(o.to, "inproc://w100") << o.message.header.ShortDebugString();
  EXPECT_EQ(core_->stats().held_requests, 2u);
}

TEST_F(ConsistencyCoreTest, AClockQueryAnswersTheSendersClockAtOnce) {
  Init(proto::BSP, 0);
  ASSERT_EQ(Clock(kW0, 1, 1).size(), 0u);  // held: w1 is at 0
  Message q = From(kW0, 2);
  q.header.mutable_clock_query();
  auto out = core_->Step(std::move(q), 0);
  ASSERT_EQ(out.size(), 1u);  // never held
  ASSERT_TRUE(out[0].message.header.has_clock_ack()) << out[0].message.header.ShortDebugString();
  EXPECT_EQ(out[0].message.header.clock_ack().worker_clock(), 1u);
  EXPECT_EQ(out[0].message.header.clock_ack().min_clock(), 0u);
  Message stranger = From(999, 3);
  stranger.header.mutable_clock_query();
  out = core_->Step(std::move(stranger), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
}

TEST_F(ConsistencyCoreTest, BspHoldsAPullUntilEveryWorkerFinishedTheClock) {
  Init(proto::BSP, 0);
  Push(kW0, 0, 1);
  ASSERT_EQ(Clock(kW0, 1, 1).size(), 0u);  // w0 waits for w1 in Clock()
  EXPECT_EQ(Pull(kW0, 1, 2).size(), 0u);   // and a pull at clock 1 waits too
  EXPECT_EQ(core_->held(), 2u);
  Push(kW1, 0, 10);
  auto out = Clock(kW1, 1, 3);  // w1 finishes clock 0: everything is released
  ASSERT_EQ(out.size(), 3u);
  // w1's own acknowledgement, then the held ones in arrival order.
  EXPECT_EQ(out[0].message.header.request_id(), 3u);
  EXPECT_EQ(out[1].message.header.request_id(), 1u);
  EXPECT_TRUE(out[1].message.header.has_clock_ack());
  EXPECT_EQ(out[2].message.header.request_id(), 2u);
  EXPECT_EQ(Value(out[2]), 11.0f);  // both clock-0 pushes are in
  EXPECT_EQ(out[2].message.header.pull_reply().staleness(), 0u);
}

TEST_F(ConsistencyCoreTest, SspLetsAReaderRunAheadByTheBound) {
  Init(proto::SSP, 2);
  for (uint64_t c = 1; c <= 2; ++c) ASSERT_EQ(Clock(kW0, c, c).size(), 1u);  // within the bound
  auto out = Pull(kW0, 2, 10);
  ASSERT_EQ(out.size(), 1u);  // clock 2 - staleness 2 = 0: w1 at 0 suffices
  EXPECT_EQ(out[0].message.header.pull_reply().staleness(), 2u);
  EXPECT_EQ(Clock(kW0, 3, 11).size(), 0u);  // 3 - 2 = 1 > w1's 0: held
  EXPECT_EQ(Pull(kW0, 3, 12).size(), 0u);
  out = Clock(kW1, 1, 13);
  EXPECT_EQ(out.size(), 3u);
}

TEST_F(ConsistencyCoreTest, AspNeverHolds) {
  Init(proto::ASP, 0);
  EXPECT_EQ(Clock(kW0, 50, 1).size(), 1u);
  EXPECT_EQ(Pull(kW0, 50, 2).size(), 1u);
}

TEST_F(ConsistencyCoreTest, WorkersThatLeftAreNotWaitedFor) {
  Init(proto::BSP, 0);
  EXPECT_EQ(Pull(kW0, 1, 1).size(), 0u);
  Clock(kW0, 1, 2);
  Message left;
  left.header.mutable_workers_left()->add_worker_node_ids(kW1);
  auto out = core_->Step(std::move(left), 0);
  ASSERT_EQ(out.size(), 2u);  // the held pull and clock, nothing for WorkersLeft itself
  EXPECT_EQ(out[0].message.header.request_id(), 1u);
  // A clock from the departed worker is refused.
  auto late = Clock(kW1, 1, 3);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_TRUE(late[0].message.header.has_error());
  // So are its pushes and pulls (a paused worker the job went on without,
  // back after the others passed its clock: found by the cluster
  // simulator, where its late pushes broke I2), while the others' go on.
  for (auto refused : {Push(kW1, 0, 1.0f), Pull(kW1, 0, 4)}) {
    EXPECT_NE(ErrorOf(refused).find("worker 1 has left the job"), std::string::npos) << ErrorOf(refused);
  }
  EXPECT_EQ(ErrorOf(Push(kW0, 1, 1.0f)), "");
}

// Load accounting: each request's keys count against their shards, and
// the heartbeat carries the counters, rows and memory.
TEST_F(ConsistencyCoreTest, HeartbeatsCarryTheTrafficOfEachShard) {
  Init(proto::ASP, 0);
  const uint32_t a = VirtualShardOf(1, 42, 4), b = VirtualShardOf(1, 7, 4);
  ASSERT_NE(a, b) << "the test wants two shards";
  PushKeys(kW0, 0, {42, 7}, 1.0f);
  PushKeys(kW1, 0, {42}, 1.0f);
  Pull(kW0, 0, 9);  // key 42
  proto::Heartbeat hb;
  core_->FillHeartbeat(&hb);
  std::map<uint32_t, proto::ShardLoad> by_shard;
  for (const proto::ShardLoad& l : hb.shard_loads()) by_shard[l.vshard()] = l;
  ASSERT_EQ(by_shard.size(), 2u);
  EXPECT_EQ(by_shard[a].requests(), 3u);  // two pushes and the pull
  EXPECT_EQ(by_shard[a].bytes_in(), 3 * sizeof(Key) + 2 * sizeof(float));
  EXPECT_EQ(by_shard[a].bytes_out(), sizeof(float));
  EXPECT_EQ(by_shard[b].requests(), 1u);
  EXPECT_EQ(by_shard[b].bytes_in(), sizeof(Key) + sizeof(float));
  EXPECT_EQ(by_shard[b].bytes_out(), 0u);
  EXPECT_EQ(hb.rows(), 2u);
  EXPECT_GT(hb.memory_bytes(), 2 * sizeof(float));
}

TEST_F(ConsistencyCoreTest, HeldRequestsTimeOutNamingTheLaggards) {
  Init(proto::BSP, 0);
  Clock(kW0, 1, 1, 0);
  Clock(kW0, 2, 2, 0);
  EXPECT_EQ(Pull(kW0, 2, 3, 0, /*timeout_ms=*/500).size(), 0u);
  EXPECT_TRUE(core_->Tick(499 * kMillis).empty());
  auto out = core_->Tick(500 * kMillis);
  ASSERT_EQ(out.size(), 1u);
  const auto& e = out[0].message.header.error();
  EXPECT_EQ(e.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_NE(e.message().find("worker 1 (at clock 0)"), std::string::npos) << e.message();
  EXPECT_EQ(core_->held(), 2u);  // the two clock acks use the default timeout
}

TEST_F(ConsistencyCoreTest, PushStampedBeforeTheAnnouncedClockIsRefused) {
  Init(proto::ASP, 0);
  Clock(kW0, 3, 1);
  auto out = Push(kW0, 2, 1.0f);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
  EXPECT_NE(out[0].message.header.error().message().find("announced clock 3"), std::string::npos);
}

TEST_F(ConsistencyCoreTest, MalformedPullIsAnsweredAtOnceNotHeld) {
  Init(proto::BSP, 0);
  Message m = From(kW0, 5);
  m.header.mutable_pull()->set_table_id(1);
  m.header.mutable_pull()->set_num_keys(3);  // but one key in the frame
  m.header.mutable_pull()->set_clock(9);
  Key k = 42;
  m.frames.push_back(Buffer::CopyOf(&k, sizeof k));
  auto out = core_->Step(std::move(m), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
}

TEST_F(ConsistencyCoreTest, TheEarlyAnswerSwitchBreaksFreshness) {
  Init(proto::BSP, 0, /*early=*/true);
  EXPECT_EQ(Pull(kW0, 5, 1).size(), 1u);  // answered although w1 is at clock 0
}

TEST_F(ConsistencyCoreTest, ARequestOverALimitIsRefusedNamingItAndChangesNothing) {
  Init(proto::ASP, 0, false,
       {.node_id = 1, .max_keys_per_request = 4, .max_table_bytes = 3 * (sizeof(float) + Table::kIndexBytesPerRow), .max_held_per_peer = 1});
  // Keys per request.
  EXPECT_NE(ErrorOf(PushKeys(kW0, 0, {1, 2, 3, 4, 5}, 1)).find("--max-keys-per-request"), std::string::npos);
  EXPECT_EQ(core_->rows(), 0u);
  // Table memory: width 1, three rows fit; a fourth row does not, by push or by pull.
  ASSERT_TRUE(PushKeys(kW0, 0, {1, 2, 3}, 1)[0].message.header.has_ack());
  EXPECT_NE(ErrorOf(PushKeys(kW0, 0, {3, 4}, 1)).find("--max-table-mb"), std::string::npos);
  ASSERT_TRUE(PushKeys(kW0, 0, {1, 2, 3, 3}, 1)[0].message.header.has_ack()) << "existing rows are fine";
  Message pull = From(kW0, 9);
  pull.header.mutable_pull()->set_table_id(1);
  pull.header.mutable_pull()->set_num_keys(1);
  Key fresh = 77;
  pull.frames.push_back(Buffer::CopyOf(&fresh, sizeof fresh));
  EXPECT_NE(ErrorOf(core_->Step(std::move(pull), 0)).find("past its limit"), std::string::npos);
  EXPECT_EQ(core_->rows(), 3u);
  // A dense table makes its rows at once: four rows of width 1 do not fit
  // (found by fuzzing: a huge dense table took all memory), three do.
  auto dense = [&](uint32_t table, uint64_t rows) {
    Message m = From(kW0, 20 + table);
    auto* c = m.header.mutable_create_table()->mutable_config();
    c->set_table_id(table);
    c->set_width(1);
    c->set_kind(proto::DENSE);
    c->set_dense_rows(rows);
    c->set_optimizer(proto::ACCUMULATE);
    return core_->Step(std::move(m), 0);
  };
  EXPECT_NE(ErrorOf(dense(5, 4)).find("--max-table-mb"), std::string::npos);
  EXPECT_EQ(core_->table(5), nullptr);
  EXPECT_NE(ErrorOf(dense(6, uint64_t{1} << 32)).find("--max-table-mb"), std::string::npos) << "stops counting early";
  auto fits = dense(7, 3);
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_FALSE(fits[0].message.header.has_error()) << fits[0].message.header.ShortDebugString();
  EXPECT_NE(core_->table(7), nullptr);
}

TEST_F(ConsistencyCoreTest, RequestsHeldPerSenderAreCapped) {
  Init(proto::BSP, 0, false, {.node_id = 1, .max_held_per_peer = 2});
  ASSERT_EQ(Clock(kW0, 1, 1).size(), 0u);  // held: w1 is at 0
  ASSERT_EQ(Pull(kW0, 1, 2).size(), 0u);   // held
  auto refused = Pull(kW0, 1, 3);          // a third: refused at once
  EXPECT_NE(ErrorOf(refused).find("--max-held-per-peer"), std::string::npos);
  EXPECT_EQ(Pull(kW1, 0, 4).size(), 1u) << "other senders are not affected";
  auto out = Clock(kW1, 1, 0);  // w1 catches up: both held requests of w0 go out
  EXPECT_EQ(out.size(), 2u);
}

// Answers to one peer that its transport still holds (it reads them slowly)
// bound what that peer may ask: past either limit its requests are refused
// as busy (Unavailable, retryable, naming both settings), past the slack
// dropped; other peers and replication are served; nothing changes.
TEST_F(ConsistencyCoreTest, APeerWhoseAnswersPileUpIsRefusedAsBusy) {
  std::map<std::string, PeerBacklog> backlog;
  Init(proto::ASP, 0, false,
       {.node_id = 1, .max_bytes_in_flight_per_peer = 1000, .max_requests_in_flight_per_peer = 10,
        .backlog_of = [&](const std::string& to) { return backlog[to]; }});
  const std::string w0 = From(kW0, 0).header.sender_address();
  ASSERT_TRUE(Acked(Push(kW0, 0, 1.0f)));
  backlog[w0] = {.messages = 9, .bytes = 999};
  ASSERT_TRUE(Acked(Push(kW0, 0, 1.0f))) << "under both limits";
  backlog[w0] = {.messages = 10, .bytes = 0};
  auto out = Push(kW0, 0, 5.0f);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(ErrorOf(out).find("--max-requests-in-flight-per-peer"), std::string::npos) << ErrorOf(out);
  EXPECT_NE(ErrorOf(out).find("--max-mb-in-flight-per-peer"), std::string::npos);
  backlog[w0] = {.messages = 1, .bytes = 1000};
  EXPECT_NE(ErrorOf(Pull(kW0, 0, 50)).find("busy"), std::string::npos) << "bytes at the limit";
  EXPECT_NE(ErrorOf(Clock(kW0, 1, 51)).find("busy"), std::string::npos) << "clock advances too";
  EXPECT_EQ(Pull(kW1, 0, 52).size(), 1u) << "another peer is served";
  EXPECT_FALSE(Pull(kW1, 0, 53)[0].message.header.has_error());
  backlog[w0] = {.messages = 10 + kBusyAnswerSlack, .bytes = 0};
  EXPECT_TRUE(Push(kW0, 0, 5.0f).empty()) << "past the slack: dropped, not even refused";
  EXPECT_EQ(core_->stats().busy_refused, 4u);
  EXPECT_EQ(core_->stats().busy_dropped, 1u);
  EXPECT_EQ(core_->stats().bad_requests, 0u) << "busy is not bad input";
  EXPECT_EQ(core_->last_busy_peer(), w0);
  backlog[w0] = {};
  auto pulled = Pull(kW0, 0, 60);
  ASSERT_EQ(pulled.size(), 1u);
  ASSERT_FALSE(pulled[0].message.header.has_error());
  EXPECT_EQ(pulled[0].message.frames[0].As<float>()[0], 2.0f) << "refused pushes changed nothing";
}

// A worker that sends a held request again (its resend timer fired while the
// server held it for a slower worker) gets one answer, under the newest
// request id, with the time held counted from the newest send; the capped
// count of held requests is not used up by resends.
TEST_F(ConsistencyCoreTest, ARequestSentAgainWhileHeldIsHeldOnceUnderItsNewestId) {
  Init(proto::BSP, 0, false, {.node_id = 1, .max_held_per_peer = 2});
  ASSERT_EQ(Pull(kW0, 1, 10, /*now=*/0).size(), 0u);  // held: w1 is at 0
  for (uint64_t id = 11; id <= 14; ++id) {
    Message again = From(kW0, id);
    again.header.set_first_request_id(10);
    again.header.mutable_pull()->set_table_id(1);
    again.header.mutable_pull()->set_num_keys(1);
    again.header.mutable_pull()->set_clock(1);
    Key k = 42;
    again.frames.push_back(Buffer::CopyOf(&k, sizeof k));
    ASSERT_EQ(core_->Step(std::move(again), static_cast<Nanos>(id) * kMillis).size(), 0u) << id;
  }
  EXPECT_EQ(core_->held(), 1u);
  EXPECT_EQ(core_->stats().held_resends, 4u);
  // Another request of w0 may still be held (the cap counts 1 so far).
  ASSERT_EQ(Clock(kW0, 1, 20, 15 * kMillis).size(), 0u);
  auto out = Clock(kW1, 1, 0, 30 * kMillis);  // w1 catches up
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].message.header.request_id(), 14u) << "the pull, under its newest id";
  EXPECT_EQ(out[0].message.header.pull_reply().held_us(), 16'000u) << "held since the newest send, at 14 ms";
  EXPECT_EQ(out[1].message.header.request_id(), 20u);
  // A resend of a request no longer held is answered like any request.
  Message late = From(kW0, 15);
  late.header.set_first_request_id(10);
  late.header.mutable_clock_advance()->set_clock(1);
  EXPECT_EQ(core_->Step(std::move(late), 31 * kMillis).size(), 1u);
}

// A push stamped far past every clock the workers announced (a buggy
// worker's stamp, below the 2^62 that is refused) is applied, but moves its
// table's clock only one past the highest announced clock: it does not age
// out every row at once, and the job's later pushes are not "far behind".
TEST_F(ConsistencyCoreTest, AFarAheadPushStampMovesTheTableClockOnlyOnePastTheAnnouncedClocks) {
  Init(proto::ASP, 0);
  constexpr uint32_t kEvicting = 2;
  CreateEvictingTable(kEvicting, proto::ASP, /*ttl=*/3);
  ASSERT_EQ(Clock(kW0, 2, 0).size(), 0u);  // notices: both workers at clock 2
  ASSERT_EQ(Clock(kW1, 2, 0).size(), 0u);
  ASSERT_TRUE(Acked(PushKeys(kW0, 2, {1, 2, 3}, 1.0f, 0, kEvicting)));
  const Table* t = core_->table(kEvicting);
  ASSERT_EQ(t->clock(), 2u);
  auto far = PushKeys(kW1, uint64_t{1} << 40, {4}, 1.0f, 0, kEvicting);
  ASSERT_TRUE(Acked(far)) << ErrorOf(far);
  EXPECT_EQ(t->clock(), 3u) << "moved to the highest announced clock + 1, not 2^40";
  EXPECT_EQ(t->num_rows(), 4u);
  EXPECT_EQ(t->counters().evicted_by_age, 0u);
  EXPECT_EQ(core_->stats().push_clocks_bounded, 1u);
  // The job goes on: a push at its real clock is taken and changes the clock as before.
  ASSERT_TRUE(Acked(PushKeys(kW0, 3, {1}, 1.0f, 0, kEvicting)));
  EXPECT_EQ(t->clock(), 3u);
  // Eviction by age still works at the real clocks: at clock 7, rows last
  // touched at clock 3 (keys 1 and 4) are 4 > 3 behind (keys 2, 3: at 2).
  ASSERT_EQ(Clock(kW0, 7, 0).size(), 0u);
  ASSERT_TRUE(Acked(PushKeys(kW0, 7, {5}, 1.0f, 0, kEvicting)));
  EXPECT_EQ(t->clock(), 7u);
  EXPECT_EQ(t->num_rows(), 1u);
  EXPECT_EQ(t->counters().evicted_by_age, 4u);
  EXPECT_EQ(core_->stats().push_clocks_bounded, 1u);
}

// Under BSP a worker stamps clock c once every server acknowledged its
// clock c - 1; its ClockAdvance(c) may be lost and sent again after a push
// stamped c arrives. That push is taken, and moves the table's clock to c
// (eviction at the real clock); the resent advance is acknowledged later.
TEST_F(ConsistencyCoreTest, APushStampedAheadOfALostClockAdvanceMovesTheTableClockAsStamped) {
  Init(proto::BSP, 0);
  constexpr uint32_t kEvicting = 2;
  CreateEvictingTable(kEvicting, proto::BSP, /*ttl=*/3);
  ASSERT_TRUE(Acked(PushKeys(kW0, 0, {1}, 1.0f, 0, kEvicting)));
  for (uint64_t c = 1; c <= 4; ++c) {
    ASSERT_EQ(Clock(kW0, c, 0).size(), 0u);
    ASSERT_EQ(Clock(kW1, c, 0).size(), 0u);
  }
  ASSERT_TRUE(Acked(PushKeys(kW1, 4, {2}, 1.0f, 0, kEvicting)));
  // w0's ClockAdvance(5) is lost; its push stamped 5 arrives first.
  auto out = PushKeys(kW0, 5, {3}, 1.0f, 0, kEvicting);
  ASSERT_TRUE(Acked(out)) << ErrorOf(out);
  const Table* t = core_->table(kEvicting);
  EXPECT_EQ(t->clock(), 5u);
  EXPECT_EQ(t->counters().evicted_by_age, 1u) << "key 1, last touched at clock 0";
  EXPECT_EQ(t->num_rows(), 2u);
  EXPECT_EQ(core_->stats().push_clocks_bounded, 0u);
  // The advance, sent again, is recorded; w0's clock ack waits for w1.
  EXPECT_EQ(Clock(kW0, 5, 77).size(), 0u);
  auto released = Clock(kW1, 5, 0);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].message.header.request_id(), 77u);
  EXPECT_TRUE(released[0].message.header.has_clock_ack());
}

}  // namespace
}  // namespace tessera
