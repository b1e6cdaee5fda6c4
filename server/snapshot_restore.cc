#include "server/snapshot_restore.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status CheckHasShards(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted) {
  for (uint32_t v : wanted) {
    if (!std::binary_search(snapshot.vshards.begin(), snapshot.vshards.end(), v)) {
      return absl::NotFoundError(absl::StrCat("the checkpoint of server ", snapshot.server_rank, " (epoch ",
                                              snapshot.epoch, ") has no shard ", v));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTablesFit(const ShardSnapshot& snapshot, const TableMap& tables) {
  for (const TableSnapshot& t : snapshot.tables) {
    if (auto s = ValidateTableConfig(t.config); !s.ok()) return s;
    auto it = tables.find(t.config.table_id());
    if (it != tables.end() && (it->second->width() != t.config.width() || it->second->config().kind() != t.config.kind() ||
                               it->second->config().dense_rows() != t.config.dense_rows() ||
                               it->second->stored_row_floats() != StoredRowFloats(t.config))) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint table ", t.config.table_id(),
                                                        " does not fit the table of that id here"));
    }
    if (t.values.size() != t.keys.size() * size_t{StoredRowFloats(t.config)}) {
      return absl::DataLossError(absl::StrCat("checkpoint table ", t.config.table_id(), " has ", t.values.size(),
                                              " values for ", t.keys.size(), " rows"));
    }
  }
  return absl::OkStatus();
}

void RowsOfShards(const TableSnapshot& t, std::span<const uint32_t> wanted, const ShardMapView& map,
                  std::vector<Key>* keys, std::vector<float>* values) {
  keys->clear();
  values->clear();
  const uint32_t id = t.config.table_id();
  const size_t w = StoredRowFloats(t.config);
  for (size_t i = 0; i < t.keys.size(); ++i) {
    if (!std::binary_search(wanted.begin(), wanted.end(), map.VShardOfKey(id, t.keys[i]))) continue;
    keys->push_back(t.keys[i]);
    values->insert(values->end(), t.values.begin() + static_cast<ptrdiff_t>(i * w),
                   t.values.begin() + static_cast<ptrdiff_t>((i + 1) * w));
  }
}

ShardSnapshot SnapshotShards(const TableMap& tables, const ShardMapView& map, uint32_t rank,
                             std::span<const std::pair<uint32_t, uint64_t>> applied) {
  ShardSnapshot snap;
  snap.server_rank = rank;
  snap.epoch = map.epoch();
  for (const auto& [v, n] : applied) {
    snap.vshards.push_back(v);
    snap.applied_pushes_by_vshard[v] = n;
  }
  std::vector<uint32_t> ids;
  for (const auto& [id, table] : tables) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    snap.tables.push_back(
        SnapshotTable(*tables.at(id), KeysOfVShards(id, map.num_vshards(), std::span<const uint32_t>(snap.vshards))));
  }
  return snap;
}

absl::StatusOr<uint64_t> RestoreShardRows(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted,
                                          const ShardMapView& map, const TableMap& tables,
                                          const std::function<absl::Status(const proto::TableConfig&)>& create) {
  uint64_t rows = 0;
  std::vector<Key> keys;
  std::vector<float> values;
  for (const TableSnapshot& t : snapshot.tables) {
    const uint32_t id = t.config.table_id();
    if (!tables.contains(id)) {
      if (auto s = create(t.config); !s.ok()) return s;
    }
    RowsOfShards(t, wanted, map, &keys, &values);
    if (auto s = tables.at(id)->RestoreRows(keys, values, /*adopt_dense=*/true); !s.ok()) return s;
    rows += keys.size();
  }
  return rows;
}

void RestoreAppliedCounts(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted,
                          absl::flat_hash_map<uint32_t, uint64_t>& applied) {
  for (uint32_t v : wanted) {
    auto it = snapshot.applied_pushes_by_vshard.find(v);
    applied[v] = it == snapshot.applied_pushes_by_vshard.end() ? 0 : it->second;
  }
}

}  // namespace tessera
