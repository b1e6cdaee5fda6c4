#pragma once
// Table: the rows of one table held by one server, and the optimizer that
// updates them. Pure: no I/O, no threads, no clock.
//
// Invariants:
// - Every row has exactly config.width floats.
// - DENSE tables: the rows that exist are exactly the keys < dense_rows that
//   the owner asked for at creation; a push or pull of any other key is an
//   error (and changes nothing).
// - SPARSE tables: a row exists once a push or pull touched its key; it is
//   created from the seeded initializer, so its first value depends only on
//   (init_seed, table id, key), never on the order of touches.
// - A request that fails validation changes nothing.
// - Storage: rows live in chunks; a row of at least kLendMinBytes has a chunk
//   of its own. A chunk may be lent to readers (ReadRowsShared) while it is
//   also the table's current storage; a lent chunk is never written: the
//   first write after a lend copies it (copy-on-write) and the table moves
//   on to the copy, while the readers keep the old bytes until they let go.
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"

namespace tessera {

// Checks a table config from the network or a file.
absl::Status ValidateTableConfig(const proto::TableConfig& config);

// The initial value of element `index` of row `key`: a pure function.
float InitialValue(const proto::TableConfig& config, Key key, uint32_t index);

class Table {
 public:
  // Rows at least this large get a chunk of their own and are lent to
  // readers instead of copied (smaller rows: a copy costs less than the
  // bookkeeping, and a copy-on-write of a shared chunk would cost more).
  static constexpr size_t kLendMinBytes = 64 * 1024;

  // `owns_key` says which keys this server holds (DENSE rows are created for
  // those keys only). Requires ValidateTableConfig(config).ok().
  template <typename OwnsKey>
  Table(const proto::TableConfig& config, OwnsKey&& owns_key) : config_(config) {
    if (config.kind() == proto::DENSE) {
      for (Key k = 0; k < config.dense_rows(); ++k)
        if (owns_key(k)) CreateRow(k);
    }
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const proto::TableConfig& config() const { return config_; }
  uint32_t width() const { return config_.width(); }
  size_t num_rows() const { return index_.size(); }
  // How many distinct keys of `keys` have no row yet (the rows a push or a
  // pull of them would create in a SPARSE table).
  size_t CountAbsent(std::span<const Key> keys) const;

  // Applies the optimizer for each (key, gradient row). values.size() must be
  // keys.size() * width. All keys are checked before anything is applied.
  absl::Status ApplyPush(std::span<const Key> keys, std::span<const float> values);
  // The checks ApplyPush makes before it changes anything: OK means that
  // ApplyPush(keys, values) will succeed (as long as the table does not
  // change in between; pushes only add rows, so other pushes do not matter).
  absl::Status CheckPush(std::span<const Key> keys, std::span<const float> values) const;

  // Copies the row of each key into out (keys.size() * width floats).
  // SPARSE rows are created on first touch.
  absl::Status ReadRows(std::span<const Key> keys, std::span<float> out);

  // The rows of `keys` (keys.size() * width floats) as one Buffer, without a
  // copy when that is possible: a single key whose row has its own chunk
  // (rows of kLendMinBytes and more) is answered with a view of the table's
  // memory. That view never changes: a later ApplyPush to the row writes to a
  // fresh copy of it (copy-on-write) while the view lives. Otherwise the rows
  // are copied into a buffer from `pool` (or a fresh one when pool is null).
  // The Buffer may outlive the table and be read from any thread.
  // SPARSE rows are created on first touch. Errors as ReadRows.
  absl::StatusOr<Buffer> ReadRowsShared(std::span<const Key> keys, BufferPool* pool);

  // Calls fn(key, row) once for every row the table holds, in no particular
  // order. The row span (width floats) is valid only during the call; fn must
  // not change the table. Creates nothing.
  void ForEachRow(absl::FunctionRef<void(Key, std::span<const float>)> fn) const;

  // Sets the row of each key to exactly its values (keys.size() * width
  // floats, row i at values[i * width]): no optimizer, no initializer. SPARSE
  // rows that do not exist are created; a DENSE key must be one this table
  // holds, or, with adopt_dense, any key below dense_rows (a server taking
  // over the copy of a shard it did not hold). All checks come before any
  // change, so an error changes nothing. A key listed twice gets its last
  // row. Rows lent to readers stay as they were for those readers
  // (copy-on-write, as ApplyPush).
  absl::Status RestoreRows(std::span<const Key> keys, std::span<const float> values, bool adopt_dense = false);

  // Statistics, for tests and metrics: rows lent without a copy, and chunks
  // copied because a write found them lent.
  uint64_t rows_lent() const { return rows_lent_; }
  uint64_t copies_on_write() const { return copies_on_write_; }

 private:
  // One block of rows. `lent` counts the Buffers that view it; while it is
  // non-zero the chunk is read-only. It drops (release) on whatever thread
  // lets go of the last view; the writer reads it (acquire) before writing.
  struct Chunk {
    explicit Chunk(size_t floats) : data(std::make_unique_for_overwrite<float[]>(floats)) {}
    std::unique_ptr<float[]> data;
    std::atomic<uint64_t> lent{0};
  };

  absl::Status CheckKeys(std::span<const Key> keys) const;
  size_t RowNumber(Key key);                   // existing row, or a new one (SPARSE)
  const float* ReadRow(size_t row) const;      // for reading only
  float* WritableRow(size_t row);              // copies a lent chunk first
  size_t CreateRow(Key key);                   // a new row with its initial values
  size_t AddRow(Key key);                      // a new row, values unset
  size_t chunk_floats() const { return rows_per_chunk_ * config_.width(); }

  const proto::TableConfig config_;
  // Rows live in fixed-size chunks, so growing never moves a row; a write to
  // a lent chunk replaces the chunk (see the class comment).
  size_t rows_per_chunk_ =
      size_t{config_.width()} * sizeof(float) >= kLendMinBytes
          ? 1
          : std::max<size_t>(1, (size_t{1} << 20) / std::max<uint32_t>(1, config_.width()));
  std::vector<std::shared_ptr<Chunk>> chunks_;
  absl::flat_hash_map<Key, uint32_t> index_;  // key -> row number
  uint64_t rows_lent_ = 0;
  uint64_t copies_on_write_ = 0;
};

}  // namespace tessera
