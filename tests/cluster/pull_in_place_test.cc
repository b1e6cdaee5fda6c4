// Pull replies written straight into the caller's memory (Worker::Pull over
// a transport that places frames: transport/transport.h, PostDestination).
// A job of one coordinator and one server over ZeroMQ tcp on loopback with
// the same-host path on (as by default: ShmTransport), all in this process,
// so the server's large pull replies go through its ring or are lent, and
// the worker's transport writes them into the caller's `out`. The test
// checks that replies did land in place (WorkerStats::pull_replies_in_place)
// and that every pulled value is right, for replies through the ring (256
// KiB) and lent (4 MiB), sequential and several in flight, and that pulls
// the worker cannot place (scattered rows, small replies) are as before.
#include <gtest/gtest.h>

#include <vector>

#include "common/logging.h"
#include "tests/cluster/raw_client.h"
#include "transport/transport_factory.h"
#include "worker/worker.h"

namespace tessera {
namespace {

constexpr uint32_t kWidth = 1024;  // 4 KiB a row
constexpr uint32_t kTable = 3;

std::unique_ptr<Worker> Connect(const std::string& coordinator) {
  auto t = MakeTransport("tcp://127.0.0.1:0");
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  WorkerOptions wo;
  wo.coordinator = coordinator;
  wo.rank = 0;
  wo.connect_timeout = 20 * kSeconds;
  wo.request_timeout = 60 * kSeconds;
  auto w = Worker::Connect(wo, std::move(*t));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

float Value(Key k, uint32_t j) { return static_cast<float>(k) * 0.5f + static_cast<float>(j) / 1024.0f; }

TEST(PullInPlaceTest, LargeRepliesLandInTheCallersMemoryAndAreRight) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  OneServerJob job;
  std::unique_ptr<Worker> worker = Connect(job.coordinator_address());
  ASSERT_NE(worker, nullptr);
  TableOptions t{.id = kTable, .name = "wide", .width = kWidth, .kind = proto::SPARSE,
                 .optimizer = proto::ACCUMULATE, .init = proto::ZEROS};
  ASSERT_TRUE(worker->CreateTable(t).ok());
  // 1024 rows, each its own values.
  std::vector<Key> all(1024);
  std::vector<float> values(all.size() * kWidth);
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = 1000 + i;
    for (uint32_t j = 0; j < kWidth; ++j) values[i * kWidth + j] = Value(all[i], j);
  }
  ASSERT_TRUE(worker->Push(kTable, all, values).Wait().ok());
  auto check = [&](std::span<const Key> keys, const std::vector<float>& out, const std::string& what) {
    size_t wrong = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      for (uint32_t j = 0; j < kWidth; ++j) wrong += out[i * kWidth + j] != Value(keys[i], j);
    EXPECT_EQ(wrong, 0u) << what;
  };
  // A first pull tells the worker's transport that the server shares the host.
  std::vector<float> warm(kWidth);
  ASSERT_TRUE(worker->Pull(kTable, std::span<const Key>(all).first(1), warm).Wait().ok());

  const uint64_t before = worker->stats().pull_replies_in_place;
  // Sequential: 64 rows (256 KiB, through the ring), then all 1024 (4 MiB, lent).
  for (size_t rows : {64u, 1024u}) {
    for (int round = 0; round < 3; ++round) {
      std::vector<float> out(rows * kWidth, -1.0f);
      const auto keys = std::span<const Key>(all).first(rows);
      ASSERT_TRUE(worker->Pull(kTable, keys, out).Wait().ok());
      check(keys, out, "sequential pull of " + std::to_string(rows) + " rows");
    }
  }
  const uint64_t sequential = worker->stats().pull_replies_in_place - before;
  EXPECT_GE(sequential, 6u) << "every large reply should have landed in place";
  // Eight in flight, each over its own 128 rows and its own memory, twice.
  // A reply may meet frames still in use in the server's ring and take the
  // wire (correct, only not in place: transport/shm_ring.h, "Lowest offset
  // first"), but the first of each burst finds the ring empty.
  const uint64_t in_flight_before = worker->stats().pull_replies_in_place;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> outs(8, std::vector<float>(128 * kWidth, -1.0f));
    std::vector<Future> pulls;
    for (size_t i = 0; i < 8; ++i)
      pulls.push_back(worker->Pull(kTable, std::span<const Key>(all).subspan(i * 128, 128), outs[i]));
    for (size_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(pulls[i].Wait().ok());
      check(std::span<const Key>(all).subspan(i * 128, 128), outs[i], "pull " + std::to_string(i) + " of 8 in flight");
    }
  }
  const TransportStats ts = worker->transport_stats();
  EXPECT_GE(worker->stats().pull_replies_in_place - in_flight_before, 2u)
      << "transport: " << ts.frames_placed << " placed, " << ts.shm_frames_received << " shm frames received, "
      << ts.shm_fallback_frames << " fell back";
  // Not placed: a reply under 64 KiB, and rows in an order of their own
  // (keys repeated: the worker asks for each once and scatters).
  const uint64_t placed = worker->stats().pull_replies_in_place;
  std::vector<Key> scattered = {1005, 1003, 1005, 1001};
  std::vector<float> out(scattered.size() * kWidth, -1.0f);
  ASSERT_TRUE(worker->Pull(kTable, scattered, out).Wait().ok());
  check(scattered, out, "a pull of repeated keys");
  std::vector<float> small(2 * kWidth, -1.0f);
  ASSERT_TRUE(worker->Pull(kTable, std::span<const Key>(all).first(2), small).Wait().ok());
  check(std::span<const Key>(all).first(2), small, "a small pull");
  EXPECT_EQ(worker->stats().pull_replies_in_place, placed);

  EXPECT_TRUE(worker->Finish(MakeWorkerDone(worker->stats(), 1, 0, "{}")).ok());
  job.ExpectOrderlyEnd();
}

}  // namespace
}  // namespace tessera
