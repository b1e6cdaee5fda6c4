#include "server/backup_plan.h"

#include <algorithm>
#include <map>
#include <set>

namespace tessera {

std::vector<BackupPlan> PlanBackups(const ShardMapView& old, const ShardMapView& now, uint32_t my_rank,
                                    std::span<const uint32_t> streamed) {
  std::vector<uint32_t> ranks(streamed.begin(), streamed.end());
  for (uint32_t v = 0; v < now.num_vshards(); ++v)
    if (now.ServerRankOf(v) == my_rank)
      for (uint32_t b : now.BackupsOf(v)) ranks.push_back(b);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<BackupPlan> plans;
  for (uint32_t rank : ranks) {
    BackupPlan plan{.rank = rank};
    const uint32_t node = now.server(rank).node_id();
    const bool same_process = rank < old.num_servers() && old.server(rank).node_id() == node && !old.IsDead(rank);
    for (uint32_t v = 0; v < now.num_vshards(); ++v) {
      if (now.ServerRankOf(v) != my_rank) continue;
      auto bs = now.BackupsOf(v);
      if (std::find(bs.begin(), bs.end(), rank) == bs.end()) continue;
      plan.held.push_back(v);
      if (!same_process || !old.Holds(rank, v) || old.ServerRankOf(v) != my_rank) plan.fresh.push_back(v);
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

std::vector<std::pair<uint32_t, std::vector<uint32_t>>> TransferTargets(const ShardMapView& map, uint32_t my_rank,
                                                                        std::span<const uint32_t> vshards) {
  std::map<uint32_t, std::vector<uint32_t>> by_backup;
  for (uint32_t v : vshards) {
    if (v >= map.num_vshards() || map.ServerRankOf(v) != my_rank) continue;
    for (uint32_t b : map.BackupsOf(v)) by_backup[b].push_back(v);
  }
  return {by_backup.begin(), by_backup.end()};
}

std::vector<uint32_t> BackupsOfLed(const ShardMapView& map, uint32_t my_rank) {
  std::set<uint32_t> ranks;
  for (uint32_t v = 0; v < map.num_vshards(); ++v) {
    if (map.ServerRankOf(v) != my_rank) continue;
    for (uint32_t b : map.BackupsOf(v))
      if (b != my_rank) ranks.insert(b);
  }
  return {ranks.begin(), ranks.end()};
}

}  // namespace tessera
