#pragma once
// ShardTrafficCounts: the load of each virtual shard while this server was
// its primary, which heartbeats report and the coordinator's rebalancer
// weighs. A part of ServerCore (docs/design.md, "Server parts").
//
// Contract:
// - Note(map, my_rank, shards, value_bytes, push) counts one request whose
//   keys fall in `shards` (one entry per key). Only shards `my_rank` is
//   primary of in `map` count (a resend's keys of other shards do not). Per
//   counted shard: the request once (however many of its keys fell there),
//   sizeof(Key) in per key, and value_bytes per key in (a push) or out (a
//   pull). Shards at or past map.num_vshards() are ignored.
// - The counts are per shard since the part was made (never reset); when a
//   map with another shard count arrives the table is resized (counts of
//   shards that remain are kept).
// - AddLoads(map, my_rank, hb) adds one ShardLoad per shard with requests
//   that `my_rank` is primary of now, in shard order.
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <span>
#include <vector>

#include "common/keys.h"
#include "proto/tessera.pb.h"

namespace tessera {

// One shard's traffic while this server was its primary.
struct ShardTraffic {
  uint64_t requests = 0, bytes_in = 0, bytes_out = 0;
  uint64_t last_request = 0;  // (counts each request once per shard)
};

class ShardTrafficCounts {
 public:
  void Note(const ShardMapView& map, uint32_t my_rank, std::span<const uint32_t> shards, size_t value_bytes,
            bool push);
  void AddLoads(const ShardMapView& map, uint32_t my_rank, proto::Heartbeat* hb) const;
  // Indexed by vshard (empty before the first request).
  const std::vector<ShardTraffic>& per_shard() const { return traffic_; }

 private:
  std::vector<ShardTraffic> traffic_;
  uint64_t requests_ = 0;
};

}  // namespace tessera
