#include "server/shard_traffic.h"

namespace tessera {

void ShardTrafficCounts::Note(const ShardMapView& map, uint32_t my_rank, std::span<const uint32_t> shards,
                              size_t value_bytes, bool push) {
  if (traffic_.size() != map.num_vshards()) traffic_.resize(map.num_vshards());
  const uint64_t request = ++requests_;
  for (uint32_t v : shards) {
    if (v >= traffic_.size() || map.ServerRankOf(v) != my_rank) continue;
    ShardTraffic& t = traffic_[v];
    if (t.last_request != request) {
      t.last_request = request;
      t.requests++;
    }
    t.bytes_in += sizeof(Key) + (push ? value_bytes : 0);
    if (!push) t.bytes_out += value_bytes;
  }
}

void ShardTrafficCounts::AddLoads(const ShardMapView& map, uint32_t my_rank, proto::Heartbeat* hb) const {
  for (uint32_t v = 0; v < traffic_.size(); ++v) {
    const ShardTraffic& t = traffic_[v];
    if (t.requests == 0 || v >= map.num_vshards() || map.ServerRankOf(v) != my_rank) continue;
    proto::ShardLoad* l = hb->add_shard_loads();
    l->set_vshard(v);
    l->set_requests(t.requests);
    l->set_bytes_in(t.bytes_in);
    l->set_bytes_out(t.bytes_out);
  }
}

}  // namespace tessera
