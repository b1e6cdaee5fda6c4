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

}  // namespace tessera
