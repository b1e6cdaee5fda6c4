#include "common/keys.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<ShardMapView> ShardMapView::Create(const proto::ShardMap& map) {
  if (map.servers_size() == 0) return absl::InvalidArgumentError("shard map has no servers");
  if (map.num_vshards() == 0 || map.vshard_server_rank_size() != static_cast<int>(map.num_vshards())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map has ", map.vshard_server_rank_size(),
                                                   " owners for ", map.num_vshards(), " virtual shards"));
  }
  ShardMapView view;
  view.epoch_ = map.epoch();
  view.servers_.assign(map.servers().begin(), map.servers().end());
  view.owner_.reserve(map.num_vshards());
  for (uint32_t rank : map.vshard_server_rank()) {
    if (rank >= view.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map names server rank ", rank, " of ",
                                                     view.servers_.size()));
    }
    view.owner_.push_back(rank);
  }
  return view;
}

proto::ShardMap RoundRobinShardMap(uint64_t epoch, uint32_t num_vshards,
                                   std::span<const proto::NodeInfo> servers) {
  proto::ShardMap map;
  map.set_epoch(epoch);
  map.set_num_vshards(num_vshards);
  for (const auto& s : servers) *map.add_servers() = s;
  for (uint32_t v = 0; v < num_vshards; ++v) {
    map.add_vshard_server_rank(servers.empty() ? 0 : v % servers.size());
  }
  return map;
}

}  // namespace tessera
