#pragma once
// Shard snapshots: what one server holds as a plain value (its virtual
// shards, the rows of its tables, how many pushes each shard has applied,
// and an opaque blob from the server core), and the helpers that move rows
// between a Table and a TableSnapshot. Checkpoints (server/checkpoint.h)
// write and read these values as files; ServerCore takes and restores them
// (SnapshotPrimaryShards, RestoreShards).
//
// Pure, header-only: no I/O, threads or clocks. Thread safety: the values
// are plain data; the helpers read or change only the table they are given
// (the caller serializes access to it).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/keys.h"
#include "proto/tessera.pb.h"
#include "server/table.h"

namespace tessera {

// The rows of one table as held by one server.
// Invariants (checked by ValidateSnapshot in server/checkpoint.h, kept by
// SnapshotTable):
// - config passes ValidateTableConfig;
// - keys are strictly increasing; DENSE keys are < config.dense_rows;
// - values.size() == keys.size() * config.width; row i is
//   values[i * width, (i + 1) * width).
struct TableSnapshot {
  proto::TableConfig config;
  std::vector<Key> keys;
  std::vector<float> values;
};

// What one server holds, as of one moment.
// Invariants (checked by ValidateSnapshot in server/checkpoint.h): vshards
// strictly increasing; table ids distinct; every table valid as above.
struct ShardSnapshot {
  uint32_t server_rank = 0;
  uint64_t epoch = 0;                                   // shard map epoch of the snapshot
  std::vector<uint32_t> vshards;                        // the virtual shards held, ascending
  std::map<uint32_t, uint64_t> applied_pushes_by_vshard;  // vshard -> pushes applied to it
  std::vector<TableSnapshot> tables;
  std::string core_state;  // opaque to this module: the server core's de-duplication table and clocks
};

// The rows of `table` whose key satisfies include(key), sorted by key.
// Pure; does not change the table (no SPARSE row is created).
// (Rows are copied during ForEachRow: a row's span is valid only during its
// call, and a row on disk is read into a buffer the next row reuses.)
template <typename KeyFilter>
TableSnapshot SnapshotTable(const Table& table, KeyFilter&& include) {
  const size_t w = table.stored_row_floats();
  std::vector<std::pair<Key, size_t>> order;  // key, place in `visited`
  std::vector<float> visited;
  table.ForEachRow([&](Key key, std::span<const float> row) {
    if (!include(key)) return;
    order.emplace_back(key, order.size());
    visited.insert(visited.end(), row.begin(), row.end());
  });
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  TableSnapshot out;
  out.config = table.config();
  out.keys.reserve(order.size());
  out.values.resize(order.size() * w);
  for (size_t i = 0; i < order.size(); ++i) {
    out.keys.push_back(order[i].first);
    const auto from = visited.begin() + static_cast<ptrdiff_t>(order[i].second * w);
    std::copy(from, from + static_cast<ptrdiff_t>(w), out.values.begin() + static_cast<ptrdiff_t>(i * w));
  }
  return out;
}
inline TableSnapshot SnapshotTable(const Table& table) {
  return SnapshotTable(table, [](Key) { return true; });
}

// The predicate "key of `table_id` lies in one of these virtual shards"
// (vshards sorted ascending, as in ShardSnapshot), for SnapshotTable and
// RestoreTableSnapshot. The span must outlive the predicate.
inline auto KeysOfVShards(uint32_t table_id, uint32_t num_vshards, std::span<const uint32_t> vshards) {
  return [=](Key key) {
    return std::binary_search(vshards.begin(), vshards.end(), VirtualShardOf(table_id, key, num_vshards));
  };
}

// Sets the rows of `table` named in `snapshot` (those whose key satisfies
// include(key)) to the snapshot's values; other rows are left alone. The
// snapshot must describe the same table: table_id, width, kind,
// dense_rows and the optimizer state's size equal (else InvalidArgument; the
// learning rate and the rest may differ). Errors as Table::RestoreRows; an error changes
// nothing.
template <typename KeyFilter>
absl::Status RestoreTableSnapshot(const TableSnapshot& snapshot, Table& table, KeyFilter&& include) {
  const proto::TableConfig& a = snapshot.config;
  const proto::TableConfig& b = table.config();
  if (a.table_id() != b.table_id() || a.width() != b.width() || a.kind() != b.kind() ||
      a.dense_rows() != b.dense_rows() || StoredRowFloats(a) != StoredRowFloats(b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot of table ", a.table_id(), " (", proto::TableKind_Name(a.kind()), ", width ", a.width(),
        ", dense_rows ", a.dense_rows(), ", optimizer ", proto::OptimizerKind_Name(a.optimizer()),
        ") does not fit table ", b.table_id(), " (", proto::TableKind_Name(b.kind()), ", width ", b.width(),
        ", dense_rows ", b.dense_rows(), ", optimizer ", proto::OptimizerKind_Name(b.optimizer()), ")"));
  }
  const size_t w = StoredRowFloats(a);
  if (snapshot.values.size() != snapshot.keys.size() * w) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot of table ", a.table_id(), ": ", snapshot.keys.size(),
                                                   " keys need ", snapshot.keys.size() * w, " values, got ",
                                                   snapshot.values.size()));
  }
  std::vector<Key> keys;
  std::vector<float> values;
  for (size_t i = 0; i < snapshot.keys.size(); ++i) {
    if (!include(snapshot.keys[i])) continue;
    keys.push_back(snapshot.keys[i]);
    values.insert(values.end(), snapshot.values.begin() + static_cast<ptrdiff_t>(i * w),
                  snapshot.values.begin() + static_cast<ptrdiff_t>((i + 1) * w));
  }
  return table.RestoreRows(keys, values);
}
inline absl::Status RestoreTableSnapshot(const TableSnapshot& snapshot, Table& table) {
  return RestoreTableSnapshot(snapshot, table, [](Key) { return true; });
}

}  // namespace tessera
