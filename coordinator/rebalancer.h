#pragma once
// The rebalancer: which virtual shard, if any, to move so that no server
// carries much more than its share of the load. A pure function of the
// shard map and the smoothed shard loads (coordinator/load_tracker.h); the
// coordinator calls it now and then and carries the move out
// (CoordinatorCore::StartMove, WithMoveStarted in common/keys.h).
//
// Load: a shard's cost is its data bytes per second (in + out) plus
// request_cost_bytes for each request per second; a server's load is the
// sum over the shards it is primary of (by the map now, so a finished move
// counts at once), divided by its weight (ShardMap.server_weights, else 1).
// Backup copies are not counted: they apply forwards but serve no pulls.
//
// Promises of PlanMove:
// - Imbalance = the busiest live server's load per unit of weight over the
//   mean (total load / total live weight). At or below the threshold, or
//   with no load at all, no move.
// - Otherwise the move goes from the busiest server to the lightest (per
//   unit of weight; ties: the lowest rank), and takes the shard of the
//   busiest that leaves the larger of the two servers' new loads smallest
//   (ties: the lowest shard). A move must make that larger load smaller
//   than the busiest's load now, so moves never oscillate: a single shard
//   hotter than the gap stays (the plan says so in `why`).
// - Shards that are moving, and the shards of a server with a move under
//   way, are left alone; one move at a time is the caller's rule. A
//   draining server is never the destination.
// Deterministic.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "proto/tessera.pb.h"

namespace tessera {

struct RebalanceOptions {
  double threshold = 0;              // imbalance above which a shard moves; 0 = the rebalancer is off
  Nanos interval = 10 * kSeconds;    // at most one move started per interval
  double request_cost_bytes = 1024;  // a request's cost, in bytes of data
};

struct MovePlan {
  bool move = false;          // false: nothing to move (why says why)
  uint32_t vshard = 0, from = 0, to = 0;
  double imbalance = 0;       // before the move
  double imbalance_after = 0; // the same measure if the shard's load moves with it
  std::string why;            // one line for the log
};

// `shard_cost[v]`: shard v's cost per second (0 for shards with no load
// measured); size num_vshards.
MovePlan PlanMove(const proto::ShardMap& map, const std::vector<double>& shard_cost, double threshold);

// Draining servers (ShardMap.draining_server_ranks, common/keys.h): what
// to do next. Promises of PlanDrain:
// - `drained`: the draining ranks that hold no copy any more (to remove).
// - At most one move: of the lowest draining rank that still holds copies,
//   its primary copies first (the costliest first, ties: the lowest shard),
//   then its backups (the lowest shard first); shards already moving are
//   left alone. The destination is a live server, not draining, that holds
//   no copy of the shard: for a primary, the one with the least load per
//   unit of weight with the shard's cost added; for a backup (and ties),
//   the fewest copies per unit of weight with this one; ties: the lowest
//   rank. The destination holds no copy, so the count of copies never
//   drops: the move adds one and its finish takes the draining one away.
// - No possible move (every server left holds the shard): no move, and
//   `why` says so. Deterministic.
struct DrainPlan {
  std::vector<uint32_t> drained;  // draining ranks that hold nothing
  bool move = false;
  uint32_t vshard = 0, from = 0, to = 0;
  std::string why;  // the move, or why there is none (empty: nothing to do)
};
DrainPlan PlanDrain(const proto::ShardMap& map, const std::vector<double>& shard_cost);

// Each server rank's load per unit of weight under `map` (dead ranks: 0).
std::vector<double> LoadPerWeight(const proto::ShardMap& map, const std::vector<double>& shard_cost);
// Busiest live server's load per unit of weight over the mean (0 with no load).
double Imbalance(const proto::ShardMap& map, const std::vector<double>& shard_cost);

}  // namespace tessera
