// ShmTransport specifics (transport/shm_transport.h): when the ring is used,
// what happens when it is full or stuck, and what a bad descriptor does. The
// general Transport contract is checked for it in transport_conformance_test.
#include "transport/shm_transport.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
  o.min_lend_bytes = 100'000;
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
  EXPECT_FALSE(a->SameHostPath(b->address()));
  ASSERT_TRUE(a->Send(b->address(), Msg(1, {big, small})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  EXPECT_EQ(a->stats().shm_frames_sent, 0u);
  EXPECT_TRUE(b->SameHostPath(a->address())) << "B has heard from A, on this host";
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
  EXPECT_TRUE(got[1].frames[1].transient()) << "a view of the ring: kept frames are copied (Buffer contract)";
  EXPECT_FALSE(got[1].frames[0].transient()) << "a frame that came over the wire is the receiver's own";
  EXPECT_EQ(got[1].header.shm_frames_size(), 0) << "transport fields reach the handler";
  EXPECT_EQ(got[1].header.shm_host(), 0u);
  EXPECT_EQ(got[1].header.sender_address(), a->address());
}

// A receiver that drops each frame before the next is sent gets every frame
// at the same place in the ring: one frame at a time touches one frame's
// pages (shm_ring.h, "Lowest offset first"). Walking the whole ring cost a
// page fault per cold page in both processes: the same-host stall.
TEST(ShmTransportTest, OneFrameAtATimeReusesTheSameRingBytes) {
  Inbox a_in, b_in;
  auto a = Make(Small());
  auto b = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  ASSERT_TRUE(b->Send(a->address(), Msg(1, {})).ok());  // A learns that B shares the host
  ASSERT_TRUE(a_in.WaitForCount(1));
  std::vector<const std::byte*> where;
  for (uint64_t i = 0; i < 40; ++i) {  // 40 x 100,000 bytes: almost four laps of the 1 MiB ring
    const Buffer frame = Pattern(100'000, static_cast<uint8_t>(i));
    ASSERT_TRUE(a->Send(b->address(), Msg(10 + i, {frame})).ok());
    ASSERT_TRUE(b_in.WaitForCount(1));
    std::vector<Message> got = b_in.Take();
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(Same(got[0].frames[0], frame)) << "frame " << i;
    where.push_back(got[0].frames[0].data());
    // `got` goes here: the frame's space returns to A before the next Send.
  }
  EXPECT_EQ(a->stats().shm_frames_sent, 40u) << "every frame took the ring";
  for (size_t i = 1; i < where.size(); ++i) {
    EXPECT_EQ(where[i], where[0]) << "frame " << i << " lies " << (where[i] - where[0]) << " bytes from the first";
  }
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
  EXPECT_FALSE(a->SameHostPath(b->address()));
  EXPECT_FALSE(b->SameHostPath(a->address()));
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
  // A lent frame from a process nobody proved readable.
  Message lent = Msg(9, {Buffer()});
  proto::ShmFrame* d = lent.header.add_shm_frames();
  d->set_index(0);
  d->set_lend_id(1);
  d->set_address(reinterpret_cast<uint64_t>(&b));
  d->set_length(64);
  lent.header.set_shm_pid(static_cast<uint32_t>(::getpid()));
  ASSERT_TRUE(raw.Send(b->address(), std::move(lent)).ok());
  Message good = Msg(8, {Pattern(8, 1)});
  ASSERT_TRUE(raw.Send(b->address(), std::move(good)).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  std::this_thread::sleep_for(100ms);
  std::vector<Message> got = b_in.Take();
  ASSERT_EQ(got.size(), 1u) << "a message with a bad descriptor reached the handler";
  EXPECT_EQ(got[0].header.request_id(), 8u);
  EXPECT_EQ(b->stats().malformed_received, 5u);
  EXPECT_EQ(b->stats().shm_lent_frames_received, 0u);
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

Message Lendable(uint64_t id, std::vector<Buffer> frames) {
  Message m = Msg(id, std::move(frames));
  m.lendable = true;
  return m;
}

// A and B exchange one message each way, so each has proven it reads the
// other (and said so to it).
void Introduce(Transport& a, Inbox& a_in, Transport& b, Inbox& b_in) {
  ASSERT_TRUE(a.Send(b.address(), Msg(100, {})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  ASSERT_TRUE(b.Send(a.address(), Msg(101, {})).ok());
  ASSERT_TRUE(a_in.WaitForCount(1));
  ASSERT_TRUE(a.Send(b.address(), Msg(102, {})).ok());  // tells B that A reads it
  ASSERT_TRUE(b_in.WaitForCount(2));
  a_in.Take();
  b_in.Take();
}

bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 2000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

TEST(ShmTransportTest, LendableFramesAreReadInPlaceAndKeptUntilReleased) {
  Inbox a_in, b_in;
  auto a = Make(Small());
  auto b = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  EXPECT_FALSE(a->LendsTo(b->address(), 300'000)) << "not before B has proven it reads A";
  Introduce(*a, a_in, *b, b_in);
  EXPECT_TRUE(a->LendsTo(b->address(), 300'000));
  EXPECT_FALSE(a->LendsTo(b->address(), 99'999)) << "below min_lend_bytes";
  EXPECT_FALSE(a->LendsTo("tcp://127.0.0.1:1", 300'000)) << "a peer never heard from";

  auto freed = std::make_shared<std::atomic<bool>>(false);
  Buffer pattern = Pattern(300'000, 9);
  std::shared_ptr<void> owner(new Buffer(pattern), [freed](void* p) {
    delete static_cast<Buffer*>(p);
    freed->store(true);
  });
  Buffer big = Buffer::Adopt(std::move(owner), pattern.mutable_data(), pattern.size());
  ASSERT_TRUE(a->Send(b->address(), Lendable(1, {big, Pattern(100, 1), Pattern(50'000, 2)})).ok());
  big = Buffer();
  ASSERT_TRUE(b_in.WaitForCount(1));
  std::vector<Message> got = b_in.Take();
  ASSERT_EQ(got[0].frames.size(), 3u);
  const Buffer& frame = got[0].frames[0];
  ASSERT_TRUE(frame.remote()) << "a lendable large frame to a proven reader is lent";
  EXPECT_FALSE(got[0].frames[1].remote()) << "small frames go over the wire";
  EXPECT_FALSE(got[0].frames[2].remote()) << "frames under min_lend_bytes take the ring";
  EXPECT_TRUE(Same(got[0].frames[2], Pattern(50'000, 2)));
  EXPECT_EQ(got[0].header.shm_pid(), 0u) << "transport fields are removed";
  std::vector<std::byte> copy(frame.size());
  const CopyRange all{0, copy.data(), copy.size()};
  ASSERT_TRUE(frame.CopyOut({&all, 1}).ok());
  EXPECT_EQ(std::memcmp(copy.data(), pattern.data(), copy.size()), 0);
  EXPECT_EQ(a->stats().shm_lent_frames_sent, 1u);
  EXPECT_EQ(a->stats().shm_frames_sent, 1u) << "only the 50 KB frame was copied into the ring";
  EXPECT_EQ(b->stats().shm_lent_bytes_received, 300'000u);
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 300'000u);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(freed->load()) << "the lender keeps a lent frame while the reader holds it";
  got.clear();  // B drops it: a release goes back
  EXPECT_TRUE(Eventually([&] { return a->stats().shm_lent_bytes_now == 0; }));
  EXPECT_TRUE(freed->load());
  EXPECT_EQ(a_in.size(), 0u) << "releases never reach the handler";

  // Not lendable: the ring, as before.
  ASSERT_TRUE(a->Send(b->address(), Msg(2, {Pattern(300'000, 3)})).ok());
  ASSERT_TRUE(b_in.WaitForCount(1));
  got = b_in.Take();
  EXPECT_FALSE(got[0].frames[0].remote());
  EXPECT_TRUE(Same(got[0].frames[0], Pattern(300'000, 3)));
  EXPECT_EQ(a->stats().shm_frames_sent, 2u);
}

TEST(ShmTransportTest, LentBytesPerPeerAreBoundedByTheRingSize) {
  Inbox a_in, b_in;
  auto a = Make(Small());  // 1 MiB
  auto b = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(b->Start(b_in.handler()).ok());
  Introduce(*a, a_in, *b, b_in);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(a->Send(b->address(), Lendable(i, {Pattern(300'000, 5)})).ok());
  ASSERT_TRUE(b_in.WaitForCount(4));
  std::vector<Message> got = b_in.Take();  // held
  EXPECT_EQ(a->stats().shm_lent_frames_sent, 3u);
  EXPECT_EQ(a->stats().shm_frames_sent, 1u) << "the fourth would pass 1 MiB lent: it takes the ring";
  EXPECT_TRUE(got[2].frames[0].remote());
  EXPECT_FALSE(got[3].frames[0].remote());
  got.clear();
  EXPECT_TRUE(Eventually([&] { return a->stats().shm_lent_bytes_now == 0; }));
}

TEST(ShmTransportTest, NoLendingWhenEitherSideTurnsItOff) {
  ShmTransport::Options off = Small();
  off.cross_memory = false;
  for (bool lender_on : {false, true}) {
    Inbox a_in, b_in;
    auto a = Make(lender_on ? Small() : off);
    auto b = Make(lender_on ? off : Small());
    ASSERT_TRUE(a->Start(a_in.handler()).ok());
    ASSERT_TRUE(b->Start(b_in.handler()).ok());
    Introduce(*a, a_in, *b, b_in);
    ASSERT_TRUE(a->Send(b->address(), Lendable(1, {Pattern(300'000, 6)})).ok());
    ASSERT_TRUE(b_in.WaitForCount(1));
    std::vector<Message> got = b_in.Take();
    EXPECT_FALSE(got[0].frames[0].remote()) << lender_on;
    EXPECT_TRUE(Same(got[0].frames[0], Pattern(300'000, 6)));
    EXPECT_EQ(a->stats().shm_lent_frames_sent, 0u);
    EXPECT_FALSE(a->LendsTo(b->address(), 300'000));
  }
}

std::unique_ptr<ShmTransport> MakeAt(const std::string& bind, ShmTransport::Options o) {
  return std::make_unique<ShmTransport>(std::make_unique<ZmqTransport>(ZmqTransport::Options{.bind = bind}), o);
}

// A reader in a child process with its own transport bound at `bind`: it
// answers every message without frames (so the parent learns this
// process), reads every lent frame, keeps it, and writes 'y' (read and
// right) or 'n' to `reports`. With `stop_after_read` it then stops its
// transport but lives on, holding the frame. With `greet` set it first
// sends one message there. Fork it before this process makes a transport
// (so the child inherits no threads); kill it with SIGKILL.
struct ForkedReader {
  pid_t pid = -1;
  std::string address;
  int reports = -1;

  ForkedReader() = default;
  ForkedReader(ForkedReader&& o) noexcept
      : pid(std::exchange(o.pid, -1)), address(std::move(o.address)), reports(std::exchange(o.reports, -1)) {}
  ForkedReader(const ForkedReader&) = delete;
  ForkedReader& operator=(const ForkedReader&) = delete;

  static ForkedReader Start(const std::string& bind, bool stop_after_read, const std::string& greet) {
    int where[2], reports[2];
    EXPECT_EQ(::pipe(where), 0);
    EXPECT_EQ(::pipe(reports), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(where[0]);
      ::close(reports[0]);
      std::vector<Message> held;
      std::mutex mu;
      auto t = MakeAt(bind, Small());
      ShmTransport* self = t.get();
      absl::Status started = t->Start([&](Message m) {
        std::lock_guard lock(mu);
        if (m.frames.empty()) {
          (void)self->Send(m.header.sender_address(), Msg(200, {}));
          return;
        }
        std::vector<std::byte> copy(m.frames[0].size());
        const CopyRange all{0, copy.data(), copy.size()};
        const bool same = m.frames[0].remote() && m.frames[0].CopyOut({&all, 1}).ok() &&
                          std::memcmp(copy.data(), Pattern(copy.size(), 7).data(), copy.size()) == 0;
        held.push_back(std::move(m));  // kept until the process is killed
        const char ok = same ? 'y' : 'n';
        (void)!::write(reports[1], &ok, 1);
        if (stop_after_read) {
          std::thread([self] { self->Stop(); }).detach();  // not from inside the handler's lock
        }
      });
      if (!started.ok()) ::_exit(3);
      if (!greet.empty()) (void)t->Send(greet, Msg(201, {}));
      const std::string& address = t->address();
      const uint32_t n = static_cast<uint32_t>(address.size());
      (void)!::write(where[1], &n, sizeof(n));
      (void)!::write(where[1], address.data(), n);
      for (;;) ::pause();
    }
    ::close(where[1]);
    ::close(reports[1]);
    ForkedReader r;
    r.pid = child;
    r.reports = reports[0];
    uint32_t n = 0;
    EXPECT_EQ(::read(where[0], &n, sizeof(n)), static_cast<ssize_t>(sizeof(n)));
    r.address.resize(n);
    EXPECT_EQ(::read(where[0], r.address.data(), n), static_cast<ssize_t>(n));
    ::close(where[0]);
    return r;
  }
  char Report() const {
    char c = 0;
    return ::read(reports, &c, 1) == 1 ? c : 0;
  }
  void Kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~ForkedReader() {
    Kill();
    if (reports >= 0) ::close(reports);
  }
};

TEST(ShmTransportTest, TheLendsOfAReaderWhoseProcessEndedAreReclaimed) {
  ForkedReader reader = ForkedReader::Start("tcp://127.0.0.1:0", false, "");
  Inbox a_in;
  auto a = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(a->Send(reader.address, Msg(1, {})).ok());
  ASSERT_TRUE(a_in.WaitForCount(1));  // its answer: A now reads it, and knows it reads A
  ASSERT_TRUE(a->Send(reader.address, Lendable(3, {Pattern(200'000, 7)})).ok());
  EXPECT_EQ(reader.Report(), 'y') << "the child read the lent frame";
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 200'000u);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 200'000u) << "never released on a timeout";
  reader.Kill();
  std::this_thread::sleep_for(150ms);
  // The next lendable send looks for readers that ended; the dead reader
  // gets no new lend (the message goes nowhere, as any send to a dead peer).
  ASSERT_TRUE(a->Send(reader.address, Lendable(4, {Pattern(200'000, 8)})).ok());
  EXPECT_EQ(a->stats().shm_lends_reclaimed, 1u);
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 0u);
  EXPECT_EQ(a->stats().shm_lent_frames_sent, 1u);
}

TEST(ShmTransportTest, AReaderReplacedAtItsAddressKeepsItsLendsUntilItsProcessEnds) {
  // The first reader stops its transport after reading but lives on with
  // the frame; a second process then binds the same address.
  ForkedReader first = ForkedReader::Start("tcp://127.0.0.1:0", /*stop_after_read=*/true, "");
  Inbox a_in;
  auto a = Make(Small());
  ASSERT_TRUE(a->Start(a_in.handler()).ok());
  ASSERT_TRUE(a->Send(first.address, Msg(1, {})).ok());
  ASSERT_TRUE(a_in.WaitForCount(1));
  ASSERT_TRUE(a->Send(first.address, Lendable(2, {Pattern(200'000, 7)})).ok());
  ASSERT_EQ(first.Report(), 'y');
  std::this_thread::sleep_for(200ms);  // its transport has stopped and freed the port
  std::unique_ptr<ForkedReader> second;
  for (int attempt = 0; attempt < 50 && a_in.size() < 2; ++attempt) {
    second = std::make_unique<ForkedReader>(ForkedReader::Start(first.address, false, a->address()));
    if (a_in.WaitForCount(2)) break;
  }
  ASSERT_GE(a_in.size(), 2u) << "the second process never spoke from " << first.address;
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(a->Send(first.address, Lendable(4, {Pattern(8192, 1)})).ok());  // rings: under min_lend_bytes
  EXPECT_EQ(a->stats().shm_lends_reclaimed, 0u) << "the first reader is alive and may still read";
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 200'000u);
  first.Kill();
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(a->Send(first.address, Lendable(5, {Pattern(8192, 1)})).ok());
  EXPECT_EQ(a->stats().shm_lends_reclaimed, 1u);
  EXPECT_EQ(a->stats().shm_lent_bytes_now, 0u);
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
  o = ShmTransport::Options();
  o.min_lend_bytes = 0;
  EXPECT_FALSE(ShmTransport::Validate(o).ok());
  ShmTransport::Options bad;
  bad.ring_bytes = 1000;
  auto t = Make(bad);
  EXPECT_EQ(t->Start([](Message) {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
