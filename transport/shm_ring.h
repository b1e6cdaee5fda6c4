#pragma once
// Shared-memory rings for large frames between two processes on one host.
//
// One ring carries bytes one way, from one sending transport to one
// receiving address. The sender copies a frame into the ring and sends, over
// ZeroMQ as before, a small descriptor in the message header instead of the
// frame; the receiver hands the handler a Buffer that views the ring (no
// copy) and gives the space back when the last reference to that Buffer is
// dropped. Space is reused in order, so a Buffer kept for long holds back the
// space after it; the sender then sends further frames over ZeroMQ (it never
// waits) until the space comes back.
//
// This header holds the pure part, positions and space accounting, which the
// unit tests drive directly, and the small OS part (ShmSegment) that creates,
// opens and maps the files.
//
// Positions. Both sides count bytes since the ring was made; position p
// lives at offset p % capacity. Positions are uint64 counted modulo 2^64 (a
// multiple of every capacity) and compared as serial numbers (the later of
// two is the one less than 2^63 ahead), so their wrapping is harmless. A region is
// [begin, end): `begin` is where the writer's head was (any padding that
// skipped the tail of the ring belongs to the region), the frame's bytes are
// [data, end) with data >= begin, data % 64 == 0, and a frame never wraps
// (data % capacity + length <= capacity). Consecutive regions of one ring
// are contiguous: each begins where the previous one ended.
//
// Lowest offset first. A frame starts at the ring's start (offset 0, the
// rest of the current lap skipped as padding) when every frame has been
// given back, or when the free space before the frames in use is at least the
// most this ring has ever had in use; otherwise right after the last frame.
// So the bytes a job touches are about twice its peak bytes in flight, not
// the whole ring: one frame at a time reuses the same offsets. A ring's pages
// cost a fault the first time each process touches them (on a 2-vCPU VM
// about 5-10 us per 4 KiB page in each process, which populating the mapping
// ahead does not avoid: 1.4 ms per 256 KiB frame), and a frame just touched
// is still in the cache; walking a 256 MiB ring paid the faults for the first
// 256 MiB of traffic (docs/benchmarks.md, "The same-host stall"). Going back
// as soon as the start is free is not enough: frames in flight just past the
// start would meet the frames that follow, which would then take the wire
// where the head would have gone on past them; the peak in use bounds that
// (a burst beyond the peak right after a jump can still meet them, once: the
// peak then grows). The padding costs positions, not memory. The // writer knows the padding it made holds no frame, so it counts a padding
// that directly follows the released position as free too: a frame lost on
// the way after a jump to the start holds back its own bytes only, and the
// next frame can still be placed (which tells the reader of the gap). A
// ring's pages cost a fault the first time each process touches them (on a
// 2-vCPU VM 9.6 us per 4 KiB page for the writer, 5 us for the reader:
// 1.4 ms per 256 KiB frame), and a frame that was just touched is still in
// the cache; walking a 64 MiB ring frame after frame paid the faults for the
// first 64 MiB and a cache miss for every byte after (docs/benchmarks.md,
// "Same-host stall"). The padding costs positions, never memory.
//
// The shared header holds the consumer's `released` position: everything
// before it is free. Only the receiver writes it (release order), only the
// sender reads it (acquire order).
//
// Lost descriptors. A message can be lost between the two transports (the
// receiver restarted, ZeroMQ dropped a queue). The receiver then sees a
// region that begins after the end of the last one it knows; the gap is
// space nobody will release, so ShmRingReleaser treats it as released. A new
// receiver incarnation (after a restart) starts from the shared `released`
// position the same way. Space lost at the very end (the last messages
// before the sender stops sending large frames) is recovered by the sender:
// ShmRingWriter::Stuck() reports a ring whose released position has not moved
// for a while although it is full, and the transport replaces that ring.
//
// Thread safety: ShmRingWriter is used under its owner's lock;
// ShmRingReleaser is thread-safe (Buffers are released from any thread).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

namespace tessera::shm {

inline constexpr uint64_t kAlignment = 64;

struct Region {
  uint64_t begin = 0;   // the writer's head before this region (padding included)
  uint64_t data = 0;    // position of the frame's first byte (begin <= data, 64-aligned)
  uint64_t length = 0;  // frame bytes
  uint64_t end() const { return data + length; }
};

// The writer's accounting. capacity: a power of two, at least 4096.
class ShmRingWriter {
 public:
  explicit ShmRingWriter(uint64_t capacity, uint64_t start = 0);

  // Space for `length` bytes (length > 0) given everything before `released`
  // is free, or nullopt when it does not fit now (or ever: length >
  // capacity). `released` must be what the reader last published (monotone,
  // never past the head). The frame goes at the ring's start when that
  // space is free, else right after the head (see "Lowest offset first").
  // On success the head moves past the region.
  std::optional<Region> Allocate(uint64_t length, uint64_t released);

  uint64_t head() const { return head_; }
  uint64_t capacity() const { return capacity_; }

  // Called with the released position and a time (any monotone unit) every
  // time an allocation fails: true once the released position has stayed
  // the same for at least `patience` units while allocations kept failing.
  // A successful allocation resets it.
  bool Stuck(uint64_t released, int64_t now, int64_t patience);

 private:
  // `released` moved past the paddings that directly follow it (they hold
  // no frame); drops the paddings it has passed.
  uint64_t FreeUpTo(uint64_t released);

  uint64_t capacity_;
  uint64_t head_;
  // [begin, end) of each padding this writer made that `released` has not
  // passed yet, in order (at most one per region in the ring).
  std::deque<std::pair<uint64_t, uint64_t>> paddings_;
  // The most bytes in use (head - free + the frame asked for) any Allocate
  // has seen: how far frames in flight may reach beyond the ring's start.
  uint64_t peak_in_use_ = 0;
  std::optional<uint64_t> stuck_released_;  // released position when failures began
  int64_t stuck_since_ = 0;
};

// Checks a region named by a peer against a ring of `capacity` bytes: the
// frame lies inside the ring without wrapping, begins 64-aligned, and the
// whole region is no larger than the ring. InvalidArgument naming the
// problem otherwise.
absl::Status ValidateRegion(const Region& region, uint64_t capacity);

// The reader's accounting: regions in the order they arrived; Release() in
// any order; Published() is the position to store in the shared header.
class ShmRingReleaser {
 public:
  // `released`: the shared released position when the reader attached.
  explicit ShmRingReleaser(uint64_t released);

  // Records a region that arrived. A region that begins before the end of
  // the last one is refused (FailedPrecondition: out of order or a replay);
  // a gap before it is treated as released (see the header comment).
  absl::Status Arrived(const Region& region);

  // The region that began at `begin` is no longer used. Returns the new
  // released position (what to publish), which moves past every region
  // released so far that has no unreleased region before it.
  uint64_t Release(uint64_t begin);

  uint64_t published() const;
  size_t outstanding() const;  // regions arrived and not released

 private:
  struct Entry {
    uint64_t begin;
    uint64_t end;
    bool released;
  };
  mutable std::mutex mu_;
  uint64_t published_ ABSL_GUARDED_BY(mu_);
  uint64_t known_end_ ABSL_GUARDED_BY(mu_);  // end of the last region that arrived
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// ---- the OS part ----

// The fixed header at the start of every ring file; the data follows at
// kHeaderBytes. Layout is part of the protocol between processes of one
// build (a version check refuses others).
inline constexpr uint64_t kMagic = 0x676e6972'61726574ull;  // "teraring"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint64_t kHeaderBytes = 4096;

// A mapped ring file under /dev/shm. Files are named
// "tessera-shm-<pid>-<counter>-<random hex>" so that names never repeat and a
// dead creator's files can be found (RemoveDeadRings).
class ShmSegment {
 public:
  // Creates and maps a new ring of `capacity` data bytes (a power of two),
  // with its memory reserved up front (so that a full /dev/shm is an error
  // here, never a SIGBUS later). ResourceExhausted when /dev/shm has no
  // room, Internal for other system errors; messages name the file.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(uint64_t capacity);
  // Maps an existing ring by name. Refuses names that are not ring names,
  // links, files of another user, and headers with a wrong magic, version or
  // size (InvalidArgument / NotFound / PermissionDenied).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  uint64_t capacity() const { return capacity_; }
  std::byte* data() { return base_ + kHeaderBytes; }
  std::byte* at(uint64_t position) { return data() + position % capacity_; }

  // The shared released position. StoreReleased never moves it backwards
  // (concurrent releases may store out of order).
  uint64_t LoadReleased() const;
  void StoreReleased(uint64_t position);

  // Removes the file (the mappings stay valid). Idempotent.
  void Unlink();

 private:
  ShmSegment(std::string name, std::byte* base, uint64_t capacity, bool owner)
      : name_(std::move(name)), base_(base), capacity_(capacity), owner_(owner) {}
  std::string name_;
  std::byte* base_;
  uint64_t capacity_;
  bool owner_;
  bool unlinked_ = false;
};

// True when `name` has the form of a ring file name (no path).
bool IsRingName(const std::string& name);

// Removes ring files in /dev/shm whose creating process no longer exists
// (left by a crash). Returns how many were removed.
int RemoveDeadRings();

// Identity of "the same host" for the shared-memory path: processes with the
// same value really share a host, and can map each other's ring files.
// Derived from the kernel's boot id, the device and inode of /dev/shm
// (containers with their own /dev/shm differ), the user id, the network
// namespace (/proc/self/ns/net: processes in different network namespaces
// are different hosts to the network, and test hosts or containers on one
// machine share the boot id and often /dev/shm; their traffic must cross
// the network, its shaping and its partitions, not a ring), and `host_id`,
// a name the launcher gives every process of one host of its placement
// (empty: none). The mount namespace is left out on purpose: processes of
// one host are often started in mount namespaces of their own (a service
// with a private /tmp, `ip netns exec`), and /dev/shm's inode already tells
// whether they see the same ring files. 0 when it cannot be determined (no
// shm then).
uint64_t HostIdentity(const std::string& host_id = "");

}  // namespace tessera::shm
