// The Transport contract (transport/transport.h), checked against every
// implementation: in-process, ZeroMQ over tcp, ZeroMQ over ipc. Then the
// ZeroMQ-specific promises (transport/zmq_transport.h) and the factory.
//
// Every wait has a deadline and fails with a message; no test asserts a time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rdma/rdma_transport.h"
#include "transport/inproc_transport.h"
#include "transport/transport.h"
#include "transport/shm_transport.h"
#include "transport/transport_factory.h"
#include "transport/zmq_transport.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: sanitizer builds on a loaded two-core machine are slow.
constexpr auto kDeadline = seconds(60);

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    const absl::Status _st = (expr);                      \
    ASSERT_TRUE(_st.ok()) << #expr << " -> " << _st;      \
  } while (0)
#define EXPECT_OK(expr)                                   \
  do {                                                    \
    const absl::Status _st = (expr);                      \
    EXPECT_TRUE(_st.ok()) << #expr << " -> " << _st;      \
  } while (0)

// Waits until `done()` holds, polling; false when the deadline passes.
bool WaitUntil(const std::function<bool()>& done, std::chrono::steady_clock::duration timeout = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Collects what a transport delivers. Must outlive the transport it feeds.
class Inbox {
 public:
  Transport::Handler handler() {
    return [this](Message m) { Add(std::move(m)); };
  }
  void Add(Message m) {
    std::lock_guard lock(mu_);
    messages_.push_back(std::move(m));
    cv_.notify_all();
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return messages_.size();
  }
  // True once at least n messages have arrived; false at the deadline.
  bool WaitForCount(size_t n, std::chrono::steady_clock::duration timeout = kDeadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return messages_.size() >= n; });
  }
  // True once a message with this request_id has arrived.
  bool WaitForRequest(uint64_t request_id, std::chrono::steady_clock::duration timeout = kDeadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const Message& m : messages_)
        if (m.header.request_id() == request_id) return true;
      return false;
    });
  }
  std::vector<Message> Snapshot() const {
    std::lock_guard lock(mu_);
    return messages_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
};

void IgnoreMessage(Message) {}

Message MakeMessage(uint64_t request_id, std::vector<Buffer> frames = {}) {
  Message m;
  m.header.set_request_id(request_id);
  m.header.mutable_heartbeat();
  m.frames = std::move(frames);
  return m;
}

Buffer U64Frame(uint64_t value) { return Buffer::CopyOf(&value, sizeof(value)); }
uint64_t U64Of(const Buffer& b) {
  uint64_t v = 0;
  if (b.size() == sizeof(v)) std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

// `size` pseudo-random bytes, different for each seed.
Buffer PatternFrame(size_t size, uint64_t seed) {
  Buffer b = Buffer::Allocate(size);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b.mutable_data()[i] = static_cast<std::byte>(x);
  }
  return b;
}

::testing::AssertionResult SameFrames(const std::vector<Buffer>& got, const std::vector<Buffer>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "frame count " << got.size() << ", want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != want[i].size()) {
      return ::testing::AssertionFailure() << "frame " << i << " has " << got[i].size() << " bytes, want "
                                           << want[i].size();
    }
    if (want[i].size() > 0 && std::memcmp(got[i].data(), want[i].data(), want[i].size()) != 0) {
      return ::testing::AssertionFailure() << "frame " << i << " differs in content";
    }
  }
  return ::testing::AssertionSuccess();
}

// A tcp port that nobody listens on now, found by binding and closing it.
// Candidates come from below Linux's ephemeral range (32768+), so that a
// socket reconnecting to the port cannot connect to itself (TCP simultaneous
// open happens when the source port the kernel picks equals the target).
std::string VacantTcpAddress() {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> port(20000, 30000);
  for (int attempt = 0; attempt < 100; ++attempt) {
    ZmqTransport probe(ZmqTransport::Options{.bind = absl::StrCat("tcp://127.0.0.1:", port(rng))});
    if (probe.Start(IgnoreMessage).ok()) {
      std::string address = probe.address();
      probe.Stop();
      return address;
    }
  }
  ZmqTransport probe;  // fall back to an ephemeral port
  if (!probe.Start(IgnoreMessage).ok()) return "tcp://127.0.0.1:1";
  std::string address = probe.address();
  probe.Stop();
  return address;
}

// Starts `t`, retrying briefly: a tcp port just released may be busy for a
// moment.
absl::Status StartAt(Transport& t, Transport::Handler handler) {
  absl::Status status;
  for (int attempt = 0; attempt < 50; ++attempt) {
    status = t.Start(handler);
    if (status.ok() || status.code() != absl::StatusCode::kUnavailable) return status;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return status;
}

// kShm*: ZeroMQ wrapped in a ShmTransport that sends every frame of at least
// one byte through shared-memory rings (peers assumed on this host). kRdma:
// the verbs transport, skipped with the reason where no device is usable.
// Every kind but kInProc comes from MakeTransport, so it is wrapped in a
// CoalescingTransport that holds what a handler sends; kHoldTcp and
// kHoldShm also hold sends to a peer that owes an answer, as a worker's
// transport does (transport/coalescing_transport.h).
enum class Kind { kInProc, kZmqTcp, kZmqIpc, kShmTcp, kShmIpc, kRdma, kHoldTcp, kHoldShm };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kInProc:
      return "InProc";
    case Kind::kZmqTcp:
      return "ZmqTcp";
    case Kind::kZmqIpc:
      return "ZmqIpc";
    case Kind::kShmTcp:
      return "ShmTcp";
    case Kind::kShmIpc:
      return "ShmIpc";
    case Kind::kRdma:
      return "Rdma";
    case Kind::kHoldTcp:
      return "HoldTcp";
    case Kind::kHoldShm:
      return "HoldShm";
  }
  return "Unknown";
}

class TransportConformanceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kRdma) {
      if (absl::Status usable = rdma::Usable(); !usable.ok()) {
        GTEST_SKIP() << "RDMA transport not tested: " << usable.message();
      }
    }
  }

  bool IsZmq() const { return GetParam() != Kind::kInProc; }
  bool IsShm() const {
    return GetParam() == Kind::kShmTcp || GetParam() == Kind::kShmIpc || GetParam() == Kind::kHoldShm;
  }
  bool Holds() const { return GetParam() == Kind::kHoldTcp || GetParam() == Kind::kHoldShm; }
  bool IsIpc() const { return GetParam() == Kind::kZmqIpc || GetParam() == Kind::kShmIpc; }

  // A transport on a fresh endpoint (not started).
  std::unique_ptr<Transport> NewTransport() {
    switch (GetParam()) {
      case Kind::kInProc:
        return network_.Create(absl::StrCat("node-", next_name_++));
      default:
        return MakeOrNull(IsIpc() ? DefaultBind("ipc", "") : DefaultBind("tcp", "127.0.0.1"));
    }
  }

  // A transport that listens at exactly `address` once started.
  std::unique_ptr<Transport> TransportAt(const std::string& address) {
    if (GetParam() == Kind::kInProc) {
      constexpr std::string_view kScheme = "inproc://";
      return network_.Create(address.substr(kScheme.size()));
    }
    return MakeOrNull(address);
  }

  // An address nobody listens on, where TransportAt can listen later.
  std::string VacantAddress() {
    switch (GetParam()) {
      case Kind::kInProc:
        return absl::StrCat("inproc://vacant-", next_name_++);
      default:
        return IsIpc() ? DefaultBind("ipc", "") : VacantTcpAddress();
    }
  }

  static absl::Status StartWithRetry(Transport& t, Transport::Handler handler) {
    return StartAt(t, std::move(handler));
  }

  std::unique_ptr<Transport> MakeOrNull(const std::string& bind) const {
    TransportChoice choice;
    choice.shm = IsShm();
    choice.shm_options.min_frame_bytes = 1;
    choice.shm_options.ring_bytes = 32u << 20;
    choice.shm_options.assume_local_peers = true;
    choice.coalesce.hold_requests = Holds();
    if (GetParam() == Kind::kRdma) {
      choice.kind = TransportChoice::Kind::kRdma;
      choice.rdma_required = true;
    }
    absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(ZmqTransport::Options{.bind = bind}, choice);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  InProcNetwork network_;  // outlives every transport of a test
  int next_name_ = 0;
};

// (a) 10,000 messages from one sender arrive complete and in order.
TEST_P(TransportConformanceTest, OneSenderKeepsOrder) {
  constexpr int kCount = 10'000;
  Inbox inbox;
  auto receiver = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(receiver && sender);
  ASSERT_OK(receiver->Start(inbox.handler()));
  ASSERT_OK(sender->Start(IgnoreMessage));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_OK(sender->Send(receiver->address(), MakeMessage(i + 1, {U64Frame(i)})));
  }
  ASSERT_TRUE(inbox.WaitForCount(kCount)) << "received " << inbox.size() << " of " << kCount;
  std::vector<Message> got = inbox.Snapshot();
  ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].header.request_id(), static_cast<uint64_t>(i + 1)) << "message " << i << " out of order";
    ASSERT_EQ(got[i].frames.size(), 1u);
    ASSERT_EQ(U64Of(got[i].frames[0]), static_cast<uint64_t>(i));
    ASSERT_EQ(got[i].header.sender_address(), sender->address());
  }
}

// (b) 16 MiB frames, empty frames, odd sizes and frame-less messages arrive
// byte for byte.
TEST_P(TransportConformanceTest, FramesRoundTripExactly) {
  Inbox inbox;
  auto receiver = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(receiver && sender);
  ASSERT_OK(receiver->Start(inbox.handler()));
  ASSERT_OK(sender->Start(IgnoreMessage));

  const Buffer big = PatternFrame(16u << 20, 1);
  std::vector<uint8_t> borrowed_bytes(100'000);
  for (size_t i = 0; i < borrowed_bytes.size(); ++i) borrowed_bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::vector<Buffer> mixed = {
      big,
      Buffer(),                                                 // empty
      PatternFrame(1, 2),                                       // tiny
      PatternFrame(1000, 3),                                    // small
      PatternFrame(5000, 4),                                    // medium
      Buffer::Borrow(borrowed_bytes.data(), borrowed_bytes.size()),
      big.Slice(3, 70'001),                                     // odd offset and size
      Buffer(),
  };
  const std::vector<std::vector<Buffer>> messages = {
      mixed,
      {},                    // no data frames at all
      {Buffer()},            // a single empty frame
      {PatternFrame(16u << 20, 5)},
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    ASSERT_OK(sender->Send(receiver->address(), MakeMessage(i + 1, messages[i])));
  }
  ASSERT_TRUE(inbox.WaitForCount(messages.size())) << "received " << inbox.size() << " of " << messages.size();
  std::vector<Message> got = inbox.Snapshot();
  ASSERT_EQ(got.size(), messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    EXPECT_EQ(got[i].header.request_id(), i + 1);
    EXPECT_TRUE(got[i].header.has_heartbeat());
    EXPECT_TRUE(SameFrames(got[i].frames, messages[i])) << "message " << i;
  }
  receiver->Stop();
  sender->Stop();  // the borrowed bytes may go after this
}

// (c) 8 senders on their own threads to one receiver: everything arrives, and
// each sender's messages arrive in its order.
TEST_P(TransportConformanceTest, ManySendersKeepPerSenderOrder) {
  constexpr int kSenders = 8;
  constexpr int kPerSender = 1000;
  Inbox inbox;
  auto receiver = NewTransport();
  ASSERT_TRUE(receiver);
  ASSERT_OK(receiver->Start(inbox.handler()));
  std::vector<std::unique_ptr<Transport>> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.push_back(NewTransport());
    ASSERT_TRUE(senders.back());
    ASSERT_OK(senders.back()->Start(IgnoreMessage));
  }
  std::atomic<int> send_errors{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSenders; ++s) {
    threads.emplace_back([&, s] {
      for (int i = 0; i < kPerSender; ++i) {
        Message m = MakeMessage(i + 1, {U64Frame(s)});
        m.header.set_sender_id(s);
        if (!senders[s]->Send(receiver->address(), std::move(m)).ok()) send_errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(send_errors.load(), 0);
  constexpr size_t kTotal = kSenders * kPerSender;
  ASSERT_TRUE(inbox.WaitForCount(kTotal)) << "received " << inbox.size() << " of " << kTotal;
  std::vector<uint64_t> next(kSenders, 1);
  for (const Message& m : inbox.Snapshot()) {
    const uint32_t s = m.header.sender_id();
    ASSERT_LT(s, static_cast<uint32_t>(kSenders));
    EXPECT_EQ(m.header.sender_address(), senders[s]->address());
    ASSERT_EQ(m.header.request_id(), next[s]) << "sender " << s << " out of order";
    next[s]++;
  }
  for (int s = 0; s < kSenders; ++s) EXPECT_EQ(next[s], static_cast<uint64_t>(kPerSender + 1)) << "sender " << s;
}

// One transport used by several threads at once, towards two receivers.
TEST_P(TransportConformanceTest, ConcurrentSendsThroughOneTransport) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  Inbox inbox_a, inbox_b;
  auto a = NewTransport();
  auto b = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(a && b && sender);
  ASSERT_OK(a->Start(inbox_a.handler()));
  ASSERT_OK(b->Start(inbox_b.handler()));
  ASSERT_OK(sender->Start(IgnoreMessage));
  std::vector<std::thread> threads;
  std::atomic<int> send_errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Message m = MakeMessage(i + 1, {PatternFrame(i % 3 == 0 ? 4096 : 16, i)});
        m.header.set_sender_id(t);
        const std::string& to = (i % 2 == 0) ? a->address() : b->address();
        if (!sender->Send(to, std::move(m)).ok()) send_errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(send_errors.load(), 0);
  const size_t half = kThreads * kPerThread / 2;
  ASSERT_TRUE(inbox_a.WaitForCount(half)) << "a received " << inbox_a.size() << " of " << half;
  ASSERT_TRUE(inbox_b.WaitForCount(half)) << "b received " << inbox_b.size() << " of " << half;
  for (Inbox* inbox : {&inbox_a, &inbox_b}) {
    std::map<uint32_t, uint64_t> last;  // per sending thread: calls from one thread stay ordered
    for (const Message& m : inbox->Snapshot()) {
      EXPECT_GT(m.header.request_id(), last[m.header.sender_id()]);
      last[m.header.sender_id()] = m.header.request_id();
      ASSERT_EQ(m.frames.size(), 1u);
      const uint64_t i = m.header.request_id() - 1;
      EXPECT_TRUE(SameFrames(m.frames, {PatternFrame(i % 3 == 0 ? 4096 : 16, i)}));
    }
  }
}

// (d) The receiver replies to header.sender_address and the sender gets it.
TEST_P(TransportConformanceTest, ReplyReachesSenderAddress) {
  constexpr int kRequests = 100;
  auto server = NewTransport();
  auto client = NewTransport();
  ASSERT_TRUE(server && client);
  Transport* server_ptr = server.get();
  std::atomic<int> reply_errors{0};
  ASSERT_OK(server->Start([server_ptr, &reply_errors](Message request) {
    Message reply = MakeMessage(request.header.request_id(), request.frames);  // echo the frames
    reply.header.mutable_ack();
    if (!server_ptr->Send(request.header.sender_address(), std::move(reply)).ok()) reply_errors++;
  }));
  Inbox replies;
  ASSERT_OK(client->Start(replies.handler()));
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_OK(client->Send(server->address(), MakeMessage(i + 1, {PatternFrame(100 + i * 100, i)})));
  }
  ASSERT_TRUE(replies.WaitForCount(kRequests)) << "got " << replies.size() << " replies of " << kRequests;
  EXPECT_EQ(reply_errors.load(), 0);
  std::vector<Message> got = replies.Snapshot();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(got[i].header.request_id(), static_cast<uint64_t>(i + 1));
    EXPECT_TRUE(got[i].header.has_ack());
    EXPECT_EQ(got[i].header.sender_address(), server->address());
    EXPECT_TRUE(SameFrames(got[i].frames, {PatternFrame(100 + i * 100, i)})) << "reply " << i;
  }
}

// (e) Sending to nobody, or to a peer that stopped, is OK and does not block;
// a peer that comes back at the same address gets new messages.
TEST_P(TransportConformanceTest, PeerDeathAndRestart) {
  auto sender = NewTransport();
  ASSERT_TRUE(sender);
  ASSERT_OK(sender->Start(IgnoreMessage));
  const std::string address = VacantAddress();

  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(sender->Send(address, MakeMessage(100 + i, {PatternFrame(2048, i)})));  // nobody listens
  }

  {  // A peer appears at the address and gets a message.
    Inbox inbox;
    auto peer = TransportAt(address);
    ASSERT_TRUE(peer);
    ASSERT_OK(StartWithRetry(*peer, inbox.handler()));
    ASSERT_OK(sender->Send(address, MakeMessage(1000)));
    ASSERT_TRUE(inbox.WaitForRequest(1000)) << "the first peer never got message 1000";
    peer->Stop();
  }

  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(sender->Send(address, MakeMessage(2000 + i, {PatternFrame(2048, i)})));  // the peer is gone
  }

  {  // It comes back at the same address; new messages arrive.
    Inbox inbox;
    auto peer = TransportAt(address);
    ASSERT_TRUE(peer);
    ASSERT_OK(StartWithRetry(*peer, inbox.handler()));
    ASSERT_OK(sender->Send(address, MakeMessage(3000)));
    ASSERT_TRUE(inbox.WaitForRequest(3000)) << "the restarted peer never got message 3000";
    // Only messages sent after the first peer got 1000 may arrive here: what
    // was queued before it reached the first peer (in order) or was lost.
    for (const Message& m : inbox.Snapshot()) {
      EXPECT_GE(m.header.request_id(), 2000u) << "a message meant for the first peer was delivered again";
    }
  }
}

// (e2) Forget (Transport::Forget): what is queued for a peer nobody listens
// on is dropped and let go, so a process that listens at the address later
// gets only what is sent after; a peer never sent to needs nothing; a
// forgotten live peer is reached again by the next Send.
TEST_P(TransportConformanceTest, ForgetDropsWhatIsQueuedForAPeer) {
  auto sender = NewTransport();
  ASSERT_TRUE(sender);
  ASSERT_OK(sender->Start(IgnoreMessage));
  const ForgetResult never = sender->Forget(VacantAddress(), kDeadline);
  EXPECT_EQ(never.messages_dropped, 0u) << "a peer never sent to";
  EXPECT_EQ(never.frames_pending, 0u);
  EXPECT_EQ(never.frames_still_held, 0u);

  // A large frame the caller owns, then small ones borrowed from it (which
  // a transport that holds requests keeps until the first is answered).
  const std::string address = VacantAddress();
  auto owned = std::make_shared<std::vector<std::byte>>(64 << 10, std::byte{0x5a});
  ASSERT_OK(sender->Send(address, MakeMessage(1, {Buffer::Adopt(owned, owned->data(), owned->size())})));
  std::vector<std::byte> borrowed(256, std::byte{0x11});
  constexpr int kSmall = 10;
  for (int i = 0; i < kSmall; ++i) {
    ASSERT_OK(sender->Send(address, MakeMessage(2 + i, {Buffer::Borrow(borrowed.data(), borrowed.size())})));
  }
  const ForgetResult forgot = sender->Forget(address, kDeadline);
  EXPECT_EQ(forgot.frames_still_held, 0u);
  EXPECT_EQ(owned.use_count(), 1) << "a frame sent to the forgotten peer is still referenced";
  if (Holds()) {
    EXPECT_EQ(forgot.messages_dropped, static_cast<uint64_t>(kSmall)) << "the held requests";
  }
  std::fill(borrowed.begin(), borrowed.end(), std::byte{0xee});  // the caller reuses its memory

  Inbox inbox;
  auto peer = TransportAt(address);
  ASSERT_TRUE(peer);
  ASSERT_OK(StartWithRetry(*peer, inbox.handler()));
  ASSERT_OK(sender->Send(address, MakeMessage(100)));
  ASSERT_TRUE(inbox.WaitForRequest(100)) << "the peer never got message 100";
  // Forgetting a live peer: the next Send reaches it on a new connection.
  EXPECT_EQ(sender->Forget(address, kDeadline).frames_still_held, 0u);
  ASSERT_OK(sender->Send(address, MakeMessage(101)));
  ASSERT_TRUE(inbox.WaitForRequest(101)) << "the peer never got message 101, sent after Forget";
  std::vector<uint64_t> ids;
  for (const Message& m : inbox.Snapshot()) ids.push_back(m.header.request_id());
  EXPECT_THAT(ids, ::testing::ElementsAre(100u, 101u)) << "a message queued before Forget was delivered";
}

// Link events (Transport::SetLinkHandler): a sender hears that its
// connection to a peer went down when the peer goes, and that it was made
// again when a peer listens there again; nothing for the first connection.
class LinkLog {
 public:
  Transport::LinkHandler handler() {
    return [this](const std::string& address, bool up) {
      std::lock_guard lock(mu_);
      events_.emplace_back(address, up);
      cv_.notify_all();
    };
  }
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return events_.size() >= n; });
  }
  std::vector<std::pair<std::string, bool>> Snapshot() const {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, bool>> events_;
};

TEST_P(TransportConformanceTest, LinkEventsFollowAPeersConnection) {
  if (GetParam() == Kind::kInProc || GetParam() == Kind::kRdma) {
    GTEST_SKIP() << "no connections of its own to watch";
  }
  LinkLog links;
  auto sender = NewTransport();
  ASSERT_TRUE(sender);
  sender->SetLinkHandler(links.handler());
  ASSERT_OK(sender->Start(IgnoreMessage));
  const std::string address = VacantAddress();
  {
    Inbox inbox;
    auto peer = TransportAt(address);
    ASSERT_TRUE(peer);
    ASSERT_OK(StartWithRetry(*peer, inbox.handler()));
    ASSERT_OK(sender->Send(address, MakeMessage(1)));
    ASSERT_TRUE(inbox.WaitForRequest(1));
    EXPECT_TRUE(links.Snapshot().empty()) << "the first connection is no event";
    peer->Stop();
  }
  ASSERT_TRUE(links.WaitFor(1)) << "no word that the connection went down";
  {
    Inbox inbox;
    auto peer = TransportAt(address);
    ASSERT_TRUE(peer);
    ASSERT_OK(StartWithRetry(*peer, inbox.handler()));
    ASSERT_TRUE(links.WaitFor(2)) << "no word that the connection was made again";
    ASSERT_OK(sender->Send(address, MakeMessage(2)));
    ASSERT_TRUE(inbox.WaitForRequest(2));
  }
  const auto events = links.Snapshot();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0], std::make_pair(address, false));
  EXPECT_EQ(events[1], std::make_pair(address, true));
}

// (f) Garbage from a raw ZeroMQ peer is counted and dropped; the handler never
// sees it and good messages still arrive.
TEST_P(TransportConformanceTest, MalformedInputIsCountedAndDropped) {
  if (!IsZmq()) GTEST_SKIP() << "raw malformed bytes cannot reach an in-process transport";
  Inbox inbox;
  auto receiver = NewTransport();
  ASSERT_TRUE(receiver);
  ASSERT_OK(receiver->Start(inbox.handler()));

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(receiver->address());

  // 1: a header that is not a protobuf.
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage";
  raw.send(zmq::buffer(garbage), zmq::send_flags::none);
  // 2: the same, followed by data frames.
  raw.send(zmq::buffer(garbage), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("data"), zmq::send_flags::none);
  // 3: a valid header that names no sender (nobody could reply).
  proto::Envelope anonymous;
  anonymous.set_request_id(77);
  const std::string anonymous_bytes = anonymous.SerializeAsString();
  raw.send(zmq::buffer(anonymous_bytes), zmq::send_flags::none);
  // 4: a good header with more data frames than the limit (64).
  proto::Envelope named;
  named.set_request_id(78);
  named.set_sender_address("tcp://raw-peer:1");
  const std::string named_bytes = named.SerializeAsString();
  raw.send(zmq::buffer(named_bytes), zmq::send_flags::sndmore);
  for (int i = 0; i < 65; ++i) {
    raw.send(zmq::str_buffer("x"), i + 1 < 65 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  ASSERT_TRUE(WaitUntil([&] { return receiver->stats().malformed_received >= 4; }))
      << "malformed_received = " << receiver->stats().malformed_received;

  // A good message from the same raw peer, then one from a real transport.
  named.set_request_id(79);
  const std::string good_bytes = named.SerializeAsString();
  raw.send(zmq::buffer(good_bytes), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("payload"), zmq::send_flags::none);
  auto sender = NewTransport();
  ASSERT_TRUE(sender);
  ASSERT_OK(sender->Start(IgnoreMessage));
  ASSERT_OK(sender->Send(receiver->address(), MakeMessage(80)));
  ASSERT_TRUE(inbox.WaitForRequest(79)) << "good raw message not delivered";
  ASSERT_TRUE(inbox.WaitForRequest(80)) << "good transport message not delivered";

  EXPECT_EQ(receiver->stats().malformed_received, 4u);
  std::vector<Message> got = inbox.Snapshot();
  ASSERT_EQ(got.size(), 2u) << "a malformed message reached the handler";
  for (const Message& m : got) {
    if (m.header.request_id() == 79) {
      ASSERT_EQ(m.frames.size(), 1u);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.frames[0].data()), m.frames[0].size()), "payload");
    }
  }
  raw.close();
}

// (g) Stop returns (no timing is asserted, but it must not hang) and the
// handler never runs after it returned, even with messages still streaming in.
TEST_P(TransportConformanceTest, NoDeliveryAfterStop) {
  std::atomic<bool> stop_returned{false};
  std::atomic<int> late_deliveries{0};
  std::atomic<int> delivered{0};
  auto receiver = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(receiver && sender);
  ASSERT_OK(receiver->Start([&](Message) {
    if (stop_returned.load()) late_deliveries++;
    delivered++;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a handler that takes a while
  }));
  ASSERT_OK(sender->Start(IgnoreMessage));
  const std::string to = receiver->address();

  std::atomic<bool> keep_sending{true};
  std::thread pump([&] {
    uint64_t id = 1;
    while (keep_sending.load()) {
      (void)sender->Send(to, MakeMessage(id++, {PatternFrame(64, id)}));
      if (id % 64 == 0) std::this_thread::sleep_for(milliseconds(1));
    }
  });
  ASSERT_TRUE(WaitUntil([&] { return delivered.load() >= 20; })) << "nothing delivered";
  receiver->Stop();
  stop_returned.store(true);
  std::this_thread::sleep_for(milliseconds(100));  // keep streaming at the stopped receiver
  keep_sending.store(false);
  pump.join();
  receiver->Stop();  // idempotent
  receiver.reset();
  EXPECT_EQ(late_deliveries.load(), 0) << "the handler ran after Stop returned";
}

// Stop() on a transport that was never started, twice, is harmless.
TEST_P(TransportConformanceTest, StopWithoutStart) {
  auto t = NewTransport();
  ASSERT_TRUE(t);
  t->Stop();
  t->Stop();
}

// (h) stats() counts messages and bytes (header + frames) on both sides.
TEST_P(TransportConformanceTest, StatsCountMessagesAndBytes) {
  Inbox inbox;
  auto receiver = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(receiver && sender);
  ASSERT_OK(receiver->Start(inbox.handler()));
  ASSERT_OK(sender->Start(IgnoreMessage));

  Message m = MakeMessage(42, {PatternFrame(100, 1), PatternFrame(5000, 2), Buffer()});
  m.header.set_epoch(9);
  Message stamped = m;
  stamped.header.set_sender_address(sender->address());
  const uint64_t expected_bytes = stamped.header.ByteSizeLong() + 5100;
  // Each message's own count (Message::sent_bytes, received_bytes) adds up
  // to the transport's.
  auto counted = std::make_shared<std::atomic<uint64_t>>(0);
  m.sent_bytes = counted;
  Message second_message = MakeMessage(43);
  second_message.sent_bytes = counted;
  ASSERT_OK(sender->Send(receiver->address(), std::move(m)));
  // A transport that holds requests to a peer owing an answer would batch
  // the second with the first if the first had not left yet (a loaded
  // machine: 1 message of 4 parts where 2 of 5 were counted on): the
  // counts below are for two messages, so the second waits for the first.
  if (Holds()) {
    ASSERT_TRUE(inbox.WaitForCount(1)) << "received " << inbox.size();
  }
  ASSERT_OK(sender->Send(receiver->address(), std::move(second_message)));
  const uint64_t expected_total = expected_bytes + [&] {
    Message second = MakeMessage(43);
    second.header.set_sender_address(sender->address());
    return second.header.ByteSizeLong();
  }();
  ASSERT_TRUE(inbox.WaitForCount(2)) << "received " << inbox.size();
  // The sender counts a message once its send returned, which may be after
  // the receiver has it (CI on a loaded machine read 1 message and 4 parts).
  ASSERT_TRUE(WaitUntil([&] { return sender->stats().messages_sent >= 2; }))
      << "the sender counted " << sender->stats().messages_sent << " messages sent";

  const TransportStats sent = sender->stats();
  EXPECT_EQ(counted->load(), sent.bytes_sent);
  uint64_t received_bytes = 0;
  for (const Message& r : inbox.Snapshot()) {
    EXPECT_FALSE(r.sent_bytes) << "the sender's counter must not travel";
    received_bytes += r.received_bytes;
  }
  EXPECT_EQ(received_bytes, receiver->stats().bytes_received);
  // ZeroMQ parts: a header and three frames, then a header alone (the
  // shared-memory frames leave empty parts behind).
  const bool zmq = IsZmq() && GetParam() != Kind::kRdma;
  EXPECT_EQ(sent.zmq_parts_sent, zmq ? 5u : 0u);
  EXPECT_EQ(receiver->stats().zmq_parts_received, zmq ? 5u : 0u);
  if (IsShm()) {
    // Headers carry the host identity and two ring descriptors; the frames'
    // bytes went through a ring and are counted all the same.
    EXPECT_EQ(sent.shm_frames_sent, 2u);
    EXPECT_EQ(sent.shm_bytes_sent, 5100u);
    EXPECT_EQ(receiver->stats().shm_bytes_received, 5100u);
    EXPECT_EQ(receiver->stats().bytes_received, sent.bytes_sent);
    EXPECT_GT(sent.bytes_sent, expected_total);
    EXPECT_LT(sent.bytes_sent, expected_total + 256);
    return;
  }
  EXPECT_EQ(sent.messages_sent, 2u);
  EXPECT_EQ(sent.bytes_sent, expected_total);
  EXPECT_EQ(sent.messages_received, 0u);
  EXPECT_EQ(sent.bytes_received, 0u);
  const TransportStats received = receiver->stats();
  EXPECT_EQ(received.messages_received, 2u);
  EXPECT_EQ(received.bytes_received, expected_total);
  EXPECT_EQ(received.messages_sent, 0u);
  EXPECT_EQ(received.malformed_received, 0u);
}

// (l) Posted destinations (Transport::PostDestination). A transport that
// does not offer them says so (PlacesInto false, Unimplemented, nothing to
// cancel); one that does writes the matching frame into the caller's memory
// and hands it over as a view of that memory; a frame of another size, or
// one whose destination was cancelled, is delivered as usual.
TEST_P(TransportConformanceTest, PostedDestinationsTakeTheirFramesInPlace) {
  Inbox inbox;
  Inbox back;
  auto receiver = NewTransport();
  auto sender = NewTransport();
  ASSERT_TRUE(receiver && sender);
  ASSERT_OK(receiver->Start(inbox.handler()));
  ASSERT_OK(sender->Start(back.handler()));
  const std::string from = sender->address();
  // Each side hears from the other first (a same-host transport learns its
  // peer, and whether it may lend to it, from the headers it receives).
  ASSERT_OK(sender->Send(receiver->address(), MakeMessage(1)));
  ASSERT_TRUE(inbox.WaitForRequest(1));
  ASSERT_OK(receiver->Send(from, MakeMessage(2)));
  ASSERT_TRUE(back.WaitForRequest(2));
  // Both sides now know whether the other is on this host's memory path
  // (wide rows go whole there: WorkerCoreOptions::whole_rows_to).
  EXPECT_EQ(receiver->SameHostPath(from), IsShm());
  EXPECT_EQ(sender->SameHostPath(receiver->address()), IsShm());
  // (The shared-memory kinds here assume every peer local; ShmTransportTest
  // covers peers not yet heard from and peers on another host.)
  if (!IsShm()) {
    EXPECT_FALSE(sender->SameHostPath("tcp://127.0.0.1:1"));
  }

  if (!receiver->PlacesInto(from)) {
    EXPECT_EQ(receiver->PostDestination(from, 10, 0, Buffer::Allocate(64)).code(), absl::StatusCode::kUnimplemented);
    EXPECT_FALSE(receiver->CancelDestination(from, 10, 0));
    return;
  }
  EXPECT_EQ(receiver->PostDestination(from, 10, 0, Buffer()).code(), absl::StatusCode::kInvalidArgument);

  // Frame 1 of request 10: large enough to be lent by a same-host sender.
  constexpr size_t kLarge = 3u << 20;
  std::vector<std::byte> large(kLarge, std::byte{0xAB});
  ASSERT_OK(receiver->PostDestination(from, 10, 1, Buffer::Borrow(large.data(), large.size())));
  EXPECT_EQ(receiver->PostDestination(from, 10, 1, Buffer::Borrow(large.data(), large.size())).code(),
            absl::StatusCode::kAlreadyExists);
  // Frame 0 of request 11: a ring-sized frame, into an owned Buffer.
  Buffer medium = Buffer::Allocate(256 * 1024);
  ASSERT_OK(receiver->PostDestination(from, 11, 0, medium));
  // Request 12 comes with a frame of another size: delivered as usual.
  std::vector<std::byte> other(100 * 1024, std::byte{0xCD});
  ASSERT_OK(receiver->PostDestination(from, 12, 0, Buffer::Borrow(other.data(), other.size())));
  // Request 13's destination is cancelled before its frame comes.
  std::vector<std::byte> cancelled(128 * 1024, std::byte{0xEF});
  ASSERT_OK(receiver->PostDestination(from, 13, 0, Buffer::Borrow(cancelled.data(), cancelled.size())));
  EXPECT_TRUE(receiver->CancelDestination(from, 13, 0));
  EXPECT_FALSE(receiver->CancelDestination(from, 13, 0)) << "cancelled twice";

  const TransportStats before = receiver->stats();
  const std::vector<Buffer> want10 = {U64Frame(10), PatternFrame(kLarge, 10)};
  const std::vector<Buffer> want11 = {PatternFrame(medium.size(), 11)};
  const std::vector<Buffer> want12 = {PatternFrame(200 * 1024, 12)};
  const std::vector<Buffer> want13 = {PatternFrame(cancelled.size(), 13)};
  for (auto [id, want] : {std::pair{10, &want10}, std::pair{11, &want11}, std::pair{12, &want12},
                          std::pair{13, &want13}}) {
    Message m = MakeMessage(id, *want);
    m.lendable = true;  // the frames are read with CopyOut below
    ASSERT_OK(sender->Send(receiver->address(), std::move(m)));
  }
  ASSERT_TRUE(inbox.WaitForRequest(13));
  std::map<uint64_t, Message> got;
  for (Message& m : inbox.Snapshot()) got[m.header.request_id()] = std::move(m);
  auto local = [](const Message& m) {
    std::vector<Buffer> frames;
    for (const Buffer& f : m.frames) {
      Buffer copy = Buffer::Allocate(f.size());
      const CopyRange whole{0, copy.mutable_data(), f.size()};
      EXPECT_OK(f.CopyOut({&whole, 1}));
      frames.push_back(copy);
    }
    return frames;
  };

  ASSERT_EQ(got[10].frames.size(), 2u);
  EXPECT_EQ(got[10].frames[1].data(), large.data()) << "frame not placed in the posted memory";
  EXPECT_EQ(got[10].frames[1].size(), kLarge);
  EXPECT_TRUE(SameFrames(local(got[10]), want10));
  EXPECT_EQ(std::memcmp(large.data(), want10[1].data(), kLarge), 0);
  EXPECT_FALSE(receiver->CancelDestination(from, 10, 1)) << "a used destination is no longer posted";

  ASSERT_EQ(got[11].frames.size(), 1u);
  EXPECT_EQ(got[11].frames[0].data(), medium.data());
  EXPECT_TRUE(SameFrames(local(got[11]), want11));

  ASSERT_EQ(got[12].frames.size(), 1u);
  EXPECT_NE(got[12].frames[0].data(), reinterpret_cast<const std::byte*>(other.data()));
  EXPECT_TRUE(SameFrames(local(got[12]), want12));
  EXPECT_EQ(other[0], std::byte{0xCD}) << "a destination of another size was written";
  EXPECT_TRUE(receiver->CancelDestination(from, 12, 0)) << "a mismatch leaves the destination posted";

  ASSERT_EQ(got[13].frames.size(), 1u);
  EXPECT_NE(got[13].frames[0].data(), reinterpret_cast<const std::byte*>(cancelled.data()));
  EXPECT_TRUE(SameFrames(local(got[13]), want13));
  for (std::byte b : cancelled) ASSERT_EQ(b, std::byte{0xEF}) << "a cancelled destination was written";

  const TransportStats after = receiver->stats();
  EXPECT_EQ(after.frames_placed - before.frames_placed, 2u);
  EXPECT_EQ(after.bytes_placed - before.bytes_placed, kLarge + medium.size());
  got.clear();
  receiver->Stop();
  sender->Stop();
  EXPECT_FALSE(receiver->PlacesInto(from));
  EXPECT_EQ(receiver->PostDestination(from, 20, 0, Buffer::Allocate(8)).code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest,
                         ::testing::Values(Kind::kInProc, Kind::kZmqTcp, Kind::kZmqIpc, Kind::kShmTcp,
                                           Kind::kShmIpc, Kind::kRdma, Kind::kHoldTcp, Kind::kHoldShm),
                         KindName);

// ---- ZmqTransport specifics (transport/zmq_transport.h) ----

TEST(ZmqTransportConformanceTest, AddressIsTheBoundEndpoint) {
  ZmqTransport tcp;
  EXPECT_EQ(tcp.address(), "");
  ASSERT_OK(tcp.Start(IgnoreMessage));
  EXPECT_TRUE(absl::StartsWith(tcp.address(), "tcp://127.0.0.1:")) << tcp.address();
  EXPECT_FALSE(absl::EndsWith(tcp.address(), ":0")) << "port 0 must become the real port";

  const std::string path = DefaultBind("ipc", "");
  ZmqTransport ipc(ZmqTransport::Options{.bind = path});
  ASSERT_OK(ipc.Start(IgnoreMessage));
  EXPECT_EQ(ipc.address(), path);
}

bool PathExists(const std::string& ipc_endpoint) {
  struct stat st {};
  return stat(ipc_endpoint.substr(std::string("ipc://").size()).c_str(), &st) == 0;
}

TEST(ZmqTransportConformanceTest, StopRemovesTheIpcSocketFile) {
  const std::string path = DefaultBind("ipc", "");
  {
    ZmqTransport t(ZmqTransport::Options{.bind = path});
    ASSERT_OK(t.Start(IgnoreMessage));
    EXPECT_TRUE(PathExists(path));
  }
  EXPECT_FALSE(PathExists(path)) << "socket file left behind";

  // A transport that lost its path to a newer bind leaves the newer file alone.
  Inbox inbox;
  auto old_owner = std::make_unique<ZmqTransport>(ZmqTransport::Options{.bind = path});
  ASSERT_OK(old_owner->Start(IgnoreMessage));
  ZmqTransport new_owner(ZmqTransport::Options{.bind = path});
  ASSERT_OK(new_owner.Start(inbox.handler()));
  old_owner.reset();
  EXPECT_TRUE(PathExists(path)) << "the newer transport's socket file was removed";
  ZmqTransport sender;
  ASSERT_OK(sender.Start(IgnoreMessage));
  ASSERT_OK(sender.Send(path, MakeMessage(5)));
  EXPECT_TRUE(inbox.WaitForRequest(5));
  new_owner.Stop();
  EXPECT_FALSE(PathExists(path));
}

TEST(ZmqTransportConformanceTest, WildcardBindAdvertisesAHost) {
  ZmqTransport advertised(ZmqTransport::Options{.bind = "tcp://*:0", .advertise_host = "node7.example"});
  ASSERT_OK(advertised.Start(IgnoreMessage));
  EXPECT_TRUE(absl::StartsWith(advertised.address(), "tcp://node7.example:")) << advertised.address();
  EXPECT_FALSE(absl::EndsWith(advertised.address(), ":0"));

  ZmqTransport plain(ZmqTransport::Options{.bind = "tcp://0.0.0.0:0"});
  ASSERT_OK(plain.Start(IgnoreMessage));
  EXPECT_FALSE(absl::StrContains(plain.address(), "0.0.0.0")) << plain.address();
  EXPECT_FALSE(absl::StrContains(plain.address(), "*")) << plain.address();
}

TEST(ZmqTransportConformanceTest, BindFailureIsUnavailableAndNamesTheEndpoint) {
  ZmqTransport first;
  ASSERT_OK(first.Start(IgnoreMessage));
  ZmqTransport second(ZmqTransport::Options{.bind = first.address()});
  absl::Status status = second.Start(IgnoreMessage);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), first.address())) << status;
  EXPECT_EQ(second.Send(first.address(), MakeMessage(1)).code(), absl::StatusCode::kFailedPrecondition);

  ZmqTransport bad_host(ZmqTransport::Options{.bind = "tcp://256.1.2.3:0"});
  status = bad_host.Start(IgnoreMessage);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "tcp://256.1.2.3:0")) << status;
}

TEST(ZmqTransportConformanceTest, LifecycleErrors) {
  ZmqTransport t;
  EXPECT_EQ(t.Send("tcp://127.0.0.1:1", MakeMessage(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ZmqTransport(ZmqTransport::Options{.io_threads = 0}).Start(IgnoreMessage).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ZmqTransport(ZmqTransport::Options{.bind = "udp://127.0.0.1:0"}).Start(IgnoreMessage).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(t.Start(IgnoreMessage));
  EXPECT_EQ(t.Start(IgnoreMessage).code(), absl::StatusCode::kFailedPrecondition);
  t.Stop();
  EXPECT_EQ(t.Send("tcp://127.0.0.1:1", MakeMessage(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Start(IgnoreMessage).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ZmqTransportConformanceTest, SendRejectsBadDestinationsAndOversizedMessages) {
  ZmqTransport t(ZmqTransport::Options{.max_message_bytes = 10'000, .max_data_frames = 3});
  ASSERT_OK(t.Start(IgnoreMessage));
  EXPECT_EQ(t.Send("nonsense", MakeMessage(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Send("tcp://", MakeMessage(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Send(t.address(), MakeMessage(1, {Buffer(), Buffer(), Buffer(), Buffer()})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Send(t.address(), MakeMessage(1, {PatternFrame(10'001, 1)})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_OK(t.Send(t.address(), MakeMessage(1, {PatternFrame(9'000, 1)})));
}

TEST(ZmqTransportConformanceTest, OversizedIncomingMessagesAreDropped) {
  Inbox inbox;
  ZmqTransport receiver(ZmqTransport::Options{.max_message_bytes = 4096});
  ASSERT_OK(receiver.Start(inbox.handler()));

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(receiver.address());
  proto::Envelope header;
  header.set_request_id(1);
  header.set_sender_address("tcp://raw-peer:1");
  const std::string header_bytes = header.SerializeAsString();
  const std::string chunk(2000, 'z');
  // Each frame fits, the sum (over 6000 bytes) does not.
  raw.send(zmq::buffer(header_bytes), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(chunk), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(chunk), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(chunk), zmq::send_flags::none);
  ASSERT_TRUE(WaitUntil([&] { return receiver.stats().malformed_received >= 1; }));

  // A single frame over the limit: libzmq drops that connection. The
  // transport keeps serving others.
  const std::string huge(10'000, 'h');
  raw.send(zmq::buffer(header_bytes), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(huge), zmq::send_flags::none);

  ZmqTransport sender;
  ASSERT_OK(sender.Start(IgnoreMessage));
  ASSERT_OK(sender.Send(receiver.address(), MakeMessage(2, {PatternFrame(1000, 1)})));
  ASSERT_TRUE(inbox.WaitForRequest(2));
  std::this_thread::sleep_for(milliseconds(50));
  for (const Message& m : inbox.Snapshot()) EXPECT_EQ(m.header.request_id(), 2u) << "an oversized message got through";
}

TEST(ZmqTransportConformanceTest, ReceivedFramesAreAlignedAndIntact) {
  Inbox inbox;
  ZmqTransport receiver, sender;
  ASSERT_OK(receiver.Start(inbox.handler()));
  ASSERT_OK(sender.Start(IgnoreMessage));
  const Buffer source = PatternFrame(3u << 20, 9);
  std::vector<Buffer> frames;
  for (size_t size : {8u, 12u, 100u, 5000u, 8192u, 20'000u, 1u << 20}) {
    frames.push_back(source.Slice(1, size));  // deliberately misaligned on the sending side
  }
  ASSERT_OK(sender.Send(receiver.address(), MakeMessage(1, frames)));
  ASSERT_TRUE(inbox.WaitForCount(1));
  const Message got = inbox.Snapshot()[0];
  EXPECT_TRUE(SameFrames(got.frames, frames));
  for (const Buffer& f : got.frames) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 8, 0u) << "frame of " << f.size() << " bytes";
    EXPECT_NE(f.owner(), nullptr) << "a received frame must own its bytes";
  }
}

// The transport holds a sent Buffer until libzmq is done with it, then lets go,
// also when the message could never be delivered.
TEST(ZmqTransportConformanceTest, SentBuffersAreReleased) {
  auto released = std::make_shared<std::atomic<int>>(0);
  auto make_frame = [&](size_t size) {
    auto* bytes = new std::vector<std::byte>(size, std::byte{0x5a});
    std::shared_ptr<void> owner(bytes, [released](void* p) {
      delete static_cast<std::vector<std::byte>*>(p);
      released->fetch_add(1);
    });
    return Buffer::Adopt(std::move(owner), bytes->data(), size);
  };
  Inbox inbox;
  ZmqTransport receiver;
  ASSERT_OK(receiver.Start(inbox.handler()));
  {
    ZmqTransport sender;
    ASSERT_OK(sender.Start(IgnoreMessage));
    ASSERT_OK(sender.Send(receiver.address(), MakeMessage(1, {make_frame(1 << 20)})));
    ASSERT_TRUE(inbox.WaitForCount(1));
    ASSERT_TRUE(WaitUntil([&] { return released->load() == 1; })) << "delivered frame still held";

    ASSERT_OK(sender.Send(VacantTcpAddress(), MakeMessage(2, {make_frame(1 << 20)})));
    sender.Stop();
    EXPECT_EQ(released->load(), 2) << "an undeliverable frame was still held after Stop";
  }
}

// Forget: a message queued for an address nobody listens on is dropped and
// its held frames are let go before Forget returns, so a process that binds
// the address later gets only what is sent after (a stale queued message
// would come first: ZeroMQ keeps the order of a connection). Without it the
// DEALER keeps the message and sends it there, reading the borrowed memory
// as the caller left it. Then the link events of the new connection are
// the first connection's (none), and closing the old one is no event.
TEST(ZmqTransportConformanceTest, ForgetDropsQueuedMessagesAndLetsTheirFramesGo) {
  for (const bool count_backlog : {false, true}) {
    SCOPED_TRACE(count_backlog ? "counting backlogs" : "not counting backlogs");
    LinkLog links;
    ZmqTransport sender(ZmqTransport::Options{.count_backlog = count_backlog});
    sender.SetLinkHandler(links.handler());
    ASSERT_OK(sender.Start(IgnoreMessage));
    const std::string address = VacantTcpAddress();
    auto owned = std::make_shared<std::vector<std::byte>>(64 << 10, std::byte{0x5a});
    std::vector<std::byte> borrowed(64 << 10, std::byte{0x11});
    ASSERT_OK(sender.Send(address, MakeMessage(1, {Buffer::Adopt(owned, owned->data(), owned->size()),
                                                   Buffer::Borrow(borrowed.data(), borrowed.size())})));
    ASSERT_OK(sender.Send(address, MakeMessage(2, {PatternFrame(100, 2)})));  // copied
    EXPECT_EQ(owned.use_count(), 2) << "the queued frame is not held by reference";
    if (count_backlog) {
      EXPECT_EQ(sender.Backlog(address).messages, 2u);
    }

    const ForgetResult forgot = sender.Forget(address, kDeadline);
    EXPECT_EQ(owned.use_count(), 1) << "Forget returned with the queued frame still held";
    EXPECT_EQ(forgot.frames_still_held, 0u);
    // Held: both large frames; counting backlogs, also message 2's last frame.
    EXPECT_EQ(forgot.frames_pending, count_backlog ? 3u : 2u);
    EXPECT_EQ(forgot.messages_dropped, 0u);
    EXPECT_EQ(sender.Backlog(address).messages, 0u);
    std::fill(borrowed.begin(), borrowed.end(), std::byte{0xee});  // the caller reuses its memory

    Inbox inbox;
    ZmqTransport receiver(ZmqTransport::Options{.bind = address});
    ASSERT_OK(StartAt(receiver, inbox.handler()));
    ASSERT_OK(sender.Send(address, MakeMessage(3)));
    ASSERT_TRUE(inbox.WaitForRequest(3)) << "the new process never got message 3";
    ASSERT_OK(sender.Send(address, MakeMessage(4)));
    ASSERT_TRUE(inbox.WaitForRequest(4));
    std::vector<uint64_t> ids;
    for (const Message& m : inbox.Snapshot()) ids.push_back(m.header.request_id());
    EXPECT_THAT(ids, ::testing::ElementsAre(3u, 4u)) << "a message queued before Forget reached the new process";

    // The link to a forgotten and re-made peer: only its own events.
    EXPECT_EQ(sender.Forget(address, kDeadline).frames_still_held, 0u);
    ASSERT_OK(sender.Send(address, MakeMessage(5)));
    ASSERT_TRUE(inbox.WaitForRequest(5));
    receiver.Stop();
    ASSERT_TRUE(links.WaitFor(1)) << "no word that the connection went down";
    const auto events = links.Snapshot();
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0], std::make_pair(address, false));
  }
}

// Sends racing Forgets of their destination: each is dropped by one or goes
// on a new connection; once the senders are done, one more Forget lets go
// of every frame.
TEST(ZmqTransportConformanceTest, SendsRacingForgetAreDroppedOrGoOnANewConnection) {
  LinkLog links;
  ZmqTransport sender(ZmqTransport::Options{.count_backlog = true});
  sender.SetLinkHandler(links.handler());
  ASSERT_OK(sender.Start(IgnoreMessage));
  const std::string address = VacantTcpAddress();
  auto owned = std::make_shared<std::vector<std::byte>>(4 << 10, std::byte{0x5a});
  std::atomic<bool> done{false};
  std::vector<std::thread> senders;
  for (int t = 0; t < 2; ++t) {
    senders.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        EXPECT_OK(sender.Send(address, MakeMessage(i, {Buffer::Adopt(owned, owned->data(), owned->size())})));
      }
    });
  }
  std::thread forgetter([&] {
    while (!done.load()) EXPECT_EQ(sender.Forget(address, kDeadline).frames_still_held, 0u);
  });
  for (std::thread& t : senders) t.join();
  done.store(true);
  forgetter.join();
  EXPECT_EQ(sender.Forget(address, kDeadline).frames_still_held, 0u);
  EXPECT_EQ(owned.use_count(), 1) << "a frame is still referenced after the last Forget";
  EXPECT_EQ(sender.Backlog(address).messages, 0u);
}

// Backlog: messages to a peer count from Send until libzmq wrote their last
// byte (or dropped them), whatever their shape, and nothing else counts.
TEST(ZmqTransportConformanceTest, BacklogCountsWhatAPeerHasNotReadYet) {
  zmq::context_t ctx(1);
  zmq::socket_t slow(ctx, zmq::socket_type::router);
  slow.set(zmq::sockopt::linger, 0);
  slow.set(zmq::sockopt::rcvhwm, 1);  // its I/O thread stops reading the socket at once
  slow.set(zmq::sockopt::rcvbuf, 64 * 1024);
  slow.bind("tcp://127.0.0.1:0");
  const std::string slow_address = slow.get(zmq::sockopt::last_endpoint);

  // No link timeout: Linux counts TCP_USER_TIMEOUT against a zero window
  // too, so a peer that reads nothing for that long (2 s by default; this
  // test under TSan) would have its connection dropped and remade.
  ZmqTransport sender(ZmqTransport::Options{.count_backlog = true, .link_timeout_ms = 0});
  ASSERT_OK(sender.Start(IgnoreMessage));
  EXPECT_EQ(sender.Backlog(slow_address).messages, 0u) << "a peer never sent to";
  constexpr int kBig = 48;
  constexpr size_t kBigBytes = 1 << 20;
  uint64_t sent = 0;
  for (int i = 0; i < kBig; ++i) {
    Message m = MakeMessage(static_cast<uint64_t>(i + 1), {PatternFrame(kBigBytes, i)});
    ASSERT_OK(sender.Send(slow_address, std::move(m)));
  }
  // Header-only messages and a small last frame, behind them.
  ASSERT_OK(sender.Send(slow_address, MakeMessage(100, {})));
  ASSERT_OK(sender.Send(slow_address, MakeMessage(101, {PatternFrame(kBigBytes, 7), PatternFrame(10, 8)})));
  sent = sender.stats().bytes_sent;
  // The kernel's buffers (and libzmq's batch) hold a few MiB at most; the
  // rest waits in the sender.
  PeerBacklog b = sender.Backlog(slow_address);
  EXPECT_GE(b.messages, 24u);
  EXPECT_LE(b.messages, static_cast<uint64_t>(kBig) + 2);
  EXPECT_GE(b.bytes, 24 * kBigBytes);
  EXPECT_LE(b.bytes, sent);
  EXPECT_EQ(sender.Backlog("tcp://127.0.0.1:1").messages, 0u) << "another address";

  // The peer reads everything: the backlog empties, exactly.
  slow.set(zmq::sockopt::rcvtimeo, 10000);  // a lost message fails the test instead of hanging it
  int read = 0;
  while (read < kBig + 2) {
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(slow, std::back_inserter(parts)));
    ++read;
  }
  ASSERT_TRUE(WaitUntil([&] { return sender.Backlog(slow_address).messages == 0; }))
      << sender.Backlog(slow_address).messages << " messages still counted";
  EXPECT_EQ(sender.Backlog(slow_address).bytes, 0u);

  // A message to an address nobody listens on stays queued, and counted.
  const std::string vacant = VacantTcpAddress();
  ASSERT_OK(sender.Send(vacant, MakeMessage(200, {PatternFrame(100, 1)})));
  std::this_thread::sleep_for(milliseconds(50));
  b = sender.Backlog(vacant);
  EXPECT_EQ(b.messages, 1u);
  EXPECT_GT(b.bytes, 100u);
}

TEST(ZmqTransportConformanceTest, HandlerMayStopTheTransport) {
  std::atomic<int> calls{0};
  ZmqTransport receiver, sender;
  ASSERT_OK(receiver.Start([&](Message) {
    calls++;
    receiver.Stop();
  }));
  ASSERT_OK(sender.Start(IgnoreMessage));
  for (int i = 0; i < 10; ++i) ASSERT_OK(sender.Send(receiver.address(), MakeMessage(i + 1)));
  ASSERT_TRUE(WaitUntil([&] { return calls.load() >= 1; }));
  receiver.Stop();  // from this thread: joins and finishes
  EXPECT_EQ(calls.load(), 1);
}

TEST(ZmqTransportConformanceTest, HandlerMayDestroyTheTransport) {
  std::atomic<bool> destroyed{false};
  auto receiver = std::make_unique<ZmqTransport>();
  std::unique_ptr<ZmqTransport>* slot = &receiver;
  ZmqTransport sender;
  std::mutex mu;
  ASSERT_OK(receiver->Start([&, slot](Message) {
    bool destroyed_here = false;
    {
      std::lock_guard lock(mu);
      if (*slot) {
        slot->reset();
        destroyed_here = true;
      }
    }
    // Last touch of the test's stack: once the test sees the flag it may end.
    if (destroyed_here) destroyed = true;
  }));
  std::string to;
  {
    // The handler destroys `receiver` under `mu`; what orders this read before
    // that is the message itself, which passes through libzmq, where
    // ThreadSanitizer cannot follow it.
    std::lock_guard lock(mu);
    to = receiver->address();
  }
  ASSERT_OK(sender.Start(IgnoreMessage));
  for (int i = 0; i < 5; ++i) ASSERT_OK(sender.Send(to, MakeMessage(i + 1)));
  ASSERT_TRUE(WaitUntil([&] { return destroyed.load(); }));
  // The delivery thread finishes the teardown on its own; give it a moment so
  // leak and race checkers see the end of it.
  std::this_thread::sleep_for(milliseconds(200));
}

TEST(ZmqTransportConformanceTest, HandlerExceptionsAreContained) {
  Inbox inbox;
  ZmqTransport receiver, sender;
  ASSERT_OK(receiver.Start([&](Message m) {
    if (m.header.request_id() == 1) throw std::runtime_error("handler bug");
    inbox.Add(std::move(m));
  }));
  ASSERT_OK(sender.Start(IgnoreMessage));
  ASSERT_OK(sender.Send(receiver.address(), MakeMessage(1)));
  ASSERT_OK(sender.Send(receiver.address(), MakeMessage(2)));
  ASSERT_TRUE(inbox.WaitForRequest(2));
}

// ---- MakeTransport / DefaultBind ----

// What the factory's coalescing wrapper (on every transport it makes) wraps.
Transport* UnderCoalescing(const std::unique_ptr<Transport>& t) {
  auto* c = dynamic_cast<CoalescingTransport*>(t.get());
  EXPECT_NE(c, nullptr) << "MakeTransport wraps every transport in a CoalescingTransport";
  return c != nullptr ? &c->inner() : t.get();
}

TEST(TransportFactoryConformanceTest, MakesZmqTransportsForTcpAndIpc) {
  for (const std::string& bind : {DefaultBind("tcp", ""), DefaultBind("ipc", "")}) {
    // By default the same-host path wraps ZeroMQ.
    absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(bind);
    ASSERT_TRUE(t.ok()) << bind << ": " << t.status();
    EXPECT_NE(dynamic_cast<ShmTransport*>(UnderCoalescing(*t)), nullptr);
    ASSERT_OK((*t)->Start(IgnoreMessage));
    // Without it, plain ZeroMQ.
    TransportChoice plain;
    plain.shm = false;
    t = MakeTransport(ZmqTransport::Options{.bind = bind}, plain);
    ASSERT_TRUE(t.ok()) << bind << ": " << t.status();
    EXPECT_NE(dynamic_cast<ZmqTransport*>(UnderCoalescing(*t)), nullptr);
    ASSERT_OK((*t)->Start(IgnoreMessage));
  }
}

TEST(TransportFactoryConformanceTest, RefusesAChoiceOutOfRangeNamingTheFlag) {
  const auto bad = [](const std::function<void(TransportChoice&)>& change) {
    TransportChoice c;
    change(c);
    return c;
  };
  for (const auto& [choice, flag] : std::vector<std::pair<TransportChoice, std::string>>{
           {bad([](TransportChoice& c) { c.rdma_pool_bytes = 0; }), "--rdma_pool_bytes"},
           {bad([](TransportChoice& c) { c.shm_options.ring_bytes = 3000000; }), "--shm_ring_bytes"},
           {bad([](TransportChoice& c) { c.coalesce.max_message_bytes = 100000; }), "--coalesce_max_batch_bytes"},
           {bad([](TransportChoice& c) { c.coalesce.max_delay = std::chrono::microseconds(0); }),
            "--coalesce_max_delay_us"},
           {bad([](TransportChoice& c) { c.coalesce.max_delay = std::chrono::minutes(2); }),
            "--coalesce_max_delay_us"}}) {
    EXPECT_THAT(std::string(ValidateTransportChoice(choice).message()), ::testing::HasSubstr(flag));
    // MakeTransport refuses it too, naming the flag.
    auto t = MakeTransport(ZmqTransport::Options{.bind = DefaultBind("tcp", "")}, choice);
    ASSERT_FALSE(t.ok()) << flag;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), ::testing::HasSubstr(flag));
  }
  EXPECT_TRUE(ValidateTransportChoice(TransportChoice{}).ok());
  // A ring ShmTransport refuses does not matter with shm off.
  TransportChoice off = bad([](TransportChoice& c) { c.shm_options.ring_bytes = 3000000; });
  off.shm = false;
  EXPECT_TRUE(ValidateTransportChoice(off).ok());
}

TEST(TransportFactoryConformanceTest, RdmaFallsBackToZeroMqUnlessRequired) {
  if (rdma::Usable().ok()) GTEST_SKIP() << "this machine has a usable RDMA device; the fallback is not reachable";
  TransportChoice choice;
  choice.shm = false;
  for (auto kind : {TransportChoice::Kind::kAuto, TransportChoice::Kind::kRdma}) {
    choice.kind = kind;
    choice.rdma_required = false;
    auto t = MakeTransport(ZmqTransport::Options{.bind = DefaultBind("tcp", "")}, choice);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_NE(dynamic_cast<ZmqTransport*>(UnderCoalescing(*t)), nullptr) << "the fallback is ZeroMQ";
    choice.rdma_required = true;
    t = MakeTransport(ZmqTransport::Options{.bind = DefaultBind("tcp", "")}, choice);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(t.status().message()), ::testing::HasSubstr("RDMA is required"));
    EXPECT_THAT(std::string(t.status().message()), ::testing::HasSubstr(std::string(rdma::Usable().message())));
  }
}

TEST(TransportFactoryConformanceTest, RejectsOtherSchemesAndSaysWhichAreAccepted) {
  for (const std::string bind : {"udp://127.0.0.1:5000", "inproc://x", "127.0.0.1:5000", "", "tcp://"}) {
    absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(bind);
    ASSERT_FALSE(t.ok()) << bind;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bind;
    EXPECT_TRUE(absl::StrContains(t.status().message(), "tcp://")) << t.status();
    EXPECT_TRUE(absl::StrContains(t.status().message(), "ipc://")) << t.status();
  }
}

TEST(TransportFactoryConformanceTest, DefaultBind) {
  EXPECT_EQ(DefaultBind("tcp", ""), "tcp://127.0.0.1:0");
  EXPECT_EQ(DefaultBind("tcp", "10.0.0.5"), "tcp://10.0.0.5:0");
  EXPECT_EQ(DefaultBind("tcp", "::1"), "tcp://[::1]:0");
  const std::string a = DefaultBind("ipc", "");
  const std::string b = DefaultBind("ipc", "ignored");
  EXPECT_TRUE(absl::StartsWith(a, "ipc:///tmp/tessera-")) << a;
  EXPECT_TRUE(absl::EndsWith(a, ".sock")) << a;
  EXPECT_NE(a, b);
  EXPECT_EQ(DefaultBind("udp", "x"), "");
}

}  // namespace
}  // namespace tessera
