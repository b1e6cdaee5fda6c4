#pragma once
// CoordinatorOptions: the settings of one job's coordinator, with their
// defaults defined here once. Who reads them: CoordinatorCore and its parts
// (coordinator_job.h and the parts above it), which never change them; who
// writes them: tessera-coordinator (coordinator_main.cc), whose flags take
// their defaults from `CoordinatorOptions{}` so that `--help` shows what a
// job started without the flag gets, and test harnesses and the simulator,
// which set what they need.
//
// The membership timings (lease, server lease, heartbeat interval) are
// shared with the servers and workers and are defined in
// node/timing_defaults.h; harnesses that want others (the in-process test
// clusters: the lease for servers too, nothing told) set them.
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/rebalancer.h"
#include "node/timing_defaults.h"

namespace tessera {

// What the job does when a worker is lost (its lease expired).
enum class WorkerLossPolicy {
  kStopJob,   // fail the job, naming the worker
  kContinue,  // drop it from the clock tables and go on with the others
  kWait,      // keep its place for a replacement process, up to rejoin_timeout
};

struct CoordinatorOptions {
  uint32_t servers = 1;                      // servers the job needs
  uint32_t workers = 1;                      // workers the job needs
  uint32_t vshards = 64;                     // virtual shards of the key space
  Nanos assemble_timeout = 30 * kSeconds;    // registration deadline, from start
  Nanos lease = kDefaultLease;               // silence after which a node is lost
  std::string address;                       // the coordinator's own address
  WorkerLossPolicy on_worker_loss = WorkerLossPolicy::kStopJob;
  Nanos rejoin_timeout = 60 * kSeconds;      // kWait: how long a lost worker's place is kept
  uint32_t replication = 2;                  // copies of each shard (primary + backups), capped at servers
  Nanos server_lease = kDefaultServerLease;  // with replication > 1: silence after which a server is lost (0 = lease)
  Nanos isolation_give_up = 60 * kSeconds;   // silence of every node taken for the coordinator's own, at most
  // When a shard loses every copy: false = fail the job naming it; true =
  // give it to a live server to restore from the last checkpoint, and say
  // how many applied pushes that checkpoint may miss.
  bool restore_lost_shards = false;
  Nanos heartbeat_interval = kDefaultHeartbeatInterval;  // told to registering nodes (RegisterReply); 0 = not told
  // Capacity of each server rank (empty: all equal): the first map gives
  // each server primaries and copies in proportion (WeightedShardMap in
  // common/keys.h), and re-made copies follow them. Weights that
  // ValidateServerWeights refuses fail the job once it has assembled, naming
  // the bad weight; tessera-coordinator refuses them at start.
  std::vector<float> server_weights;
  // Servers the job may grow to while it runs (0: `servers`, no growth): a
  // server that registers for the next rank (or any rank, -1) once the job
  // runs is added to the map (WithServerAdded), empty; the rebalancer then
  // moves shards to it.
  uint32_t max_servers = 0;
  // Workers the job may grow to while it runs (0: `workers`, no growth): a
  // worker that registers for the next rank joins (see Joining workers).
  uint32_t max_workers = 0;
  RebalanceOptions rebalance;               // threshold 0: no automatic moves
  Nanos load_tau = 10 * kSeconds;           // time constant of the smoothed loads (LoadTracker)
  Nanos move_timeout = 60 * kSeconds;       // a move not finished by then is cancelled
  bool test_switch_before_sync = false;     // TEST ONLY (negative control): a move switches at once, without the copy
};

}  // namespace tessera
