#pragma once
// LogIndex: the in-memory index of LogColdRows (server/log_cold_rows.h),
// key -> slot of its record in the log, in 8 bytes a slot and without the
// doubling of a growing hash table.
//
// Layout (extendible hashing, Fagin et al. 1979): a directory of 2^G page
// pointers chosen by the top G bits of a key's hash; a page is an open-
// addressing table of kPageEntries entries with linear probing, holding the
// keys whose hash starts with the page's d bits (its local depth, d <= G).
// An entry is the top 32 bits of the key's hash and the slot; the key itself
// is not kept: a lookup whose 32 bits match reads the record's key
// (key_of(slot)) to confirm. A page that passes 3/4 full splits in two by
// the next bit (the directory doubles when d reaches G), so growth costs one
// new page at a time, never a second copy of the whole index.
//
// Contract:
// - Keys are any 64-bit values, slots any uint32_t but kNoSlot. Each key at
//   most once. key_of(slot) must return the key stored with `slot` for
//   every slot in the index (it is called for candidates only).
// - Find: the key's slot or kNoSlot. Insert: requires the key absent.
//   Replace: requires the key present; gives it a new slot. Erase: whether
//   it was present. Expected O(1) each; a split moves one page's entries.
// - Memory: memory_bytes() is what it holds (pages and directory). Pages
//   sit between 3/8 and 3/4 full as they grow (11 to 21 bytes an entry);
//   erasures empty pages without freeing them. MemoryFor(entries) is a
//   bound on what it holds for `entries` entries once grown to them: at
//   most 22 bytes an entry, plus a page being split and the directory.
// - A lookup reads a record it does not want only when another key in
//   the probe has the same 32 bits: for a page of depth d, about 2^(d-32)
//   per entry probed. At most 2^19 pages (a page's keys must keep 13 bits
//   of their own): about 3 * 10^9 entries; a store that would pass it stops
//   the process (TESSERA_CHECK_MSG).
// - Not thread-safe.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/keys.h"

namespace tessera {

class LogIndex {
 public:
  static constexpr uint32_t kNoSlot = ~uint32_t{0};
  static constexpr uint32_t kPageBits = 13;
  static constexpr size_t kPageEntries = size_t{1} << kPageBits;
  static constexpr size_t kPageBytes = kPageEntries * 8;

  explicit LogIndex(std::function<Key(uint32_t)> key_of);
  LogIndex(const LogIndex&) = delete;
  LogIndex& operator=(const LogIndex&) = delete;

  static uint64_t Hash(Key key) { return Mix64(key ^ 0x243f6a8885a308d3ULL); }

  uint32_t Find(Key key, uint64_t hash) const;
  void Insert(Key key, uint64_t hash, uint32_t slot);
  void Replace(Key key, uint64_t hash, uint32_t slot);
  bool Erase(Key key, uint64_t hash);
  bool Contains(Key key) const { return Find(key, Hash(key)) != kNoSlot; }
  // fn(slot) for every entry, page by page.
  void ForEach(absl::FunctionRef<void(uint32_t)> fn) const;

  size_t size() const { return size_; }
  uint64_t memory_bytes() const { return pages_.size() * kPageBytes + directory_.size() * sizeof(Page*); }
  static uint64_t MemoryFor(uint64_t entries) { return entries * 22 + 2 * kPageBytes + (entries / 1000 + 64) * 8; }
  size_t pages() const { return pages_.size(); }

 private:
  struct Entry {
    uint32_t bits;  // the top 32 bits of the key's hash
    uint32_t slot;  // kNoSlot: empty
  };
  struct Page {
    uint32_t depth = 0;  // the leading hash bits its keys share
    uint32_t count = 0;
    std::unique_ptr<Entry[]> entries;
  };
  static uint32_t Bits(uint64_t hash) { return static_cast<uint32_t>(hash >> 32); }
  // The home entry: a mix of all 32 bits. (Not their low bits: the keys of
  // a page share its leading bits, so two keys at one home would then differ
  // in only the bits between, and a lookup would often read a record of
  // another key to tell them apart.)
  static size_t Home(uint32_t bits) { return (bits * 0x9e3779b1u) >> (32 - kPageBits); }
  Page& PageOf(uint32_t bits) const;
  // The position of `key` in its page, or kPageEntries.
  size_t Position(const Page& page, Key key, uint32_t bits) const;
  Page* NewPage(uint32_t depth);
  void Split(Page& page);
  static void Put(Page& page, uint32_t bits, uint32_t slot);

  std::function<Key(uint32_t)> key_of_;
  uint32_t global_depth_ = 0;
  std::vector<Page*> directory_;
  std::vector<std::unique_ptr<Page>> pages_;
  size_t size_ = 0;
};

}  // namespace tessera
