#include "server/table.h"

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/sparse_batch.h"
#include "compress/row_compressor.h"

namespace tessera {
namespace {

constexpr uint32_t kMaxWidth = 1u << 26;  // 256 MiB per row
constexpr uint64_t kMaxDenseRows = 1ull << 32;
constexpr uint64_t kMaxSketchWidth = 1ull << 26;  // 512 MiB of counters
constexpr uint32_t kMaxAdmitAfter = 65535;          // AdmissionSketch counters saturate there

// Uniform in [0, 1) from 24 high bits of a hash.
float UnitFloat(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

}  // namespace

absl::Status ValidateTableConfig(const proto::TableConfig& c) {
  if (c.width() == 0 || c.width() > kMaxWidth)
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": width must be in [1, ", kMaxWidth,
                                                   "], got ", c.width()));
  if (!proto::TableKind_IsValid(c.kind()))
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": unknown kind ", c.kind()));
  if (c.kind() == proto::DENSE && (c.dense_rows() == 0 || c.dense_rows() > kMaxDenseRows))
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": dense table needs dense_rows in [1, ",
                                                   kMaxDenseRows, "], got ", c.dense_rows()));
  if (c.kind() == proto::SPARSE && c.dense_rows() != 0)
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": sparse table must not set dense_rows"));
  if (!proto::ConsistencyKind_IsValid(c.consistency()))
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": unknown consistency ", c.consistency()));
  if (!proto::OptimizerKind_IsValid(c.optimizer()))
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": unknown optimizer ", c.optimizer()));
  if (!proto::InitKind_IsValid(c.init()))
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": unknown initializer ", c.init()));
  if (!std::isfinite(c.learning_rate()) || c.learning_rate() < 0)
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(),
                                                   ": learning_rate must be finite and >= 0, got ", c.learning_rate()));
  if (!std::isfinite(c.init_scale()) || c.init_scale() < 0)
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(),
                                                   ": init_scale must be finite and >= 0, got ", c.init_scale()));
  if (auto s = ValidateOptimizer(c); !s.ok()) return s;
  if (c.kind() == proto::DENSE &&
      (c.admit_after() > 1 || c.evict_after_clocks() > 0 || c.memory_budget_bytes() > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(),
                                                   ": admission and eviction are for sparse tables only"));
  }
  if (StoredRowFloats(c) > kMaxWidth) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": width ", c.width(), " with optimizer ",
                                                   proto::OptimizerKind_Name(c.optimizer()), " stores ",
                                                   StoredRowFloats(c), " floats a row, more than ", kMaxWidth));
  }
  if (c.admit_after() > kMaxAdmitAfter) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": admit_after must be <= ", kMaxAdmitAfter,
                                                   " (the sketch's counters are 16-bit), got ", c.admit_after()));
  }
  if (c.admission_sketch_width() > kMaxSketchWidth) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": admission_sketch_width must be <= ",
                                                   kMaxSketchWidth, ", got ", c.admission_sketch_width()));
  }
  if (c.disk_tier()) {
    if (auto s = Table::CheckDiskTier(c, 0); !s.ok()) return s;
  }
  if (c.memory_budget_bytes() > 0 && c.memory_budget_bytes() < Table::RowBytes(c)) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": memory_budget_bytes ",
                                                   c.memory_budget_bytes(), " is less than one row (",
                                                   Table::RowBytes(c), " bytes)"));
  }
  if (!c.compression().empty()) {
    if (auto spec = compress::ParseCodecSpec(c.compression()); !spec.ok())
      return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": compression \"", c.compression(),
                                                     "\": ", spec.status().message()));
  }
  if (!c.pull_compression().empty()) {
    if (auto spec = compress::ParsePullSpec(c.pull_compression()); !spec.ok())
      return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(), ": pull_compression \"",
                                                     c.pull_compression(), "\": ", spec.status().message()));
  }
  return absl::OkStatus();
}

float InitialValue(const proto::TableConfig& c, Key key, uint32_t index) {
  if (c.init() == proto::ZEROS) return 0.0f;
  uint64_t base = Mix64(c.init_seed() ^ Mix64(key ^ (uint64_t{c.table_id()} << 40)));
  uint64_t h1 = Mix64(base + 2 * uint64_t{index} + 1);
  if (c.init() == proto::UNIFORM) return (2.0f * UnitFloat(h1) - 1.0f) * c.init_scale();
  // NORMAL: Box-Muller on two independent uniforms; u1 in (0, 1].
  uint64_t h2 = Mix64(base + 2 * uint64_t{index} + 2);
  float u1 = 1.0f - UnitFloat(h1);
  float u2 = UnitFloat(h2);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2) * c.init_scale();
}

size_t Table::CountAbsent(std::span<const Key> keys) const {
  absl::flat_hash_set<Key> absent;
  for (Key k : keys)
    if (!absent.contains(k) && !Holds(k)) absent.insert(k);
  return absent.size();
}

bool Table::Holds(Key key) const {
  return index_.Contains(key) || (rows_on_disk_ > 0 && cold_->Contains(key));
}

absl::Status Table::CheckDiskTier(const proto::TableConfig& c, uint64_t store_memory_bytes) {
  if (c.kind() != proto::SPARSE || c.memory_budget_bytes() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", c.table_id(), ": a disk tier is for sparse tables with a memory_budget_bytes (rows over the "
        "budget go to disk)"));
  }
  if (c.evict_after_clocks() > 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", c.table_id(),
                                                   ": a disk tier does not go with evict_after_clocks (rows on disk "
                                                   "carry no clock stamp); choose one"));
  }
  if (c.memory_budget_bytes() < store_memory_bytes + RowBytes(c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", c.table_id(), ": memory_budget_bytes ", c.memory_budget_bytes(),
        " leaves no room for rows beside the disk tier's own ", store_memory_bytes,
        " bytes of buffers and caches (at least ", store_memory_bytes + RowBytes(c), " needed)"));
  }
  return absl::OkStatus();
}

void Table::AttachDiskTier() {
  TESSERA_CHECK_MSG(CheckDiskTier(config_, cold_->memory_bytes(0)).ok(),
                    "Table: a disk tier for a table that cannot have one (CheckDiskTier)");
  TESSERA_CHECK(cold_->row_floats() == stride_);
  disk_row_.resize(stride_);
}

uint64_t Table::RowsInMemoryLimit() const {
  if (cold_ == nullptr) return max_rows_;
  const uint64_t budget = config_.memory_budget_bytes();
  const uint64_t store = std::min(budget, cold_->memory_bytes(rows_on_disk_));
  return std::max<uint64_t>(1, (budget - store) / RowBytes(config_));
}

uint32_t Table::LoadFromDisk(Key key) {
  if (rows_on_disk_ == 0) return kNoRow;
  uint8_t found = 0;
  if (cold_->Take(std::span<const Key>(&key, 1), disk_row_, std::span<uint8_t>(&found, 1)) == 0) return kNoRow;
  --rows_on_disk_;
  ++counters_.loaded_from_disk;
  const uint32_t row = static_cast<uint32_t>(AddRow(key));  // may move another row out (never this key's)
  std::memcpy(WritableRow(row), disk_row_.data(), size_t{stride_} * sizeof(float));
  return row;
}

void Table::LoadManyFromDisk(std::span<const Key> keys, std::vector<uint8_t>& found,
                             absl::FunctionRef<void(size_t, const float*)> row_read) {
  found.assign(keys.size(), 0);
  if (rows_on_disk_ == 0 || keys.empty()) return;
  std::vector<float> rows(keys.size() * stride_);
  if (cold_->Take(keys, rows, found) == 0) return;  // (a key listed twice is found once)
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) continue;
    const float* row = rows.data() + i * stride_;
    row_read(i, row);
    --rows_on_disk_;
    ++counters_.loaded_from_disk;
    const size_t r = AddRow(keys[i]);
    std::memcpy(WritableRow(r), row, size_t{stride_} * sizeof(float));
  }
}

absl::Status Table::CheckKeys(std::span<const Key> keys) const {
  if (config_.kind() != proto::DENSE) return absl::OkStatus();
  for (Key k : keys) {
    if (!index_.Contains(k)) {
      return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), " is dense with ",
                                                     config_.dense_rows(), " rows; key ", k,
                                                     k < config_.dense_rows() ? " is not held by this server"
                                                                              : " is out of range"));
    }
  }
  return absl::OkStatus();
}

uint64_t Table::RowBytes(const proto::TableConfig& c) {
  const bool evicts = c.kind() == proto::SPARSE && (c.evict_after_clocks() > 0 || c.memory_budget_bytes() > 0);
  return uint64_t{StoredRowFloats(c)} * sizeof(float) + kIndexBytesPerRow + (evicts ? kRecencyBytesPerRow : 0);
}

size_t Table::AddRow(Key key) {
  // (A loop: with a disk tier each row moved out makes the store's memory,
  // and so the limit, a little smaller.)
  while (evicts_ && index_.size() >= RowsInMemoryLimit() && tail_ != kNoRow) {
    if (cold_ != nullptr) {
      cold_->Add(recency_[tail_].key, std::span<const float>(ReadRow(tail_), stride_));
      ++rows_on_disk_;
      ++counters_.moved_to_disk;
    } else {
      ++counters_.evicted_by_budget;
    }
    DropRow(tail_);
  }
  uint32_t row;
  if (!free_rows_.empty()) {
    row = free_rows_.back();
    free_rows_.pop_back();
  } else {
    row = static_cast<uint32_t>(slots_++);
    if ((row >> chunk_shift_) >= chunks_.size()) chunks_.push_back(std::make_shared<Chunk>(chunk_floats()));
  }
  index_.Insert(key, row);
  if (evicts_) {
    if (recency_.size() <= row) recency_.resize(size_t{row} + 1);
    recency_[row] = Recency{.key = key, .clock = clock_};
    // Link at the head (most recently used).
    recency_[row].next = head_;
    if (head_ != kNoRow) recency_[head_].prev = row;
    head_ = row;
    if (tail_ == kNoRow) tail_ = row;
  }
  return row;
}

void Table::Unlink(uint32_t row) {
  Recency& r = recency_[row];
  if (r.prev != kNoRow) recency_[r.prev].next = r.next; else head_ = r.next;
  if (r.next != kNoRow) recency_[r.next].prev = r.prev; else tail_ = r.prev;
  r.prev = r.next = kNoRow;
}

void Table::Touch(uint32_t row) {
  if (!evicts_) return;
  recency_[row].clock = clock_;
  if (row == head_) return;
  Unlink(row);
  recency_[row].next = head_;
  if (head_ != kNoRow) recency_[head_].prev = row;
  head_ = row;
  if (tail_ == kNoRow) tail_ = row;
}

void Table::DropRow(uint32_t row) {
  index_.Erase(recency_[row].key);
  Unlink(row);
  free_rows_.push_back(row);
}

void Table::MoveRow(uint32_t from, uint32_t to) {
  if (rows_per_chunk_ == 1) {
    chunks_[to] = std::move(chunks_[from]);  // a row with its own chunk moves without a copy
  } else {
    float* dst = WritableRow(to);  // (first: a copy-on-write here must not strand `from`'s pointer)
    std::memcpy(dst, ReadRow(from), size_t{stride_} * sizeof(float));
  }
  if (!evicts_) return;
  const Recency r = recency_[from];
  recency_[to] = r;
  if (r.prev != kNoRow) recency_[r.prev].next = to; else head_ = to;
  if (r.next != kNoRow) recency_[r.next].prev = to; else tail_ = to;
}

void Table::MaybeGiveMemoryBack() {
  // Worth it once at least a chunk can go. The pass costs what was freed in
  // a table with eviction (its recency records name each row's key); in
  // one without, finding the rows to move walks the index, so it waits for
  // an eighth of the slots as well.
  const size_t free = free_rows_.size();
  if (free < 2 * rows_per_chunk_ || (!evicts_ && free < slots_ / 8)) return;
  // Live rows at n and above move down into the free slots below n, so
  // that the rows in memory fill [0, n) and what is above can go.
  const size_t n = index_.size();
  TESSERA_CHECK(slots_ == n + free);
  std::vector<uint32_t> holes;
  std::vector<uint8_t> free_above(slots_ - n, 0);
  for (uint32_t r : free_rows_) {
    if (r < n) holes.push_back(r); else free_above[r - n] = 1;
  }
  std::vector<std::pair<Key, uint32_t>> movers;
  movers.reserve(holes.size());
  if (evicts_) {
    for (size_t r = n; r < slots_; ++r)
      if (!free_above[r - n]) movers.emplace_back(recency_[r].key, static_cast<uint32_t>(r));
  } else {
    index_.ForEach([&](Key key, uint32_t row) {
      if (row >= n) movers.emplace_back(key, row);
    });
  }
  TESSERA_CHECK(movers.size() == holes.size());
  for (size_t i = 0; i < movers.size(); ++i) {
    MoveRow(movers[i].second, holes[i]);
    const bool indexed = index_.Reassign(movers[i].first, holes[i]);
    TESSERA_CHECK(indexed);
  }
  free_rows_ = {};
  slots_ = n;
  chunks_.resize((n + rows_per_chunk_ - 1) >> chunk_shift_);
  if (evicts_) {
    recency_.resize(n);
    if (recency_.capacity() > n + n / 2) recency_.shrink_to_fit();
  }
  // The index keeps room for the rows memory may still take (the budget's
  // limit), but no more than twice what it holds: a table that fills again
  // grows it again, as it did the first time.
  index_.ShrinkTo(std::max<uint64_t>(n, std::min<uint64_t>(RowsInMemoryLimit(), 2 * uint64_t{n})));
  ++compactions_;
}

void Table::AdvanceClock(uint64_t clock) {
  if (clock <= clock_) return;
  clock_ = clock;
  const uint64_t ttl = config_.evict_after_clocks();
  if (!evicts_ || ttl == 0) return;
  // The list is ordered by stamp (a touch stamps the current clock, which
  // never decreases), so the rows too old are a suffix at the tail.
  while (tail_ != kNoRow && clock_ - recency_[tail_].clock > ttl) {
    DropRow(tail_);
    ++counters_.evicted_by_age;
  }
}

size_t Table::CreateRow(Key key) {
  const size_t row = AddRow(key);
  float* p = WritableRow(row);
  for (uint32_t i = 0; i < config_.width(); ++i) p[i] = InitialValue(config_, key, i);
  InitOptimizerState(config_, std::span<float>(p + config_.width(), stride_ - config_.width()));
  return row;
}

size_t Table::RowNumber(Key key) {
  uint32_t row = index_.Find(key);
  if (row == kNoRow) row = LoadFromDisk(key);
  return row == kNoRow ? CreateRow(key) : row;
}

uint32_t Table::RowForPush(Key key, bool on_disk) {
  if (const uint32_t row = index_.Find(key); row != kNoRow) return row;
  if (on_disk) {
    if (const uint32_t row = LoadFromDisk(key); row != kNoRow) return row;
  }
  if (admission_) {
    if (admission_->Add(key) < config_.admit_after()) {
      ++counters_.admission_dropped;
      return kNoRow;
    }
    ++counters_.admitted;
  }
  return static_cast<uint32_t>(CreateRow(key));
}

const float* Table::ReadRow(size_t row) const {
  return RowAddress(row);
}

float* Table::WritableRow(size_t row) {
  std::shared_ptr<Chunk>& chunk = chunks_[row >> chunk_shift_];
  if (chunk->lent.load(std::memory_order_acquire) != 0) {
    // Readers still hold views of this chunk: leave it to them, write to a copy.
    auto copy = std::make_shared<Chunk>(chunk_floats());
    std::memcpy(copy->data.get(), chunk->data.get(), chunk_floats() * sizeof(float));
    chunk = std::move(copy);
    ++copies_on_write_;
  }
  return chunk->data.get() + (row & (rows_per_chunk_ - 1)) * stride_;
}

absl::Status Table::CheckColumns(Columns columns) const {
  if (columns.whole()) {
    if (columns.first == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("table ", config_.table_id(), ": a piece of rows from column ", columns.first, " has no columns"));
  }
  if (uint64_t{columns.first} + columns.count > config_.width()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": columns [", columns.first, ", ",
                                                   uint64_t{columns.first} + columns.count,
                                                   ") are outside rows of width ", config_.width()));
  }
  if (!UpdatesPiecesOfRows(config_.optimizer())) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": ",
                                                   proto::OptimizerKind_Name(config_.optimizer()),
                                                   " updates whole rows only, not a piece of each row"));
  }
  return absl::OkStatus();
}

absl::Status Table::CheckPush(std::span<const Key> keys, std::span<const float> values, Columns columns) const {
  if (auto s = CheckColumns(columns); !s.ok()) return s;
  const size_t w = columns.Width(config_.width());
  if (values.size() != keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": push of ", keys.size(),
                                                   " keys needs ", keys.size() * w, " values, got ", values.size()));
  }
  return CheckKeys(keys);
}

void Table::ApplyRow(uint32_t row, const float* __restrict gradient, Columns columns) {
  Touch(row);
  float* __restrict w = WritableRow(row);
  if (config_.optimizer() == proto::SGD) {  // the common case, inline
    const float lr = config_.learning_rate();
    w += columns.first;
    for (uint32_t j = 0, n = columns.Width(config_.width()); j < n; ++j) w[j] -= lr * gradient[j];
    return;
  }
  ApplyOptimizer(config_, w, gradient, columns);
}

absl::Status Table::ApplyPush(std::span<const Key> keys, std::span<const float> values, uint64_t clock,
                              Columns columns) {
  absl::Cleanup give_back = [this] { MaybeGiveMemoryBack(); };
  const size_t w = columns.Width(config_.width());
  if (auto s = CheckPush(keys, values, columns); !s.ok()) return s;
  AdvanceClock(clock);
  // Disk tier: the keys not in memory are looked up on disk together first
  // (one batch lookup, not one per key), and the rows held there come back.
  // A key found absent is then created without asking the disk again,
  // unless its row was made and moved out within this push (a key listed
  // twice: only its first listing skips the disk).
  absl::flat_hash_set<Key> not_on_disk;
  if (rows_on_disk_ > 0) {
    std::vector<Key> absent;
    for (Key k : keys)
      if (!index_.Contains(k)) absent.push_back(k);
    std::vector<uint8_t> found;
    LoadManyFromDisk(absent, found, [](size_t, const float*) {});
    // (A key listed twice is found at its first listing only.)
    absl::flat_hash_set<Key> was_on_disk;
    for (size_t i = 0; i < absent.size(); ++i)
      if (found[i]) was_on_disk.insert(absent[i]);
    for (size_t i = 0; i < absent.size(); ++i)
      if (!found[i] && !was_on_disk.contains(absent[i])) not_on_disk.insert(absent[i]);
  }
  auto row_for = [&](Key key) { return RowForPush(key, /*on_disk=*/not_on_disk.erase(key) == 0); };
  if (IsStateful(config_.optimizer()) && keys.size() > 1) {
    // One optimizer step per key and push: sum the rows of a key listed twice.
    absl::StatusOr<SparseBatch> batch = SparseBatch::Build(keys);
    if (!batch.ok()) return batch.status();
    if (batch->unique().size() < keys.size()) {
      std::vector<float> sums(batch->unique().size() * w);
      if (auto s = batch->ScatterAdd(values, static_cast<uint32_t>(w), sums); !s.ok()) return s;
      for (size_t u = 0; u < batch->unique().size(); ++u) {
        const uint32_t row = row_for(batch->unique()[u]);
        if (row != kNoRow) ApplyRow(row, sums.data() + u * w, columns);
      }
      return absl::OkStatus();
    }
  }
  if (evicts_) {
    // Creating a row may evict another and give its number to the new one:
    // each key is looked up when its row is applied.
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t row = row_for(keys[i]);
      if (row != kNoRow) ApplyRow(row, values.data() + i * w, columns);
    }
    return absl::OkStatus();
  }
  // The pipeline of ReadRows (below): key i + kSlotAhead is hashed and its
  // index slot asked for, key i is probed and its row asked for (to write),
  // the row of key i - kRowAhead is updated. A key absent at its probe is
  // looked up again when applied (an earlier copy of it in this push may
  // have made its row since). Row numbers stay valid within the push: no
  // row is dropped (the table does not evict) and rows never move.
  constexpr size_t kSlotAhead = 32, kRowAhead = 16, kRing = 64;
  static_assert(kRing > kSlotAhead && kRing > kRowAhead && (kRing & (kRing - 1)) == 0);
  const size_t n = keys.size();
  const size_t lines = std::min<size_t>((w * sizeof(float) + 63) / 64, 4);
  uint64_t hashes[kRing];
  uint32_t rows[kRing];
  auto ask_slot = [&](size_t i) {
    const uint64_t h = RowIndex::Hash(keys[i]);
    hashes[i % kRing] = h;
    index_.Prefetch(h);
  };
  auto apply = [&](size_t i) {
    uint32_t row = rows[i % kRing];
    if (row == kNoRow) row = RowForPush(keys[i]);
    if (row != kNoRow) ApplyRow(row, values.data() + i * w, columns);
  };
  for (size_t i = 0; i < std::min(n, kSlotAhead); ++i) ask_slot(i);
  for (size_t i = 0; i < n; ++i) {
    if (i + kSlotAhead < n) ask_slot(i + kSlotAhead);
    const uint32_t found = index_.Find(keys[i], hashes[i % kRing]);
    rows[i % kRing] = found;
    if (found != kNoRow) {
      const char* row = reinterpret_cast<const char*>(RowAddress(found) + columns.first);
      for (size_t l = 0; l < lines; ++l) __builtin_prefetch(row + 64 * l, 1);
    }
    if (i >= kRowAhead) apply(i - kRowAhead);
  }
  for (size_t i = n > kRowAhead ? n - kRowAhead : 0; i < n; ++i) apply(i);
  return absl::OkStatus();
}

absl::Status Table::ReadRows(std::span<const Key> keys, std::span<float> out) {
  absl::Cleanup give_back = [this] { MaybeGiveMemoryBack(); };
  const size_t w = config_.width();
  if (out.size() != keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": pull of ", keys.size(),
                                                   " keys needs room for ", keys.size() * w, " values"));
  }
  if (auto s = CheckKeys(keys); !s.ok()) return s;
  const bool create = pull_creates_rows();
  // A software pipeline of three stages: key i + kSlotAhead is hashed (once:
  // the hash serves both the prefetch and the probe) and its index slot asked
  // for; key i is probed (its slot asked for kSlotAhead keys earlier) and its
  // row asked for; the row of key i - kRowAhead (asked for kRowAhead keys
  // earlier) is copied. With ids drawn from a large table most lookups
  // miss the cache twice (index slot, then row); this way the misses of
  // neighbouring keys overlap instead of each waiting for the one before.
  // The distances were tuned with bench/sparse_lookup_bench (docs/
  // benchmarks.md): from (16, 8) to (32, 16) dim 16 gained about 15% and dim
  // 64 nothing measurable; (8, 4) lost a quarter; up to (48, 24) nothing
  // changed beyond the noise.
  constexpr size_t kSlotAhead = 32, kRowAhead = 16, kRing = 64;  // kRing > both, a power of two
  static_assert(kRing > kSlotAhead && kRing > kRowAhead && (kRing & (kRing - 1)) == 0);
  const size_t row_bytes = w * sizeof(float);
  const size_t lines = std::min<size_t>((row_bytes + 63) / 64, 4);
  const size_t n = keys.size();
  uint64_t hashes[kRing];
  const float* rows[kRing];
  auto ask_slot = [&](size_t i) {
    const uint64_t h = RowIndex::Hash(keys[i]);
    hashes[i % kRing] = h;
    index_.Prefetch(h);
  };
  std::vector<size_t> on_disk;  // keys[i] not in memory: perhaps on disk (read after the pipeline)
  auto copy = [&](size_t i) {
    float* dst = out.data() + i * w;
    if (const float* src = rows[i % kRing]; src != nullptr) {
      std::memcpy(dst, src, row_bytes);
    } else if (rows_on_disk_ > 0) {
      on_disk.push_back(i);
    } else if (create) {
      std::memcpy(dst, ReadRow(RowNumber(keys[i])), row_bytes);  // (an earlier copy of the key may have made it)
    } else {
      for (uint32_t j = 0; j < w; ++j) dst[j] = InitialValue(config_, keys[i], j);
    }
  };
  for (size_t i = 0; i < std::min(n, kSlotAhead); ++i) ask_slot(i);
  for (size_t i = 0; i < n; ++i) {
    if (i + kSlotAhead < n) ask_slot(i + kSlotAhead);
    const uint32_t found = index_.Find(keys[i], hashes[i % kRing]);
    const float* row = found == kNoRow ? nullptr : RowAddress(found);
    rows[i % kRing] = row;
    if (row != nullptr)
      for (size_t l = 0; l < lines; ++l) __builtin_prefetch(reinterpret_cast<const char*>(row) + 64 * l);
    if (i >= kRowAhead) copy(i - kRowAhead);
  }
  for (size_t i = n > kRowAhead ? n - kRowAhead : 0; i < n; ++i) copy(i);
  if (!on_disk.empty()) {
    // Disk tier (no pull creates rows there): one batch lookup; the rows
    // found come back into memory (which may move others out: hence after
    // the pipeline, whose row pointers that would invalidate).
    std::vector<Key> disk_keys(on_disk.size());
    for (size_t j = 0; j < on_disk.size(); ++j) disk_keys[j] = keys[on_disk[j]];
    std::vector<uint8_t> found;
    LoadManyFromDisk(disk_keys, found,
                     [&](size_t j, const float* row) { std::memcpy(out.data() + on_disk[j] * w, row, row_bytes); });
    for (size_t j = 0; j < on_disk.size(); ++j) {
      if (found[j]) continue;
      float* dst = out.data() + on_disk[j] * w;
      // A listing before may have brought it back (or back and out again,
      // when this pull brings more rows back than memory holds).
      uint32_t row = index_.Find(disk_keys[j]);
      if (row == kNoRow) row = LoadFromDisk(disk_keys[j]);
      if (row != kNoRow) {
        std::memcpy(dst, ReadRow(row), row_bytes);
      } else {
        for (uint32_t e = 0; e < w; ++e) dst[e] = InitialValue(config_, disk_keys[j], e);
      }
    }
  }
  return absl::OkStatus();
}

void Table::ForEachRow(absl::FunctionRef<void(Key, std::span<const float>)> fn) const {
  if (rows_on_disk_ > 0) cold_->ForEach(fn);  // colder than every row in memory
  if (evicts_) {
    for (uint32_t row = tail_; row != kNoRow; row = recency_[row].prev)
      fn(recency_[row].key, std::span<const float>(ReadRow(row), stride_));
    return;
  }
  index_.ForEach([&](Key key, uint32_t row) { fn(key, std::span<const float>(ReadRow(row), stride_)); });
}

size_t Table::EraseRows(absl::FunctionRef<bool(Key)> which) {
  if (config_.kind() != proto::SPARSE) return 0;
  std::vector<Key> keys;  // chosen first: erasing changes what the walks walk
  if (rows_on_disk_ > 0) {
    cold_->ForEachKey([&](Key k) {  // no row read from disk
      if (which(k)) keys.push_back(k);
    });
  }
  index_.ForEach([&](Key k, uint32_t) {
    if (which(k)) keys.push_back(k);
  });
  for (Key k : keys) {
    const uint32_t row = index_.Find(k);
    if (row == kNoRow) {  // on disk
      cold_->Erase(k);
      --rows_on_disk_;
      continue;
    }
    if (evicts_) {
      DropRow(row);
    } else {
      index_.Erase(k);
      free_rows_.push_back(row);
    }
  }
  MaybeGiveMemoryBack();
  return keys.size();
}

absl::Status Table::RestoreRows(std::span<const Key> keys, std::span<const float> values, bool adopt_dense) {
  const size_t w = stride_;
  if (values.size() != keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": restore of ", keys.size(),
                                                   " keys needs ", keys.size() * w, " values, got ", values.size()));
  }
  if (adopt_dense && config_.kind() == proto::DENSE) {
    for (Key k : keys) {
      if (k >= config_.dense_rows()) {
        return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), " is dense with ",
                                                       config_.dense_rows(), " rows; key ", k, " is out of range"));
      }
    }
  } else if (auto s = CheckKeys(keys); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    uint32_t row = index_.Find(keys[i]);
    if (row == kNoRow && rows_on_disk_ > 0 && cold_->Contains(keys[i])) {  // replaced: its old row goes
      cold_->Erase(keys[i]);
      --rows_on_disk_;
    }
    if (row == kNoRow) row = static_cast<uint32_t>(AddRow(keys[i]));
    Touch(row);
    std::memcpy(WritableRow(row), values.data() + i * w, w * sizeof(float));
  }
  MaybeGiveMemoryBack();
  return absl::OkStatus();
}

namespace {

// Keeps a lent chunk alive and marked lent while a Buffer views it.
struct ChunkLoan {
  explicit ChunkLoan(std::shared_ptr<void> c, std::atomic<uint64_t>* counter) : chunk(std::move(c)), lent(counter) {
    lent->fetch_add(1, std::memory_order_relaxed);
  }
  ~ChunkLoan() { lent->fetch_sub(1, std::memory_order_release); }
  ChunkLoan(const ChunkLoan&) = delete;
  ChunkLoan& operator=(const ChunkLoan&) = delete;
  std::shared_ptr<void> chunk;
  std::atomic<uint64_t>* lent;  // inside *chunk
};

}  // namespace

absl::StatusOr<Buffer> Table::ReadRowsShared(std::span<const Key> keys, BufferPool* pool) {
  if (auto s = CheckKeys(keys); !s.ok()) return s;
  const size_t row_bytes = size_t{config_.width()} * sizeof(float);
  if (keys.size() == 1 && rows_per_chunk_ == 1 && (pull_creates_rows() || index_.Contains(keys[0]))) {
    const size_t row = RowNumber(keys[0]);
    const std::shared_ptr<Chunk>& chunk = chunks_[row];
    auto loan = std::make_shared<ChunkLoan>(chunk, &chunk->lent);
    ++rows_lent_;
    float* data = chunk->data.get();
    MaybeGiveMemoryBack();  // (the loan keeps the chunk, wherever its row goes)
    return Buffer::Adopt(std::move(loan), data, row_bytes);
  }
  const size_t bytes = keys.size() * row_bytes;
  Buffer out = pool ? pool->Get(bytes) : Buffer::Allocate(bytes);
  if (auto s = ReadRows(keys, out.AsMutable<float>()); !s.ok()) return s;
  return out;
}

}  // namespace tessera
