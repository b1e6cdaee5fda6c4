// A whole job in one process: the real coordinator, server and worker shells
// and cores, wired through the in-process transport.
#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <thread>

#include "tests/cluster/inproc_cluster.h"

namespace tessera {
namespace {

// The integer gradient worker w pushes for element j of key k in round r.
float Gradient(uint32_t w, Key k, uint32_t j, uint32_t r) {
  return static_cast<float>((w + 1) * ((k % 7) + 1) + j + r);
}

TEST(InProcClusterTest, PulledRowsEqualTheExactSumOfEveryPush) {
  constexpr uint32_t kWorkers = 3, kWidth = 4, kKeys = 2000, kRounds = 4, kBatch = 250;
  InProcCluster cluster({.servers = 3, .workers = kWorkers, .started_servers = 3, .vshards = 64});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), kWorkers);

  TableOptions sparse{.id = 1, .name = "sparse", .width = kWidth, .kind = proto::SPARSE,
                      .optimizer = proto::ACCUMULATE};
  TableOptions dense{.id = 2, .name = "dense", .width = 1, .kind = proto::DENSE, .dense_rows = kKeys,
                     .optimizer = proto::ACCUMULATE};
  auto statuses = OnEachWorker(workers, [&](Worker& w) -> absl::Status {
    if (auto s = w.CreateTable(sparse); !s.ok()) return s;
    if (auto s = w.CreateTable(dense); !s.ok()) return s;
    if (auto s = w.Barrier("created"); !s.ok()) return s;
    // Many pushes in flight at once: every batch of every round is issued
    // before any is waited for.
    const uint32_t r = w.rank();
    std::vector<std::vector<Key>> keys;
    std::vector<std::vector<float>> values, ones;
    for (uint32_t round = 0; round < kRounds; ++round) {
      for (Key start = 0; start < kKeys; start += kBatch) {
        std::vector<Key> k(kBatch);
        std::iota(k.begin(), k.end(), start);
        std::vector<float> v;
        for (Key key : k)
          for (uint32_t j = 0; j < kWidth; ++j) v.push_back(Gradient(r, key, j, round));
        keys.push_back(std::move(k));
        values.push_back(std::move(v));
        ones.push_back(std::vector<float>(kBatch, 1.0f));
      }
    }
    std::vector<Future> futures;
    for (size_t i = 0; i < keys.size(); ++i) {
      futures.push_back(w.Push(1, keys[i], values[i]));
      futures.push_back(w.Push(2, keys[i], ones[i]));
    }
    for (auto& f : futures)
      if (auto s = f.Wait(); !s.ok()) return s;
    return w.Barrier("pushed");
  });
  for (auto& s : statuses) ASSERT_TRUE(s.ok()) << s;

  // Every worker pulls every row, in one request across all shards.
  std::vector<Key> all(kKeys);
  std::iota(all.begin(), all.end(), 0);
  statuses = OnEachWorker(workers, [&](Worker& w) -> absl::Status {
    std::vector<float> rows(kKeys * kWidth, -1.0f), counts(kKeys, -1.0f);
    PulledRows view;  // the same rows, left in the reply frames
    Future a = w.Pull(1, all, rows);
    Future b = w.Pull(2, all, counts);
    Future c = w.PullView(1, all, &view);
    if (auto s = a.Wait(); !s.ok()) return s;
    if (auto s = b.Wait(); !s.ok()) return s;
    if (auto s = c.Wait(); !s.ok()) return s;
    if (view.size() != kKeys || view.width() != kWidth) return absl::InternalError("view of the wrong shape");
    for (Key k = 0; k < kKeys; ++k) {
      for (uint32_t j = 0; j < kWidth; ++j) {
        float expected = 0;
        for (uint32_t wr = 0; wr < kWorkers; ++wr)
          for (uint32_t round = 0; round < kRounds; ++round) expected += Gradient(wr, k, j, round);
        if (rows[k * kWidth + j] != expected || view.row(k)[j] != expected) {
          return absl::InternalError(absl::StrCat("key ", k, " element ", j, ": pulled ", rows[k * kWidth + j],
                                                  " (view ", view.row(k)[j], "), expected ", expected));
        }
      }
      if (counts[k] != kWorkers * kRounds) {
        return absl::InternalError(absl::StrCat("dense key ", k, ": pulled ", counts[k]));
      }
    }
    return absl::OkStatus();
  });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;

  statuses = OnEachWorker(workers, [](Worker& w) {
    proto::WorkerDone done;
    done.set_steps(7);
    done.set_report_json("{\"checked\": true}");
    return w.Finish(done);
  });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(cluster.CoordinatorResult().ok());
  for (auto& s : cluster.ServerResults()) EXPECT_TRUE(s.ok()) << s;
  std::string summary = cluster.Summary();
  EXPECT_NE(summary.find("\"status\": \"ok\""), std::string::npos) << summary;
  EXPECT_NE(summary.find("{\"checked\": true}"), std::string::npos) << summary;
}

// A view holds the rows as the server answered them: later pushes change
// the server's row (copy-on-write, server/table.h), never the view.
// Rows wider than the workers' part_bytes are pushed in pieces of columns
// (WorkerOptions::part_bytes): with every shard on two servers, the pulled
// rows equal the exact sum of every push, on the primaries and, after the
// sums are read, the same rows for a table whose optimizer takes whole rows
// only (ADAM: its wide pushes go whole and are applied).
TEST(InProcClusterTest, WideRowsPushedInPiecesSumExactly) {
  constexpr uint32_t kWorkers = 2, kWidth = 1000, kRows = 8, kRounds = 3;
  InProcCluster cluster({.servers = 2, .workers = kWorkers, .started_servers = 2, .vshards = 16,
                         .replication = 2, .part_bytes = 1024});  // pieces of 256 columns
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), kWorkers);
  TableOptions dense{.id = 1, .name = "wide", .width = kWidth, .kind = proto::DENSE, .dense_rows = kRows,
                     .optimizer = proto::ACCUMULATE};
  TableOptions adam{.id = 2, .name = "wide-adam", .width = kWidth, .kind = proto::DENSE, .dense_rows = kRows,
                    .optimizer = proto::ADAM, .learning_rate = 0.01f};
  std::vector<Key> keys(kRows);
  std::iota(keys.begin(), keys.end(), 0);
  auto statuses = OnEachWorker(workers, [&](Worker& w) -> absl::Status {
    if (auto s = w.CreateTable(dense); !s.ok()) return s;
    if (auto s = w.CreateTable(adam); !s.ok()) return s;
    if (auto s = w.Barrier("created"); !s.ok()) return s;
    std::vector<std::vector<float>> values;
    for (uint32_t round = 0; round < kRounds; ++round) {
      std::vector<float> v;
      for (Key key : keys)
        for (uint32_t j = 0; j < kWidth; ++j) v.push_back(Gradient(w.rank(), key, j, round));
      values.push_back(std::move(v));
    }
    std::vector<Future> futures;  // every round in flight at once
    for (const auto& v : values) {
      futures.push_back(w.Push(1, keys, v));
      futures.push_back(w.Push(2, keys, v));
    }
    for (auto& f : futures)
      if (auto s = f.Wait(); !s.ok()) return s;
    return w.Barrier("pushed");
  });
  for (auto& s : statuses) ASSERT_TRUE(s.ok()) << s;
  std::vector<float> out(kRows * kWidth);
  ASSERT_TRUE(workers[0]->Pull(1, keys, out).Wait().ok());
  for (Key key : keys) {
    for (uint32_t j = 0; j < kWidth; ++j) {
      float want = 0;
      for (uint32_t w = 0; w < kWorkers; ++w)
        for (uint32_t r = 0; r < kRounds; ++r) want += Gradient(w, key, j, r);
      ASSERT_EQ(out[key * kWidth + j], want) << "key " << key << " column " << j;
    }
  }
  std::vector<float> moved(kRows * kWidth, 0.0f);
  ASSERT_TRUE(workers[1]->Pull(2, keys, moved).Wait().ok());
  EXPECT_NE(moved, std::vector<float>(kRows * kWidth, 0.0f)) << "the ADAM table took no step";
  statuses = OnEachWorker(workers, [](Worker& w) { return w.Finish(proto::WorkerDone()); });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(cluster.CoordinatorResult().ok());
}

TEST(InProcClusterTest, AViewKeepsTheRowsItWasAnsweredWith) {
  InProcCluster cluster({.servers = 1, .workers = 1, .started_servers = 1});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  constexpr uint32_t kWidth = 1 << 16;  // 256 KiB rows: answered straight from the table's memory
  ASSERT_TRUE(w.CreateTable({.id = 3, .width = kWidth, .kind = proto::DENSE, .dense_rows = 2,
                             .optimizer = proto::ACCUMULATE}).ok());
  const std::vector<Key> keys = {1, 0, 1};
  std::vector<float> ones(keys.size() * kWidth, 1.0f);
  ASSERT_TRUE(w.Push(3, keys, ones).Wait().ok());
  PulledRows view, single;  // single: one row, answered with a view of the table's own chunk
  ASSERT_TRUE(w.PullView(3, keys, &view).Wait().ok());
  ASSERT_TRUE(w.PullView(3, std::vector<Key>{1}, &single).Wait().ok());
  ASSERT_TRUE(w.Push(3, keys, ones).Wait().ok());
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single.row(0)[kWidth / 2], 2.0f);
  std::vector<float> now(keys.size() * kWidth);
  ASSERT_TRUE(w.Pull(3, keys, now).Wait().ok());
  ASSERT_EQ(view.size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    const float before = keys[i] == 1 ? 2.0f : 1.0f;  // key 1 appears twice per push
    EXPECT_EQ(view.row(i)[0], before) << i;
    EXPECT_EQ(view.row(i)[kWidth - 1], before) << i;
    EXPECT_EQ(now[i * kWidth + kWidth - 1], 2 * before) << i;
  }
  PulledRows none;
  EXPECT_TRUE(w.PullView(3, {}, &none).Wait().ok());
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(w.PullView(3, keys, nullptr).Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.PullView(9, keys, &none).Wait().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.Finish({}).ok());
}

// A worker whose tables are all ASP does not wait in Clock(), yet workers of a
// BSP table in the same job still see its clock advance.
TEST(InProcClusterTest, AspOnlyWorkerClocksWithoutWaitingAndStillReleasesBspWorkers) {
  InProcCluster cluster({.servers = 2, .workers = 2, .started_servers = 2, .hold_timeout = 3 * kSeconds});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 2u);
  Worker& bsp = *workers[0];
  Worker& asp = *workers[1];
  ASSERT_TRUE(bsp.CreateTable({.id = 1, .width = 1, .consistency = proto::BSP}).ok());
  ASSERT_TRUE(asp.CreateTable({.id = 2, .width = 1, .consistency = proto::ASP}).ok());
  // The BSP worker has not clocked: a synchronous Clock() here would be held.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(asp.Clock().ok());
  EXPECT_EQ(asp.stats().clocks, 3u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(bsp.Clock().ok()) << "clock " << i + 1;
  EXPECT_EQ(bsp.clock(), 3u);
  auto statuses = OnEachWorker(workers, [](Worker& w) { return w.Finish({}); });
  for (auto& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(InProcClusterTest, PullSeesTheCallersOwnEarlierPush) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 2});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  ASSERT_TRUE(w.CreateTable({.id = 5, .width = 1, .optimizer = proto::ACCUMULATE}).ok());
  std::vector<Key> keys = {11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<float> ones(keys.size(), 1.0f), out(keys.size());
  for (int i = 1; i <= 50; ++i) {
    (void)w.Push(5, keys, ones);  // not waited for: ordering alone must make the pull see it
    ASSERT_TRUE(w.Pull(5, keys, out).Wait().ok());
    for (float v : out) ASSERT_EQ(v, static_cast<float>(i));
  }
  ASSERT_TRUE(w.Finish({}).ok());
}

TEST(InProcClusterTest, BadRequestsFailWithClearErrors) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 2});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  std::vector<Key> keys = {1, 2};
  std::vector<float> values = {1, 2};
  auto s = w.Push(9, keys, values).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_TRUE(w.CreateTable({.id = 9, .width = 2}).ok());
  s = w.Push(9, keys, values).Wait();  // 2 values for 2 keys of width 2
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = w.CreateTable({.id = 9, .width = 3});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("server"), std::string::npos) << s;
  ASSERT_TRUE(w.Finish({}).ok());
}

TEST(InProcClusterTest, MissingServerFailsTheJobAndIsNamed) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 1, .assemble_timeout = 1 * kSeconds});
  auto workers = cluster.ConnectWorkers();
  ASSERT_EQ(workers.size(), 1u);
  ASSERT_FALSE(workers[0].ok());
  EXPECT_NE(workers[0].status().message().find("missing server 1"), std::string::npos) << workers[0].status();
  absl::Status c = cluster.CoordinatorResult();
  EXPECT_NE(c.message().find("missing server 1"), std::string::npos) << c;
  auto servers = cluster.ServerResults();
  ASSERT_EQ(servers.size(), 1u);
  EXPECT_NE(servers[0].message().find("missing server 1"), std::string::npos) << servers[0];
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Compressed pushes and pulls end to end: encoded parts travel instead of
// fp32 values, servers decode and aggregate in fp32, pulls come back encoded.
TEST(InProcClusterCompressionTest, CompressedPushesAndPullsCarryTheValues) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 2});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  constexpr uint32_t kWidth = 4;
  std::vector<Key> keys(600);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + i;
  std::vector<float> v(keys.size() * kWidth);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.5f;

  // Exact codecs in several parts: pulled sums are exact.
  ASSERT_TRUE(w.CreateTable({.id = 1, .width = kWidth, .optimizer = proto::ACCUMULATE,
                             .compression = "none:raw_below=1,part=500",
                             .pull_compression = "fp16:raw_below=1,part=700"})
                  .ok());
  ASSERT_TRUE(w.Push(1, keys, v).Wait().ok());
  ASSERT_TRUE(w.Push(1, keys, v).Wait().ok());
  std::vector<float> out(v.size());
  const uint64_t pulled_before = w.stats().wire_bytes_pulled;
  ASSERT_TRUE(w.Pull(1, keys, out).Wait().ok());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i], 2 * v[i]) << i;
  // fp16 replies: about 2 bytes per value (plus keys sent and headers).
  const uint64_t pulled = w.stats().wire_bytes_pulled - pulled_before;
  EXPECT_LT(pulled, keys.size() * sizeof(Key) + v.size() * 2 + 1024) << pulled;
  // A view of encoded replies holds what they were decoded into.
  PulledRows view;
  ASSERT_TRUE(w.PullView(1, keys, &view).Wait().ok());
  ASSERT_EQ(view.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    for (uint32_t j = 0; j < kWidth; ++j) ASSERT_EQ(view.row(i)[j], 2 * v[i * kWidth + j]) << i;

  // Top-k 1% with error feedback: after T pushes of v the servers hold T*v
  // minus what is still in the worker's residual, which stays bounded; the
  // same without error feedback loses most of the mass.
  ASSERT_TRUE(w.CreateTable({.id = 2, .width = kWidth, .optimizer = proto::ACCUMULATE,
                             .compression = "topk:ratio=0.05,raw_below=1"})
                  .ok());
  ASSERT_TRUE(w.CreateTable({.id = 3, .width = kWidth, .optimizer = proto::ACCUMULATE,
                             .compression = "topk:ratio=0.05,ef=false,raw_below=1"})
                  .ok());
  constexpr int kSteps = 60;
  for (int t = 0; t < kSteps; ++t) {
    ASSERT_TRUE(w.Push(2, keys, v).Wait().ok());
    ASSERT_TRUE(w.Push(3, keys, v).Wait().ok());
  }
  std::vector<float> with_ef(v.size()), without_ef(v.size());
  ASSERT_TRUE(w.Pull(2, keys, with_ef).Wait().ok());
  ASSERT_TRUE(w.Pull(3, keys, without_ef).Wait().ok());
  double expected = 0, err_ef = 0, err_noef = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    expected += std::abs(kSteps * v[i]);
    err_ef += std::abs(kSteps * v[i] - with_ef[i]);
    err_noef += std::abs(kSteps * v[i] - without_ef[i]);
  }
  EXPECT_LT(err_ef, 0.35 * expected) << "error feedback must deliver most of the mass";
  EXPECT_GT(err_noef, 0.6 * expected) << "without error feedback top-k 5% drops most of it";
  ASSERT_TRUE(w.Finish({}).ok());
}

// The worker's wire counts (pushes, pulls, other server traffic) add up to
// exactly what its transport counted sending and receiving. Heartbeats are
// 12 s apart here (the first at join), so no coordinator traffic falls
// between the snapshots.
TEST(InProcClusterCompressionTest, WireCountsEqualWhatTheTransportCounted) {
  InProcCluster cluster({.servers = 2, .workers = 1, .started_servers = 2, .lease = 60 * kSeconds});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  ASSERT_TRUE(w.CreateTable({.id = 1, .width = 8, .optimizer = proto::ACCUMULATE,
                             .compression = "topk:ratio=0.05,raw_below=1", .pull_compression = "qsgd:raw_below=1"})
                  .ok());
  auto total = [](const WorkerStats& s) { return s.wire_bytes_pushed + s.wire_bytes_pulled + s.wire_bytes_other; };
  // The first heartbeat goes out as the worker joins: let its ack arrive.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const WorkerStats s0 = w.stats();
  const TransportStats t0 = w.transport_stats();
  std::vector<Key> keys(300);
  std::iota(keys.begin(), keys.end(), 1);
  std::vector<float> v(keys.size() * 8, 0.25f), out(v.size());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(w.Push(1, keys, v).Wait().ok());
    ASSERT_TRUE(w.Pull(1, keys, out).Wait().ok());
    ASSERT_TRUE(w.Clock().ok());
  }
  const WorkerStats s1 = w.stats();
  const TransportStats t1 = w.transport_stats();
  EXPECT_GT(s1.wire_bytes_pushed, s0.wire_bytes_pushed);
  EXPECT_EQ(total(s1) - total(s0),
            (t1.bytes_sent - t0.bytes_sent) + (t1.bytes_received - t0.bytes_received));
  ASSERT_TRUE(w.Finish({}).ok());
}

TEST(InProcClusterCompressionTest, BadCodecSpecsAreRejectedWithTheReason) {
  InProcCluster cluster({.servers = 1, .workers = 1, .started_servers = 1});
  auto workers = Unwrap(cluster.ConnectWorkers());
  ASSERT_EQ(workers.size(), 1u);
  Worker& w = *workers[0];
  absl::Status s = w.CreateTable({.id = 1, .compression = "zip"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("zip"), std::string::npos) << s;
  s = w.CreateTable({.id = 2, .pull_compression = "topk"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("pulls return weights"), std::string::npos) << s;
  ASSERT_TRUE(w.Finish({}).ok());
}

}  // namespace
}  // namespace tessera
