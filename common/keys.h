#pragma once
// Keys, virtual shards and the shard map.
//
// A key of a table is hashed onto one of `num_vshards` virtual shards; the
// shard map names the server that holds each virtual shard. The hash mixes
// the table id in, so the same key of two tables lands on different shards,
// and consecutive or hot ids spread evenly.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tessera.pb.h"

namespace tessera {

using Key = uint64_t;

// splitmix64 finalizer: a bijective, well-mixed 64-bit hash.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline uint32_t VirtualShardOf(uint32_t table_id, Key key, uint32_t num_vshards) {
  uint64_t h = Mix64(key ^ (uint64_t{table_id} * 0x9e3779b97f4a7c15ULL));
  // Multiply-shift range reduction: unbiased enough and avoids a division.
  return static_cast<uint32_t>((static_cast<unsigned __int128>(h) * num_vshards) >> 64);
}

// Read-only view of a proto::ShardMap with fast lookup.
// Invariants: vshard_server_rank has num_vshards entries, each < servers.size().
class ShardMapView {
 public:
  // Validates the map; an inconsistent map is an error, never a crash.
  static absl::StatusOr<ShardMapView> Create(const proto::ShardMap& map);

  uint64_t epoch() const { return epoch_; }
  uint32_t num_vshards() const { return static_cast<uint32_t>(owner_.size()); }
  size_t num_servers() const { return servers_.size(); }
  const proto::NodeInfo& server(size_t rank) const { return servers_[rank]; }
  uint32_t ServerRankOf(uint32_t vshard) const { return owner_[vshard]; }
  uint32_t ServerRankOfKey(uint32_t table_id, Key key) const {
    return owner_[VirtualShardOf(table_id, key, num_vshards())];
  }

 private:
  uint64_t epoch_ = 0;
  std::vector<proto::NodeInfo> servers_;
  std::vector<uint32_t> owner_;
};

// The initial placement: virtual shard v goes to server v mod num_servers.
proto::ShardMap RoundRobinShardMap(uint64_t epoch, uint32_t num_vshards,
                                   std::span<const proto::NodeInfo> servers);

}  // namespace tessera
