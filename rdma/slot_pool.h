#pragma once
// SlotPool: accounting of fixed-size slots carved from one registered region
// (the eager buffers: receive slots, outgoing headers and small messages, and
// the chunks of staged rendezvous writes).
//
// Contract:
// - The region is borrowed: the owner keeps it alive (and registered, under
//   `lkey`) for the pool's lifetime. Slot i is bytes [i * slot_bytes,
//   (i + 1) * slot_bytes) of it; a trailing remainder is unused.
// - Acquire() hands out a free slot or nullopt when all are in use; the
//   caller then queues its work and retries after a Release (the pool itself
//   keeps no waiters; see EndpointCore). Every failed Acquire counts one wait.
// - Release(i) requires i to be in use (a double release is a bug: it aborts).
// - Counters: in_use, high_water (largest in_use seen), waits, acquires.
// - Thread safety: none; used under the owner's lock.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tessera::rdma {

class SlotPool {
 public:
  SlotPool(std::span<std::byte> region, size_t slot_bytes, uint32_t lkey);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  std::optional<uint32_t> Acquire();
  void Release(uint32_t slot);

  std::span<std::byte> Memory(uint32_t slot) const;
  uint64_t Address(uint32_t slot) const { return reinterpret_cast<uint64_t>(Memory(slot).data()); }
  uint32_t lkey() const { return lkey_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint32_t slot_count() const { return static_cast<uint32_t>(in_use_flags_.size()); }

  uint32_t in_use() const { return in_use_; }
  uint32_t free_slots() const { return slot_count() - in_use_; }
  uint32_t high_water() const { return high_water_; }
  uint64_t waits() const { return waits_; }
  uint64_t acquires() const { return acquires_; }

 private:
  const std::span<std::byte> region_;
  const size_t slot_bytes_;
  const uint32_t lkey_;
  // Invariants: free_ holds exactly the slots whose in_use_flags_ is false;
  // in_use_ = slot_count() - free_.size(); high_water_ >= in_use_.
  std::vector<uint32_t> free_;  // LIFO: recently used slots are warm in cache
  std::vector<bool> in_use_flags_;
  uint32_t in_use_ = 0;
  uint32_t high_water_ = 0;
  uint64_t waits_ = 0;
  uint64_t acquires_ = 0;
};

}  // namespace tessera::rdma
