// I1-I4 under BSP, SSP(1), SSP(3) and ASP with stragglers, on an in-process
// cluster; the negative control shows the checker catches early answers; a
// worker that dies under BSP is dropped or stops the job, by policy.
#include <gtest/gtest.h>

#include "tests/cluster/inproc_cluster.h"
#include "tests/consistency/consistency_checker.h"

namespace tessera::consistency {
namespace {

struct Case {
  const char* name;
  proto::ConsistencyKind kind;
  uint32_t staleness;
};

class ConsistencyTest : public ::testing::TestWithParam<Case> {};

CheckResult RunAndCheck(const Case& c, bool answer_early, uint64_t seed) {
  constexpr uint32_t kWorkers = 4;
  ClusterOptions co{.servers = 2, .workers = kWorkers, .started_servers = 2, .vshards = 16};
  co.server.testing.answer_early = answer_early;
  InProcCluster cluster(co);
  auto workers = Unwrap(cluster.ConnectWorkers());
  EXPECT_EQ(workers.size(), kWorkers);
  Recorder rec;
  WorkloadOptions wo{.consistency = c.kind, .staleness = c.staleness, .seed = seed};
  auto statuses = OnEachWorker(workers, [&](Worker& w) { return RunWorkload(w, wo, rec); });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  statuses = OnEachWorker(workers, [](Worker& w) { return w.Finish({}); });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  uint64_t staleness = c.kind == proto::ASP ? kUnbounded : c.kind == proto::BSP ? 0 : c.staleness;
  return Check(rec, kWorkers, staleness);
}

TEST_P(ConsistencyTest, InvariantsHold) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    CheckResult r = RunAndCheck(GetParam(), false, seed);
    EXPECT_GT(r.pulls_checked, 0u);
    for (const auto& v : r.violations) ADD_FAILURE() << "seed " << seed << ": " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ConsistencyTest,
                         ::testing::Values(Case{"BSP", proto::BSP, 0}, Case{"SSP1", proto::SSP, 1},
                                           Case{"SSP3", proto::SSP, 3}, Case{"ASP", proto::ASP, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

// Negative control: a server that answers pulls without waiting must be caught.
TEST(ConsistencyCheckerTest, CatchesAServerThatAnswersPullsEarly) {
  uint64_t i2 = 0;
  for (uint64_t seed = 1; seed <= 3 && i2 == 0; ++seed) i2 += RunAndCheck({"BSP", proto::BSP, 0}, true, seed).i2;
  EXPECT_GT(i2, 0u) << "the checker missed a server that answers pulls early";
}

// The checker itself, on hand-made records.
TEST(ConsistencyCheckerTest, FlagsEachInvariantOnHandMadeRecords) {
  Recorder rec;
  rec.Add(PushEvent{0, 0, {5}, 10});
  rec.Add(PushEvent{1, 0, {5}, 11});
  rec.Add(ClockEvent{0, 1, 15, 25});
  rec.Add(ClockEvent{1, 1, 20, 21});
  // Worker 0 pulls at clock 1 (BSP) but sees nothing of worker 1's clock-0 push (I2),
  // nothing of its own push (I3), and two pushes of worker 1 where one was issued (I4).
  rec.Add(PullEvent{0, 1, {5}, {0.0f, 2.0f}, 30, 40});
  // Worker 0 returns from Clock() to 2 while worker 1 announced only 1 (I1).
  rec.Add(ClockEvent{0, 2, 50, 60});
  CheckResult r = Check(rec, 2, 0);
  EXPECT_EQ(r.i1, 1u);
  EXPECT_EQ(r.i2, 1u);  // worker 0's own column is short too, but that is counted once per cell
  EXPECT_EQ(r.i3, 1u);
  EXPECT_EQ(r.i4, 1u);
}

// A push that was never acknowledged (its worker died) need not be seen,
// but it still counts as issued: a pull may reflect it.
TEST(ConsistencyCheckerTest, APushThatMayBeMissingIsNeitherRequiredNorAPhantom) {
  for (bool may_be_missing : {false, true}) {
    Recorder rec;
    rec.Add(PushEvent{1, 0, {5}, 11, may_be_missing});
    rec.Add(PushEvent{0, 0, {5}, 12, may_be_missing});
    rec.Add(ClockEvent{0, 1, 15, 25});
    rec.Add(ClockEvent{1, 1, 20, 21});
    rec.Add(PullEvent{0, 1, {5}, {0.0f, 0.0f}, 30, 40});  // sees neither
    rec.Add(PullEvent{1, 1, {5}, {1.0f, 1.0f}, 30, 40});  // sees both
    CheckResult r = Check(rec, 2, 0);
    EXPECT_EQ(r.i2, may_be_missing ? 0u : 2u);
    EXPECT_EQ(r.i3, may_be_missing ? 0u : 1u);
    EXPECT_EQ(r.i4, 0u);
  }
}

TEST(ConsistencyCheckerTest, RecordsSurviveAFileRoundTrip) {
  Recorder a;
  a.Add(PushEvent{0, 3, {1, 2}, 10});
  a.Add(PullEvent{1, 2, {1}, {1.0f, 0.0f}, 5, 6});
  a.Add(ClockEvent{0, 4, 7, 8});
  a.Add(FinishEvent{1, 9});
  std::string path = ::testing::TempDir() + "/records.txt";
  ASSERT_TRUE(a.WriteTo(path).ok());
  Recorder b;
  ASSERT_TRUE(b.ReadFrom(path).ok());
  ASSERT_EQ(b.pulls().size(), 1u);
  EXPECT_EQ(b.pulls()[0].values, (std::vector<float>{1.0f, 0.0f}));
  EXPECT_EQ(b.pushes()[0].keys, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(b.clocks()[0].new_clock, 4u);
  EXPECT_EQ(b.finishes()[0].finished_ns, 9);
}

// A worker dies mid-job under BSP: with the continue policy the others go on
// once its lease expires; with the stop policy the job fails naming it.
void KillOneWorker(WorkerLossPolicy policy) {
  ClusterOptions co{.servers = 1, .workers = 3, .started_servers = 1, .vshards = 8};
  co.lease = 1 * kSeconds;
  co.on_worker_loss = policy;
  InProcCluster cluster(co);
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 3u);
  for (auto& w : workers) {
    ASSERT_TRUE(w->CreateTable({.id = 1, .width = 1, .optimizer = proto::ACCUMULATE, .consistency = proto::BSP}).ok());
  }
  workers[2].reset();  // dies: no more heartbeats, never clocks again
  const Nanos start = MonotonicNow();
  std::vector<std::unique_ptr<Worker>> live;
  live.push_back(std::move(workers[0]));
  live.push_back(std::move(workers[1]));
  auto statuses = OnEachWorker(live, [](Worker& w) { return w.Clock(); });
  const Nanos waited = MonotonicNow() - start;
  if (policy == WorkerLossPolicy::kContinue) {
    for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
    statuses = OnEachWorker(live, [](Worker& w) { return w.Finish({}); });
    for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(cluster.CoordinatorResult().ok());
    EXPECT_NE(cluster.Summary().find("\"lost\": \"worker 2"), std::string::npos) << cluster.Summary();
  } else {
    for (auto& s : statuses) {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.message().find("worker 2"), std::string::npos) << s;
    }
    absl::Status c = cluster.CoordinatorResult();
    EXPECT_NE(c.message().find("lost worker 2"), std::string::npos) << c;
  }
  // Detected within the lease plus a second (generous on a loaded machine).
  EXPECT_LT(waited, 1 * kSeconds + 1 * kSeconds + 500 * kMillis);
}

// With the wait policy, the others wait for a dead worker's clock until a
// replacement takes its place; the replacement resumes at its predecessor's
// clock, sees its acknowledged pushes, passes the barriers it passed, and
// releases the others by clocking.
TEST(WorkerLossTest, WaitPolicyKeepsThePlaceForAReplacementThatResumes) {
  ClusterOptions co{.servers = 2, .workers = 3, .started_servers = 2, .vshards = 8};
  co.lease = 1 * kSeconds;
  co.on_worker_loss = WorkerLossPolicy::kWait;
  co.rejoin_timeout = 30 * kSeconds;
  co.hold_timeout = 30 * kSeconds;
  InProcCluster cluster(co);
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 3u);
  const TableOptions table{.id = 1, .width = 1, .optimizer = proto::ACCUMULATE, .consistency = proto::BSP};
  const std::vector<Key> keys = {7, 8, 9, 10};  // on both servers
  const std::vector<float> ones(keys.size(), 1.0f);
  auto step = [&](Worker& w) -> absl::Status {
    if (auto s = w.Push(1, keys, ones).Wait(); !s.ok()) return s;
    return w.Clock();
  };
  for (auto& w : workers) ASSERT_TRUE(w->CreateTable(table).ok());
  auto statuses = OnEachWorker(workers, [](Worker& w) { return w.Barrier("start"); });
  for (auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  for (int c = 0; c < 2; ++c) {
    statuses = OnEachWorker(workers, step);
    for (auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_EQ(workers[2]->clock(), 2u);
  workers[2].reset();  // dies after two acknowledged pushes and clocks

  // The others take a step; their Clock() to 3 waits for worker 2's place.
  std::vector<std::future<absl::Status>> waiting;
  for (int i = 0; i < 2; ++i) waiting.push_back(std::async(std::launch::async, [&, i] { return step(*workers[i]); }));
  for (auto& f : waiting) {
    ASSERT_EQ(f.wait_for(std::chrono::milliseconds(2500)), std::future_status::timeout)
        << "released without worker 2: " << f.get();
  }

  auto replacement = cluster.ConnectWorker(2);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  Worker& r = **replacement;
  EXPECT_EQ(r.rank(), 2u);
  EXPECT_EQ(r.incarnation(), 1u);
  ASSERT_EQ(r.clock(), 2u) << "resumes at its predecessor's clock";
  ASSERT_TRUE(r.CreateTable(table).ok());
  ASSERT_TRUE(r.Barrier("start").ok()) << "its predecessor passed it";
  std::vector<float> out(keys.size());
  ASSERT_TRUE(r.Pull(1, keys, out).Wait().ok());
  // Under BSP a pull at clock 2 sees every push stamped 0 and 1: 3 workers x 2,
  // its predecessor's included (the others' clock-2 pushes may be there too).
  for (float v : out) EXPECT_GE(v, 6.0f);
  ASSERT_TRUE(step(r).ok());
  for (auto& f : waiting) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
  }
  workers[2] = std::move(*replacement);
  statuses = OnEachWorker(workers, [](Worker& w) { return w.Finish({}); });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(cluster.CoordinatorResult().ok());
  EXPECT_NE(cluster.Summary().find("\"incarnation\": 1"), std::string::npos) << cluster.Summary();
}

TEST(WorkerLossTest, ContinuePolicyDropsTheDeadWorker) { KillOneWorker(WorkerLossPolicy::kContinue); }
TEST(WorkerLossTest, StopPolicyFailsTheJobNamingTheDeadWorker) { KillOneWorker(WorkerLossPolicy::kStopJob); }

}  // namespace
}  // namespace tessera::consistency
