#pragma once
// ColdRows: where a table keeps the rows its memory budget has no room for
// (the disk tier; server/table.h, "Disk tier").
//
// A Table with a disk tier (TableConfig.disk_tier, with memory_budget_bytes)
// holds its most recently used rows in memory and hands the others to a
// ColdRows instead of dropping them; a push or pull that touches a row held
// here takes it back. This interface is what the pure Table sees: the store
// behind it may write files (RocksColdRows, server/rocks_cold_rows.h, made
// by the server's shell) or keep the rows in memory (MemoryColdRows below,
// for the pure core's tests and the cluster simulator).
//
// Contract, for every implementation:
// - Rows are opaque runs of row_floats() floats (a table's stored row:
//   weights, then optimizer state); what Get returns is bit for bit what the
//   last Put of that key stored.
// - Keys are any 64-bit values. The store holds at most one row per key.
// - The Table keeps a key in at most one of memory and the store, so it
//   knows the store's row count without asking (Table::rows_on_disk()).
// - Failure: a store that cannot read or write its medium stops the process
//   with a line naming the file and the error (TESSERA_CHECK_MSG): a server
//   whose disk fails is a server that fails, and its replicas take over
//   without losing an acknowledged push (docs/fault_tolerance.md). No method
//   returns an error the Table would have to undo.
// - memory_bytes(rows): the most memory the store itself holds (buffers,
//   caches, and what it keeps in memory per row held: an index, filters)
//   while it holds `rows` rows; the Table counts it against the table's
//   memory budget. The rows' values are not counted: they are on disk.
// - Thread safety: none; the Table's caller serializes every call (the
//   server's shard thread), const methods included.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/keys.h"

namespace tessera {

// What a store did, since it was made (metrics; docs/embeddings.md).
struct ColdRowStats {
  uint64_t rows_written = 0;   // Put calls
  uint64_t rows_read = 0;      // keys Get found
  uint64_t lookups_absent = 0; // keys Get did not find
  uint64_t rows_erased = 0;    // Erase calls
  uint64_t bytes_on_disk = 0;  // what its files take now (0 for a store in memory)
};

class ColdRows {
 public:
  virtual ~ColdRows() = default;

  // Floats in every row (fixed when the store was made).
  virtual uint32_t row_floats() const = 0;
  // Stores `row` (row_floats() floats) under `key`, replacing what was there.
  virtual void Put(Key key, std::span<const float> row) = 0;
  // For each i, when keys[i] is held: copies its row to out[i *
  // row_floats(), (i + 1) * row_floats()) and sets found[i] to 1; else sets
  // found[i] to 0 and leaves that part of out alone. out.size() must be
  // keys.size() * row_floats() and found.size() keys.size(). Returns how
  // many keys were found. A key listed twice is found twice.
  virtual size_t Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) = 0;
  // Get, and forgets the keys found, in one pass (a table bringing rows
  // back). A key listed twice is found once, at its first listing.
  virtual size_t Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found);
  // Put of a key the store does not hold (the caller knows: a table moves
  // out only rows it holds in memory). Stores may skip the lookup Put makes.
  virtual void Add(Key key, std::span<const float> row) { Put(key, row); }
  // Whether `key` is held (no row is copied).
  virtual bool Contains(Key key) = 0;
  // Forgets `key` (nothing happens when it is not held).
  virtual void Erase(Key key) = 0;
  // Calls fn(key, row) once for every row held, in no particular order. The
  // span is valid during the call only; fn must not change the store.
  virtual void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) = 0;
  // Calls fn(key) once for every key held, in no particular order, reading
  // no row where the store can (the default walks ForEach). fn must not
  // change the store.
  virtual void ForEachKey(absl::FunctionRef<void(Key)> fn) {
    ForEach([&](Key key, std::span<const float>) { fn(key); });
  }
  // The most memory the store holds while it holds `rows` rows (see above).
  virtual uint64_t memory_bytes(uint64_t rows) const = 0;
  virtual ColdRowStats stats() const = 0;
};

// Makes the store of one table (the server gives one to each table that
// asks for a disk tier): `table_id` and `row_floats` as the table's. An
// error (a directory it cannot make) refuses the table's creation.
using ColdRowsFactory =
    std::function<absl::StatusOr<std::unique_ptr<ColdRows>>(uint32_t table_id, uint32_t row_floats)>;

// ColdRows in memory: the pure core's stand-in for the disk (tests, the
// cluster simulator). Same contract; memory_bytes() is 0, since what it
// holds stands for disk.
class MemoryColdRows : public ColdRows {
 public:
  explicit MemoryColdRows(uint32_t row_floats) : row_floats_(row_floats) {}
  uint32_t row_floats() const override { return row_floats_; }
  void Put(Key key, std::span<const float> row) override;
  size_t Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override;
  bool Contains(Key key) override { return rows_.contains(key); }
  void Erase(Key key) override;
  void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override;
  void ForEachKey(absl::FunctionRef<void(Key)> fn) override;
  uint64_t memory_bytes(uint64_t) const override { return 0; }
  ColdRowStats stats() const override { return stats_; }
  size_t size() const { return rows_.size(); }

 private:
  const uint32_t row_floats_;
  absl::flat_hash_map<Key, std::vector<float>> rows_;
  ColdRowStats stats_;
};

}  // namespace tessera
