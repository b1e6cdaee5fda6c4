#include "rdma/slot_pool.h"

#include "rdma/invariant.h"

namespace tessera::rdma {

SlotPool::SlotPool(std::span<std::byte> region, size_t slot_bytes, uint32_t lkey)
    : region_(region), slot_bytes_(slot_bytes), lkey_(lkey) {
  RDMA_CHECK(slot_bytes > 0);
  const size_t count = region.size() / slot_bytes;
  RDMA_CHECK(count <= UINT32_MAX);
  in_use_flags_.assign(count, false);
  free_.reserve(count);
  for (size_t i = count; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
}

std::optional<uint32_t> SlotPool::Acquire() {
  if (free_.empty()) {
    ++waits_;
    return std::nullopt;
  }
  const uint32_t slot = free_.back();
  free_.pop_back();
  in_use_flags_[slot] = true;
  ++in_use_;
  ++acquires_;
  if (in_use_ > high_water_) high_water_ = in_use_;
  return slot;
}

void SlotPool::Release(uint32_t slot) {
  RDMA_CHECK(slot < in_use_flags_.size() && in_use_flags_[slot]);
  in_use_flags_[slot] = false;
  --in_use_;
  free_.push_back(slot);
}

std::span<std::byte> SlotPool::Memory(uint32_t slot) const {
  RDMA_CHECK(slot < in_use_flags_.size());
  return region_.subspan(size_t{slot} * slot_bytes_, slot_bytes_);
}

}  // namespace tessera::rdma
