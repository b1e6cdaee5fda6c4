#include "server/admission_sketch.h"

#include <algorithm>
#include <limits>

#include "common/keys.h"

namespace tessera {

AdmissionSketch::AdmissionSketch(uint64_t width, uint64_t seed)
    : width_(std::max<uint64_t>(1, width)), seed_(seed), counters_(kDepth * width_, 0) {}

uint64_t AdmissionSketch::Slot(int row, uint64_t id) const {
  const uint64_t h = Mix64(id ^ Mix64(seed_ + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(row + 1)));
  return static_cast<uint64_t>(row) * width_ + h % width_;
}

uint32_t AdmissionSketch::Count(uint64_t id) const {
  uint32_t m = std::numeric_limits<uint16_t>::max();
  for (int r = 0; r < kDepth; ++r) m = std::min<uint32_t>(m, counters_[Slot(r, id)]);
  return m;
}

uint32_t AdmissionSketch::Add(uint64_t id) {
  uint64_t slots[kDepth];
  uint32_t m = std::numeric_limits<uint16_t>::max();
  for (int r = 0; r < kDepth; ++r) {
    slots[r] = Slot(r, id);
    m = std::min<uint32_t>(m, counters_[slots[r]]);
  }
  // Conservative update: raise only the counters at the minimum, to the new
  // estimate; the others already over-count this id.
  const uint32_t next = std::min<uint32_t>(m + 1, std::numeric_limits<uint16_t>::max());
  for (uint64_t s : slots)
    if (counters_[s] < next) counters_[s] = static_cast<uint16_t>(next);
  if (++additions_ >= width_ * 10) Halve();
  return next;
}

void AdmissionSketch::Halve() {
  for (uint16_t& c : counters_) c = static_cast<uint16_t>(c >> 1);
  additions_ = 0;
  ++halvings_;
}

}  // namespace tessera
