#include "server/row_index.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/check.h"
#include "server/huge_pages.h"

namespace tessera {

void RowIndex::FreeSlots::operator()(Slot* p) const {
  if (bytes >= kHugePageBytes) {
    FreeHugePageBacked(p, bytes);
  } else {
    std::free(p);
  }
}

std::unique_ptr<RowIndex::Slot[], RowIndex::FreeSlots> RowIndex::AllocateEmpty(size_t capacity) {
  const size_t bytes = capacity * sizeof(Slot);
  void* p = nullptr;
  if (bytes >= kHugePageBytes) {
    p = AllocateHugePageBacked(bytes);  // 2 MiB aligned
  } else if (posix_memalign(&p, 64, bytes) != 0) {
    throw std::bad_alloc();
  }
  // All bits set: key kEmptyKey, row kNoRow, in every slot.
  std::memset(p, 0xff, bytes);
  return std::unique_ptr<Slot[], FreeSlots>(static_cast<Slot*>(p), FreeSlots{bytes});
}

RowIndex::RowIndex() : owned_(AllocateEmpty(kMinCapacity)) {
  slots_ = owned_.get();
  mask_ = kMinCapacity - 1;
  shift_ = 64 - static_cast<uint32_t>(std::countr_zero(kMinCapacity));
}

void RowIndex::Rehash(size_t new_capacity) {
  auto fresh = AllocateEmpty(new_capacity);
  const size_t new_mask = new_capacity - 1;
  const uint32_t new_shift = 64 - static_cast<uint32_t>(std::countr_zero(new_capacity));
  Slot* const to = fresh.get();
  for (size_t i = 0, n = capacity(); i < n; ++i) {
    const Slot& s = slots_[i];
    if (s.row == kNoRow) continue;
    size_t j = static_cast<size_t>(Hash(s.key) >> new_shift);
    while (to[j].row != kNoRow) j = (j + 1) & new_mask;
    to[j] = s;
  }
  owned_ = std::move(fresh);
  slots_ = to;
  mask_ = new_mask;
  shift_ = new_shift;
}

void RowIndex::Reserve(size_t entries) {
  size_t cap = capacity();
  while (entries * kMaxLoadDenominator > cap * kMaxLoadNumerator) cap *= 2;
  if (cap != capacity()) Rehash(cap);
}

bool RowIndex::ShrinkTo(size_t entries) {
  entries = std::max(entries, size_);
  size_t cap = kMinCapacity;
  while (entries * kMaxLoadDenominator > cap * kMaxLoadNumerator) cap *= 2;
  if (cap >= capacity()) return false;
  Rehash(cap);
  return true;
}

bool RowIndex::Reassign(Key key, uint32_t row) {
  TESSERA_CHECK(row != kNoRow);
  for (size_t i = Home(Hash(key));; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.row == kNoRow) return false;
    if (s.key == key) {
      s.row = row;
      return true;
    }
  }
}

bool RowIndex::Insert(Key key, uint32_t row, uint64_t hash) {
  if (row == kNoRow) {  // a broken invariant of the caller, not bad input
    std::fprintf(stderr, "RowIndex::Insert: kNoRow is not a row number\n");
    std::abort();
  }
  size_t i = Home(hash);
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.row == kNoRow) break;
    if (s.key == key) return false;
  }
  if ((size_ + 1) * kMaxLoadDenominator > capacity() * kMaxLoadNumerator) {
    Rehash(capacity() * 2);
    for (i = Home(hash); slots_[i].row != kNoRow; i = (i + 1) & mask_) {
    }
  }
  slots_[i].key = key;
  slots_[i].row = row;
  ++size_;
  return true;
}

bool RowIndex::Erase(Key key, uint64_t hash) {
  size_t i = Home(hash);
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.row == kNoRow) return false;
    if (s.key == key) break;
  }
  // Backward shift: walk the run after the hole; an entry whose home is not
  // between the hole and itself (cyclically) moves back into the hole, and
  // the hole moves to where it was. The run ends at an empty slot.
  size_t hole = i;
  for (size_t j = (hole + 1) & mask_; slots_[j].row != kNoRow; j = (j + 1) & mask_) {
    const size_t home = Home(Hash(slots_[j].key));
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].key = kEmptyKey;
  slots_[hole].row = kNoRow;
  --size_;
  return true;
}

void RowIndex::ForEach(absl::FunctionRef<void(Key, uint32_t)> fn) const {
  for (size_t i = 0, n = capacity(); i < n; ++i)
    if (slots_[i].row != kNoRow) fn(slots_[i].key, slots_[i].row);
}

RowIndex::ProbeStats RowIndex::Probes() const {
  ProbeStats stats;
  size_t total = 0;
  for (size_t i = 0, n = capacity(); i < n; ++i) {
    if (slots_[i].row == kNoRow) continue;
    const size_t d = (i - Home(Hash(slots_[i].key))) & mask_;
    total += d;
    stats.max_displacement = std::max(stats.max_displacement, d);
  }
  if (size_ > 0) stats.mean_displacement = static_cast<double>(total) / static_cast<double>(size_);
  return stats;
}

}  // namespace tessera
