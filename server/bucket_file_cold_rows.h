#pragma once
// BucketFileColdRows: a table's disk tier (server/cold_rows.h) in a file of
// our own, a hash table on disk with no per-row index in memory.
//
// Layout: the rows live in buckets of bucket_bytes() (whole 4 KiB pages,
// enough for at least 16 records), each a header (how many records it
// holds, its overflow bucket), then the records' keys together (so a lookup
// reads a few cache lines of keys, not one line per record), then their
// rows in the same order. A key's bucket is chosen by linear hashing (Litwin, 1980): with
// n0 buckets at level 0, level L and split pointer p, the key's hash h goes
// to h mod (n0 * 2^L), or to h mod (n0 * 2^(L+1)) when that is below p. When
// the rows pass 3/4 of what the primary buckets hold, bucket p is split: the
// records of it (and its overflow chain) that belong to the new bucket
// n0 * 2^L + p move there, and p advances. So the table grows one bucket at
// a time (no pause to rehash everything), and a lookup reads one bucket, a
// few more when it overflowed (a full bucket gets an overflow bucket from a
// second file; an emptied one goes to a free list).
//
// Both files are mapped into address space reserved up front (so a mapping
// never moves) and grown with fallocate in steps, so that a full disk is
// an error at growth (the ColdRows contract: the process stops, naming the
// file), not a SIGBUS on a later write. Reads and writes are copies into and
// out of the mapping: a row found costs a hash, one or two cache misses and a
// copy when its page is in the page cache, and one page read when it is
// not. The pages are the kernel's page cache (file-backed: the process's
// RssFile, given back under memory pressure), not the process's anonymous
// memory; memory_bytes() is a constant (this object and its bookkeeping).
//
// Why this and RocksDB both: RocksDB (server/rocks_cold_rows.h) keeps about
// 3 bytes a row in memory and writes in long sequential runs, which suits a
// real disk; but it rewrites every row several times in flushes and
// compactions, which on a machine with few cores costs more CPU than the
// rows' own updates. This file rewrites nothing and needs no background
// thread; its writes are random 4 KiB pages, which a solid-state disk takes
// well. bench/disk_tier_bench measures both (--store).
//
// Scratch, like the RocksDB store: Open removes what an earlier process
// left in the directory; the destructor removes the files.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/cold_rows.h"

namespace tessera {

class BucketFileColdRows final : public ColdRows {
 public:
  // `directory` is made if missing; files an earlier store left in it are
  // removed, other files are refused (FailedPrecondition, nothing removed).
  static absl::StatusOr<std::unique_ptr<BucketFileColdRows>> Open(const std::string& directory, uint32_t row_floats);
  ~BucketFileColdRows() override;
  BucketFileColdRows(const BucketFileColdRows&) = delete;
  BucketFileColdRows& operator=(const BucketFileColdRows&) = delete;

  uint32_t row_floats() const override { return row_floats_; }
  void Put(Key key, std::span<const float> row) override;
  size_t Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override {
    return Read(keys, out, found, /*take=*/false);
  }
  size_t Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override {
    return Read(keys, out, found, /*take=*/true);
  }
  void Add(Key key, std::span<const float> row) override;
  bool Contains(Key key) override;
  void Erase(Key key) override;
  void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override;
  void ForEachKey(absl::FunctionRef<void(Key)> fn) override;
  uint64_t memory_bytes(uint64_t) const override { return kMemoryBytes; }
  ColdRowStats stats() const override;
  void KeepAlive(std::shared_ptr<const void> owner) { owner_ = std::move(owner); }

  // For tests: the geometry.
  size_t bucket_bytes() const { return bucket_bytes_; }
  uint32_t records_per_bucket() const { return per_bucket_; }
  uint64_t primary_buckets() const { return buckets_; }
  uint64_t overflow_buckets_in_use() const { return overflow_used_ - overflow_free_.size(); }
  uint64_t size() const { return rows_; }

  static constexpr uint64_t kMemoryBytes = 1ull << 20;  // this object, the free list, slack
  static constexpr uint64_t kInitialBuckets = 64;       // n0

 private:
  // One file mapped into a reserved range of address space.
  struct Mapped {
    int fd = -1;
    char* base = nullptr;      // the reservation
    size_t reserved = 0;       // bytes of address space
    size_t mapped = 0;         // bytes of the file mapped (and allocated)
    std::string path;
  };
  struct Header {
    uint32_t count;
    uint32_t unused;
    uint64_t overflow;  // overflow bucket number + 1; 0 = none
  };
  static constexpr size_t kHeaderBytes = sizeof(Header);

  BucketFileColdRows(std::string directory, uint32_t row_floats);
  absl::Status OpenFiles();
  // Makes `file` at least `bytes` long (allocated and mapped).
  void Grow(Mapped& file, size_t bytes);
  uint64_t BucketOf(uint64_t hash) const;
  Header* Primary(uint64_t bucket) { return reinterpret_cast<Header*>(primary_.base + bucket * bucket_bytes_); }
  Header* Overflow(uint64_t index) { return reinterpret_cast<Header*>(overflow_.base + index * bucket_bytes_); }
  Header* Next(const Header* h) { return h->overflow == 0 ? nullptr : Overflow(h->overflow - 1); }
  Key* Keys(Header* h) { return reinterpret_cast<Key*>(reinterpret_cast<char*>(h) + kHeaderBytes); }
  char* Row(Header* h, uint32_t i) {
    return reinterpret_cast<char*>(h) + kHeaderBytes + size_t{per_bucket_} * sizeof(Key) + size_t{i} * row_bytes_;
  }
  // The record of `key`: its bucket (primary or overflow) and index, or null.
  std::pair<Header*, uint32_t> Find(Key key);
  // Appends a record to the chain starting at `head` (takes an overflow
  // bucket when the chain is full).
  void Append(Header* head, Key key, const char* row);
  // Removes record i of bucket h, in the chain starting at `head`: the
  // chain's last record fills its place, and an overflow bucket left empty
  // goes back.
  void Remove(Header* head, Header* h, uint32_t i);
  void GrowIfFull();
  // Get, or with `take` Take.
  size_t Read(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found, bool take);
  uint64_t NewOverflow();
  void SplitOne();

  const std::string directory_;
  const uint32_t row_floats_;
  const size_t row_bytes_;
  const size_t record_bytes_;
  const size_t bucket_bytes_;
  const uint32_t per_bucket_;
  Mapped primary_, overflow_;
  uint64_t level_ = 0, split_ = 0;
  uint64_t buckets_ = kInitialBuckets;  // primary buckets in use: n0 * 2^level + split
  uint64_t overflow_used_ = 0;           // overflow buckets ever handed out
  std::vector<uint64_t> overflow_free_;  // emptied ones, to hand out again
  uint64_t rows_ = 0;
  ColdRowStats stats_;
  std::shared_ptr<const void> owner_;
};

}  // namespace tessera
