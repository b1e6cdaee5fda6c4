#include "server/table.h"

#include "absl/container/flat_hash_set.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "compress/row_compressor.h"

namespace tessera {
namespace {

constexpr uint32_t kMaxWidth = 1u << 26;  // 256 MiB per row
constexpr uint64_t kMaxDenseRows = 1ull << 32;

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
    if (!index_.contains(k)) absent.insert(k);
  return absent.size();
}

absl::Status Table::CheckKeys(std::span<const Key> keys) const {
  if (config_.kind() != proto::DENSE) return absl::OkStatus();
  for (Key k : keys) {
    if (!index_.contains(k)) {
      return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), " is dense with ",
                                                     config_.dense_rows(), " rows; key ", k,
                                                     k < config_.dense_rows() ? " is not held by this server"
                                                                              : " is out of range"));
    }
  }
  return absl::OkStatus();
}

size_t Table::AddRow(Key key) {
  const size_t row = index_.size();
  if (row / rows_per_chunk_ >= chunks_.size()) chunks_.push_back(std::make_shared<Chunk>(chunk_floats()));
  index_.emplace(key, static_cast<uint32_t>(row));
  return row;
}

size_t Table::CreateRow(Key key) {
  const size_t row = AddRow(key);
  float* p = WritableRow(row);
  for (uint32_t i = 0; i < config_.width(); ++i) p[i] = InitialValue(config_, key, i);
  return row;
}

size_t Table::RowNumber(Key key) {
  auto it = index_.find(key);
  return it == index_.end() ? CreateRow(key) : it->second;
}

const float* Table::ReadRow(size_t row) const {
  return chunks_[row / rows_per_chunk_]->data.get() + (row % rows_per_chunk_) * config_.width();
}

float* Table::WritableRow(size_t row) {
  std::shared_ptr<Chunk>& chunk = chunks_[row / rows_per_chunk_];
  if (chunk->lent.load(std::memory_order_acquire) != 0) {
    // Readers still hold views of this chunk: leave it to them, write to a copy.
    auto copy = std::make_shared<Chunk>(chunk_floats());
    std::memcpy(copy->data.get(), chunk->data.get(), chunk_floats() * sizeof(float));
    chunk = std::move(copy);
    ++copies_on_write_;
  }
  return chunk->data.get() + (row % rows_per_chunk_) * config_.width();
}

absl::Status Table::CheckPush(std::span<const Key> keys, std::span<const float> values) const {
  const size_t w = config_.width();
  if (values.size() != keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": push of ", keys.size(),
                                                   " keys needs ", keys.size() * w, " values, got ", values.size()));
  }
  return CheckKeys(keys);
}

absl::Status Table::ApplyPush(std::span<const Key> keys, std::span<const float> values) {
  const size_t w = config_.width();
  if (auto s = CheckPush(keys, values); !s.ok()) return s;
  const float lr = config_.learning_rate();
  for (size_t i = 0; i < keys.size(); ++i) {
    float* __restrict row = WritableRow(RowNumber(keys[i]));
    const float* __restrict g = values.data() + i * w;
    switch (config_.optimizer()) {
      case proto::ACCUMULATE:
        for (size_t j = 0; j < w; ++j) row[j] += g[j];
        break;
      default:  // SGD
        for (size_t j = 0; j < w; ++j) row[j] -= lr * g[j];
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Table::ReadRows(std::span<const Key> keys, std::span<float> out) {
  const size_t w = config_.width();
  if (out.size() != keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("table ", config_.table_id(), ": pull of ", keys.size(),
                                                   " keys needs room for ", keys.size() * w, " values"));
  }
  if (auto s = CheckKeys(keys); !s.ok()) return s;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out.data() + i * w, ReadRow(RowNumber(keys[i])), w * sizeof(float));
  }
  return absl::OkStatus();
}

void Table::ForEachRow(absl::FunctionRef<void(Key, std::span<const float>)> fn) const {
  const size_t w = config_.width();
  for (const auto& [key, row] : index_) fn(key, std::span<const float>(ReadRow(row), w));
}

absl::Status Table::RestoreRows(std::span<const Key> keys, std::span<const float> values, bool adopt_dense) {
  const size_t w = config_.width();
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
    auto it = index_.find(keys[i]);
    const size_t row = it == index_.end() ? AddRow(keys[i]) : it->second;
    std::memcpy(WritableRow(row), values.data() + i * w, w * sizeof(float));
  }
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
  if (keys.size() == 1 && rows_per_chunk_ == 1) {
    const size_t row = RowNumber(keys[0]);
    const std::shared_ptr<Chunk>& chunk = chunks_[row];
    auto loan = std::make_shared<ChunkLoan>(chunk, &chunk->lent);
    ++rows_lent_;
    return Buffer::Adopt(std::move(loan), chunk->data.get(), row_bytes);
  }
  const size_t bytes = keys.size() * row_bytes;
  Buffer out = pool ? pool->Get(bytes) : Buffer::Allocate(bytes);
  if (auto s = ReadRows(keys, out.AsMutable<float>()); !s.ok()) return s;
  return out;
}

}  // namespace tessera
