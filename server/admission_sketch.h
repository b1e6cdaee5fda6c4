#pragma once
// AdmissionSketch: how often each id has been seen, approximately, in fixed
// memory: a count-min sketch with conservative update (Estan and Varghese,
// 2002) of 16-bit saturating counters. Pure; deterministic for a given seed
// and sequence of calls.
//
// Promises:
// - Count(id) never underestimates the number of Add(id) calls since the
//   last Halve() (halving divides by two, rounding down, like every
//   counter); it overestimates only when ids collide in every row.
// - Memory: kDepth * width * 2 bytes, allocated at construction.
// - Ageing: after width * 10 additions in all, every counter is halved (the
//   "reset" of TinyLFU), so old popularity fades and the counters never sit
//   at their cap. halvings() counts that.
#include <cstdint>
#include <memory>
#include <vector>

namespace tessera {

class AdmissionSketch {
 public:
  static constexpr int kDepth = 4;

  // width >= 1 counters per row; seed varies the hash functions.
  AdmissionSketch(uint64_t width, uint64_t seed);

  // Counts one sighting of `id` and returns its estimated count afterwards.
  uint32_t Add(uint64_t id);
  // The estimated count of `id`.
  uint32_t Count(uint64_t id) const;

  uint64_t width() const { return width_; }
  uint64_t bytes() const { return counters_.size() * sizeof(uint16_t); }
  uint64_t halvings() const { return halvings_; }

 private:
  uint64_t Slot(int row, uint64_t id) const;
  void Halve();

  uint64_t width_;
  uint64_t seed_;
  std::vector<uint16_t> counters_;  // kDepth rows of width_
  uint64_t additions_ = 0;          // since the last halving
  uint64_t halvings_ = 0;
};

}  // namespace tessera
