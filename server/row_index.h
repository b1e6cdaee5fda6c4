#pragma once
// RowIndex: a table's key -> row number index (server/table.h). An open-
// addressing hash table with linear probing, made for the lookups of a pull:
// a batch of thousands of keys spread over millions of rows, where most
// lookups miss the cache. The caller hashes a key once (Hash), asks
// for its slot's cache line early (Prefetch) and probes later with the same
// hash (Find), so the misses of neighbouring keys overlap and no key is
// hashed twice.
//
// Contract:
// - Keys are any 64-bit values (0 and ~0 included); row numbers are any
//   uint32_t except kNoRow, which Find returns for "absent".
// - Find, Contains: expected O(1); for most keys present one cache line
//   (the home slot's), for keys absent often more. Never allocate.
// - Insert: expected amortized O(1); grows the table (doubling, a rehash of
//   every entry: O(size)) before the load would pass the maximum,
//   kMaxLoadNumerator / kMaxLoadDenominator = 3/4. Erase:
//   expected O(1), by backward shift: no tombstones, so a table that keeps
//   dropping and adding keys (eviction) probes as if freshly built.
// - Iteration (ForEach) visits every entry exactly once, in slot order:
//   no order a caller may rely on, except that it is a function of the
//   sequence of Insert/Erase/Reserve calls that built the index (the hash
//   is fixed, not seeded per process), so two indexes built by the same
//   calls iterate alike. The index must not change during ForEach.
// - Hashes stay valid across growth: a hash is a function of the key only.
// - Memory: 16 bytes a slot, capacity a power of two; the load (size /
//   capacity) stays at most 3/4 and, after the first growth, at least 3/8
//   until erases lower it: 21 to 43 bytes per entry. Slot arrays of 2 MiB and more are huge-page backed
//   (server/huge_pages.h). The index shrinks only when asked (ShrinkTo).
// - Not thread-safe: const methods may run concurrently with each other,
//   nothing may run concurrently with a non-const method.
//
// Why these choices: with linear probing a present key is found on average
// after 1.5 slots at load 1/2 and 2.5 at 3/4 (a cache line holds 4), so the
// one prefetched line (the home slot's) holds the key for most lookups: for
// 85% of the keys present at load 0.6 (a simulation of random homes), 78%
// at 3/4. Prefetching the next line as well measured slower (the extra
// traffic costs more than the misses it saves). Keys and row numbers sit
// together in one slot, so a probe costs one miss, not two. A maximum load
// of 3/4 keeps the probe of an absent key (an insert) to 8.5 slots on
// average while keeping the memory close to what the memory budget counts
// (Table::kIndexBytesPerRow). An empty slot is marked by its row number
// (kNoRow), never by a key value, so every key is storable; an empty slot
// also holds the key ~0, so a probe decides a hit with one comparison.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "common/keys.h"

namespace tessera {

class RowIndex {
 public:
  static constexpr uint32_t kNoRow = ~uint32_t{0};
  // The most entries per slot before the index grows.
  static constexpr size_t kMaxLoadNumerator = 3, kMaxLoadDenominator = 4;
  static constexpr size_t kMinCapacity = 16;

  RowIndex();
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // The index's hash of a key: a pure function, the same for every index
  // and process. It is not VirtualShardOf's hash (nor close to it), so the
  // keys of one shard spread over the whole index.
  static uint64_t Hash(Key key) {
    uint64_t x = key ^ 0x2545f4914f6cdd1dULL;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Slots (a power of two); grows as entries come, shrinks by ShrinkTo only.
  size_t capacity() const { return mask_ + 1; }

  // Asks the memory system for the cache line of the first slot a Find of a
  // key with this hash reads. Changes nothing; a later growth makes it
  // useless, never wrong.
  void Prefetch(uint64_t hash) const {
    const Slot* slot = &slots_[Home(hash)];
    __builtin_prefetch(slot);
    // GCC 12 may optimize prefetches away: it dropped those of absl's
    // flat_hash_map::prefetch from Table::ReadRows, and those of trial
    // versions of this function (as "pure": a prefetch is no side effect to
    // it). An empty volatile asm that takes the address is an effect it must
    // keep, and it emits no instruction. (objdump -d of ReadRows shows the
    // prefetcht0 instructions.)
    asm volatile("" : : "r"(slot));
  }

  // The row of `key`, or kNoRow. `hash` must be Hash(key).
  uint32_t Find(Key key, uint64_t hash) const {
    for (size_t i = Home(hash);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      // An empty slot holds key ~0 and row kNoRow: a match on it is the
      // answer "absent" for key ~0, which an empty slot means anyway.
      if (s.key == key) return s.row;
      if (s.row == kNoRow) return kNoRow;
    }
  }
  uint32_t Find(Key key) const { return Find(key, Hash(key)); }
  bool Contains(Key key) const { return Find(key) != kNoRow; }

  // Adds key -> row if the key is absent and returns true; a present key
  // keeps its row and the call returns false. Requires row != kNoRow.
  // `hash` must be Hash(key). May grow the index (see the contract).
  bool Insert(Key key, uint32_t row, uint64_t hash);
  bool Insert(Key key, uint32_t row) { return Insert(key, row, Hash(key)); }

  // Removes the key; returns whether it was present.
  bool Erase(Key key, uint64_t hash);
  bool Erase(Key key) { return Erase(key, Hash(key)); }

  // Grows (never shrinks) so that `entries` fit without another growth.
  void Reserve(size_t entries);
  // Shrinks to the smallest capacity (a power of two, at least
  // kMinCapacity) that holds max(entries, size()) within the maximum load,
  // when that is smaller than the capacity now: a rehash, O(capacity()),
  // and the old slot array goes back to the allocator. Returns whether it
  // shrank. (The only way the index gets smaller: the table calls it once
  // it has dropped many rows for good, server/table.h "Memory given back".)
  bool ShrinkTo(size_t entries);

  // Gives the present `key` the row number `row` (a row the table moved);
  // returns false, changing nothing, when the key is absent. Requires
  // row != kNoRow. Never allocates.
  bool Reassign(Key key, uint32_t row);

  // fn(key, row) for every entry, in slot order (see the contract).
  void ForEach(absl::FunctionRef<void(Key, uint32_t)> fn) const;

  // For tests: how far entries sit from their home slot (0: at home).
  struct ProbeStats {
    double mean_displacement = 0;
    size_t max_displacement = 0;
  };
  ProbeStats Probes() const;

 private:
  // Invariants:
  // - A slot is empty iff row == kNoRow, and then key == kEmptyKey.
  // - Every entry sits at its home slot or after it (cyclically), with no
  //   empty slot between its home and it (linear probing).
  // - size_ entries; size_ * kMaxLoadDenominator <= capacity() *
  //   kMaxLoadNumerator; capacity() is a power of two >= kMinCapacity;
  //   shift_ == 64 - log2(capacity()).
  // - The slot array is 64-byte aligned, so each cache line holds 4 whole
  //   slots.
  struct Slot {
    Key key;
    uint32_t row;
    uint32_t unused;  // padding to 16 bytes: aligned slots, 4 per cache line
  };
  static_assert(sizeof(Slot) == 16);
  static constexpr Key kEmptyKey = ~Key{0};
  struct FreeSlots {
    size_t bytes = 0;  // what was allocated (AllocateHugePageBacked frees by size)
    void operator()(Slot* p) const;
  };

  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> shift_); }
  void Rehash(size_t new_capacity);
  static std::unique_ptr<Slot[], FreeSlots> AllocateEmpty(size_t capacity);

  std::unique_ptr<Slot[], FreeSlots> owned_;
  Slot* slots_ = nullptr;  // owned_.get()
  size_t mask_ = 0;        // capacity() - 1
  uint32_t shift_ = 64;
  size_t size_ = 0;
};

}  // namespace tessera
