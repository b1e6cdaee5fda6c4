// Transfer scheduling over a bandwidth-limited link (issue 11): a job of one
// coordinator and one server over ZeroMQ tcp on loopback, and a Worker whose
// transport is the real ZeroMQ one behind a throttle of its own (a token
// bucket in each direction, first in first out, like a slow link). Pushes
// and pulls issued at the same time with different priorities complete in
// priority order when the worker bounds its bytes in flight; without the
// bound, in issue order (the control: the link is the bottleneck and keeps
// its order). The assertions are on completion order, never on timings.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "tests/cluster/raw_client.h"
#include "transport/transport_factory.h"
#include "worker/worker.h"

namespace tessera {
namespace {

// One direction of a slow link: messages leave in order, each once the link
// has had time to carry it at `bytes_per_second` (its header and frames).
class ThrottledDirection {
 public:
  using Out = std::function<void(std::string to, Message m)>;
  ThrottledDirection(double bytes_per_second, Out out) : rate_(bytes_per_second), out_(std::move(out)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ThrottledDirection() { Stop(); }

  void Put(std::string to, Message m) {
    {
      std::lock_guard lock(mu_);
      queue_.emplace_back(std::move(to), std::move(m));
    }
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  void Run() {
    using Clock = std::chrono::steady_clock;
    Clock::time_point free_at = Clock::now();
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
      if (stopped_) return;
      auto [to, m] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      uint64_t bytes = m.header.ByteSizeLong();
      for (const Buffer& f : m.frames) bytes += f.size();
      free_at = std::max(free_at, Clock::now()) +
                std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bytes / rate_));
      std::this_thread::sleep_until(free_at);
      out_(std::move(to), std::move(m));
      lock.lock();
    }
  }

  const double rate_;
  const Out out_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, Message>> queue_;
  bool stopped_ = false;
  std::thread thread_;
};

// A transport whose sends and deliveries pass a throttle each way.
class ThrottledTransport final : public Transport {
 public:
  ThrottledTransport(std::unique_ptr<Transport> inner, double bytes_per_second)
      : inner_(std::move(inner)),
        out_(bytes_per_second, [this](std::string to, Message m) { (void)inner_->Send(to, std::move(m)); }),
        in_(bytes_per_second, [this](std::string, Message m) { handler_(std::move(m)); }) {}
  ~ThrottledTransport() override { Stop(); }

  absl::Status Start(Handler handler) override {
    handler_ = std::move(handler);
    return inner_->Start([this](Message m) { in_.Put({}, std::move(m)); });
  }
  const std::string& address() const override { return inner_->address(); }
  absl::Status Send(const std::string& to, Message message) override {
    message.header.set_sender_address(inner_->address());
    out_.Put(to, std::move(message));
    return absl::OkStatus();
  }
  void Stop() override {
    out_.Stop();
    inner_->Stop();
    in_.Stop();
  }
  TransportStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<Transport> inner_;
  Handler handler_;
  ThrottledDirection out_, in_;
};

constexpr uint32_t kRowWidth = 64;               // 256 value bytes a row
constexpr size_t kRows = 2048;                   // 512 KiB an operation
constexpr uint64_t kPartBytes = 32 << 10;        // 16 parts an operation
constexpr double kLinkBytesPerSecond = 4 << 20;  // about 8 ms a part

std::unique_ptr<Worker> ConnectThrottled(const std::string& coordinator, uint64_t bound) {
  auto zmq = MakeTransport("tcp://127.0.0.1:0");
  EXPECT_TRUE(zmq.ok()) << zmq.status();
  if (!zmq.ok()) return nullptr;
  WorkerOptions wo;
  wo.coordinator = coordinator;
  wo.rank = 0;
  wo.connect_timeout = 20 * kSeconds;
  wo.request_timeout = 60 * kSeconds;
  wo.resend_after = 30 * kSeconds;  // no resends of parts the slow link holds
  wo.part_bytes = kPartBytes;
  wo.max_bytes_in_flight_per_server = bound;
  auto w = Worker::Connect(wo, std::make_unique<ThrottledTransport>(std::move(*zmq), kLinkBytesPerSecond));
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  TableOptions t;
  t.id = kTable;
  t.width = kRowWidth;
  t.kind = proto::SPARSE;
  t.optimizer = proto::ACCUMULATE;
  t.consistency = proto::ASP;
  EXPECT_TRUE((*w)->CreateTable(t).ok());
  return std::move(*w);
}

// Three operations' keys (disjoint) and values (row of key k: k + column / 100).
struct Batch {
  std::vector<std::vector<Key>> keys;
  std::vector<std::vector<float>> values;
  Batch() {
    for (Key base : {0, 100000, 200000}) {
      std::vector<Key> k;
      std::vector<float> v;
      for (Key i = 0; i < kRows; ++i) {
        k.push_back(base + i);
        for (uint32_t j = 0; j < kRowWidth; ++j) v.push_back(static_cast<float>(base + i) + j / 100.0f);
      }
      keys.push_back(std::move(k));
      values.push_back(std::move(v));
    }
  }
};

// Waits for the futures in `order`; each must be the only one of those left
// that is complete when it completes, and succeed.
void ExpectCompletionOrder(const std::vector<Future>& futures, const std::vector<size_t>& order,
                           const std::string& what) {
  for (size_t i = 0; i < order.size(); ++i) {
    const absl::Status s = futures[order[i]].Wait();
    EXPECT_TRUE(s.ok()) << what << " " << order[i] << ": " << s;
    for (size_t j = i + 1; j < order.size(); ++j)
      EXPECT_FALSE(futures[order[j]].ready()) << what << " " << order[j] << " completed before " << order[i];
  }
}

void Finish(Worker& worker, OneServerJob& job) {
  EXPECT_TRUE(worker.Finish(MakeWorkerDone(worker.stats(), 1, 0, "{}")).ok());
  job.ExpectOrderlyEnd();
}

TEST(TransferPriorityTest, HighPriorityPartsFinishFirstOnASlowLink) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  OneServerJob job;
  // One part in flight to the server at a time.
  std::unique_ptr<Worker> worker = ConnectThrottled(job.coordinator_address(), kPartBytes);
  ASSERT_NE(worker, nullptr);
  const Batch b;
  // Issued back to back, lowest priority first (higher numbers go later).
  std::vector<Future> pushes;
  for (size_t i = 0; i < 3; ++i) {
    pushes.push_back(worker->Push(kTable, b.keys[i], b.values[i], 2 - static_cast<int>(i)));
  }
  ExpectCompletionOrder(pushes, {2, 1, 0}, "push");

  std::vector<std::vector<float>> out(3, std::vector<float>(kRows * kRowWidth, -1));
  std::vector<Future> pulls;
  for (size_t i = 0; i < 3; ++i) pulls.push_back(worker->Pull(kTable, b.keys[i], out[i], 2 - static_cast<int>(i)));
  ExpectCompletionOrder(pulls, {2, 1, 0}, "pull");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], b.values[i]) << "pull " << i;
  // Split into parts of 128 rows, one number each.
  EXPECT_EQ(worker->next_push_seq(), 3 * kRows / (kPartBytes / (kRowWidth * sizeof(float))) + 1);
  Finish(*worker, job);
}

// The control: the same link without the bound carries everything in issue
// order, so the low-priority operation issued first completes first.
TEST(TransferPriorityTest, WithoutTheBoundTheLinkKeepsIssueOrder) {
  spdlog::default_logger()->set_level(spdlog::level::warn);
  OneServerJob job;
  std::unique_ptr<Worker> worker = ConnectThrottled(job.coordinator_address(), 0);
  ASSERT_NE(worker, nullptr);
  const Batch b;
  std::vector<Future> pushes;
  for (size_t i = 0; i < 3; ++i) {
    pushes.push_back(worker->Push(kTable, b.keys[i], b.values[i], 2 - static_cast<int>(i)));
  }
  ExpectCompletionOrder(pushes, {0, 1, 2}, "push");
  Finish(*worker, job);
}

}  // namespace
}  // namespace tessera
