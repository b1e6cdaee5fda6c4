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
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"

namespace tessera {

// Checks a table config from the network or a file.
absl::Status ValidateTableConfig(const proto::TableConfig& config);

// The initial value of element `index` of row `key`: a pure function.
float InitialValue(const proto::TableConfig& config, Key key, uint32_t index);

class Table {
 public:
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

  // Applies the optimizer for each (key, gradient row). values.size() must be
  // keys.size() * width. All keys are checked before anything is applied.
  absl::Status ApplyPush(std::span<const Key> keys, std::span<const float> values);

  // Copies the row of each key into out (keys.size() * width floats).
  // SPARSE rows are created on first touch.
  absl::Status ReadRows(std::span<const Key> keys, std::span<float> out);

 private:
  absl::Status CheckKeys(std::span<const Key> keys) const;
  float* Row(Key key);  // existing row, or a new one (SPARSE)
  float* CreateRow(Key key);

  const proto::TableConfig config_;
  // Rows live in fixed-size chunks, so growing never moves a row.
  size_t rows_per_chunk_ = std::max<size_t>(1, (size_t{1} << 20) / std::max<uint32_t>(1, config_.width()));
  std::vector<std::unique_ptr<float[]>> chunks_;
  absl::flat_hash_map<Key, uint32_t> index_;  // key -> row number
};

}  // namespace tessera
