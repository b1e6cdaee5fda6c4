#include "coordinator/rebalancer.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/keys.h"

namespace tessera {

namespace {

struct Servers {
  std::vector<double> load;    // by rank: sum of the primary shards' costs
  std::vector<double> weight;  // by rank
  std::vector<bool> live;
  double total_load = 0, total_weight = 0;
  double per_weight(uint32_t r) const { return load[r] / weight[r]; }
  double mean() const { return total_weight > 0 ? total_load / total_weight : 0; }
};

Servers Measure(const proto::ShardMap& map, const std::vector<double>& cost) {
  const size_t n = static_cast<size_t>(map.servers_size());
  Servers s;
  s.load.assign(n, 0);
  s.weight.assign(n, 1);
  s.live.assign(n, true);
  if (map.server_weights_size() == static_cast<int>(n))
    for (size_t r = 0; r < n; ++r) s.weight[r] = map.server_weights(static_cast<int>(r));
  for (uint32_t d : map.dead_server_ranks())
    if (d < n) s.live[d] = false;
  for (uint32_t v = 0; v < map.num_vshards() && v < cost.size(); ++v) {
    const uint32_t r = map.vshard_server_rank(static_cast<int>(v));
    if (r < n) s.load[r] += cost[v];
  }
  for (size_t r = 0; r < n; ++r) {
    if (!s.live[r]) continue;
    s.total_load += s.load[r];
    s.total_weight += s.weight[r];
  }
  return s;
}

}  // namespace

std::vector<double> LoadPerWeight(const proto::ShardMap& map, const std::vector<double>& shard_cost) {
  const Servers s = Measure(map, shard_cost);
  std::vector<double> out(s.load.size(), 0);
  for (size_t r = 0; r < out.size(); ++r)
    if (s.live[r]) out[r] = s.per_weight(static_cast<uint32_t>(r));
  return out;
}

double Imbalance(const proto::ShardMap& map, const std::vector<double>& shard_cost) {
  const Servers s = Measure(map, shard_cost);
  if (s.mean() <= 0) return 0;
  double busiest = 0;
  for (uint32_t r = 0; r < s.load.size(); ++r)
    if (s.live[r]) busiest = std::max(busiest, s.per_weight(r));
  return busiest / s.mean();
}

MovePlan PlanMove(const proto::ShardMap& map, const std::vector<double>& shard_cost, double threshold) {
  MovePlan plan;
  const Servers s = Measure(map, shard_cost);
  const uint32_t n = static_cast<uint32_t>(s.load.size());
  if (s.mean() <= 0) {
    plan.why = "no load measured";
    return plan;
  }
  // Servers with a move under way (as source or destination) sit this one out.
  std::vector<bool> busy(n, false);
  auto moving = [&](uint32_t v) { return MovingTo(map, v) != ShardMapView::kNotMoving; };
  for (int i = 0; i < map.moving_vshards_size() && i < map.moving_to_size(); ++i) {
    const uint32_t v = map.moving_vshards(i);
    if (v < map.num_vshards()) busy[map.vshard_server_rank(static_cast<int>(v))] = true;
    if (const uint32_t from = MovingFrom(map, v); from < n) busy[from] = true;
    if (map.moving_to(i) < n) busy[map.moving_to(i)] = true;
  }
  uint32_t busiest = n, lightest = n;
  for (uint32_t i = 0; i < n; ++i) {
    if (!s.live[i]) continue;
    if (busiest == n || s.per_weight(i) > s.per_weight(busiest)) busiest = i;
    if (!IsDraining(map, i) && (lightest == n || s.per_weight(i) < s.per_weight(lightest))) lightest = i;
  }
  if (lightest == n) {
    plan.why = "every live server is being drained";
    return plan;
  }
  plan.imbalance = s.per_weight(busiest) / s.mean();
  plan.imbalance_after = plan.imbalance;
  if (plan.imbalance <= threshold) {
    plan.why = absl::StrFormat("server %u carries %.2fx the mean load per unit of weight, within the threshold %.2f",
                               busiest, plan.imbalance, threshold);
    return plan;
  }
  if (busy[busiest] || busy[lightest]) {
    plan.why = absl::StrFormat("server %u carries %.2fx the mean load, but a move to or from server %u or %u is "
                               "under way",
                               busiest, plan.imbalance, busiest, lightest);
    return plan;
  }
  const double now_max = s.per_weight(busiest);
  double best_max = now_max;
  uint32_t best = map.num_vshards();
  double hottest = 0;
  for (uint32_t v = 0; v < map.num_vshards() && v < shard_cost.size(); ++v) {
    if (map.vshard_server_rank(static_cast<int>(v)) != busiest || moving(v) || shard_cost[v] <= 0) continue;
    hottest = std::max(hottest, shard_cost[v]);
    const double from_after = (s.load[busiest] - shard_cost[v]) / s.weight[busiest];
    const double to_after = (s.load[lightest] + shard_cost[v]) / s.weight[lightest];
    const double worst = std::max(from_after, to_after);
    if (worst < best_max) {
      best_max = worst;
      best = v;
    }
  }
  if (best == map.num_vshards()) {
    plan.why = absl::StrFormat(
        "server %u carries %.2fx the mean load per unit of weight (threshold %.2f), but no shard of it would lower "
        "that by moving to server %u (its hottest shard alone is %.0f%% of its load)",
        busiest, plan.imbalance, threshold, lightest, s.load[busiest] > 0 ? 100 * hottest / s.load[busiest] : 0.0);
    return plan;
  }
  proto::ShardMap moved = map;
  moved.set_vshard_server_rank(static_cast<int>(best), lightest);
  plan.imbalance_after = Imbalance(moved, shard_cost);
  plan.move = true;
  plan.vshard = best;
  plan.from = busiest;
  plan.to = lightest;
  plan.why = absl::StrFormat(
      "server %u carries %.2fx the mean load per unit of weight (threshold %.2f): moving shard %u (%.0f%% of its "
      "load) to server %u, %.2fx after",
      busiest, plan.imbalance, threshold, best, 100 * shard_cost[best] / s.load[busiest], lightest,
      plan.imbalance_after);
  return plan;
}

DrainPlan PlanDrain(const proto::ShardMap& map, const std::vector<double>& shard_cost) {
  DrainPlan plan;
  const uint32_t n = static_cast<uint32_t>(map.servers_size());
  std::vector<uint32_t> draining(map.draining_server_ranks().begin(), map.draining_server_ranks().end());
  std::sort(draining.begin(), draining.end());
  draining.erase(std::unique(draining.begin(), draining.end()), draining.end());
  const BackupLists lists = BackupListsOf(map);
  auto holds = [&](uint32_t r, uint32_t v) {
    return map.vshard_server_rank(static_cast<int>(v)) == r ||
           (!lists.empty() && std::find(lists[v].begin(), lists[v].end(), r) != lists[v].end());
  };
  const Servers s = Measure(map, shard_cost);
  std::vector<uint32_t> copies(n, 0);
  for (uint32_t r = 0; r < n; ++r) copies[r] = CopiesHeldBy(map, r);
  auto cost = [&](uint32_t v) { return v < shard_cost.size() ? shard_cost[v] : 0.0; };
  for (uint32_t d : draining) {
    if (d >= n) continue;
    if (copies[d] == 0) {
      plan.drained.push_back(d);
      continue;
    }
    if (plan.move || !plan.why.empty()) continue;  // one move at a time; the next drains later
    // Its primaries first (the hottest first: they carry its traffic), then its backups.
    std::vector<uint32_t> order;
    for (uint32_t v = 0; v < map.num_vshards(); ++v)
      if (holds(d, v) && MovingTo(map, v) == ShardMapView::kNotMoving) order.push_back(v);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const bool pa = map.vshard_server_rank(static_cast<int>(a)) == d, pb = map.vshard_server_rank(static_cast<int>(b)) == d;
      if (pa != pb) return pa;
      return pa && cost(a) > cost(b);
    });
    if (order.empty()) {
      plan.why = absl::StrFormat("server %u holds %u shard cop%s, all moving now", d, copies[d], copies[d] == 1 ? "y" : "ies");
      continue;
    }
    const uint32_t v = order.front();
    const bool primary = map.vshard_server_rank(static_cast<int>(v)) == d;
    // Where it goes: a live server, not draining, that holds no copy of it;
    // a primary to the least load per unit of weight with it, a backup to
    // the fewest copies per unit of weight (ties: the lowest rank).
    uint32_t to = n;
    auto better = [&](uint32_t a, uint32_t b) {
      if (primary) {
        const double la = (s.load[a] + cost(v)) / s.weight[a], lb = (s.load[b] + cost(v)) / s.weight[b];
        if (la != lb) return la < lb;
      }
      return static_cast<double>(copies[a] + 1) * s.weight[b] < static_cast<double>(copies[b] + 1) * s.weight[a];
    };
    for (uint32_t r = 0; r < n; ++r) {
      if (!s.live[r] || IsDraining(map, r) || holds(r, v)) continue;
      if (to == n || better(r, to)) to = r;
    }
    if (to == n) {
      plan.why = absl::StrFormat(
          "server %u still holds %u shard cop%s, but every server left (live, not draining) already holds shard %u", d,
          copies[d], copies[d] == 1 ? "y" : "ies", v);
      continue;
    }
    plan.move = true;
    plan.vshard = v;
    plan.from = d;
    plan.to = to;
    plan.why = absl::StrFormat("draining server %u (%u shard cop%s left): its %s copy of shard %u goes to server %u",
                               d, copies[d], copies[d] == 1 ? "y" : "ies", primary ? "primary" : "backup", v, to);
  }
  return plan;
}

}  // namespace tessera
