// Caller delivery (Transport::DeliverUntil, transport/transport.h): a thread
// that waits reads its messages itself, and the transport's promises (one
// handler call at a time, arrival order, Stop from the handler) still hold.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "transport/inproc_transport.h"
#include "transport/shm_transport.h"
#include "transport/zmq_transport.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

Message Numbered(uint64_t id) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_heartbeat();
  return m;
}

// What a receiving transport saw: ids in handler order, the threads that
// ran the handler, and whether two handler calls ever overlapped.
struct Seen {
  std::mutex mu;
  std::vector<uint64_t> ids;
  std::set<std::thread::id> threads;
  std::atomic<uint64_t> count{0};
  std::atomic<bool> inside{false};
  std::atomic<bool> overlapped{false};
  std::function<void(const Message&)> also;  // extra work inside the handler (set before Start)

  Transport::Handler handler() {
    return [this](Message m) {
      if (inside.exchange(true)) overlapped = true;
      {
        std::lock_guard lock(mu);
        ids.push_back(m.header.request_id());
        threads.insert(std::this_thread::get_id());
      }
      if (also) also(m);
      inside = false;
      count.fetch_add(1);
    };
  }
  bool RanOn(std::thread::id id) {
    std::lock_guard lock(mu);
    return threads.contains(id);
  }
};

// Calls DeliverUntil until the transport lets this thread deliver (its
// delivery thread must be idle first). `done` is called only once this
// thread delivers, so its first call can start the traffic under test.
bool Borrow(Transport& t, const std::function<bool()>& done, std::chrono::milliseconds max_wait = 5s) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    if (t.DeliverUntil(done, max_wait)) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

std::unique_ptr<Transport> MakeZmq() { return std::make_unique<ZmqTransport>(); }

std::unique_ptr<Transport> MakeShm() {
  return std::make_unique<ShmTransport>(std::make_unique<ZmqTransport>(), ShmTransport::Options{});
}

class CallerDeliveryTest : public ::testing::TestWithParam<bool /*shm*/> {
 protected:
  std::unique_ptr<Transport> Make() { return GetParam() ? MakeShm() : MakeZmq(); }
};

TEST_P(CallerDeliveryTest, AWaitingThreadHandlesItsMessageOnItsOwnThread) {
  Seen seen;
  auto receiver = Make();
  auto sender = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  ASSERT_TRUE(sender->Start([](Message) {}).ok());
  std::atomic<bool> sent{false};
  const bool borrowed = Borrow(*receiver, [&] {
    if (!sent.exchange(true)) {
      EXPECT_TRUE(sender->Send(receiver->address(), Numbered(7)).ok());
    }
    return seen.count.load() >= 1;
  });
  ASSERT_TRUE(borrowed);
  ASSERT_EQ(seen.count.load(), 1u);
  EXPECT_TRUE(seen.RanOn(std::this_thread::get_id())) << "the reply was handed over, not delivered here";
  // Afterwards the delivery thread delivers again.
  ASSERT_TRUE(sender->Send(receiver->address(), Numbered(8)).ok());
  for (int i = 0; i < 1000 && seen.count.load() < 2; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(seen.count.load(), 2u);
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.ids, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(seen.threads.size(), 2u) << "the second message should come on the delivery thread";
}

TEST_P(CallerDeliveryTest, OrderIsKeptAndHandlersNeverOverlapAcrossManyHandOvers) {
  Seen seen;
  auto receiver = Make();
  auto sender = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  ASSERT_TRUE(sender->Start([](Message) {}).ok());
  constexpr uint64_t kMessages = 3000;
  std::thread sending([&] {
    for (uint64_t i = 1; i <= kMessages; ++i) {
      ASSERT_TRUE(sender->Send(receiver->address(), Numbered(i)).ok());
      if (i % 64 == 0) std::this_thread::sleep_for(200us);  // let the delivery thread go idle now and then
    }
  });
  // Take delivery over in short turns while the messages stream in.
  int turns = 0;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (seen.count.load() < kMessages && std::chrono::steady_clock::now() < until) {
    const uint64_t target = seen.count.load() + 40;
    if (receiver->DeliverUntil([&] { return seen.count.load() >= std::min(target, kMessages); }, 2ms)) ++turns;
  }
  sending.join();
  ASSERT_EQ(seen.count.load(), kMessages);
  EXPECT_FALSE(seen.overlapped.load());
  EXPECT_GT(turns, 0);
  std::lock_guard lock(seen.mu);
  for (uint64_t i = 0; i < kMessages; ++i) ASSERT_EQ(seen.ids[i], i + 1) << "at " << i;
  EXPECT_TRUE(seen.threads.contains(std::this_thread::get_id()));
}

TEST_P(CallerDeliveryTest, RefusedInsideTheHandlerAndToASecondCaller) {
  Seen seen;
  std::atomic<int> inside_answer{-1};
  auto receiver = Make();
  Transport* r = receiver.get();
  seen.also = [&](const Message&) { inside_answer = r->DeliverUntil([] { return true; }, 1ms) ? 1 : 0; };
  auto sender = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  ASSERT_TRUE(sender->Start([](Message) {}).ok());
  std::atomic<int> second_answer{-1};
  std::atomic<bool> started{false};
  std::thread other;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(Borrow(*receiver, [&] {
    if (!started.exchange(true)) {
      other = std::thread([&] {
        second_answer = r->DeliverUntil([] { return true; }, 1ms) ? 1 : 0;
        r->WakeCallerDelivery();  // the first caller's done() depends on this
      });
      EXPECT_TRUE(sender->Send(r->address(), Numbered(1)).ok());
    }
    return seen.count.load() >= 1 && second_answer.load() >= 0;
  }));
  other.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "the wake from the second caller's thread was lost";
  EXPECT_EQ(second_answer.load(), 0) << "a second caller took delivery while the first held it";
  EXPECT_EQ(inside_answer.load(), 0) << "the handler took delivery from inside itself";
}

TEST_P(CallerDeliveryTest, WakeCallerDeliveryMakesTheCallerLookAgainAtOnce) {
  Seen seen;
  auto receiver = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  std::atomic<bool> flag{false};
  std::atomic<bool> started{false};
  std::thread waker;
  const auto t0 = std::chrono::steady_clock::now();
  // Made true by another thread, with no message: only the wake can end
  // the wait before max_wait (a minute).
  ASSERT_TRUE(Borrow(*receiver, [&] {
    if (!started.exchange(true)) {
      waker = std::thread([&] {
        std::this_thread::sleep_for(50ms);
        flag = true;
        receiver->WakeCallerDelivery();
      });
    }
    return flag.load();
  }, 60s));
  waker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

TEST_P(CallerDeliveryTest, StopWhileACallerDeliversEndsItsWaitAndStopReturns) {
  Seen seen;
  auto receiver = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  std::atomic<bool> started{false};
  std::thread stopper;
  auto waiting = std::async(std::launch::async, [&] {
    return Borrow(*receiver, [&] {
      if (!started.exchange(true)) {
        stopper = std::thread([&] {
          std::this_thread::sleep_for(20ms);
          receiver->Stop();
        });
      }
      return false;  // never done: only the stop ends it
    }, 60s);
  });
  ASSERT_EQ(waiting.wait_for(30s), std::future_status::ready) << "Stop did not end the caller's delivery";
  EXPECT_TRUE(waiting.get());
  stopper.join();
  EXPECT_FALSE(receiver->DeliverUntil([] { return true; }, 1ms)) << "delivery taken after Stop";
}

TEST_P(CallerDeliveryTest, StopFromTheHandlerOnTheCallersThreadStopsDelivery) {
  Seen seen;
  auto receiver = Make();
  Transport* r = receiver.get();
  seen.also = [&](const Message&) { r->Stop(); };
  auto sender = Make();
  ASSERT_TRUE(receiver->Start(seen.handler()).ok());
  ASSERT_TRUE(sender->Start([](Message) {}).ok());
  std::atomic<bool> sent{false};
  ASSERT_TRUE(Borrow(*receiver, [&] {
    if (!sent.exchange(true)) {
      EXPECT_TRUE(sender->Send(r->address(), Numbered(1)).ok());
    }
    return seen.count.load() >= 1;
  }));
  EXPECT_TRUE(seen.RanOn(std::this_thread::get_id()));
  EXPECT_TRUE(sender->Send(r->address(), Numbered(2)).ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(seen.count.load(), 1u) << "a message was handled after Stop";
  receiver->Stop();  // from outside now: returns
  receiver.reset();
}

INSTANTIATE_TEST_SUITE_P(ZmqAndShm, CallerDeliveryTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Shm" : "Zmq"; });

TEST(CallerDeliveryDefaultTest, TransportsWithoutItAndStoppedOnesRefuse) {
  InProcNetwork network;
  auto inproc = network.Create("a");
  ASSERT_TRUE(inproc->Start([](Message) {}).ok());
  EXPECT_FALSE(inproc->DeliverUntil([] { return true; }, 1ms));
  inproc->WakeCallerDelivery();  // a no-op

  ZmqTransport never_started;
  EXPECT_FALSE(never_started.DeliverUntil([] { return true; }, 1ms));
  never_started.WakeCallerDelivery();
}

}  // namespace
}  // namespace tessera
