#pragma once
// Table: the rows of one table held by one server, and the optimizer that
// updates them. Pure: no I/O, no threads, no clock.
//
// Invariants:
// - Every row has exactly config.width floats of weights, followed by its
//   optimizer's state (server/optimizer.h): StoredRowFloats(config) floats.
//   Pulls read the weights; state transfer and checkpoints carry the whole
//   stored row, so a copy of a table continues exactly where it was.
// - DENSE tables: the rows that exist are exactly the keys < dense_rows that
//   the owner asked for at creation; a push or pull of any other key is an
//   error (and changes nothing).
// - SPARSE tables: a row exists once a push (or, in a table without
//   admission and eviction, a pull) touched its key; it is created from the
//   seeded initializer, so its first value depends only on (init_seed,
//   table id, key), never on the order of touches.
// - Admission (SPARSE, admit_after > 1): a push of a key without a row
//   counts one sighting in the table's AdmissionSketch (each time the key
//   is listed, for SGD and ACCUMULATE; once per push for the stateful
//   optimizers, which sum a key's rows first); the row is created
//   (and that push applied to it) once the sketch counts admit_after
//   sightings; until then the push's row for it is dropped. Pulls of such a
//   key return the initializer's values and count nothing.
// - Eviction (SPARSE, evict_after_clocks or memory_budget_bytes): the
//   table's clock is the largest clock stamp of the pushes applied to it
//   (ApplyPush's `clock`: ServerCore passes the worker's stamp bounded by
//   the clocks the workers announced, "Push clocks" in server_core.h, so
//   one wrong stamp cannot age out every row at once). A
//   push stamps the rows it touches with that clock and makes them the most
//   recently used. A row whose stamp is more than evict_after_clocks behind
//   the table's clock is dropped when the clock advances; before a row is
//   created that would make num_rows() * RowBytes(config) exceed
//   memory_budget_bytes, the least recently used row is dropped. So the
//   budget is never exceeded, and a dropped key that comes back starts
//   again from its initializer (and, with admission, must be admitted
//   again: the sketch keeps counting it). Pulls change no recency.
// - Determinism: what the table holds after a sequence of ApplyPush calls
//   depends only on that sequence (keys, values, clocks): replicas that
//   apply the same pushes in the same order agree exactly, admission and
//   eviction included. (A replica built by state transfer or from a
//   checkpoint starts its sketch from zero and its recency order from the
//   order it was given the rows in: it may admit or evict differently from
//   the copy it was made from.)
// - Disk tier (a table made with a ColdRows store, server/cold_rows.h:
//   SPARSE, with memory_budget_bytes, without evict_after_clocks): the row
//   the budget would drop moves to the store instead (its whole stored row,
//   optimizer state included), and a push, pull or restore that touches a
//   key held there moves its row back into memory first, as the most
//   recently used, bit for bit as it left. So nothing is dropped and every
//   value is exactly what an unbounded table would hold; which rows sit in
//   memory is a cache decision that pulls also change (they bring rows
//   back), so replicas may differ in it, never in values. A key is in at
//   most one of memory and the store; num_rows() counts both. The budget
//   covers the rows in memory and the store's own memory (its buffers,
//   caches and per-row index, ColdRows::memory_bytes(rows_on_disk())):
//   rows in memory are at most (memory_budget_bytes - store memory) /
//   RowBytes(config), never fewer than one, and CheckDiskTier says when
//   not even one row fits beside an empty store.
// - A request that fails validation changes nothing.
// - Storage: rows live in chunks; a row of at least kLendMinBytes has a chunk
//   of its own. A chunk may be lent to readers (ReadRowsShared) while it is
//   also the table's current storage; a lent chunk is never written: the
//   first write after a lend copies it (copy-on-write) and the table moves
//   on to the copy, while the readers keep the old bytes until they let go.
//   The slot of a dropped row is reused by the next new row.
// - Memory given back: rows dropped for good (age eviction, EraseRows, or a
//   disk tier whose store's own memory grows and so leaves room for fewer
//   rows in memory) leave free slots. Once two chunks' worth of slots are
//   free (and, in a table without eviction, an eighth of all slots), the
//   end of the public call that freed them moves the rows above the live
//   count down into the free slots (same bytes, same recency, same keys),
//   returns the chunks above to the system, and shrinks the index and the
//   recency records to what the rows in memory (at most
//   RowsInMemoryLimit()) need. So the memory a table holds follows its
//   rows down, not only up. The cost is that of the rows freed (a table
//   without eviction also walks its index), plus a rehash of the index
//   when it shrinks to half or less. Row numbers
//   are internal: nothing outside the table sees them move, and lent
//   chunks stay with their readers.
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "server/admission_sketch.h"
#include "server/cold_rows.h"
#include "server/huge_pages.h"
#include "server/optimizer.h"
#include "server/row_index.h"

namespace tessera {

// Checks a table config from the network or a file.
absl::Status ValidateTableConfig(const proto::TableConfig& config);

// The initial value of element `index` of row `key`: a pure function.
float InitialValue(const proto::TableConfig& config, Key key, uint32_t index);

// What admission and eviction did, since the table was made.
struct TableCounters {
  uint64_t admitted = 0;           // rows created by admission (admit_after > 1)
  uint64_t admission_dropped = 0;  // pushed rows dropped: their key not admitted yet
  uint64_t evicted_by_age = 0;     // rows dropped by evict_after_clocks
  uint64_t evicted_by_budget = 0;  // rows dropped by memory_budget_bytes
  uint64_t moved_to_disk = 0;      // rows the budget moved to the disk tier
  uint64_t loaded_from_disk = 0;   // rows a push, pull or restore brought back
};

class Table {
 public:
  // Rows at least this large get a chunk of their own and are lent to
  // readers instead of copied (smaller rows: a copy costs less than the
  // bookkeeping, and a copy-on-write of a shared chunk would cost more).
  static constexpr size_t kLendMinBytes = 64 * 1024;

  // `owns_key` says which keys this server holds (DENSE rows are created for
  // those keys only). Requires ValidateTableConfig(config).ok(), and with a
  // store for a disk tier (`cold`, not null) CheckDiskTier(config,
  // cold->memory_bytes(0)).ok() and cold->row_floats() ==
  // StoredRowFloats(config); the store must be empty.
  template <typename OwnsKey>
  Table(const proto::TableConfig& config, OwnsKey&& owns_key, std::unique_ptr<ColdRows> cold = nullptr)
      : config_(config), cold_(std::move(cold)) {
    if (cold_ != nullptr) AttachDiskTier();
    if (config.kind() == proto::SPARSE && config.admit_after() > 1) {
      admission_ = std::make_unique<AdmissionSketch>(
          config.admission_sketch_width() > 0 ? config.admission_sketch_width() : uint64_t{1} << 20,
          config.init_seed() ^ (uint64_t{config.table_id()} << 32));
    }
    if (config.kind() == proto::DENSE) {
      for (Key k = 0; k < config.dense_rows(); ++k)
        if (owns_key(k)) CreateRow(k);
    }
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Bytes one row costs on a server, as the memory budget counts it: the
  // stored floats, the index entry (kIndexBytesPerRow) and, in a table with
  // eviction, the recency record (kRecencyBytesPerRow). Measured against
  // the process's real growth in bench/sparse_bench.cc (docs/embeddings.md).
  static constexpr uint64_t kIndexBytesPerRow = 32;
  static constexpr uint64_t kRecencyBytesPerRow = 24;
  static uint64_t RowBytes(const proto::TableConfig& config);
  // Whether `config` may have a disk tier whose store holds
  // `store_memory_bytes` of memory: a SPARSE table with a memory budget that
  // leaves room for at least one row beside the store, and no
  // evict_after_clocks (rows on disk carry no clock stamp). InvalidArgument
  // naming the table and what is missing otherwise.
  static absl::Status CheckDiskTier(const proto::TableConfig& config, uint64_t store_memory_bytes);

  const proto::TableConfig& config() const { return config_; }
  uint32_t width() const { return config_.width(); }
  // Floats stored per row: the weights, then the optimizer's state.
  uint32_t stored_row_floats() const { return stride_; }
  // Rows held: in memory and, with a disk tier, on disk.
  size_t num_rows() const { return index_.size() + rows_on_disk_; }
  size_t rows_in_memory() const { return index_.size(); }
  size_t rows_on_disk() const { return rows_on_disk_; }
  bool has_disk_tier() const { return cold_ != nullptr; }
  // The disk tier's counters (zeros without one).
  ColdRowStats disk_stats() const { return cold_ ? cold_->stats() : ColdRowStats{}; }
  // What the disk tier's store holds in memory now (its index, buffers),
  // as the budget counts it (0 without one).
  uint64_t store_memory_bytes() const { return cold_ ? cold_->memory_bytes(rows_on_disk_) : 0; }
  // The largest clock stamp of the pushes applied so far.
  uint64_t clock() const { return clock_; }
  const TableCounters& counters() const { return counters_; }
  // Whether a pull of a key without a row creates it (SPARSE tables without
  // admission or eviction); otherwise it reads the initializer's values.
  bool pull_creates_rows() const { return !admission_ && !evicts_; }
  // How many distinct keys of `keys` have no row yet (the rows a push or a
  // pull of them would create in a SPARSE table).
  size_t CountAbsent(std::span<const Key> keys) const;

  // Applies the optimizer for each (key, gradient row). values.size() must be
  // keys.size() * width. All keys are checked before anything is applied.
  // `clock` is the push's clock stamp (eviction by age; see the invariants).
  // SGD and ACCUMULATE apply every occurrence of a key listed twice; the
  // stateful optimizers sum the rows of a key listed twice and make one
  // update from the sum (one optimizer step per push).
  // With a piece of the rows (`columns` not whole), values holds
  // keys.size() * columns.count floats, the gradients of those columns of
  // each key's row, and only those columns change (exactly as a whole-row
  // push of the same gradients with zeros elsewhere would change them, for
  // every optimizer that UpdatesPiecesOfRows; ADAM tables refuse pieces).
  absl::Status ApplyPush(std::span<const Key> keys, std::span<const float> values, uint64_t clock = 0,
                         Columns columns = {});
  // The checks ApplyPush makes before it changes anything: OK means that
  // ApplyPush(keys, values, clock, columns) will succeed (as long as the
  // table does not change in between; pushes only add rows, so other pushes
  // do not matter).
  absl::Status CheckPush(std::span<const Key> keys, std::span<const float> values, Columns columns = {}) const;
  // Whether a push may carry `columns` of each row: whole rows, or a piece
  // inside the row (first + count <= width) of a table whose optimizer
  // UpdatesPiecesOfRows. The first check of CheckPush.
  absl::Status CheckColumns(Columns columns) const;

  // Copies the row of each key into out (keys.size() * width floats).
  // SPARSE rows are created on first touch when pull_creates_rows(); else a
  // key without a row reads its initializer's values and nothing changes.
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
  // order (least recently used first in a table with eviction; rows on disk
  // before those in memory). The row span
  // (stored_row_floats(): weights and optimizer state) is valid only during
  // the call; fn must not change the table. Creates nothing.
  void ForEachRow(absl::FunctionRef<void(Key, std::span<const float>)> fn) const;

  // Sets the stored row of each key (weights and optimizer state) to exactly
  // its values (keys.size() * stored_row_floats() floats, row i at values[i *
  // stored_row_floats()]): no optimizer, no initializer. With eviction, the
  // rows become the most recently used, in the order given, at the table's
  // clock, and the memory budget holds (older rows are dropped). SPARSE
  // rows that do not exist are created; a DENSE key must be one this table
  // holds, or, with adopt_dense, any key below dense_rows (a server taking
  // over the copy of a shard it did not hold). All checks come before any
  // change, so an error changes nothing. A key listed twice gets its last
  // row. Rows lent to readers stay as they were for those readers
  // (copy-on-write, as ApplyPush).
  absl::Status RestoreRows(std::span<const Key> keys, std::span<const float> values, bool adopt_dense = false);
  // SPARSE tables: drops every row whose key `which` selects (a state
  // transfer replacing this server's copy of some shards); returns how many.
  // DENSE tables keep their rows (a transfer sets every one of them).
  size_t EraseRows(absl::FunctionRef<bool(Key)> which);

  // Statistics, for tests and metrics: rows lent without a copy, and chunks
  // copied because a write found them lent.
  uint64_t rows_lent() const { return rows_lent_; }
  uint64_t copies_on_write() const { return copies_on_write_; }
  // What the table's storage holds, for tests and metrics: chunks of rows
  // (rows_per_chunk() rows each), row slots handed out (live or free), the
  // index's slots, and how often memory was given back (see the contract).
  size_t chunks() const { return chunks_.size(); }
  size_t rows_per_chunk() const { return rows_per_chunk_; }
  size_t row_slots() const { return slots_; }
  size_t index_capacity() const { return index_.capacity(); }
  uint64_t compactions() const { return compactions_; }

 private:
  // One block of rows. `lent` counts the Buffers that view it; while it is
  // non-zero the chunk is read-only. It drops (release) on whatever thread
  // lets go of the last view; the writer reads it (acquire) before writing.
  struct Chunk {
    struct Free {
      size_t bytes = 0;
      void operator()(float* p) const { FreeHugePageBacked(p, bytes); }
    };
    explicit Chunk(size_t floats)
        : data(static_cast<float*>(AllocateHugePageBacked(floats * sizeof(float))), Free{floats * sizeof(float)}) {}
    std::unique_ptr<float[], Free> data;  // huge-page backed (server/huge_pages.h)
    std::atomic<uint64_t> lent{0};
  };

  static constexpr uint32_t kNoRow = RowIndex::kNoRow;
  // Recency of one row (tables with eviction): a doubly linked list through
  // row numbers, most recently used at head_.
  struct Recency {
    Key key = 0;
    uint32_t prev = kNoRow;
    uint32_t next = kNoRow;
    uint64_t clock = 0;
  };

  absl::Status CheckKeys(std::span<const Key> keys) const;
  size_t RowNumber(Key key);                   // existing row, or a new one (SPARSE)
  // Existing (from memory or disk), new, or kNoRow (not admitted). With
  // on_disk false the caller knows the disk tier does not hold the key.
  uint32_t RowForPush(Key key, bool on_disk = true);
  const float* ReadRow(size_t row) const;      // for reading only
  float* WritableRow(size_t row);              // copies a lent chunk first
  size_t CreateRow(Key key);                   // a new row with its initial values
  size_t AddRow(Key key);                      // a new row, values unset (drops the LRU row at the budget)
  uint64_t RowsInMemoryLimit() const;          // the budget's rows (with a disk tier: beside the store)
  // Disk tier: the store's key of what the constructor checked.
  void AttachDiskTier();
  // Brings the row of `key` back from the disk tier: its row number, or
  // kNoRow when the store does not hold it (or there is none).
  uint32_t LoadFromDisk(Key key);
  // The same for many keys with one lookup of the store: calls
  // row_read(i, stored row) for each keys[i] it held (before the row moves
  // into memory; a key listed twice is found at its first listing only) and
  // returns whether each was found there (found[i]).
  void LoadManyFromDisk(std::span<const Key> keys, std::vector<uint8_t>& found,
                        absl::FunctionRef<void(size_t, const float*)> row_read);
  // Whether `key` has a row in memory or on disk.
  bool Holds(Key key) const;
  void ApplyRow(uint32_t row, const float* gradient, Columns columns);
  void AdvanceClock(uint64_t clock);           // and drops rows too old
  void Touch(uint32_t row);                    // most recently used, at clock_
  void Unlink(uint32_t row);
  void DropRow(uint32_t row);
  // The public calls that may drop rows end with this: gives memory back
  // when enough slots are free (the contract's "Memory given back").
  void MaybeGiveMemoryBack();
  void MoveRow(uint32_t from, uint32_t to);  // a live row into a free slot
  size_t chunk_floats() const { return rows_per_chunk_ * stride_; }
  const float* RowAddress(size_t row) const {
    return chunks_[row >> chunk_shift_]->data.get() + (row & (rows_per_chunk_ - 1)) * stride_;
  }

  const proto::TableConfig config_;
  const uint32_t stride_ = StoredRowFloats(config_);  // floats per stored row
  // Rows live in fixed-size chunks, so growing never moves a row; a write to
  // a lent chunk replaces the chunk (see the class comment).
  // A power of two (so a row's chunk and place are a shift and a mask away).
  const uint32_t chunk_shift_ = ChunkShift(stride_);
  const size_t rows_per_chunk_ = size_t{1} << chunk_shift_;
  static uint32_t ChunkShift(uint32_t stride) {
    if (size_t{stride} * sizeof(float) >= kLendMinBytes) return 0;
    uint32_t shift = 0;  // the largest power of two of rows within 4 MiB
    while ((size_t{2} << shift) * std::max<uint32_t>(1, stride) <= (size_t{1} << 20)) ++shift;
    return shift;
  }
  std::vector<std::shared_ptr<Chunk>> chunks_;
  // key -> row number, in huge pages: lookups into millions of rows would
  // otherwise miss the TLB on nearly every probe.
  RowIndex index_;
  size_t slots_ = 0;                          // row numbers handed out (live or free)
  std::vector<uint32_t> free_rows_;           // row numbers of dropped rows
  // Admission and eviction (SPARSE tables that ask for them).
  std::unique_ptr<AdmissionSketch> admission_;
  const bool evicts_ = config_.kind() == proto::SPARSE &&
                       (config_.evict_after_clocks() > 0 || config_.memory_budget_bytes() > 0);
  uint64_t max_rows_ = config_.memory_budget_bytes() > 0 ? config_.memory_budget_bytes() / RowBytes(config_)
                                                          : ~uint64_t{0};
  // The disk tier (null: none), the rows it holds, one row read back.
  std::unique_ptr<ColdRows> cold_;
  size_t rows_on_disk_ = 0;
  std::vector<float> disk_row_;
  // By row number (evicts_ only). Large ones are mapped, so the arrays left
  // behind as it doubles go back to the kernel (server/huge_pages.h).
  std::vector<Recency, HugePageAllocator<Recency>> recency_;
  uint32_t head_ = kNoRow;        // most recently used
  uint32_t tail_ = kNoRow;        // least recently used
  uint64_t clock_ = 0;
  TableCounters counters_;
  uint64_t rows_lent_ = 0;
  uint64_t copies_on_write_ = 0;
  uint64_t compactions_ = 0;
};

}  // namespace tessera
