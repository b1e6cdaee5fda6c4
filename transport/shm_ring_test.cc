#include "transport/shm_ring.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera::shm {
namespace {

constexpr uint64_t kCap = 4096;

// True when the frame of `r` shares a byte of the ring with a frame in `live`.
bool OverlapsALiveFrame(const Region& r, const std::deque<Region>& live, uint64_t cap) {
  const uint64_t a = r.data % cap;
  for (const Region& l : live) {
    const uint64_t b = l.data % cap;
    if (a < b + l.length && b < a + r.length) return true;
  }
  return false;
}

TEST(ShmRingWriterTest, AllocatesAlignedContiguousRegions) {
  ShmRingWriter w(kCap);
  auto a = w.Allocate(100, 0);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->begin, 0u);
  EXPECT_EQ(a->data, 0u);
  EXPECT_EQ(a->end(), 100u);
  auto b = w.Allocate(10, 0);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->begin, 100u) << "a region begins where the last ended";
  EXPECT_EQ(b->data, 128u) << "frames start 64-byte aligned";
  EXPECT_EQ(w.head(), 138u);
}

TEST(ShmRingWriterTest, RefusesWhatDoesNotFitUntilReleased) {
  ShmRingWriter w(kCap);
  ASSERT_TRUE(w.Allocate(3000, 0));
  EXPECT_FALSE(w.Allocate(2000, 0)) << "only 1096 bytes are free";
  EXPECT_FALSE(w.Allocate(kCap + 1, 0)) << "larger than the ring";
  EXPECT_FALSE(w.Allocate(0, 0)) << "empty frames never take the ring";
  // Releasing the first region frees its space; the frame cannot straddle
  // the end, so it skips to the start: the padding belongs to its region.
  auto r = w.Allocate(2000, 3000);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->begin, 3000u);
  EXPECT_EQ(r->data, kCap) << "moved to the ring's start";
  EXPECT_EQ(r->data % kCap, 0u);
  EXPECT_EQ(w.head(), kCap + 2000);
}

TEST(ShmRingWriterTest, NeverHandsOutSpaceThatIsInUse) {
  // Random sizes, random release lag: no live region may overlap another,
  // and no frame may wrap.
  std::mt19937_64 rng(5);
  ShmRingWriter w(kCap);
  std::deque<Region> live;
  uint64_t released = 0;
  for (int i = 0; i < 20000; ++i) {
    if (!live.empty() && (rng() % 3 == 0)) {
      released = live.front().end();
      live.pop_front();
    }
    const uint64_t len = 1 + rng() % 1500;
    auto r = w.Allocate(len, released);
    if (!r) continue;
    ASSERT_EQ(ValidateRegion(*r, kCap), absl::OkStatus());
    ASSERT_FALSE(OverlapsALiveFrame(*r, live, kCap)) << "frame " << i;
    if (!live.empty()) {
      ASSERT_EQ(r->begin, live.back().end());
    }
    live.push_back(*r);
  }
}

// One frame at a time (each released before the next is placed): every
// frame reuses the ring's first bytes, so a job touches one frame's pages,
// not the whole ring (a cold page costs a fault in each process).
TEST(ShmRingWriterTest, OneFrameAtATimeReusesTheRingsStart) {
  constexpr uint64_t cap = 1 << 20;
  ShmRingWriter w(cap);
  uint64_t released = 0;
  for (int i = 0; i < 100; ++i) {
    auto r = w.Allocate(256 * 1024 + 7, released);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->data % cap, 0u) << "frame " << i << " lies at offset " << r->data % cap;
    ASSERT_EQ(ValidateRegion(*r, cap), absl::OkStatus());
    released = r->end();
  }
}

// k frames in flight, given back in order: no frame is refused (the linear
// ring's promise: only a ring full of frames in use sends frames over the
// wire), a pipeline that drains starts again at the ring's start, and the
// frames stay within about twice the most ever in flight, not the whole ring
// (the padding a jump leaves is not counted as in flight).
TEST(ShmRingWriterTest, FramesInFlightAreRefusedOnlyWhenTheRingIsFull) {
  constexpr uint64_t cap = 64 << 20, len = 1 << 20;
  std::mt19937_64 rng(7);
  for (const uint64_t k : {1u, 2u, 8u}) {
    ShmRingWriter w(cap);
    ShmRingReleaser reader(0);
    std::deque<Region> live;
    uint64_t released = 0, highest = 0;
    for (int i = 0; i < 2000; ++i) {
      while (live.size() >= k) {
        released = reader.Release(live.front().begin);
        live.pop_front();
      }
      if (i % 97 == 0) {  // now and then the pipeline drains
        for (const Region& r : live) released = reader.Release(r.begin);
        live.clear();
      }
      auto r = w.Allocate(len - 64 * (rng() % 100), released);
      ASSERT_TRUE(r) << k << " in flight, frame " << i << ": refused with " << w.head() - released
                     << " bytes between the released position and the head";
      ASSERT_FALSE(OverlapsALiveFrame(*r, live, cap));
      if (live.empty()) {
        EXPECT_LT(r->data % cap, len) << "an empty ring starts again at its start (frame " << i << ")";
      }
      ASSERT_EQ(reader.Arrived(*r), absl::OkStatus());
      live.push_back(*r);
      highest = std::max(highest, r->data % cap + r->length);
    }
    EXPECT_LE(highest, 3 * k * len + len) << k << " in flight touched " << highest << " bytes of a " << cap
                                          << "-byte ring";
  }
}

// Frames still in use just past the ring's start: going back to the start
// then would soon run into them (the frames after it would not fit, and take
// the wire, while most of the ring is free). Found with 8 pulls in flight.
TEST(ShmRingWriterTest, NoJumpBackIntoFramesStillInUse) {
  constexpr uint64_t cap = 1 << 20, len = 100'000;
  ShmRingWriter w(cap);
  std::deque<Region> live;
  uint64_t released = 0;
  for (int i = 0; i < 3; ++i) live.push_back(*w.Allocate(len, released));
  released = live.front().end();  // the first is given back, the next two not yet
  live.pop_front();
  for (int i = 0; i < 5; ++i) {
    auto r = w.Allocate(len, released);
    ASSERT_TRUE(r) << "frame " << i << " after the release did not fit a ring with "
                   << cap - (w.head() - released) << " bytes free";
    ASSERT_FALSE(OverlapsALiveFrame(*r, live, cap));
    live.push_back(*r);
  }
}

// A frame lost on the way after a jump to the ring's start (its region holds
// the rest of the lap as padding) must not keep the next frame out: the
// reader learns of a lost region only from a later one, so a next frame that
// could not be placed would leave the ring stuck until it is replaced.
TEST(ShmRingWriterTest, AFrameLostAfterAJumpHoldsBackOnlyItsOwnBytes) {
  constexpr uint64_t cap = 1 << 20, len = 300'000;
  ShmRingWriter w(cap);
  ShmRingReleaser reader(0);
  auto a = w.Allocate(len, 0);
  ASSERT_TRUE(a);
  ASSERT_EQ(reader.Arrived(*a), absl::OkStatus());
  uint64_t released = reader.Release(a->begin);
  auto lost = w.Allocate(len, released);  // jumps to the start; never arrives
  ASSERT_TRUE(lost);
  ASSERT_EQ(lost->data, cap);
  auto next = w.Allocate(len, released);
  ASSERT_TRUE(next) << "the lost frame's padding kept the next frame out";
  EXPECT_FALSE(OverlapsALiveFrame(*next, {*lost}, cap));
  ASSERT_EQ(reader.Arrived(*next), absl::OkStatus());
  released = reader.Release(next->begin);
  EXPECT_EQ(released, next->end()) << "the reader counted the lost region as a gap";
  auto after = w.Allocate(len, released);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->data % cap, 0u) << "and the ring's start is reused again";
}

// Positions are counted modulo 2^64: a ring whose positions pass 2^64 goes on
// as before, for the writer, the check of a peer's region and the releaser.
TEST(ShmRingWriterTest, PositionsWrapAroundTwoToTheSixtyFour) {
  const uint64_t start = ~uint64_t{0} - 3 * kCap + 101;  // three laps before the wrap, unaligned
  std::mt19937_64 rng(11);
  ShmRingWriter w(kCap, start);
  ShmRingReleaser rel(start);
  std::deque<Region> live;
  uint64_t released = start;
  bool wrapped = false;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      // Out of order sometimes: the releaser publishes only contiguous ones.
      const size_t pick = live.size() > 1 && rng() % 2 ? 1 : 0;
      released = rel.Release(live[pick].begin);
      live.erase(live.begin() + static_cast<long>(pick));
    }
    auto r = w.Allocate(1 + rng() % 1500, released);
    if (!r) continue;
    ASSERT_EQ(ValidateRegion(*r, kCap), absl::OkStatus()) << "at " << r->data;
    ASSERT_FALSE(OverlapsALiveFrame(*r, live, kCap)) << "frame " << i;
    ASSERT_EQ(rel.Arrived(*r), absl::OkStatus()) << "at " << r->begin;
    wrapped = wrapped || r->data < start;
    live.push_back(*r);
  }
  EXPECT_TRUE(wrapped) << "the run never passed 2^64";
  for (const Region& r : live) released = rel.Release(r.begin);
  EXPECT_EQ(released, w.head()) << "everything released";
  EXPECT_EQ(rel.outstanding(), 0u);
  // A replay from before the wrap is still "before".
  EXPECT_FALSE(rel.Arrived(Region{start, start, 64}).ok());
}

TEST(ShmRingWriterTest, StuckOnlyAfterPatienceWithoutProgress) {
  ShmRingWriter w(kCap);
  ASSERT_TRUE(w.Allocate(kCap, 0));
  EXPECT_FALSE(w.Stuck(0, 1000, 500));
  EXPECT_FALSE(w.Stuck(0, 1400, 500));
  EXPECT_TRUE(w.Stuck(0, 1500, 500));
  EXPECT_FALSE(w.Stuck(64, 1600, 500)) << "progress restarts the wait";
  EXPECT_FALSE(w.Stuck(64, 2000, 500));
  EXPECT_TRUE(w.Stuck(64, 2100, 500));
  ASSERT_TRUE(w.Allocate(64, 128));
  EXPECT_FALSE(w.Stuck(128, 5000, 500)) << "a successful allocation restarts the wait";
}

TEST(ShmRingValidateTest, RefusesRegionsOutsideTheRing) {
  EXPECT_TRUE(ValidateRegion({0, 0, 4096}, kCap).ok());
  EXPECT_TRUE(ValidateRegion({4000, 4096, 100}, kCap).ok());
  EXPECT_FALSE(ValidateRegion({0, 0, 0}, kCap).ok());
  EXPECT_FALSE(ValidateRegion({0, 0, 4097}, kCap).ok());
  EXPECT_FALSE(ValidateRegion({0, 4032, 128}, kCap).ok()) << "wraps";
  EXPECT_FALSE(ValidateRegion({0, 8, 10}, kCap).ok()) << "unaligned";
  EXPECT_FALSE(ValidateRegion({100, 64, 10}, kCap).ok()) << "data before begin";
  EXPECT_FALSE(ValidateRegion({0, 4096, 100}, kCap).ok()) << "region larger than the ring";
  EXPECT_FALSE(ValidateRegion({0, ~0ull - 63, 64}, kCap).ok());
}

TEST(ShmRingReleaserTest, PublishesOnlyContiguousReleases) {
  ShmRingReleaser r(0);
  ASSERT_TRUE(r.Arrived({0, 0, 100}).ok());
  ASSERT_TRUE(r.Arrived({100, 128, 100}).ok());
  ASSERT_TRUE(r.Arrived({228, 256, 100}).ok());
  EXPECT_EQ(r.outstanding(), 3u);
  EXPECT_EQ(r.Release(100), 0u) << "the first region is still held";
  EXPECT_EQ(r.Release(228), 0u);
  EXPECT_EQ(r.Release(0), 356u) << "all three are free now";
  EXPECT_EQ(r.outstanding(), 0u);
  EXPECT_EQ(r.published(), 356u);
}

TEST(ShmRingReleaserTest, GapsOfLostMessagesCountAsReleased) {
  ShmRingReleaser r(64);  // attached to a ring whose reader had released up to 64
  ASSERT_TRUE(r.Arrived({512, 512, 64}).ok()) << "[64, 512) was lost on the way";
  EXPECT_EQ(r.Release(512), 576u);
}

TEST(ShmRingReleaserTest, RefusesRegionsOutOfOrder) {
  ShmRingReleaser r(0);
  ASSERT_TRUE(r.Arrived({0, 0, 100}).ok());
  EXPECT_EQ(r.Arrived({0, 0, 100}).code(), absl::StatusCode::kFailedPrecondition) << "replayed";
  EXPECT_EQ(r.Arrived({50, 64, 10}).code(), absl::StatusCode::kFailedPrecondition) << "overlaps";
  EXPECT_EQ(r.outstanding(), 1u);
}

TEST(ShmSegmentTest, TwoMappingsShareBytesAndTheReleasedPosition) {
  auto made = ShmSegment::Create(1 << 16);
  ASSERT_TRUE(made.ok()) << made.status();
  auto opened = ShmSegment::Open((*made)->name());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->capacity(), 1u << 16);
  std::memcpy((*made)->at(70000), "hello", 5);  // position wraps to offset 70000 % 65536
  EXPECT_EQ(std::memcmp((*opened)->data() + (70000 % 65536), "hello", 5), 0);
  (*opened)->StoreReleased(4242);
  EXPECT_EQ((*made)->LoadReleased(), 4242u);
  (*opened)->StoreReleased(100);
  EXPECT_EQ((*made)->LoadReleased(), 4242u) << "the released position moved backwards";
  const std::string path = absl::StrCat("/dev/shm/", (*made)->name());
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  made->reset();  // the creator removes the file; the other mapping stays
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(std::memcmp((*opened)->data() + (70000 % 65536), "hello", 5), 0);
}

TEST(ShmSegmentTest, OpenRefusesWhatIsNotARing) {
  EXPECT_EQ(ShmSegment::Open("../etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmSegment::Open("tessera-shm-1/../../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmSegment::Open("tessera-shm-999999999-0-0").status().code(), absl::StatusCode::kNotFound);
  // A file with a ring's name but not a ring's header.
  const std::string name = absl::StrCat("tessera-shm-", getpid(), "-999-abc");
  const std::string path = "/dev/shm/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096 + 65536), 0);
  ::close(fd);
  EXPECT_EQ(ShmSegment::Open(name).status().code(), absl::StatusCode::kInvalidArgument);
  ::unlink(path.c_str());
  EXPECT_FALSE(ShmSegment::Create(1000).ok()) << "not a power of two";
}

TEST(ShmSegmentTest, RemoveDeadRingsRemovesOnlyFilesOfDeadProcesses) {
  // A child that exits gives a pid that is (almost surely) not reused at once.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const std::string dead = absl::StrCat("/dev/shm/tessera-shm-", child, "-0-dead");
  const std::string alive = absl::StrCat("/dev/shm/tessera-shm-", getpid(), "-77-a11e");
  for (const std::string& p : {dead, alive}) {
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0) << p;
    ::close(fd);
  }
  EXPECT_GE(RemoveDeadRings(), 1);
  EXPECT_NE(::access(dead.c_str(), F_OK), 0) << "the dead process's file stays";
  EXPECT_EQ(::access(alive.c_str(), F_OK), 0) << "a live process's file was removed";
  ::unlink(alive.c_str());
}

TEST(ShmHostIdentityTest, StableAndNonZero) {
  const uint64_t a = HostIdentity();
  EXPECT_NE(a, 0u);
  EXPECT_EQ(a, HostIdentity());
}

TEST(ShmHostIdentityTest, TheLaunchersHostNameSeparatesHosts) {
  EXPECT_EQ(HostIdentity("node1"), HostIdentity("node1"));
  EXPECT_NE(HostIdentity("node1"), HostIdentity("node2"));
  EXPECT_NE(HostIdentity("node1"), HostIdentity());
}

// A process in a network namespace of its own (a test host, a container) is
// another host, although it shares the boot id, /dev/shm and the user.
TEST(ShmHostIdentityTest, AnotherNetworkNamespaceIsAnotherHost) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    uint64_t id[2] = {HostIdentity(), 0};
    if (::unshare(CLONE_NEWNET) == 0) id[1] = HostIdentity();
    (void)!::write(fds[1], id, sizeof(id));
    ::_exit(0);
  }
  ::close(fds[1]);
  uint64_t id[2] = {0, 0};
  ASSERT_EQ(::read(fds[0], id, sizeof(id)), static_cast<ssize_t>(sizeof(id)));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(id[0], HostIdentity()) << "a child in the same namespaces is the same host";
  if (id[1] == 0) GTEST_SKIP() << "cannot make a network namespace here (unshare needs CAP_SYS_ADMIN)";
  EXPECT_NE(id[1], 0u);
  EXPECT_NE(id[1], id[0]);
}

}  // namespace
}  // namespace tessera::shm
