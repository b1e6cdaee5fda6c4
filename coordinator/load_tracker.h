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
    proto::Heartbeat last;          // the counters of the last heartbeat
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
  template <typename IsPrimary>
  void OnHeartbeat(uint32_t rank, uint32_t node_id, const proto::Heartbeat& hb, Nanos now, IsPrimary&& is_primary) {
    ServerLoad& s = Server(rank);
    const bool same_process = s.have_baseline && s.node_id == node_id;
    s.node_id = node_id;
    const double a = same_process ? Weight(now - s.last_at) : 0;
    const double dt = same_process ? static_cast<double>(now - s.last_at) / kSeconds : 0;
    if (same_process && dt > 0) {
      auto rate = [&](double now_value, double before) { return (now_value - before) / dt; };
      if (hb.cpu_seconds() >= s.last.cpu_seconds()) Move(s.cpu_cores, rate(hb.cpu_seconds(), s.last.cpu_seconds()), a);
      if (hb.net_bytes_in() >= s.last.net_bytes_in())
        Move(s.net_in_bytes_per_s, rate(Double(hb.net_bytes_in()), Double(s.last.net_bytes_in())), a);
      if (hb.net_bytes_out() >= s.last.net_bytes_out())
        Move(s.net_out_bytes_per_s, rate(Double(hb.net_bytes_out()), Double(s.last.net_bytes_out())), a);
    }
    s.rows = hb.rows();
    s.memory_bytes = hb.memory_bytes();
    s.last = hb;
    s.last.clear_shard_loads();
    s.last_at = now;
    s.have_baseline = true;
    for (const proto::ShardLoad& l : hb.shard_loads()) {
      if (!is_primary(l.vshard())) continue;
      NoteShard(rank, same_process, l, now);
    }
    // The server's data rates: the sum over the shards it is primary of.
    s.requests_per_s = s.bytes_in_per_s = s.bytes_out_per_s = 0;
    for (const auto& [v, shard] : shards_) {
      if (shard.primary != rank || !is_primary(v)) continue;
      s.requests_per_s += shard.requests_per_s;
      s.bytes_in_per_s += shard.bytes_in_per_s;
      s.bytes_out_per_s += shard.bytes_out_per_s;
    }
  }

  const std::vector<ServerLoad>& servers() const { return servers_; }
  const absl::flat_hash_map<uint32_t, ShardLoad>& shards() const { return shards_; }

  // "server 0: 0.41 cores, 12.3 MB/s in, 8.1 MB/s out, 120 req/s, 1000 rows;
  // ..." (servers heard from, by rank), for logs.
  std::string Describe() const;

 private:
  ServerLoad& Server(uint32_t rank) {
    if (servers_.size() <= rank) servers_.resize(rank + 1);
    return servers_[rank];
  }
  void NoteShard(uint32_t rank, bool same_process, const proto::ShardLoad& l, Nanos now);
  double Weight(Nanos dt) const;
  static void Move(double& average, double sample, double weight) { average += weight * (sample - average); }
  static double Double(uint64_t x) { return static_cast<double>(x); }

  const Nanos tau_;
  std::vector<ServerLoad> servers_;                 // by rank
  absl::flat_hash_map<uint32_t, ShardLoad> shards_;  // by vshard
};

}  // namespace tessera
