#pragma once
// LoadTracker: the coordinator's smoothed view of each server's and each
// virtual shard's load, from the counters servers send in their heartbeats
// (proto::Heartbeat: shard_loads, rows, memory_bytes, cpu_seconds,
// net_bytes_in/out). A pure core: time comes in as `now`.
//
// Promises:
// - Rates are exponentially weighted moving averages with time constant
//   `tau`: after a heartbeat dt after the previous one, each rate moves a
//   fraction 1 - exp(-dt / tau) of the way to the rate over that interval
//   (counter delta / dt). The first heartbeat of a server process only sets
//   the baseline; rates start at 0.
// - Counters belong to one server process: a heartbeat from another node
//   id for the same rank (a restarted server), or any counter that went
//   down, starts that server's (or shard's) baseline again, keeping the
//   smoothed rates.
// - A shard's rates come from its current primary only: a heartbeat that
//   reports a shard from another server is ignored for that shard; a new
//   primary starts a new baseline.
// - Rows and memory are the latest values reported (not smoothed).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "proto/tessera.pb.h"

namespace tessera {

class LoadTracker {
 public:
  explicit LoadTracker(Nanos tau = 10 * kSeconds) : tau_(tau) {}

  struct ServerLoad {
    uint32_t node_id = 0;
    double cpu_cores = 0;           // CPU seconds per second
    double net_in_bytes_per_s = 0;  // what its transport received
    double net_out_bytes_per_s = 0;
    double requests_per_s = 0;      // summed over its primary shards (a request counts once per shard it touches)
    double bytes_in_per_s = 0;      // data: keys and pushed values, over its primary shards
    double bytes_out_per_s = 0;     // data: pulled values
    uint64_t rows = 0;
    uint64_t memory_bytes = 0;
    Nanos last_at = 0;              // its last heartbeat (0: never heard)
    bool have_baseline = false;
    double cpu_seconds = 0;         // counters of the last heartbeat
    uint64_t net_bytes_in = 0, net_bytes_out = 0;
  };
  struct ShardLoad {
    uint32_t primary = 0;           // server rank the counters come from
    double requests_per_s = 0;
    double bytes_in_per_s = 0;
    double bytes_out_per_s = 0;
    Nanos last_at = 0;
    bool have_baseline = false;
    uint64_t requests = 0, bytes_in = 0, bytes_out = 0;  // counters of the last report
  };

  // A heartbeat from server `rank` (process `node_id`). `is_primary(v)`
  // says whether the map makes `rank` the primary of shard v.
  void OnHeartbeat(uint32_t rank, uint32_t node_id, const proto::Heartbeat& hb, Nanos now,
                   const std::function<bool(uint32_t)>& is_primary);

  const std::vector<ServerLoad>& servers() const { return servers_; }
  const absl::flat_hash_map<uint32_t, ShardLoad>& shards() const { return shards_; }

  // "server 0: 0.41 cores, 12.3 MB/s in, 8.1 MB/s out, 120 req/s, 1000 rows;
  // ..." (servers heard from, by rank), for logs.
  std::string Describe() const;

 private:
  void NoteShard(uint32_t rank, bool same_process, const proto::ShardLoad& l, Nanos now);
  double Weight(Nanos dt) const;

  const Nanos tau_;
  std::vector<ServerLoad> servers_;                 // by rank
  absl::flat_hash_map<uint32_t, ShardLoad> shards_;  // by vshard
};

}  // namespace tessera
