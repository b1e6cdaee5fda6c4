#include "coordinator/coordinator_core.h"
#include "common/keys.h"

#include "absl/status/status.h"

#include <cmath>

#include <gtest/gtest.h>

namespace tessera {
namespace {

class CoordinatorCoreTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(uint32_t servers, uint32_t workers) {
    CoordinatorOptions o;
    o.servers = servers;
    o.workers = workers;
    o.vshards = 8;
    o.assemble_timeout = 10 * kSeconds;
    o.lease = 3 * kSeconds;
    o.replication = 1;  // one copy per shard unless a test says otherwise (Replicated)
    return o;
  }

  static Message From(const std::string& address, uint64_t request_id = 1) {
    Message m;
    m.header.set_sender_address(address);
    m.header.set_request_id(request_id);
    return m;
  }

  static Message Register(const std::string& address, proto::Role role, int rank) {
    Message m = From(address);
    m.header.mutable_register_request()->set_role(role);
    m.header.mutable_register_request()->set_rank(rank);
    return m;
  }

  static std::vector<Outgoing> To(const std::vector<Outgoing>& out, const std::string& address) {
    std::vector<Outgoing> r;
    for (const auto& o : out)
      if (o.to == address) r.push_back(o);
    return r;
  }

  // A heartbeat from `from` at `now`; returns the outputs.
  static std::vector<Outgoing> Heartbeat(CoordinatorCore& core, const std::string& from, Nanos now) {
    Message m = From(from);
    m.header.mutable_heartbeat();
    return core.Step(m, now);
  }

  // s servers and w workers, replication 2, servers lost after 1 s of silence.
  CoordinatorOptions Replicated(uint32_t s, uint32_t w) {
    CoordinatorOptions o = Options(s, w);
    o.replication = 2;
    o.server_lease = 1 * kSeconds;
    return o;
  }

  // Every primary reports its recruited backups in sync (as after their
  // state transfers were acknowledged). Server addresses are "s<rank>",
  // or as the map names them.
  static void SyncAll(CoordinatorCore& core, Nanos now) {
    const proto::ShardMap& map = core.shard_map();
    const BackupLists lists = BackupListsOf(map);
    for (uint32_t v = 0; v < map.num_vshards() && v < lists.size(); ++v) {
      for (uint32_t b : lists[v]) {
        Message m = From(map.servers(map.vshard_server_rank(v)).address(), 0);
        m.header.mutable_shards_in_sync()->add_vshards(v);
        m.header.mutable_shards_in_sync()->set_backup_rank(b);
        core.Step(m, now);
      }
    }
  }

  // Registers s servers and w workers at time `now`; returns the last outputs.
  std::vector<Outgoing> Assemble(CoordinatorCore& core, uint32_t s, uint32_t w, Nanos now = 0) {
    std::vector<Outgoing> out;
    for (uint32_t i = 0; i < s; ++i) out = core.Step(Register("s" + std::to_string(i), proto::SERVER, i), now);
    for (uint32_t i = 0; i < w; ++i) out = core.Step(Register("w" + std::to_string(i), proto::WORKER, i), now);
    return out;
  }
};

TEST_F(CoordinatorCoreTest, AssemblesAndPublishesTheShardMap) {
  CoordinatorCore core(Options(2, 2), 0);
  auto out = Assemble(core, 2, 2);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  // The last registrant gets its reply, then everyone gets JobReady.
  size_t ready = 0;
  for (const auto& o : out) {
    if (!o.message.header.has_job_ready()) continue;
    ++ready;
    const auto& map = o.message.header.job_ready().shard_map();
    EXPECT_EQ(map.epoch(), 1u);
    EXPECT_EQ(map.num_vshards(), 8u);
    ASSERT_EQ(map.servers_size(), 2);
    EXPECT_EQ(map.servers(1).address(), "s1");
    EXPECT_EQ(o.message.header.job_ready().nodes_size(), 4);
  }
  EXPECT_EQ(ready, 4u);
}

TEST_F(CoordinatorCoreTest, ServerWeightsWeighTheFirstMap) {
  CoordinatorOptions o = Replicated(3, 1);
  o.vshards = 64;
  o.server_weights = {1, 1, 2};
  CoordinatorCore core(o, 0);
  auto out = Assemble(core, 3, 1);
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  size_t ready = 0;
  for (const auto& m : out) {
    if (!m.message.header.has_job_ready()) continue;
    ++ready;
    const proto::ShardMap& map = m.message.header.job_ready().shard_map();
    ASSERT_TRUE(ShardMapView::Create(map).ok()) << ShardMapView::Create(map).status();
    ASSERT_EQ(map.server_weights_size(), 3);
    EXPECT_EQ(map.server_weights(2), 2.0f);
    std::vector<uint32_t> primaries(3, 0);
    for (uint32_t rank : map.vshard_server_rank()) primaries[rank]++;
    EXPECT_EQ(primaries, (std::vector<uint32_t>{16, 16, 32}));  // 64 shards by weights 1, 1, 2
    EXPECT_EQ(BackupListsOf(map).size(), 64u);
  }
  EXPECT_EQ(ready, 4u);
}

TEST_F(CoordinatorCoreTest, BadServerWeightsFailTheJobOnceItAssembles) {
  CoordinatorOptions o = Options(3, 1);
  o.server_weights = {1, 0, 2};
  CoordinatorCore core(o, 0);
  auto out = Assemble(core, 3, 1);
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("server weight 0 (server rank 1) must be a positive"), std::string::npos)
      << core.failure_reason();
  size_t shutdowns = 0;
  for (const auto& m : out) shutdowns += m.message.header.has_shutdown() && !m.message.header.shutdown().ok();
  EXPECT_EQ(shutdowns, 4u);
}

TEST_F(CoordinatorCoreTest, RanksAreAssignedAndChecked) {
  CoordinatorCore core(Options(2, 1), 0);
  auto out = core.Step(Register("a", proto::SERVER, -1), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.header.register_reply().self().rank(), 0u);
  out = core.Step(Register("b", proto::SERVER, 0), 0);  // taken
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  out = core.Step(Register("c", proto::SERVER, 5), 0);  // out of range
  EXPECT_EQ(out[0].message.header.error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(out[0].message.header.error().message().find("server 5 does not exist"), std::string::npos);
  // A retried registration from the same address gets the same answer.
  out = core.Step(Register("a", proto::SERVER, -1), 0);
  EXPECT_EQ(out[0].message.header.register_reply().self().rank(), 0u);
  EXPECT_EQ(core.nodes().size(), 1u);
}

TEST_F(CoordinatorCoreTest, AssemblyTimeoutNamesTheMissing) {
  CoordinatorOptions options = Options(2, 2);
  options.lease = 60 * kSeconds;  // so only the assembly deadline fires
  CoordinatorCore core(options, 0);
  core.Step(Register("s0", proto::SERVER, 0), 0);
  core.Step(Register("w1", proto::WORKER, 1), 0);
  EXPECT_TRUE(core.Tick(9 * kSeconds).empty());
  auto out = core.Tick(10 * kSeconds);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("missing server 1, worker 0"), std::string::npos) << core.failure_reason();
  ASSERT_EQ(out.size(), 2u);  // Shutdown to both registered nodes
  for (const auto& o : out) {
    EXPECT_FALSE(o.message.header.shutdown().ok());
    EXPECT_EQ(o.message.header.shutdown().reason(), core.failure_reason());
  }
}

TEST_F(CoordinatorCoreTest, SilentNodeIsLostAndNamed) {
  CoordinatorCore core(Options(2, 1), 0);
  Assemble(core, 2, 1, 0);
  Message hb = From("s0");
  hb.header.mutable_heartbeat();
  Message hbw = From("w0");
  hbw.header.mutable_heartbeat();
  auto out = core.Step(hb, 2 * kSeconds);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_heartbeat_ack());
  core.Step(hbw, 2 * kSeconds);
  EXPECT_TRUE(core.Tick(2 * kSeconds).empty());
  core.Step(hb, 4 * kSeconds);
  core.Step(hbw, 4 * kSeconds);
  out = core.Tick(4 * kSeconds);  // s1 last seen at 0, lease 3 s
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("lost server 1 (s1)"), std::string::npos) << core.failure_reason();
  EXPECT_EQ(out.size(), 3u);
}

TEST_F(CoordinatorCoreTest, BarrierReleasesWhenAllWorkersArrive) {
  CoordinatorCore core(Options(1, 3), 0);
  Assemble(core, 1, 3);
  auto barrier = [&](const std::string& w) {
    Message m = From(w);
    m.header.mutable_barrier_request()->set_name("epoch-1");
    return core.Step(m, 0);
  };
  EXPECT_TRUE(barrier("w0").empty());
  EXPECT_TRUE(barrier("w2").empty());
  EXPECT_TRUE(barrier("w0").empty());  // a repeat does not count twice
  auto out = barrier("w1");
  ASSERT_EQ(out.size(), 3u);
  for (const auto& o : out) EXPECT_EQ(o.message.header.barrier_release().name(), "epoch-1");
  // w2's release was lost: w2 sends the same request again and gets the
  // release again, without starting a new round of the barrier.
  Message repeat = From("w2", 77);
  repeat.header.mutable_barrier_request()->set_name("epoch-2");
  EXPECT_TRUE(core.Step(repeat, 0).empty()) << "epoch-2 waits for w0 and w1";
  for (const char* w : {"w0", "w1"}) {
    Message m = From(w, 78);
    m.header.mutable_barrier_request()->set_name("epoch-2");
    out = core.Step(m, 0);
  }
  ASSERT_EQ(out.size(), 3u) << "epoch-2 released";
  out = core.Step(repeat, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, "w2");
  EXPECT_EQ(out[0].message.header.barrier_release().name(), "epoch-2");
  Message next = From("w2", 79);  // a new request of the same name: a new round
  next.header.mutable_barrier_request()->set_name("epoch-2");
  EXPECT_TRUE(core.Step(next, 0).empty());
  // Servers cannot take part.
  Message m = From("s0");
  m.header.mutable_barrier_request()->set_name("x");
  out = core.Step(m, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
}

TEST_F(CoordinatorCoreTest, JobEndsWhenEveryWorkerIsDone) {
  CoordinatorCore core(Options(1, 2), 0);
  Assemble(core, 1, 2);
  auto done = [&](const std::string& w, double loss) {
    Message m = From(w);
    m.header.mutable_worker_done()->set_final_loss(loss);
    m.header.mutable_worker_done()->set_steps(10);
    return core.Step(m, 0);
  };
  auto out = done("w0", 0.5);
  ASSERT_EQ(out.size(), 2u);  // the ack, and WorkersLeft to the server
  EXPECT_TRUE(out[0].message.header.has_ack());
  EXPECT_EQ(out[1].to, "s0");
  EXPECT_EQ(out[1].message.header.workers_left().worker_node_ids(0), core.nodes().at(2).info.node_id());
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  // A done worker is no longer watched for heartbeats.
  Message hb = From("w1");
  hb.header.mutable_heartbeat();
  Message hs = From("s0");
  hs.header.mutable_heartbeat();
  core.Step(hb, 5 * kSeconds);
  core.Step(hs, 5 * kSeconds);
  EXPECT_TRUE(core.Tick(5 * kSeconds).empty());
  out = done("w1", 0.25);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kDone);
  size_t shutdowns = 0;
  for (const auto& o : out) shutdowns += o.message.header.has_shutdown() && o.message.header.shutdown().ok();
  EXPECT_EQ(shutdowns, 3u);
}

TEST_F(CoordinatorCoreTest, UnregisteredSendersGetAnError) {
  CoordinatorCore core(Options(1, 1), 0);
  Message m = From("stranger");
  m.header.mutable_heartbeat();
  auto out = core.Step(m, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].message.header.error().message().find("not registered"), std::string::npos);
}

TEST_F(CoordinatorCoreTest, RetriedRegistrationAfterStartGetsTheWholeJobReady) {
  CoordinatorCore core(Options(1, 2), 0);
  Assemble(core, 1, 2);
  auto out = core.Step(Register("w1", proto::WORKER, 1), 0);  // its first reply was lost
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].message.header.register_reply().self().rank(), 1u);
  ASSERT_TRUE(out[1].message.header.has_job_ready());
  EXPECT_EQ(out[1].message.header.job_ready().nodes_size(), 3);  // servers learn the workers from it
  EXPECT_EQ(out[1].message.header.job_ready().shard_map().epoch(), 1u);
}

TEST_F(CoordinatorCoreTest, LateRegistrationIsRefused) {
  CoordinatorCore core(Options(1, 1), 0);
  Assemble(core, 1, 1);
  auto out = core.Step(Register("late", proto::WORKER, -1), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].message.header.has_error());
}

// on_worker_loss: wait keeps a lost worker's place: nobody is told it left,
// barriers wait for it, a process registering for its rank takes it over
// (same node id, next incarnation) and passes barriers its predecessor passed.
TEST_F(CoordinatorCoreTest, WaitPolicyKeepsALostWorkersPlaceForAReplacement) {
  CoordinatorOptions o = Options(1, 2);
  o.on_worker_loss = WorkerLossPolicy::kWait;
  o.rejoin_timeout = 10 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 2);
  auto heartbeat = [&](const std::string& from, Nanos now) { return Heartbeat(core, from, now); };
  uint64_t request_id = 100;  // each request its own id, as sessions number them
  auto barrier = [&](const std::string& from, const std::string& name, Nanos now) {
    Message m = From(from, ++request_id);
    m.header.mutable_barrier_request()->set_name(name);
    return core.Step(m, now);
  };
  ASSERT_TRUE(barrier("w0", "start", 0).empty());
  ASSERT_EQ(barrier("w1", "start", 0).size(), 2u);
  const uint32_t w1_id = core.nodes().at(3).info.node_id();
  ASSERT_EQ(core.nodes().at(3).info.rank(), 1u);
  // w1 goes silent; w0 and the server keep heartbeating.
  for (Nanos t = kSeconds; t <= 4 * kSeconds; t += kSeconds) {
    heartbeat("w0", t);
    heartbeat("s0", t);
  }
  auto out = core.Tick(4 * kSeconds);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  EXPECT_TRUE(out.empty()) << "nothing is announced: the servers keep waiting for its clock";
  auto events = core.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("worker 1 (w1): no heartbeat"), std::string::npos) << events[0];
  EXPECT_NE(events[0].find("on_worker_loss: wait"), std::string::npos) << events[0];
  // A barrier waits for the lost worker's place.
  EXPECT_TRUE(barrier("w0", "epoch-1", 5 * kSeconds).empty());
  // A replacement for rank 1 from a new address.
  out = core.Step(Register("w1-again", proto::WORKER, 1), 6 * kSeconds);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].to, "w1-again");
  EXPECT_EQ(out[0].message.header.register_reply().self().node_id(), w1_id);
  EXPECT_EQ(out[0].message.header.register_reply().self().incarnation(), 1u);
  EXPECT_TRUE(out[1].message.header.has_job_ready());
  EXPECT_NE(core.TakeEvents().at(0).find("worker 1 rejoined from w1-again (incarnation 1)"), std::string::npos);
  // The old address is refused from now on.
  EXPECT_TRUE(heartbeat("w1", 6 * kSeconds).at(0).message.header.has_error());
  // The replacement passes "start" at once (its predecessor did), alone.
  out = barrier("w1-again", "start", 6 * kSeconds);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, "w1-again");
  // "epoch-1" is new to both: it releases both once the replacement arrives.
  EXPECT_EQ(barrier("w1-again", "epoch-1", 6 * kSeconds).size(), 2u);
  // A barrier name reused by the same incarnation waits as usual.
  EXPECT_TRUE(barrier("w1-again", "start", 6 * kSeconds).empty());
}

// A replacement that registers before its predecessor's lease ran out (a
// process restarted at once) is told "not yet" (Unavailable: the node's
// session retries), and takes the place once the lease has run out.
TEST_F(CoordinatorCoreTest, WaitPolicyAnswersAnEarlyReplacementNotYet) {
  CoordinatorOptions o = Options(1, 2);
  o.on_worker_loss = WorkerLossPolicy::kWait;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 2);
  auto out = core.Step(Register("w1-again", proto::WORKER, 1), 1 * kSeconds);
  ASSERT_EQ(out.size(), 1u);
  const proto::Error& e = out[0].message.header.error();
  EXPECT_EQ(e.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(e.message().find("worker 1 is held by the process at w1, heard from 1 s ago"), std::string::npos)
      << e.message();
  EXPECT_NE(e.message().find("silent for 3 s"), std::string::npos) << e.message();
  for (Nanos t = kSeconds; t <= 3 * kSeconds; t += kSeconds) {
    for (const char* from : {"w0", "s0"}) Heartbeat(core, from, t);
  }
  core.Tick(3 * kSeconds);  // w1 silent for the lease: away
  out = core.Step(Register("w1-again", proto::WORKER, 1), 3500 * kMillis);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].message.header.register_reply().self().incarnation(), 1u);
}

// A server that missed a WorkersLeft (a lost message) would wait for that
// worker's clock forever: its heartbeat says how many workers it knows
// left, and the coordinator names them all again (found by the cluster
// simulator).
TEST_F(CoordinatorCoreTest, AServerThatMissedWorkersLeftGetsItAgain) {
  CoordinatorOptions o = Options(2, 3);
  o.on_worker_loss = WorkerLossPolicy::kContinue;
  CoordinatorCore core(o, 0);
  Assemble(core, 2, 3);
  for (Nanos t = kSeconds; t <= 3 * kSeconds; t += kSeconds) {
    for (const char* from : {"w0", "w1", "s0", "s1"}) Heartbeat(core, from, t);
  }
  auto out = core.Tick(3 * kSeconds);  // w2 lost
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].message.header.has_workers_left());
  const uint32_t w2 = out[0].message.header.workers_left().worker_node_ids(0);
  Message done = From("w0");
  done.header.mutable_worker_done()->set_steps(1);
  core.Step(done, 3 * kSeconds);  // w0 done: left too

  auto heartbeat = [&](const std::string& from, uint32_t knows) {
    Message m = From(from);
    m.header.mutable_heartbeat()->set_workers_left(knows);
    return To(core.Step(m, 4 * kSeconds), from);
  };
  out = heartbeat("s1", 1);  // it missed one of the two
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[1].message.header.has_workers_left());
  const auto& left = out[1].message.header.workers_left();
  ASSERT_EQ(left.worker_node_ids_size(), 2);
  EXPECT_TRUE(left.worker_node_ids(0) == w2 || left.worker_node_ids(1) == w2);
  EXPECT_NE(left.reason().find("server 1 knows of 1 of the 2 workers that left"), std::string::npos) << left.reason();
  EXPECT_EQ(heartbeat("s0", 2).size(), 1u) << "only the heartbeat ack: it knows them all";
  EXPECT_EQ(heartbeat("w1", 0).size(), 1u) << "workers are not told";
}

// Server heartbeats feed the load view: a shard counts from its primary.
TEST_F(CoordinatorCoreTest, ServerHeartbeatsFeedTheLoadView) {
  CoordinatorCore core(Options(2, 1), 0);
  Assemble(core, 2, 1);
  const uint32_t mine = core.shard_map().vshard_server_rank(0) == 0 ? 0 : 1;  // a shard of server 0
  auto beat = [&](Nanos now, uint64_t requests, double cpu) {
    Message m = From("s0");
    proto::Heartbeat* hb = m.header.mutable_heartbeat();
    hb->set_cpu_seconds(cpu);
    hb->set_rows(77);
    proto::ShardLoad* l = hb->add_shard_loads();
    l->set_vshard(mine);
    l->set_requests(requests);
    core.Step(m, now);
  };
  beat(1 * kSeconds, 100, 1.0);
  beat(11 * kSeconds, 1100, 6.0);  // 100 requests/s, half a core, over 10 s
  const double moved = 1 - std::exp(-1.0);  // tau 10 s
  ASSERT_GE(core.load().servers().size(), 1u);
  EXPECT_NEAR(core.load().servers()[0].cpu_cores, 0.5 * moved, 1e-9);
  EXPECT_NEAR(core.load().servers()[0].requests_per_s, 100 * moved, 1e-9);
  EXPECT_EQ(core.load().servers()[0].rows, 77u);
  EXPECT_NEAR(core.load().shards().at(mine).requests_per_s, 100 * moved, 1e-9);
}

// The write-ahead rule both the shell and the simulator save state by.
TEST_F(CoordinatorCoreTest, TheStateIsSavedWhenItChangesAndForTheCountsNowAndThen) {
  CoordinatorCore core(Options(1, 1), 0);
  CoordinatorStateSaver saver(5 * kSeconds);
  auto first = saver.Due(core, 0);
  ASSERT_TRUE(first.has_value()) << "the first state is always written";
  EXPECT_TRUE(saver.Due(core, 0).has_value()) << "until it was written, it is due again";
  saver.Written(0);
  EXPECT_FALSE(saver.Due(core, 1 * kSeconds).has_value()) << "nothing changed";
  core.Step(Register("s0", proto::SERVER, 0), 1 * kSeconds);
  auto changed = saver.Due(core, 1 * kSeconds);
  ASSERT_TRUE(changed.has_value());
  proto::CoordinatorState state;
  ASSERT_TRUE(state.ParseFromString(*changed));
  EXPECT_EQ(state.nodes_size(), 1);
  saver.Written(1 * kSeconds);
  EXPECT_FALSE(saver.Due(core, 5 * kSeconds).has_value());
  EXPECT_TRUE(saver.Due(core, 6 * kSeconds).has_value()) << "the applied counts, every 5 s";
}

TEST_F(CoordinatorCoreTest, WaitPolicyFailsTheJobWhenNoReplacementComes) {
  CoordinatorOptions o = Options(1, 2);
  o.on_worker_loss = WorkerLossPolicy::kWait;
  o.rejoin_timeout = 10 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 2);
  for (Nanos t = kSeconds; t <= 14 * kSeconds; t += kSeconds) {
    for (const char* from : {"w0", "s0"}) Heartbeat(core, from, t);
    core.Tick(t);
    if (t < 13 * kSeconds) {
      ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << "at " << t / kSeconds << " s";
    }
  }
  // Lost at 3 s (lease 3 s), place kept 10 s: the job fails at 13 s.
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("worker 1 (w1): no heartbeat"), std::string::npos) << core.failure_reason();
  EXPECT_NE(core.failure_reason().find("no replacement joined within 10 s"), std::string::npos)
      << core.failure_reason();
}

TEST_F(CoordinatorCoreTest, WithoutTheWaitPolicyNoPlaceCanBeTakenOver) {
  CoordinatorOptions o = Options(1, 2);
  o.on_worker_loss = WorkerLossPolicy::kContinue;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 2);
  for (Nanos t = kSeconds; t <= 4 * kSeconds; t += kSeconds) {
    for (const char* from : {"w0", "s0"}) Heartbeat(core, from, t);
  }
  core.Tick(4 * kSeconds);
  auto out = core.Step(Register("w1-again", proto::WORKER, 1), 5 * kSeconds);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(out[0].message.header.error().message().find("on_worker_loss: wait"), std::string::npos)
      << out[0].message.header.error().message();
}

// A worker the job went on without (it was only paused) comes back: it is
// told to stop, and its done report does not count, so the job still waits
// for the other workers (found by the cluster simulator: the lost worker
// counted as lost and as done, and the job ended before worker 0 finished).
TEST_F(CoordinatorCoreTest, UnderTheContinuePolicyALostWorkerThatComesBackIsToldToStop) {
  CoordinatorOptions o = Options(1, 3);
  o.on_worker_loss = WorkerLossPolicy::kContinue;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 3);
  for (Nanos t = kSeconds; t <= 4 * kSeconds; t += kSeconds) {
    for (const char* from : {"w0", "w1", "s0"}) Heartbeat(core, from, t);
  }
  core.Tick(4 * kSeconds);  // w2 silent since 0: lost, the job goes on
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);

  auto out = Heartbeat(core, "w2", 4500 * kMillis);
  const std::vector<Outgoing> to_w2 = To(out, "w2");
  ASSERT_EQ(to_w2.size(), 1u);
  const proto::Shutdown& stop = to_w2[0].message.header.shutdown();
  EXPECT_FALSE(stop.ok());
  EXPECT_NE(stop.reason().find("worker 2 was declared lost"), std::string::npos) << stop.reason();
  EXPECT_NE(stop.reason().find("on_worker_loss: continue"), std::string::npos) << stop.reason();

  for (const char* from : {"w2", "w1"}) {
    Message done = From(from);
    done.header.mutable_worker_done()->set_steps(10);
    core.Step(done, 5 * kSeconds);
  }
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << "worker 0 has not finished";
  Message done = From("w0");
  done.header.mutable_worker_done()->set_steps(10);
  out = core.Step(done, 5 * kSeconds);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kDone);
}

TEST_F(CoordinatorCoreTest, WithReplicationALostServerFailsOverAndTheJobGoesOn) {
  CoordinatorCore core(Replicated(3, 1), 0);  // servers are watched more closely than workers
  Assemble(core, 3, 1, 0);
  ASSERT_EQ(core.shard_map().replication(), 2u);
  ASSERT_EQ(core.shard_map().backup_counts_size(), 8);
  const uint64_t epoch = core.shard_map().epoch();
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  EXPECT_TRUE(core.Tick(900 * kMillis).empty());
  auto out = core.Tick(1100 * kMillis);  // s1: silent for 1.1 s > server lease
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  EXPECT_EQ(core.shard_map().epoch(), epoch + 1);
  ASSERT_EQ(core.shard_map().dead_server_ranks_size(), 1);
  EXPECT_EQ(core.shard_map().dead_server_ranks(0), 1u);
  for (uint32_t v = 0; v < 8; ++v) EXPECT_NE(core.shard_map().vshard_server_rank(v), 1u) << v;
  // Every node hears of it, the lost server too (so that it stops serving if it was only paused).
  EXPECT_EQ(out.size(), 4u);
  for (const auto& m : out) {
    EXPECT_TRUE(m.message.header.has_shard_map_update());
    EXPECT_EQ(m.message.header.epoch(), epoch + 1);
    EXPECT_NE(m.message.header.shard_map_update().reason().find("server 1 (s1)"), std::string::npos);
  }
  auto events = core.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("fail over"), std::string::npos) << events[0];
  // Workers are still held to the ordinary lease.
  Heartbeat(core, "s0", 2900 * kMillis);
  Heartbeat(core, "s2", 2900 * kMillis);
  EXPECT_TRUE(core.Tick(2900 * kMillis).empty());
  // The lost copies were re-made on s0 and s2 (once in sync), so losing s2
  // too leaves everything on s0; losing s0 after that loses data and fails
  // the job.
  SyncAll(core, 3000 * kMillis);
  Heartbeat(core, "s0", 3500 * kMillis);
  Heartbeat(core, "w0", 3500 * kMillis);
  Heartbeat(core, "w0", 3900 * kMillis);  // (someone is heard: not the coordinator's own silence)
  core.Tick(4000 * kMillis);  // s2 silent since 2.9 s
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  Heartbeat(core, "w0", 4500 * kMillis);
  core.Tick(4600 * kMillis);  // s0 silent since 3.5 s
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("lost server 0 (s0)"), std::string::npos) << core.failure_reason();
  EXPECT_NE(core.failure_reason().find("last copy of virtual shard"), std::string::npos) << core.failure_reason();
}

// A server whose core is busy (a long push) heartbeats with `busy` and
// nothing else: it stays alive through such heartbeats alone, and what its
// last full heartbeat reported (rows, applied counts) stands.
TEST_F(CoordinatorCoreTest, ABusyServersHeartbeatsKeepItAliveAndChangeNothingElse) {
  CoordinatorCore core(Replicated(2, 1), 0);
  Assemble(core, 2, 1, 0);
  const uint64_t epoch = core.shard_map().epoch();
  auto full = [&](const std::string& from, Nanos now) {
    Message m = From(from);
    m.header.mutable_heartbeat()->set_rows(1000);
    return core.Step(m, now);
  };
  full("s0", 100 * kMillis);
  full("s1", 100 * kMillis);
  ASSERT_EQ(core.load().servers().size(), 2u);
  EXPECT_EQ(core.load().servers()[1].rows, 1000u);
  // s1 busy for 3 s (three server leases): only busy heartbeats, whose other
  // fields are empty.
  for (Nanos t = 200 * kMillis; t <= 3000 * kMillis; t += 200 * kMillis) {
    Message m = From("s1");
    m.header.mutable_heartbeat()->set_busy(true);
    auto out = core.Step(m, t);
    ASSERT_EQ(out.size(), 1u);  // the ack only: no WorkersLeft sent again, nothing else
    EXPECT_TRUE(out[0].message.header.has_heartbeat_ack());
    Heartbeat(core, "s0", t);
    Heartbeat(core, "w0", t);
    core.Tick(t);
  }
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  EXPECT_EQ(core.shard_map().epoch(), epoch);  // nobody was lost
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  EXPECT_EQ(core.load().servers()[1].rows, 1000u);  // the last full report stands
  // The control: silence instead of busy heartbeats loses it.
  for (Nanos t = 3200 * kMillis; t <= 4400 * kMillis; t += 200 * kMillis) {
    Heartbeat(core, "s0", t);
    Heartbeat(core, "w0", t);
    core.Tick(t);
  }
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 1);
}

TEST_F(CoordinatorCoreTest, WithoutReplicationALostServerStillFailsTheJob) {
  CoordinatorOptions o = Options(2, 1);
  o.server_lease = 1 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 2, 1, 0);
  EXPECT_EQ(core.shard_map().backup_counts_size(), 0);
  Heartbeat(core, "s0", 1500 * kMillis);
  Heartbeat(core, "w0", 1500 * kMillis);
  // Where a lost server ends the job, servers get the ordinary lease (3 s):
  // a short one would only make false alarms fatal.
  core.Tick(1500 * kMillis);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  Heartbeat(core, "s0", 3100 * kMillis);
  Heartbeat(core, "w0", 3100 * kMillis);
  core.Tick(3100 * kMillis);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("lost server 1 (s1)"), std::string::npos) << core.failure_reason();
}

TEST_F(CoordinatorCoreTest, LostCopiesAreRemadeAndARestartedServerRejoins) {
  const CoordinatorOptions o = Replicated(3, 1);
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(1100 * kMillis);  // s1 lost
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  auto view = ShardMapView::Create(core.shard_map());
  ASSERT_TRUE(view.ok());
  for (uint32_t v = 0; v < 8; ++v) EXPECT_EQ(view->BackupsOf(v).size(), 1u) << "copy of shard " << v << " not re-made";
  EXPECT_NE(core.TakeEvents()[0].find("lost copies re-made"), std::string::npos);
  // A new process registers for rank 1.
  SyncAll(core, 1150 * kMillis);
  auto out = core.Step(Register("s1-new", proto::SERVER, 1), 1200 * kMillis);
  auto to_new = To(out, "s1-new");
  ASSERT_GE(to_new.size(), 2u);
  ASSERT_TRUE(to_new[0].message.header.has_register_reply()) << to_new[0].message.header.ShortDebugString();
  const proto::NodeInfo self = to_new[0].message.header.register_reply().self();
  EXPECT_EQ(self.rank(), 1u);
  EXPECT_EQ(self.incarnation(), 1u);
  EXPECT_TRUE(to_new.back().message.header.has_job_ready());
  EXPECT_EQ(core.shard_map().epoch(), 3u);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  EXPECT_EQ(core.shard_map().servers(1).address(), "s1-new");
  EXPECT_EQ(core.shard_map().servers(1).node_id(), self.node_id());
  EXPECT_EQ(To(out, "s0").size(), 1u);  // everyone hears of the new map
  EXPECT_TRUE(To(out, "s0")[0].message.header.has_shard_map_update());
  // The old process's address is refused from now on.
  Message late = From("s1");
  late.header.mutable_heartbeat();
  auto refused = core.Step(late, 1300 * kMillis);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(refused[0].message.header.has_error());
  // Another loss: the rejoined server takes copies.
  SyncAll(core, 1150 * kMillis);  // the copies re-made after the first loss are in sync
  for (const char* n : {"s0", "s1-new", "w0"}) Heartbeat(core, n, 2000 * kMillis);
  core.Tick(2200 * kMillis);  // s2 silent since 1.15 s
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  view = ShardMapView::Create(core.shard_map());
  ASSERT_TRUE(view.ok());
  for (uint32_t v = 0; v < 8; ++v) {
    EXPECT_TRUE(view->Holds(0, v) && view->Holds(1, v)) << v << ": " << core.shard_map().ShortDebugString();
  }
}

// A server cut off from the coordinator (not dead) is declared lost; once the
// cut heals it hears of the new map, and registers again from its own
// address: it becomes a new node for its rank, empty, and gets copies.
TEST_F(CoordinatorCoreTest, ALostServerThatWasOnlyCutOffRejoinsFromItsAddress) {
  const CoordinatorOptions o = Replicated(3, 1);
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  const uint32_t old_id = core.shard_map().servers(1).node_id();
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(1100 * kMillis);  // s1 lost
  ASSERT_EQ(core.shard_map().dead_server_ranks_size(), 1);
  SyncAll(core, 1150 * kMillis);
  // The cut heals: its heartbeat (with the old epoch) gets the new map.
  Message hb = From("s1");
  hb.header.set_epoch(1);
  hb.header.mutable_heartbeat();
  auto out = core.Step(hb, 1200 * kMillis);
  bool map_sent = false;
  for (const Outgoing& x : To(out, "s1")) map_sent |= x.message.header.has_shard_map_update();
  EXPECT_TRUE(map_sent) << "a node behind on the map gets it";
  // It registers again for rank 1 from the same address.
  out = core.Step(Register("s1", proto::SERVER, 1), 1300 * kMillis);
  auto to_s1 = To(out, "s1");
  ASSERT_GE(to_s1.size(), 2u);
  ASSERT_TRUE(to_s1[0].message.header.has_register_reply()) << to_s1[0].message.header.ShortDebugString();
  const proto::NodeInfo self = to_s1[0].message.header.register_reply().self();
  EXPECT_EQ(self.rank(), 1u);
  EXPECT_EQ(self.incarnation(), 1u);
  EXPECT_NE(self.node_id(), old_id) << "a new node, not the lost one";
  EXPECT_TRUE(to_s1.back().message.header.has_job_ready());
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  EXPECT_EQ(core.shard_map().servers(1).node_id(), self.node_id());
  auto view = ShardMapView::Create(core.shard_map());
  ASSERT_TRUE(view.ok());
  bool rejoined = false;
  for (const std::string& e : core.TakeEvents()) rejoined |= e.find("server 1 rejoined from s1 (incarnation 1)") == 0;
  EXPECT_TRUE(rejoined);
  // Its heartbeats count for the new node from now on.
  Heartbeat(core, "s1", 1400 * kMillis);
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 1400 * kMillis);
  core.Tick(2000 * kMillis);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  // A retry of that registration (its reply lost) gets the same answer.
  out = core.Step(Register("s1", proto::SERVER, 1), 2100 * kMillis);
  ASSERT_FALSE(To(out, "s1").empty());
  EXPECT_EQ(To(out, "s1")[0].message.header.register_reply().self().node_id(), self.node_id());
}

// A coordinator that heard from nobody (its own host was cut off, or it
// was paused) does not take every server for dead: while the silence lasts,
// nobody is declared lost, and every node has a whole lease from the heal.
TEST_F(CoordinatorCoreTest, SilenceFromEveryNodeIsTakenForTheCoordinatorsOwn) {
  CoordinatorOptions o = Replicated(3, 1);
  o.isolation_give_up = 10 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  for (const char* n : {"s0", "s1", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.TakeEvents();
  core.Tick(2500 * kMillis);  // nobody for 1.6 s: the coordinator was cut off
  core.Tick(5 * kSeconds);    // and still is
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  auto events = core.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("heard from no node for 1.6 s"), std::string::npos) << events[0];
  // The network heals: everyone but s1 is heard; s1 is lost a lease after
  // the silence ended, not before.
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 5100 * kMillis);
  events = core.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("again after 4.2 s of silence from every node"), std::string::npos) << events[0];
  core.Tick(5500 * kMillis);
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 5900 * kMillis);
  core.Tick(5950 * kMillis);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  core.Tick(6100 * kMillis);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 1);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
}

// Nodes heartbeat at different moments: in a silence from every node, the
// lease of the one heard first runs out before the others'. It must not be
// declared lost for that.
TEST_F(CoordinatorCoreTest, TheFirstLeaseToRunOutInASilenceFromEveryNodeDoesNotCount) {
  const CoordinatorOptions o = Replicated(3, 1);  // server lease 1 s
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  Heartbeat(core, "s0", 500 * kMillis);
  for (const char* n : {"s1", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(1450 * kMillis);  // s0 silent 0.95 s; every node 0.55 s: the coordinator's silence
  core.Tick(1550 * kMillis);  // s0 would be 1.05 s
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  // Heard again, except s0: it is lost a whole lease after the silence.
  for (const char* n : {"s1", "s2", "w0"}) Heartbeat(core, n, 1600 * kMillis);
  for (const char* n : {"s1", "s2", "w0"}) Heartbeat(core, n, 2400 * kMillis);
  core.Tick(2500 * kMillis);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 0);
  core.Tick(2600 * kMillis);
  EXPECT_EQ(core.shard_map().dead_server_ranks_size(), 1);
}

TEST_F(CoordinatorCoreTest, SilenceThatOutlastsTheGiveUpIsEveryNodesLoss) {
  CoordinatorOptions o = Replicated(3, 1);
  o.isolation_give_up = 3 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  for (const char* n : {"s0", "s1", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(2 * kSeconds);     // taken for the coordinator's own silence
  core.Tick(3 * kSeconds);
  core.Tick(3950 * kMillis);   // 3.05 s: past the give-up, but a lease has not passed since 3 s
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  core.Tick(4100 * kMillis);   // they did all die
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
}

TEST_F(CoordinatorCoreTest, ARecruitNotYetInSyncIsNeverPromoted) {
  const CoordinatorOptions o = Replicated(3, 1);
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1, 0);
  for (const char* n : {"s0", "s2", "w0"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(1100 * kMillis);  // s1 lost: its copies re-made on s0 and s2, not yet in sync
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  // s2 is lost before any transfer is acknowledged: shards whose only synced
  // copy was on s2 are lost, though s0 is listed as their backup.
  for (const char* n : {"s0", "w0"}) Heartbeat(core, n, 2000 * kMillis);
  core.Tick(2100 * kMillis);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(core.failure_reason().find("last copy"), std::string::npos) << core.failure_reason();
}

TEST_F(CoordinatorCoreTest, WithRestoreALostShardGoesToALiveServerWithItsLastAppliedCount) {
  CoordinatorOptions o = Options(2, 1);
  o.replication = 1;
  o.lease = 1 * kSeconds;
  o.restore_lost_shards = true;
  CoordinatorCore core(o, 0);
  Assemble(core, 2, 1, 0);
  // s1 reports what it applied to its shards (1, 3, 5, 7).
  Message hb = From("s1");
  for (uint32_t v : {1u, 3u, 5u, 7u}) {
    hb.header.mutable_heartbeat()->add_vshards(v);
    hb.header.mutable_heartbeat()->add_applied(10 + v);
  }
  hb.header.mutable_heartbeat()->add_vshards(0);  // not its shard: ignored
  hb.header.mutable_heartbeat()->add_applied(99);
  core.Step(hb, 500 * kMillis);
  for (const char* n : {"s0", "w0"}) Heartbeat(core, n, 1200 * kMillis);
  auto out = core.Tick(1600 * kMillis);
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  auto to_s0 = To(out, "s0");
  ASSERT_EQ(to_s0.size(), 1u);
  const proto::ShardMapUpdate& u = to_s0[0].message.header.shard_map_update();
  ASSERT_EQ(u.restores_size(), 4);
  for (const auto& r : u.restores()) {
    EXPECT_EQ(r.last_applied(), 10 + r.vshard());
    EXPECT_EQ(u.shard_map().vshard_server_rank(r.vshard()), 0u);
  }
  auto events = core.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[1].find("restored from the last checkpoint"), std::string::npos) << events[1];
  EXPECT_NE(events[1].find("last reported 56 applied pushes"), std::string::npos) << events[1];  // 11+13+15+17
  // A coordinator that takes the job over now (a restart, a standby) still
  // owes s0 those restores, with the counts; the counts are left out of the
  // state saved on every change.
  {
    const proto::CoordinatorState saved = core.SaveState();
    EXPECT_EQ(saved.pending_restores_size(), 4);
    EXPECT_EQ(saved.applied_vshards_size(), 4);
    EXPECT_EQ(core.SaveState(/*with_counts=*/false).applied_vshards_size(), 0);
    CoordinatorCore successor(o, 0);
    ASSERT_TRUE(successor.RestoreState(saved, 1600 * kMillis).ok());
    Message m = From("s0");
    m.header.set_epoch(1);
    m.header.mutable_heartbeat();
    auto caught_up = To(successor.Step(m, 1650 * kMillis), "s0");
    ASSERT_EQ(caught_up.size(), 2u);  // the ack, and the map with the restores
    uint64_t applied = 0;
    for (const auto& r : caught_up[1].message.header.shard_map_update().restores()) applied += r.last_applied();
    EXPECT_EQ(caught_up[1].message.header.shard_map_update().restores_size(), 4);
    EXPECT_EQ(applied, 56u);
    EXPECT_EQ(successor.SaveState().SerializeAsString(), saved.SerializeAsString());
  }
  // s0 missed that update (its heartbeat says epoch 1): the catch-up map
  // carries the restores again; once it heartbeats at epoch 2 they are done.
  auto stale_heartbeat = [&](uint64_t epoch, Nanos now) {
    Message m = From("s0");
    m.header.set_epoch(epoch);
    m.header.mutable_heartbeat();
    return To(core.Step(m, now), "s0");
  };
  auto again = stale_heartbeat(1, 1700 * kMillis);
  ASSERT_EQ(again.size(), 2u);  // the ack, and the map
  EXPECT_EQ(again[1].message.header.shard_map_update().restores_size(), 4);
  EXPECT_EQ(stale_heartbeat(2, 1800 * kMillis).size(), 1u);  // up to date: just the ack
  again = stale_heartbeat(1, 1900 * kMillis);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[1].message.header.shard_map_update().restores_size(), 0) << "restored once already";
}

TEST_F(CoordinatorCoreTest, ARestartedCoordinatorTakesTheJobOverFromItsSavedState) {
  const CoordinatorOptions o = Replicated(3, 2);
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 2, 0);
  for (const char* n : {"s0", "s2", "w0", "w1"}) Heartbeat(core, n, 900 * kMillis);
  core.Tick(1100 * kMillis);  // s1 lost: epoch 2, copies re-made (syncing)
  Message barrier = From("w0");
  barrier.header.mutable_barrier_request()->set_name("b");
  core.Step(barrier, 1200 * kMillis);  // w0 waits at a barrier
  const proto::CoordinatorState saved = core.SaveState();
  ASSERT_EQ(saved.shard_map().epoch(), 2u);

  // A new process takes over at t = 50 s (its own clock).
  CoordinatorCore again(o, 50 * kSeconds);
  ASSERT_TRUE(again.RestoreState(saved, 50 * kSeconds).ok());
  EXPECT_EQ(again.phase(), CoordinatorCore::Phase::kRunning);
  EXPECT_EQ(again.SaveState().SerializeAsString(), saved.SerializeAsString());
  EXPECT_TRUE(again.Tick(50 * kSeconds + 500 * kMillis).empty()) << "nodes count as just heard from";
  // The barrier it was holding is released when w1 arrives.
  Message b1 = From("w1");
  b1.header.mutable_barrier_request()->set_name("b");
  auto out = again.Step(b1, 50 * kSeconds + 600 * kMillis);
  EXPECT_EQ(To(out, "w0").size(), 1u);
  EXPECT_EQ(To(out, "w1").size(), 1u);
  // A recruit still syncing is not promoted by the new coordinator either.
  for (const char* n : {"s0", "w0", "w1"}) Heartbeat(again, n, 51 * kSeconds);
  Heartbeat(again, "w0", 51 * kSeconds + 600 * kMillis);
  again.Tick(51 * kSeconds + 700 * kMillis);  // s2 silent since 50 s
  EXPECT_EQ(again.phase(), CoordinatorCore::Phase::kFailed);
  EXPECT_NE(again.failure_reason().find("last copy"), std::string::npos) << again.failure_reason();
  // Restoring twice, or a state with nonsense in it, is refused.
  EXPECT_EQ(again.RestoreState(saved, 0).code(), absl::StatusCode::kFailedPrecondition);
  proto::CoordinatorState bad = saved;
  bad.mutable_nodes(0)->mutable_info()->set_node_id(0);
  CoordinatorCore third(o, 0);
  EXPECT_EQ(third.RestoreState(bad, 0).code(), absl::StatusCode::kInvalidArgument);
  proto::CoordinatorState bad_rank = saved;
  bad_rank.mutable_nodes(0)->mutable_info()->set_rank(7);  // the job has 3 servers
  EXPECT_EQ(third.RestoreState(bad_rank, 0).code(), absl::StatusCode::kInvalidArgument);
  CoordinatorCore fourth(CoordinatorOptions{.servers = 2, .workers = 2}, 0);
  EXPECT_EQ(fourth.RestoreState(saved, 0).code(), absl::StatusCode::kInvalidArgument) << "another job's state";
}

TEST_F(CoordinatorCoreTest, StatsCountHeartbeatsLossesAndMaps) {
  CoordinatorCore core(Replicated(3, 2), 0);
  Assemble(core, 3, 2, 0);
  const uint64_t assembled = core.stats().messages;
  EXPECT_GE(assembled, 5u) << "five registrations";
  for (const char* n : {"s0", "s2", "w0", "w1"}) Heartbeat(core, n, 900 * kMillis);
  EXPECT_EQ(core.stats().heartbeats, 4u);
  EXPECT_EQ(core.stats().messages, assembled + 4);
  EXPECT_EQ(core.stats().servers_lost, 0u);
  core.Tick(1100 * kMillis);  // s1 silent: lost, failed over, copies re-made
  EXPECT_EQ(core.stats().servers_lost, 1u);
  EXPECT_EQ(core.stats().maps_published, 1u);
  EXPECT_GT(core.syncing_copies(), 0u);
  EXPECT_EQ(core.stats().workers_lost, 0u);
}

TEST_F(CoordinatorCoreTest, RegisteringNodesAreToldTheJobsHeartbeatInterval) {
  CoordinatorOptions o = Options(1, 1);
  o.heartbeat_interval = 200 * kMillis;
  CoordinatorCore core(o, 0);
  auto out = core.Step(Register("s0", proto::SERVER, 0), 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].message.header.register_reply().heartbeat_interval_ms(), 200u);
  // A repeated registration gets it too.
  out = core.Step(Register("s0", proto::SERVER, 0), 0);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0].message.header.register_reply().heartbeat_interval_ms(), 200u);
}

// The map updates in `out` (one broadcast: the map sent to each node).
static std::vector<proto::ShardMap> MapsIn(const std::vector<Outgoing>& out, const std::string& to) {
  std::vector<proto::ShardMap> maps;
  for (const Outgoing& o : out)
    if (o.to == to && o.message.header.has_shard_map_update()) maps.push_back(o.message.header.shard_map_update().shard_map());
  return maps;
}

TEST_F(CoordinatorCoreTest, AMoveCopiesTheShardThenSwitchesItsPrimary) {
  CoordinatorCore core(Options(3, 1), 0);  // no replication: a move still copies first
  Assemble(core, 3, 1);
  const uint32_t v = 0, from = core.shard_map().vshard_server_rank(0), to = (from + 1) % 3;
  auto started = core.StartMove(v, to, 1 * kSeconds, "a test");
  ASSERT_TRUE(started.ok()) << started.status();
  std::vector<proto::ShardMap> maps = MapsIn(*started, "w0");
  ASSERT_EQ(maps.size(), 1u);
  auto view = ShardMapView::Create(maps[0]);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->ServerRankOf(v), from);
  EXPECT_EQ(view->MovingTo(v), to);
  EXPECT_EQ(core.moves_in_progress(), 1u);
  EXPECT_EQ(core.StartMove(1, to, 1 * kSeconds).status().code(), absl::StatusCode::kFailedPrecondition)
      << "one move at a time";
  // The primary's heartbeat under an older map does not count; under this one it does.
  Message old = From("s" + std::to_string(from));
  old.header.set_epoch(maps[0].epoch() - 1);
  old.header.mutable_heartbeat()->add_moves_in_sync(v);
  EXPECT_TRUE(MapsIn(core.Step(old, 2 * kSeconds), "w0").empty());
  Message hb = From("s" + std::to_string(from));
  hb.header.set_epoch(maps[0].epoch());
  hb.header.mutable_heartbeat()->add_moves_in_sync(v);
  maps = MapsIn(core.Step(hb, 2 * kSeconds), "w0");
  ASSERT_EQ(maps.size(), 1u);
  view = ShardMapView::Create(maps[0]);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->ServerRankOf(v), to);
  EXPECT_FALSE(view->Holds(from, v));
  EXPECT_EQ(core.moves_in_progress(), 0u);
  EXPECT_EQ(core.stats().moves_started, 1u);
  EXPECT_EQ(core.stats().moves_finished, 1u);
  bool said = false;
  for (const std::string& e : core.TakeEvents()) said |= e.find("moved shard 0 from server") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST_F(CoordinatorCoreTest, AMoveThatDoesNotSyncIsCancelledAndBadMovesAreRefused) {
  CoordinatorOptions o = Options(3, 1);
  o.move_timeout = 5 * kSeconds;
  o.lease = 100 * kSeconds;
  CoordinatorCore core(o, 0);
  EXPECT_EQ(core.StartMove(0, 1, 0).status().code(), absl::StatusCode::kFailedPrecondition) << "not running yet";
  Assemble(core, 3, 1);
  const uint32_t from = core.shard_map().vshard_server_rank(0);
  EXPECT_EQ(core.StartMove(0, from, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core.StartMove(0, 9, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core.StartMove(99, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(core.StartMove(0, (from + 1) % 3, 1 * kSeconds).ok());
  EXPECT_TRUE(MapsIn(core.Tick(5 * kSeconds), "w0").empty());
  std::vector<proto::ShardMap> maps = MapsIn(core.Tick(6 * kSeconds), "w0");
  ASSERT_EQ(maps.size(), 1u);
  auto view = ShardMapView::Create(maps[0]);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->ServerRankOf(0), from);
  EXPECT_EQ(view->MovingTo(0), ShardMapView::kNotMoving);
  EXPECT_FALSE(view->Holds((from + 1) % 3, 0));
  EXPECT_EQ(core.stats().moves_cancelled, 1u);
  EXPECT_EQ(core.moves_in_progress(), 0u);
}

TEST_F(CoordinatorCoreTest, ARestartedCoordinatorFinishesOrCancelsAMoveItFindsInTheMap) {
  CoordinatorOptions o = Options(3, 1);
  o.move_timeout = 5 * kSeconds;
  o.lease = 100 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1);
  const uint32_t from = core.shard_map().vshard_server_rank(0);
  ASSERT_TRUE(core.StartMove(0, (from + 1) % 3, 1 * kSeconds).ok());
  const proto::CoordinatorState saved = core.SaveState();
  CoordinatorCore again(o, 10 * kSeconds);
  ASSERT_TRUE(again.RestoreState(saved, 10 * kSeconds).ok());
  EXPECT_TRUE(MapsIn(again.Tick(10 * kSeconds), "w0").empty()) << "the move gets a new deadline";
  EXPECT_EQ(again.moves_in_progress(), 1u);
  EXPECT_EQ(MapsIn(again.Tick(16 * kSeconds), "w0").size(), 1u) << "and is cancelled after it";
  EXPECT_EQ(again.stats().moves_cancelled, 1u);
}

TEST_F(CoordinatorCoreTest, TheRebalancerMovesAShardOffAServerThatCarriesTooMuch) {
  CoordinatorOptions o = Options(3, 1);
  o.vshards = 12;
  o.lease = 100 * kSeconds;
  o.rebalance.threshold = 1.25;
  o.rebalance.interval = 5 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 3, 1);
  const proto::ShardMap first = core.shard_map();
  // Every shard of server 0 takes 300 requests/s, the others 100.
  auto beat = [&](uint32_t rank, Nanos now) {
    Message m = From("s" + std::to_string(rank));
    m.header.set_epoch(core.shard_map().epoch());
    proto::Heartbeat* hb = m.header.mutable_heartbeat();
    for (uint32_t v = 0; v < 12; ++v) {
      if (core.shard_map().vshard_server_rank(v) != rank) continue;
      proto::ShardLoad* l = hb->add_shard_loads();
      l->set_vshard(v);
      l->set_requests(static_cast<uint64_t>((first.vshard_server_rank(v) == 0 ? 300 : 100) * (now / kSeconds)));
    }
    return core.Step(m, now);
  };
  std::vector<proto::ShardMap> maps;
  for (Nanos t = 1 * kSeconds; t <= 60 * kSeconds && maps.empty(); t += 1 * kSeconds) {
    for (uint32_t r = 0; r < 3; ++r) beat(r, t);
    maps = MapsIn(core.Tick(t), "w0");
  }
  ASSERT_EQ(maps.size(), 1u) << "a move started";
  auto view = ShardMapView::Create(maps[0]);
  ASSERT_TRUE(view.ok());
  uint32_t moving = 0, dest = 0;
  for (uint32_t v = 0; v < 12; ++v)
    if (view->MovingTo(v) != ShardMapView::kNotMoving) moving = v, dest = view->MovingTo(v);
  EXPECT_EQ(view->ServerRankOf(moving), 0u) << "off the busiest";
  EXPECT_NE(dest, 0u);
  bool said = false;
  for (const std::string& e : core.TakeEvents()) said |= e.find("mean load per unit of weight") != std::string::npos;
  EXPECT_TRUE(said) << "the event line says why";
}

TEST_F(CoordinatorCoreTest, AServerJoinsARunningJobUpToMaxServers) {
  CoordinatorOptions o = Options(2, 1);
  o.max_servers = 3;
  o.lease = 100 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 2, 1);
  ASSERT_EQ(core.shard_map().servers_size(), 2);
  // Not the next rank: refused, saying which is.
  auto out = core.Step(Register("s5", proto::SERVER, 5), 1 * kSeconds);
  ASSERT_EQ(To(out, "s5").size(), 1u);
  EXPECT_NE(To(out, "s5")[0].message.header.error().message().find("as the next rank, 2"), std::string::npos)
      << To(out, "s5")[0].message.header.ShortDebugString();
  out = core.Step(Register("s2", proto::SERVER, -1), 1 * kSeconds);
  const auto to_new = To(out, "s2");
  ASSERT_EQ(to_new.size(), 3u) << "its registration, the map, and the job";
  EXPECT_EQ(to_new[0].message.header.register_reply().self().rank(), 2u);
  EXPECT_TRUE(to_new[2].message.header.has_job_ready());
  std::vector<proto::ShardMap> maps = MapsIn(out, "w0");
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].servers_size(), 3);
  EXPECT_EQ(maps[0].epoch(), 2u);
  for (uint32_t v = 0; v < 8; ++v) EXPECT_NE(maps[0].vshard_server_rank(v), 2u) << "it holds nothing yet";
  EXPECT_EQ(core.stats().servers_added, 1u);
  // It can be moved to, and the state with three servers restores.
  ASSERT_TRUE(core.StartMove(0, 2, 2 * kSeconds).ok());
  CoordinatorCore again(o, 3 * kSeconds);
  ASSERT_TRUE(again.RestoreState(core.SaveState(), 3 * kSeconds).ok());
  EXPECT_EQ(again.shard_map().servers_size(), 3);
  // At max_servers no more join.
  out = core.Step(Register("s3", proto::SERVER, -1), 4 * kSeconds);
  ASSERT_EQ(To(out, "s3").size(), 1u);
  EXPECT_TRUE(To(out, "s3")[0].message.header.has_error());
  EXPECT_EQ(core.shard_map().servers_size(), 3);
  // Without max_servers a job does not grow.
  CoordinatorCore fixed(Options(2, 1), 0);
  Assemble(fixed, 2, 1);
  out = fixed.Step(Register("s2", proto::SERVER, -1), 1 * kSeconds);
  ASSERT_EQ(To(out, "s2").size(), 1u);
  EXPECT_TRUE(To(out, "s2")[0].message.header.has_error());
}

TEST_F(CoordinatorCoreTest, ADrainedServerHandsEveryCopyOverAndIsToldToStop) {
  CoordinatorOptions o = Replicated(4, 1);
  o.server_lease = 100 * kSeconds;
  o.lease = 100 * kSeconds;
  o.rebalance.threshold = 1.1;  // paused while a server drains
  CoordinatorCore core(o, 0);
  Assemble(core, 4, 1);
  SyncAll(core, 0);
  const uint32_t held = CopiesHeldBy(core.shard_map(), 3);
  ASSERT_GT(held, 0u);
  auto drain = [&](uint32_t rank, Nanos now) {
    Message m = From("admin", 7);
    m.header.mutable_drain_request()->set_server_rank(rank);
    return core.Step(m, now);
  };
  std::vector<Outgoing> out = drain(3, 1 * kSeconds);
  std::vector<Outgoing> replies = To(out, "admin");
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].message.header.has_drain_reply()) << replies[0].message.header.DebugString();
  EXPECT_EQ(replies[0].message.header.request_id(), 7u);
  EXPECT_EQ(replies[0].message.header.drain_reply().copies_left(), held);
  EXPECT_FALSE(replies[0].message.header.drain_reply().removed());
  EXPECT_NE(replies[0].message.header.drain_reply().state().find("moving shard"), std::string::npos)
      << replies[0].message.header.drain_reply().state();
  EXPECT_TRUE(IsDraining(core.shard_map(), 3));
  EXPECT_EQ(core.moves_in_progress(), 1u) << "the first move starts at once";
  // Each move finishes when its primary reports the destination in sync; the next starts on the tick.
  Nanos now = 2 * kSeconds;
  for (int step = 0; step < 100 && !core.Removed(3); ++step, now += kSeconds) {
    const proto::ShardMap& map = core.shard_map();
    ASSERT_EQ(map.moving_vshards_size(), 1) << step;
    const uint32_t v = map.moving_vshards(0);
    EXPECT_EQ(MovingFrom(map, v), 3u);
    EXPECT_FALSE(IsDraining(map, MovingTo(map, v)));
    Message hb = From(map.servers(map.vshard_server_rank(v)).address(), 0);
    hb.header.set_epoch(map.epoch());
    hb.header.mutable_heartbeat()->add_moves_in_sync(v);
    out = core.Step(hb, now);
    std::vector<Outgoing> tick = core.Tick(now);
    out.insert(out.end(), tick.begin(), tick.end());
  }
  ASSERT_TRUE(core.Removed(3));
  EXPECT_EQ(core.stats().moves_finished, held);
  EXPECT_EQ(core.stats().servers_drained, 1u);
  EXPECT_EQ(core.stats().servers_lost, 0u);
  bool stopped = false;
  for (const Outgoing& m : To(out, "s3")) stopped |= m.message.header.has_shutdown() && m.message.header.shutdown().ok();
  EXPECT_TRUE(stopped) << "the drained server is told to stop, in order";
  const proto::ShardMap& map = core.shard_map();
  auto view = ShardMapView::Create(map);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->IsDead(3));
  EXPECT_FALSE(IsDraining(map, 3));
  for (uint32_t v = 0; v < map.num_vshards(); ++v) {
    EXPECT_FALSE(view->Holds(3, v)) << v;
    EXPECT_EQ(view->BackupsOf(v).size(), 1u) << "two copies of shard " << v;
  }
  // Asked again: removed. It is not lost when it falls silent, and a late message gets the Shutdown again.
  replies = To(drain(3, now), "admin");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].message.header.drain_reply().removed());
  for (const char* n : {"s0", "s1", "s2", "w0"}) Heartbeat(core, n, now + 200 * kSeconds);
  core.Tick(now + 200 * kSeconds);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << core.failure_reason();
  EXPECT_EQ(core.stats().servers_lost, 0u);
  out = Heartbeat(core, "s3", now + 201 * kSeconds);
  ASSERT_FALSE(To(out, "s3").empty());
  EXPECT_TRUE(To(out, "s3").back().message.header.has_shutdown());
  // Three servers left with two copies each: one more may drain, not two.
  replies = To(drain(0, now + 202 * kSeconds), "admin");
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].message.header.has_drain_reply());
  replies = To(drain(1, now + 202 * kSeconds), "admin");
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].message.header.has_error());
  EXPECT_NE(replies[0].message.header.error().message().find("1 server would be left"), std::string::npos)
      << replies[0].message.header.error().message();
  // A drain survives a restart of the coordinator.
  CoordinatorCore again(o, now);
  ASSERT_TRUE(again.RestoreState(core.SaveState(), now).ok());
  EXPECT_TRUE(IsDraining(again.shard_map(), 0));
  EXPECT_TRUE(again.Removed(3));
}

TEST_F(CoordinatorCoreTest, AWorkerJoinsTheRunningJobAndPassesTheBarriersItMissed) {
  CoordinatorOptions o = Options(1, 2);
  o.max_workers = 3;
  o.lease = 100 * kSeconds;
  CoordinatorCore core(o, 0);
  Assemble(core, 1, 2);
  ASSERT_EQ(core.phase(), CoordinatorCore::Phase::kRunning);
  auto barrier = [&](const std::string& from, const std::string& name, Nanos now) {
    Message m = From(from, 3);
    m.header.mutable_barrier_request()->set_name(name);
    return core.Step(m, now);
  };
  auto released = [](const std::vector<Outgoing>& out, const std::string& to) {
    for (const Outgoing& o : out)
      if (o.to == to && o.message.header.has_barrier_release()) return true;
    return false;
  };
  barrier("w0", "start", kSeconds);
  ASSERT_TRUE(released(barrier("w1", "start", kSeconds), "w0"));
  barrier("w0", "epoch-1", 2 * kSeconds);  // w1 not there yet
  // Not the next rank: refused; the next rank, or any, joins.
  std::vector<Outgoing> out = core.Step(Register("w9", proto::WORKER, 5), 3 * kSeconds);
  ASSERT_FALSE(out.empty());
  EXPECT_FALSE(out[0].message.header.has_register_reply() && !out[0].message.header.has_error());
  out = core.Step(Register("w2", proto::WORKER, -1), 3 * kSeconds);
  std::vector<Outgoing> to_w2 = To(out, "w2");
  ASSERT_EQ(to_w2.size(), 2u);
  ASSERT_TRUE(to_w2[0].message.header.has_register_reply());
  EXPECT_EQ(to_w2[0].message.header.register_reply().self().rank(), 2u);
  EXPECT_TRUE(to_w2[0].message.header.register_reply().joined_running_job());
  EXPECT_TRUE(to_w2[1].message.header.has_job_ready());
  EXPECT_EQ(to_w2[1].message.header.job_ready().nodes_size(), 4);
  EXPECT_EQ(core.stats().workers_added, 1u);
  // A repeated registration says it joined the running job too.
  out = core.Step(Register("w2", proto::WORKER, -1), 3 * kSeconds);
  ASSERT_FALSE(To(out, "w2").empty());
  EXPECT_TRUE(To(out, "w2")[0].message.header.register_reply().joined_running_job());
  // "start" was passed before it joined: released to it at once.
  EXPECT_TRUE(released(barrier("w2", "start", 4 * kSeconds), "w2"));
  // "epoch-1" is under way: it waits for all three.
  out = barrier("w1", "epoch-1", 5 * kSeconds);
  EXPECT_FALSE(released(out, "w0")) << "the job waits for the newcomer";
  out = barrier("w2", "epoch-1", 6 * kSeconds);
  EXPECT_TRUE(released(out, "w0") && released(out, "w1") && released(out, "w2"));
  // A restarted coordinator knows it (rank 2 of at most 3).
  CoordinatorCore again(o, 7 * kSeconds);
  ASSERT_TRUE(again.RestoreState(core.SaveState(), 7 * kSeconds).ok());
  // The job ends once all three are done.
  for (const char* w : {"w0", "w1"}) {
    Message done = From(w, 9);
    done.header.mutable_worker_done();
    core.Step(done, 8 * kSeconds);
  }
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kRunning) << "w2 has not finished";
  Message done = From("w2", 9);
  done.header.mutable_worker_done();
  core.Step(done, 9 * kSeconds);
  EXPECT_EQ(core.phase(), CoordinatorCore::Phase::kDone);
  // At max_workers, no more join.
  CoordinatorCore full(o, 0);
  Assemble(full, 1, 2);
  full.Step(Register("w2", proto::WORKER, 2), kSeconds);
  out = full.Step(Register("w3", proto::WORKER, 3), kSeconds);
  EXPECT_EQ(full.stats().workers_added, 1u);
}

}  // namespace
}  // namespace tessera
