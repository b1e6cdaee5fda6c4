// ShmTransport specifics (transport/shm_transport.h): when the ring is used,
// what happens when it is full or stuck, and what a bad descriptor does. The
// general Transport contract is checked for it in transport_conformance_test.
#include "transport/shm_transport.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "transport/shm_ring.h"
#include "transport/zmq_transport.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

class Inbox {
 public:
  Transport::Handler handler() {
    return [this](Message m) {
      std::lock_guard lock(mu_);
      messages_.push_back(std::move(m));
      cv_.notify_all();
    };
  }
  bool WaitForCount(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 20s, [&] { return messages_.size() >= n; });
  }
  std::vector<Message> Take() {
    std::lock_guard lock(mu_);
    return std::exchange(messages_, {});
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return messages_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> messages_;
};

// Drops every message it is asked to send while `dropping` is set: a link
// that loses messages after the ring space was taken.
class DroppingTransport final : public Transport {
 public:
  explicit DroppingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  absl::Status Start(Handler h) override { return inner_->Start(std::move(h)); }
  const std::string& address() const override { return inner_->address(); }
  absl::Status Send(const std::string& to, Message m) override {
    if (dropping.load()) return absl::OkStatus();
    return inner_->Send(to, std::move(m));
  }
  void Stop() override { inner_->Stop(); }
  TransportStats stats() const override { return inner_->stats(); }
  std::atomic<bool> dropping{false};

 private:
  std::unique_ptr<Transport> inner_;
};

Message Msg(uint64_t id, std::vector<Buffer> frames) {
  Message m;
  m.header.set_request_id(id);
  m.header.mutable_heartbeat();
  m.frames = std::move(frames);
  return m;
}

Buffer Pattern(size_t size, uint8_t seed) {
  Buffer b = Buffer::Allocate(size);
  for (size_t i = 0; i < size; ++i) b.mutable_data()[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return b;
}

bool Same(const Buffer& a, const Buffer& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

std::unique_ptr<ShmTransport> Make(ShmTransport::Options o, DroppingTransport** dropper = nullptr) {
  auto zmq = std::make_unique<ZmqTransport>(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"});
  if (dropper != nullptr) {
    auto d = std::make_unique<DroppingTransport>(std::move(zmq));
    *dropper = d.get();
    return std::make_unique<ShmTransport>(std::move(d), o);
  }
  return std::make_unique<ShmTransport>(std::move(zmq), o);
}

ShmTransport::Options Small() {
  ShmTransport::Options o;
  o.min_frame_bytes = 4096;
  o.ring_bytes = 1 << 20;
  o.stuck_ms = 200;
  return o;
}

TEST(ShmTransportTest, LargeFramesTakeTheRingOnceThePeerIsKnownToShareTheHost) {
  Inbox a_in, b_in;
  auto a = Make(Small());
  auto b = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  const Buffer big = Pattern(100'000, 1), small = Pattern(100, 2);

  // A has never heard from B: everything goes over the wire.
  ASSERT_TRUE(a->Send(b->address(), Msg(1, {big, small})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  EXPECT_EQ(a->stats().shm_frames_sent, 0u);
  // B has heard from A, so B's large frames to A take the ring at once.
  ASSERT_TRUE(b->Send(a->address(), Msg(2, {big})).ok());
  ASSERT_TRUE(a_in.WaitForCount(1));
  EXPECT_EQ(b->stats().shm_frames_sent, 1u);
  EXPECT_EQ(a->stats().shm_frames_received, 1u);
  // Now A knows B too: the big frame goes through the ring, the small one not.
  ASSERT_TRUE(a->Send(b->address(), Msg(3, {small, big, Buffer()})).ok());
  ASSERT_TRUE(b_in.WaitForCount(2));
  EXPECT_EQ(a->stats().shm_frames_sent, 1u);
  EXPECT_EQ(a->stats().shm_bytes_sent, 100'000u);
  EXPECT_EQ(a->stats().shm_peers, 1u);

  std::vector<Message> got = b_in.Take();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got[1].frames.size(), 3u);
  EXPECT_TRUE(Same(got[1].frames[0], small));
  EXPECT_TRUE(Same(got[1].frames[1], big));
  EXPECT_TRUE(got[1].frames[2].empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got[1].frames[1].data()) % 64, 0u);
  EXPECT_EQ(got[1].header.shm_frames_size(), 0) << "transport fields reach the handler";
  EXPECT_EQ(got[1].header.shm_host(), 0u);
  EXPECT_EQ(got[1].header.sender_address(), a->address());
}

TEST(ShmTransportTest, PeersOnAnotherHostNeverUseTheRing) {
  ShmTransport::Options oa = Small(), ob = Small();
  oa.host_identity = 1111;
  ob.host_identity = 2222;
  Inbox a_in, b_in;
  auto a = Make(oa);
  auto b = Make(ob);
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  const Buffer big = Pattern(200'000, 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a->Send(b->address(), Msg(i, {big})).ok());
    ASSERT_TRUE(b->Send(a->address(), Msg(i, {big})).ok());
  }
  ASSERT_TRUE(a_in.WaitForCount(3));
  ASSERT_TRUE(b_in.WaitForCount(3));
  EXPECT_EQ(a->stats().shm_frames_sent + b->stats().shm_frames_sent, 0u);
  for (const Message& m : b_in.Take()) EXPECT_TRUE(Same(m.frames[0], big));
}

TEST(ShmTransportTest, AFullRingSendsOverTheWireAndKeepsOrder) {
  // The receiver keeps every message: the 1 MiB ring fills after a few
  // frames, and the rest go over ZeroMQ, all in order and intact.
  ShmTransport::Options o = Small();
  o.assume_local_peers = true;
  Inbox b_in;
  auto a = Make(o);
  auto b = Make(o);
  ASSERT_TRUE(a->Start([](Message) {}).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  constexpr int kCount = 40;
  std::vector<Buffer> sent;
  for (int i = 0; i < kCount; ++i) {
    sent.push_back(Pattern(100'000 + i * 1000, static_cast<uint8_t>(i)));
    ASSERT_TRUE(a->Send(b->address(), Msg(i, {sent.back(), Pattern(10, 9)})).ok());
  }
  ASSERT_TRUE(b_in.WaitForCount(kCount));
  const TransportStats s = a->stats();
  EXPECT_GT(s.shm_frames_sent, 0u);
  EXPECT_GT(s.shm_fallback_frames, 0u) << "a 1 MiB ring cannot hold 40 frames of 100 KB";
  EXPECT_EQ(s.shm_frames_sent + s.shm_fallback_frames, static_cast<uint64_t>(kCount));
  std::vector<Message> got = b_in.Take();
  ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i].header.request_id(), static_cast<uint64_t>(i));
    ASSERT_TRUE(Same(got[i].frames[0], sent[i])) << "message " << i;
  }
  // Once the receiver lets go, the space returns and the ring is used again.
  got.clear();
  const uint64_t before = a->stats().shm_frames_sent;
  ASSERT_TRUE(a->Send(b->address(), Msg(99, {sent[0]})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  EXPECT_EQ(a->stats().shm_frames_sent, before + 1);
  EXPECT_TRUE(Same(b_in.Take()[0].frames[0], sent[0]));
}

TEST(ShmTransportTest, LostMessagesNeitherCorruptNorBlockTheRing) {
  ShmTransport::Options o = Small();
  o.assume_local_peers = true;
  DroppingTransport* link = nullptr;
  Inbox b_in;
  auto a = Make(o, &link);
  auto b = Make(o);
  ASSERT_TRUE(a->Start([](Message) {}).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  const Buffer big = Pattern(300'000, 7);

  // Gaps: every other message is lost after its ring space was taken; the
  // receiver counts the gaps as free, so the ring never fills.
  for (int i = 0; i < 40; ++i) {
    link->dropping = (i % 2 == 1);
    ASSERT_TRUE(a->Send(b->address(), Msg(i, {big})).ok());
    if (i % 2 == 0) {
      ASSERT_TRUE(b_in.WaitForCount(1)) << "message " << i;
      ASSERT_TRUE(Same(b_in.Take()[0].frames[0], big));
    }
  }
  EXPECT_EQ(a->stats().shm_fallback_frames, 0u) << "space of lost messages was never given back";

  // The last messages are lost and the ring is left full: after stuck_ms the
  // sender replaces the ring and large frames take shared memory again.
  link->dropping = true;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(a->Send(b->address(), Msg(100 + i, {big})).ok());
  link->dropping = false;
  EXPECT_GT(a->stats().shm_fallback_frames, 0u);
  const uint64_t shm_before = a->stats().shm_frames_sent;
  bool replaced = false;
  for (int i = 0; i < 50 && !replaced; ++i) {
    ASSERT_TRUE(a->Send(b->address(), Msg(200 + i, {big})).ok());
    ASSERT_TRUE(b_in.WaitForCount(1));
    for (const Message& m : b_in.Take()) ASSERT_TRUE(Same(m.frames[0], big));
    replaced = a->stats().shm_frames_sent > shm_before;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(replaced) << "a stuck ring was never replaced";
  EXPECT_EQ(a->stats().shm_peers, 1u);
}

TEST(ShmTransportTest, BadDescriptorsAreDroppedAndCounted) {
  Inbox b_in;
  auto b = Make(Small());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  ZmqTransport raw(ZmqTransport::Options{.bind = "tcp://127.0.0.1:0"});
  ASSERT_TRUE(raw.Start([](Message) {}).ok());
  auto forged = [&](const std::string& ring, uint32_t index, std::vector<Buffer> frames) {
    Message m = Msg(7, std::move(frames));
    proto::ShmFrame* d = m.header.add_shm_frames();
    d->set_index(index);
    d->set_ring(ring);
    d->set_length(64);
    return m;
  };
  ASSERT_TRUE(raw.Send(b->address(), forged("../../etc/passwd", 0, {Buffer()})).ok());
  ASSERT_TRUE(raw.Send(b->address(), forged("tessera-shm-1-2-3", 0, {Buffer()})).ok());  // no such ring
  ASSERT_TRUE(raw.Send(b->address(), forged("tessera-shm-1-2-3", 5, {Buffer()})).ok());  // no such frame
  ASSERT_TRUE(raw.Send(b->address(), forged("tessera-shm-1-2-3", 0, {Pattern(8, 1)})).ok());  // not empty
  Message good = Msg(8, {Pattern(8, 1)});
  ASSERT_TRUE(raw.Send(b->address(), std::move(good)).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  std::this_thread::sleep_for(100ms);
  std::vector<Message> got = b_in.Take();
  ASSERT_EQ(got.size(), 1u) << "a message with a bad descriptor reached the handler";
  EXPECT_EQ(got[0].header.request_id(), 8u);
  EXPECT_EQ(b->stats().malformed_received, 4u);
}

TEST(ShmTransportTest, StopRemovesTheRingsButHeldFramesStayReadable) {
  ShmTransport::Options o = Small();
  o.assume_local_peers = true;
  Inbox b_in;
  auto a = Make(o);
  auto b = Make(o);
  ASSERT_TRUE(a->Start([](Message) {}).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  const Buffer big = Pattern(50'000, 4);
  ASSERT_TRUE(a->Send(b->address(), Msg(1, {big})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  std::vector<Message> got = b_in.Take();
  a.reset();  // the sender goes away, its ring file with it
  b->Stop();
  EXPECT_TRUE(Same(got[0].frames[0], big));
  got.clear();  // releasing into a ring nobody reads is harmless
}

TEST(ShmTransportTest, OptionsAreChecked) {
  ShmTransport::Options o;
  EXPECT_TRUE(ShmTransport::Validate(o).ok());
  o.ring_bytes = 3 << 20;
  EXPECT_FALSE(ShmTransport::Validate(o).ok());
  o.ring_bytes = 1 << 20;
  o.min_frame_bytes = 1 << 20;
  EXPECT_FALSE(ShmTransport::Validate(o).ok());
  o.min_frame_bytes = 0;
  EXPECT_FALSE(ShmTransport::Validate(o).ok());
  ShmTransport::Options bad;
  bad.ring_bytes = 1000;
  auto t = Make(bad);
  EXPECT_EQ(t->Start([](Message) {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
