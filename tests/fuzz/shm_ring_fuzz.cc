// Fuzz target: the shared-memory ring's accounting (transport/shm_ring.h), as
// a sender and a receiver drive it, plus descriptors forged by a peer.
// The input is a program of operations; after each one the invariants are
// checked, and a violation traps:
// - every region the writer hands out validates, begins where the previous
//   one ended and after the released position, and its frame shares no byte
//   of the ring with a frame the receiver still holds (the writer may reuse
//   the space of its own padding and of lost frames: shm_ring.h);
// - the released position never moves backwards and never passes a region
//   the receiver still holds;
// - a forged descriptor either fails ValidateRegion / Arrived or is
//   accounted for without breaking the same rules.
// Replayed over tests/fuzz/corpus/shm_ring.
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include "transport/shm_ring.h"

namespace {

struct Reader {
  size_t pos = 0;
  const uint8_t* data;
  size_t size;
  bool more() const { return pos < size; }
  uint64_t Bytes(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n && pos < size; ++i) v |= uint64_t{data[pos++]} << (8 * i);
    return v;
  }
};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::shm;
  Reader in{0, data, size};
  const uint64_t capacity = uint64_t{4096} << (in.Bytes(1) % 6);
  ShmRingWriter writer(capacity);
  ShmRingReleaser releaser(0);
  ShmRingReleaser forged_side(in.Bytes(2));
  std::deque<Region> held;  // arrived, not released
  uint64_t published = 0, last_end = 0;
  for (int step = 0; step < 4096 && in.more(); ++step) {
    switch (in.Bytes(1) % 4) {
      case 0:
      case 1: {  // the sender places a frame; it arrives unless "lost"
        const uint64_t length = in.Bytes(2) * (1 + in.Bytes(1) % 8);
        const bool lost = in.Bytes(1) % 5 == 0;
        auto r = writer.Allocate(length, published);
        if (!r) break;
        Check(ValidateRegion(*r, capacity).ok());
        Check(r->begin == last_end);
        Check(static_cast<int64_t>(r->begin - published) >= 0);
        for (const Region& h : held) {
          const uint64_t a = r->data % capacity, b = h.data % capacity;
          Check(a + r->length <= b || b + h.length <= a);
        }
        last_end = r->end();
        if (lost) break;
        Check(releaser.Arrived(*r).ok());
        held.push_back(*r);
        break;
      }
      case 2: {  // the receiver drops a frame it held
        if (held.empty()) break;
        const size_t i = in.Bytes(1) % held.size();
        const uint64_t p = releaser.Release(held[i].begin);
        held.erase(held.begin() + static_cast<long>(i));
        Check(p >= published);
        published = p;
        break;
      }
      case 3: {  // a peer forges a descriptor
        const Region r{in.Bytes(8), in.Bytes(8), in.Bytes(8)};
        if (!ValidateRegion(r, capacity).ok()) break;
        Check(r.length > 0 && r.length <= capacity && r.data - r.begin < capacity);  // positions are serial
        Check(r.data % capacity + r.length <= capacity);
        const uint64_t before = forged_side.published();
        if (forged_side.Arrived(r).ok()) Check(forged_side.Release(r.begin) >= before);
        break;
      }
    }
    for (const Region& r : held) Check(published <= r.begin);
    Check(releaser.published() == published);
  }
  return 0;
}

void WriteSeeds(const std::string& dir) {
  auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                            static_cast<std::streamsize>(bytes.size()));
  };
  // Fill a 4 KiB ring, release out of order, lose one, forge one.
  write("fill_release", {0, 0, 0, 0, 0x00, 1, 0, 0, 1, 0x00, 0, 4, 0, 1, 0x02, 1, 0x02, 0, 0x00, 0, 2, 0, 0});
  write("lost_and_forged", {1, 7, 0, 1, 0x00, 0, 1, 0, 0, 0x03, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0x40, 0, 0, 0, 0,
                            0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0x02, 0});
}
