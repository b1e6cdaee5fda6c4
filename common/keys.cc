#include "common/keys.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

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
  view.replication_ = std::max<uint32_t>(1, map.replication());
  view.dead_.assign(view.servers_.size(), false);
  for (uint32_t rank : map.dead_server_ranks()) {
    if (rank >= view.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map names dead server rank ", rank, " of ",
                                                     view.servers_.size()));
    }
    view.dead_[rank] = true;
  }
  if (map.vshard_backups_size() != 0 && map.vshard_backups_size() != static_cast<int>(map.num_vshards())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map has backup lists for ", map.vshard_backups_size(),
                                                   " of ", map.num_vshards(), " virtual shards"));
  }
  for (uint32_t v = 0; v < static_cast<uint32_t>(map.vshard_backups_size()); ++v) {
    std::vector<uint32_t> backups(map.vshard_backups(v).ranks().begin(), map.vshard_backups(v).ranks().end());
    std::vector<uint32_t> all = backups;
    all.push_back(view.owner_[v]);
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] >= view.servers_.size() || view.dead_[all[i]] ||
          std::count(all.begin(), all.end(), all[i]) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("shard map: virtual shard ", v,
                                                       " has a bad replica list (primary ", view.owner_[v],
                                                       ", backups ", absl::StrJoin(backups, ","), ")"));
      }
    }
    view.backups_.push_back(std::move(backups));
  }
  for (uint32_t v = 0; v < view.owner_.size(); ++v) {
    if (view.dead_[view.owner_[v]]) {
      return absl::InvalidArgumentError(absl::StrCat("shard map: virtual shard ", v, " has dead server ",
                                                     view.owner_[v], " as its primary"));
    }
  }
  return view;
}

bool ShardMapView::Holds(uint32_t rank, uint32_t vshard) const {
  if (owner_[vshard] == rank) return true;
  auto b = BackupsOf(vshard);
  return std::find(b.begin(), b.end(), rank) != b.end();
}

std::vector<uint32_t> ShardMapView::LiveServers() const {
  std::vector<uint32_t> live;
  for (uint32_t r = 0; r < servers_.size(); ++r)
    if (!dead_[r]) live.push_back(r);
  return live;
}

absl::StatusOr<proto::ShardMap> WithoutServer(const proto::ShardMap& map, uint32_t rank,
                                              std::vector<uint32_t>* reassign,
                                              const std::function<bool(uint32_t, uint32_t)>& in_sync) {
  if (rank >= static_cast<uint32_t>(map.servers_size())) {
    return absl::InvalidArgumentError(absl::StrCat("no server rank ", rank, " in the shard map"));
  }
  proto::ShardMap next = map;
  next.set_epoch(map.epoch() + 1);
  if (std::find(map.dead_server_ranks().begin(), map.dead_server_ranks().end(), rank) ==
      map.dead_server_ranks().end()) {
    next.add_dead_server_ranks(rank);
  }
  std::vector<std::string> orphans;
  for (uint32_t v = 0; v < map.num_vshards(); ++v) {
    proto::Replicas* backups = next.vshard_backups_size() > 0 ? next.mutable_vshard_backups(v) : nullptr;
    if (backups != nullptr) {
      auto* ranks = backups->mutable_ranks();
      ranks->erase(std::remove(ranks->begin(), ranks->end(), rank), ranks->end());
    }
    if (next.vshard_server_rank(v) != rank) continue;
    if (backups == nullptr) {
      orphans.push_back(absl::StrCat(v));
      continue;
    }
    auto* ranks = backups->mutable_ranks();
    auto heir = std::find_if(ranks->begin(), ranks->end(),
                             [&](uint32_t b) { return in_sync == nullptr || in_sync(v, b); });
    if (heir == ranks->end()) {
      orphans.push_back(absl::StrCat(v));
      continue;
    }
    next.set_vshard_server_rank(v, *heir);
    ranks->erase(heir);
  }
  if (!orphans.empty() && reassign != nullptr) {
    const uint32_t n = static_cast<uint32_t>(next.servers_size());
    std::vector<bool> dead(n, false);
    for (uint32_t d : next.dead_server_ranks()) dead[d] = true;
    std::vector<uint32_t> load(n, 0);
    for (uint32_t v = 0; v < next.num_vshards(); ++v) {
      if (next.vshard_server_rank(v) != rank) load[next.vshard_server_rank(v)]++;
      if (next.vshard_backups_size() > 0)
        for (uint32_t b : next.vshard_backups(v).ranks()) load[b]++;
    }
    for (const std::string& o : orphans) {
      const uint32_t v = static_cast<uint32_t>(std::stoul(o));
      uint32_t best = n;
      for (uint32_t r = 0; r < n; ++r)
        if (!dead[r] && (best == n || load[r] < load[best])) best = r;
      if (best == n) break;
      next.set_vshard_server_rank(v, best);
      if (next.vshard_backups_size() > 0) {  // (a backup that never got the state may be chosen)
        auto* ranks = next.mutable_vshard_backups(v)->mutable_ranks();
        if (std::find(ranks->begin(), ranks->end(), best) != ranks->end()) {
          ranks->erase(std::find(ranks->begin(), ranks->end(), best));
        } else {
          load[best]++;
        }
      } else {
        load[best]++;
      }
      reassign->push_back(v);
    }
    if (reassign->size() == orphans.size()) return next;
    reassign->clear();
  }
  if (!orphans.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("server ", rank, " held the last copy of virtual shard",
                                                      orphans.size() > 1 ? "s " : " ", absl::StrJoin(orphans, ", ")));
  }
  return next;
}

proto::ShardMap WithBackupsFilled(const proto::ShardMap& map, uint32_t* added) {
  proto::ShardMap next = map;
  if (added != nullptr) *added = 0;
  const uint32_t n = static_cast<uint32_t>(map.servers_size());
  const uint32_t r = std::max<uint32_t>(1, map.replication());
  if (r <= 1 || n == 0) return next;
  std::vector<bool> dead(n, false);
  for (uint32_t d : map.dead_server_ranks())
    if (d < n) dead[d] = true;
  if (next.vshard_backups_size() == 0) {
    for (uint32_t v = 0; v < map.num_vshards(); ++v) next.add_vshard_backups();
  }
  std::vector<uint32_t> load(n, 0);
  for (uint32_t v = 0; v < next.num_vshards(); ++v) {
    load[next.vshard_server_rank(v)]++;
    for (uint32_t b : next.vshard_backups(v).ranks()) load[b]++;
  }
  for (uint32_t v = 0; v < next.num_vshards(); ++v) {
    proto::Replicas* backups = next.mutable_vshard_backups(v);
    while (static_cast<uint32_t>(backups->ranks_size()) + 1 < r) {
      auto holds = [&](uint32_t rank) {
        return next.vshard_server_rank(v) == rank ||
               std::find(backups->ranks().begin(), backups->ranks().end(), rank) != backups->ranks().end();
      };
      uint32_t best = n;
      for (uint32_t rank = 0; rank < n; ++rank) {
        if (dead[rank] || holds(rank)) continue;
        if (best == n || load[rank] < load[best]) best = rank;
      }
      if (best == n) break;  // fewer live servers than copies
      backups->add_ranks(best);
      load[best]++;
      if (added != nullptr) ++*added;
    }
  }
  return next;
}

absl::StatusOr<proto::ShardMap> WithServerBack(const proto::ShardMap& map, const proto::NodeInfo& server) {
  const uint32_t rank = server.rank();
  if (rank >= static_cast<uint32_t>(map.servers_size()) ||
      std::find(map.dead_server_ranks().begin(), map.dead_server_ranks().end(), rank) ==
          map.dead_server_ranks().end()) {
    return absl::FailedPreconditionError(absl::StrCat("server rank ", rank, " is not dead in the shard map"));
  }
  proto::ShardMap next = map;
  *next.mutable_servers(static_cast<int>(rank)) = server;
  auto* ranks = next.mutable_dead_server_ranks();
  ranks->erase(std::remove(ranks->begin(), ranks->end(), rank), ranks->end());
  return next;
}

proto::ShardMap RoundRobinShardMap(uint64_t epoch, uint32_t num_vshards,
                                   std::span<const proto::NodeInfo> servers, uint32_t replication) {
  proto::ShardMap map;
  map.set_epoch(epoch);
  map.set_num_vshards(num_vshards);
  const uint32_t n = static_cast<uint32_t>(servers.size());
  const uint32_t r = std::clamp<uint32_t>(replication, 1, std::max<uint32_t>(1, n));
  map.set_replication(r);
  for (const auto& s : servers) *map.add_servers() = s;
  for (uint32_t v = 0; v < num_vshards; ++v) {
    map.add_vshard_server_rank(n == 0 ? 0 : v % n);
    if (r > 1) {
      proto::Replicas* b = map.add_vshard_backups();
      for (uint32_t i = 1; i < r; ++i) b->add_ranks((v + i) % n);
    }
  }
  return map;
}

std::string ShardMapDigest(const proto::ShardMap& map) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    map.SerializeToCodedStream(&coded);
  }
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return absl::StrFormat("%08x", static_cast<uint32_t>(Mix64(h)));
}

}  // namespace tessera
