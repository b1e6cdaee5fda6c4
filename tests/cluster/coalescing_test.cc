// Small requests issued together go as batches, and the server's replies to
// a batch go as one (transport/coalescing_transport.h), in a job of one
// coordinator, one server and one worker over ZeroMQ tcp on loopback, all in
// this process, each with the transport the binaries make (the worker's
// from Worker::Connect, which holds requests to a server that owes an
// answer). Checks that batches did flow both ways and that every push was
// applied once and every pull is right, for pushes and pulls 16 in flight,
// mixed with a large push that must not overtake or be held.
#include <gtest/gtest.h>

#include <vector>

#include "common/logging.h"
#include "tests/cluster/raw_client.h"
#include "worker/worker.h"

namespace tessera {
namespace {

constexpr uint32_t kWidth = 16;
constexpr uint32_t kTable = 5;

TEST(CoalescingClusterTest, SmallRequestsInFlightGoAsBatchesAndEveryValueIsRight) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  OneServerJob job;
  WorkerOptions wo;
  wo.coordinator = job.coordinator_address();
  wo.rank = 0;
  wo.connect_timeout = 20 * kSeconds;
  wo.request_timeout = 60 * kSeconds;
  auto connected = Worker::Connect(wo);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<Worker> worker = std::move(*connected);
  TableOptions t{.id = kTable, .name = "small", .width = kWidth, .kind = proto::SPARSE,
                 .optimizer = proto::ACCUMULATE, .init = proto::ZEROS};
  ASSERT_TRUE(worker->CreateTable(t).ok());
  // One request at a time: nothing is held (each answer came before the
  // next request, so no server owed one).
  {
    const TransportStats s0 = worker->transport_stats();
    const Key k = 1;
    std::vector<float> row(kWidth, 1.0f);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(worker->Push(kTable, std::span<const Key>(&k, 1), row).Wait().ok());
      ASSERT_TRUE(worker->Pull(kTable, std::span<const Key>(&k, 1), row).Wait().ok());
    }
    EXPECT_EQ(worker->transport_stats().coalesce_messages_held, s0.coalesce_messages_held)
        << "a sequential caller's requests were held: the server's answers did not count as its answers";
  }
  const TransportStats before = worker->transport_stats();

  constexpr int kKeys = 64, kRounds = 20, kInFlight = 16;
  std::vector<std::vector<float>> values(kKeys, std::vector<float>(kWidth));
  for (int k = 0; k < kKeys; ++k) {
    for (uint32_t j = 0; j < kWidth; ++j) values[k][j] = static_cast<float>(k) + static_cast<float>(j) / 16.0f;
  }
  std::vector<Key> keys(kKeys);
  for (int k = 0; k < kKeys; ++k) keys[k] = 7000 + k;
  // A push of every row at once, wider than a held message, every 5th round.
  std::vector<float> all;
  for (int k = 0; k < kKeys; ++k) all.insert(all.end(), values[k].begin(), values[k].end());
  std::vector<float> big_keys_values(size_t{kKeys} * kWidth * 20, 0.0f);  // 80 KiB of zeros over 20x the keys
  std::vector<Key> big_keys(size_t{kKeys} * 20);
  for (size_t i = 0; i < big_keys.size(); ++i) big_keys[i] = 100000 + i;
  int expected_pushes = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Future> pending;
    for (int k = 0; k < kKeys; ++k) {
      pending.push_back(worker->Push(kTable, std::span<const Key>(&keys[k], 1), values[k]));
      if (k == kKeys / 2 && round % 5 == 0) pending.push_back(worker->Push(kTable, big_keys, big_keys_values));
      if (pending.size() >= kInFlight) {
        ASSERT_TRUE(pending.front().Wait().ok());
        pending.erase(pending.begin());
      }
    }
    for (Future& f : pending) ASSERT_TRUE(f.Wait().ok());
    ++expected_pushes;
  }
  // Pulls, 16 in flight, one row each.
  std::vector<std::vector<float>> out(kKeys, std::vector<float>(kWidth, -1.0f));
  std::vector<Future> pulls;
  for (int k = 0; k < kKeys; ++k) {
    pulls.push_back(worker->Pull(kTable, std::span<const Key>(&keys[k], 1), out[k]));
    if (pulls.size() >= kInFlight) {
      ASSERT_TRUE(pulls.front().Wait().ok());
      pulls.erase(pulls.begin());
    }
  }
  for (Future& f : pulls) ASSERT_TRUE(f.Wait().ok());
  for (int k = 0; k < kKeys; ++k) {
    for (uint32_t j = 0; j < kWidth; ++j) {
      ASSERT_EQ(out[k][j], values[k][j] * static_cast<float>(expected_pushes)) << "key " << keys[k] << " column " << j
                                                                                << ": each push applied exactly once";
    }
  }
  const TransportStats after = worker->transport_stats();
  const uint64_t batches_sent = after.coalesce_batches_sent - before.coalesce_batches_sent;
  const uint64_t batched = after.coalesce_messages_batched - before.coalesce_messages_batched;
  const uint64_t batches_received = after.coalesce_batches_received - before.coalesce_batches_received;
  const uint64_t requests = kRounds * kKeys + kKeys;
  EXPECT_GT(batches_sent, 0u) << "16 small requests in flight to one server went one by one";
  EXPECT_GT(batches_received, 0u) << "the server's replies to a batch did not come as one";
  // Fewer messages than requests went out: the batches saved some.
  EXPECT_LT(after.messages_sent - before.messages_sent, requests) << batched << " requests went in " << batches_sent
                                                                  << " batches";
  ASSERT_TRUE(worker->Finish(proto::WorkerDone()).ok());
  job.ExpectOrderlyEnd();
}

}  // namespace
}  // namespace tessera
