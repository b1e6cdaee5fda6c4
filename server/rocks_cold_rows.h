#pragma once
// RocksColdRows: a table's disk tier (server/cold_rows.h) in an embedded
// RocksDB store on the server's local disk. Made by the server's shell, one
// per table that asks for a disk tier, in its own directory.
//
// Why RocksDB and not a log of our own: a store of our own with fixed-size
// records needs a key -> record index in memory, about 32 bytes a row (the
// table's own RowIndex); a table 8x its budget at dim 16 (128-byte rows with
// Adagrad) would spend more than its whole budget on that index alone.
// RocksDB keeps its index and Bloom filters on disk, in blocks cached within
// a bound we set (about 2.5 bytes a row with 10-bit filters and 16 KiB
// blocks), and writes in large sequential runs (memtable flushes) rather than
// a write per evicted row.
//
// The store is scratch: it holds rows only while this process runs. Opening
// removes what an earlier process left in the directory (a server that
// restarts gets its rows from its replicas or a checkpoint, like the rows
// it held in memory). No write-ahead log and no fsync: a crash loses the
// directory's rows by design, never an acknowledged push, since the
// replicas hold them (docs/embeddings.md, "Disk tier").
//
// Memory: memory_bytes(rows) = 2 * write_buffer_bytes (the memtable and one
// being flushed) + block_cache_bytes (data blocks) + kFixedOverheadBytes
// (arenas, iterators) + kBytesPerRow * rows: the files' index and Bloom
// filter blocks, which stay in memory with their table readers (10 bits a
// key of filter, an index entry per 4 KiB block of ~28 rows of dim 16;
// rounded up: measured in bench/disk_tier_bench's resident column). The
// files are read through mmap (a miss costs a copy, not a system call: 25%
// less CPU a row in the bench): their pages are the kernel's page cache,
// counted in the process's file-backed resident size (RssFile) and given
// back under memory pressure, not in its anonymous memory (RssAnon), which
// is what the budget bounds.
//
// Settings, measured with bench/disk_tier_bench (docs/embeddings.md): mmap
// reads (above), a
// hash memtable (point lookups only; the skip list's key compares cost
// more), universal compaction (less rewriting than levels, for a store
// that mostly replaces its rows), no compression, 4 KiB blocks (a miss
// reads one), filter and index blocks outside the block cache (in it they
// were pushed out by data blocks and read again on every lookup).
//
// Failure: an error of RocksDB after opening (I/O, corruption) stops the
// process naming the directory (the ColdRows contract); Open returns an
// error instead (a directory it cannot make or lock).
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/cold_rows.h"

namespace rocksdb {
class Cache;
class DB;
}  // namespace rocksdb

namespace tessera {

struct RocksColdRowsOptions {
  std::string directory;                    // made if missing; what is in it is removed
  uint64_t write_buffer_bytes = 8ull << 20;  // one memtable
  uint64_t block_cache_bytes = 16ull << 20;  // data, index and filter blocks
};

class RocksColdRows final : public ColdRows {
 public:
  static constexpr uint64_t kFixedOverheadBytes = 8ull << 20;
  static constexpr uint64_t kBytesPerRow = 3;

  static absl::StatusOr<std::unique_ptr<RocksColdRows>> Open(const RocksColdRowsOptions& options,
                                                             uint32_t row_floats);
  ~RocksColdRows() override;

  uint32_t row_floats() const override { return row_floats_; }
  void Put(Key key, std::span<const float> row) override;
  size_t Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override;
  size_t Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override;
  bool Contains(Key key) override;
  void Erase(Key key) override;
  void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override;
  uint64_t memory_bytes(uint64_t rows) const override;
  ColdRowStats stats() const override;
  const std::string& directory() const { return options_.directory; }
  // Keeps `owner` (the directory this store's directory is in) alive as
  // long as the store.
  void KeepAlive(std::shared_ptr<const void> owner) { owner_ = std::move(owner); }

 private:
  RocksColdRows(const RocksColdRowsOptions& options, uint32_t row_floats, std::shared_ptr<rocksdb::Cache> cache,
                rocksdb::DB* db);

  const RocksColdRowsOptions options_;
  const uint32_t row_floats_;
  std::shared_ptr<rocksdb::Cache> cache_;
  std::unique_ptr<rocksdb::DB> db_;
  ColdRowStats stats_;
  std::string scratch_;  // one value, reused by Contains
  std::shared_ptr<const void> owner_;  // declared last: destroyed after the store closed
};

}  // namespace tessera
