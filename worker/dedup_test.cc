// Worker::PullDeduplicated and Worker::PushAggregated against an in-process
// cluster (2 servers): their results against plain Pull and Push of the
// same rows, the bytes they send, the memory they own, ordering, and errors.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tests/cluster/inproc_cluster.h"
#include "worker/worker.h"

namespace tessera {
namespace {

class WorkerDedupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<InProcCluster>(ClusterOptions{.servers = 2, .workers = 1, .started_servers = 2});
    workers_ = Unwrap(cluster_->ConnectWorkers());
    ASSERT_EQ(workers_.size(), 1u);
  }
  void TearDown() override {
    if (workers_.empty()) return;
    absl::Status s = workers_[0]->Finish({});
    EXPECT_TRUE(s.ok()) << s;
  }
  Worker& worker() { return *workers_[0]; }

  std::unique_ptr<InProcCluster> cluster_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

constexpr uint32_t kWidth = 3;

// Keys with repeats (hot ids), spread over both servers; distinct: 0..9 and
// 1000003.
std::vector<Key> BatchKeys() {
  std::vector<Key> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(static_cast<Key>((i * 7) % 10));
  keys.push_back(1000003);
  keys.push_back(1000003);
  return keys;
}

std::vector<float> Values(size_t rows, float base) {
  std::vector<float> v(rows * kWidth);
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25f * static_cast<float>(i % 17) - 0.5f * (i % 3);
  return v;
}

TEST_F(WorkerDedupTest, AggregatedPushSumsRepeatsAndDeduplicatedPullExpandsThem) {
  ASSERT_TRUE(worker().CreateTable({.id = 1, .width = kWidth, .optimizer = proto::ACCUMULATE}).ok());
  const std::vector<Key> keys = BatchKeys();
  std::vector<float> values = Values(keys.size(), 1.0f);
  // The expected rows: per distinct key, its positions' rows summed in order.
  absl::flat_hash_map<Key, std::vector<float>> sums;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto& row = sums[keys[i]];
    row.resize(kWidth, 0.0f);
    for (uint32_t c = 0; c < kWidth; ++c) row[c] += values[i * kWidth + c];
  }
  ASSERT_EQ(sums.size(), 11u);

  const WorkerStats before = worker().stats();
  Future push = worker().PushAggregated(1, keys, values);
  // The sums are the request's own: the caller's values may change at once.
  std::fill(values.begin(), values.end(), 1e6f);
  ASSERT_TRUE(push.Wait().ok());
  const WorkerStats after_push = worker().stats();
  EXPECT_EQ(after_push.pushes - before.pushes, 1u);
  EXPECT_EQ(after_push.bytes_pushed - before.bytes_pushed, sums.size() * (sizeof(Key) + kWidth * sizeof(float)));

  std::vector<float> out(keys.size() * kWidth, -7.0f);
  Future pull = worker().PullDeduplicated(1, keys, out);
  ASSERT_TRUE(pull.Wait().ok());
  EXPECT_TRUE(pull.ready());
  EXPECT_TRUE(pull.Wait().ok());  // idempotent
  const WorkerStats after_pull = worker().stats();
  EXPECT_EQ(after_pull.bytes_pulled - after_push.bytes_pulled,
            sums.size() * (sizeof(Key) + kWidth * sizeof(float)));
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t c = 0; c < kWidth; ++c) {
      ASSERT_EQ(out[i * kWidth + c], sums[keys[i]][c]) << "position " << i << " key " << keys[i] << " column " << c;
    }
  }
  // The same as a plain pull of every position.
  std::vector<float> plain(keys.size() * kWidth);
  ASSERT_TRUE(worker().Pull(1, keys, plain).Wait().ok());
  EXPECT_EQ(out, plain);
}

TEST_F(WorkerDedupTest, AggregatedPushIsOneOptimizerStepOnTheSums) {
  // Adam is not linear in the gradient: the aggregated push must equal a
  // plain push of the per-key sums, bit for bit. (Zero rows: a seeded
  // initializer's rows depend on the table id.)
  for (uint32_t id : {2u, 3u}) {
    ASSERT_TRUE(worker().CreateTable({.id = id, .width = kWidth, .optimizer = proto::ADAM, .learning_rate = 0.1f}).ok());
  }
  const std::vector<Key> keys = BatchKeys();
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> grads = Values(keys.size(), 0.1f * static_cast<float>(step + 1));
    ASSERT_TRUE(worker().PushAggregated(2, keys, grads).Wait().ok());
    // By hand: distinct keys in first-occurrence order, sums in position order.
    std::vector<Key> unique;
    absl::flat_hash_map<Key, size_t> index;
    std::vector<float> sums;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, fresh] = index.try_emplace(keys[i], unique.size());
      if (fresh) {
        unique.push_back(keys[i]);
        sums.resize(sums.size() + kWidth, 0.0f);
      }
      for (uint32_t c = 0; c < kWidth; ++c) sums[it->second * kWidth + c] += grads[i * kWidth + c];
    }
    ASSERT_TRUE(worker().Push(3, unique, sums).Wait().ok());
  }
  std::vector<float> a(keys.size() * kWidth), b(keys.size() * kWidth);
  ASSERT_TRUE(worker().PullDeduplicated(2, keys, a).Wait().ok());
  ASSERT_TRUE(worker().PullDeduplicated(3, keys, b).Wait().ok());
  EXPECT_EQ(a, b);
  const std::vector<float> initial(keys.size() * kWidth, 0.0f);
  EXPECT_NE(a, initial);  // it trained
}

TEST_F(WorkerDedupTest, PullAfterPushReflectsItAndReadyRunsTheCopy) {
  ASSERT_TRUE(worker().CreateTable({.id = 5, .width = kWidth, .optimizer = proto::ACCUMULATE}).ok());
  const std::vector<Key> keys = BatchKeys();
  const std::vector<float> ones(keys.size() * kWidth, 1.0f);
  Future push = worker().PushAggregated(5, keys, ones);  // not waited for before the pull
  std::vector<float> out(keys.size() * kWidth, 0.0f);
  Future pull = worker().PullDeduplicated(5, keys, out);
  // Poll ready() only: once it says so, `out` is written.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pull.ready()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the deduplicated pull did not complete";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(push.Wait().ok());
  absl::flat_hash_map<Key, float> count;
  for (Key k : keys) count[k] += 1.0f;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t c = 0; c < kWidth; ++c) ASSERT_EQ(out[i * kWidth + c], count[keys[i]]) << "position " << i;
  }
  ASSERT_TRUE(pull.Wait().ok());
}

TEST_F(WorkerDedupTest, BadSizesAndUnknownTablesAreRefusedWithoutSending) {
  ASSERT_TRUE(worker().CreateTable({.id = 6, .width = kWidth, .optimizer = proto::ACCUMULATE}).ok());
  const std::vector<Key> keys = {1, 2, 1};
  const WorkerStats before = worker().stats();
  std::vector<float> short_values(keys.size() * kWidth - 1);
  absl::Status s = worker().PushAggregated(6, keys, short_values).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("need 9 values, got 8"), std::string::npos) << s;
  std::vector<float> short_out(keys.size() * kWidth + 1);
  s = worker().PullDeduplicated(6, keys, short_out).Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("need room for 9 values, got 10"), std::string::npos) << s;
  std::vector<float> out(keys.size() * kWidth);
  EXPECT_FALSE(worker().PullDeduplicated(99, keys, out).Wait().ok());
  EXPECT_FALSE(worker().PushAggregated(99, keys, out).Wait().ok());
  const WorkerStats after = worker().stats();
  EXPECT_EQ(after.pushes, before.pushes);
  EXPECT_EQ(after.pulls, before.pulls);
  // No keys: nothing to do, OK.
  EXPECT_TRUE(worker().PullDeduplicated(6, {}, {}).Wait().ok());
  EXPECT_TRUE(worker().PushAggregated(6, {}, {}).Wait().ok());
}

}  // namespace
}  // namespace tessera
