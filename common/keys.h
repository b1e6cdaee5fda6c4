#pragma once
// Keys, virtual shards and the shard map.
//
// A key of a table is hashed onto one of `num_vshards` virtual shards; the
// shard map names the server that holds each virtual shard. The hash mixes
// the table id in, so the same key of two tables lands on different shards,
// and consecutive or hot ids spread evenly.
#include <cstdint>
#include <functional>
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
// Invariants: vshard_server_rank has num_vshards entries, each < servers.size();
// every shard's replicas (primary, then backups) are distinct live ranks.
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
  uint32_t VShardOfKey(uint32_t table_id, Key key) const { return VirtualShardOf(table_id, key, num_vshards()); }
  // The backups of a shard, in promotion order (empty without replication).
  std::span<const uint32_t> BackupsOf(uint32_t vshard) const {
    if (backups_.empty()) return {};
    return std::span<const uint32_t>(backups_[vshard]);
  }
  // Whether `rank` holds a copy of the shard (as primary or backup).
  bool Holds(uint32_t rank, uint32_t vshard) const;
  bool IsDead(uint32_t rank) const { return dead_[rank]; }
  // The ranks of the servers that are not dead, ascending.
  std::vector<uint32_t> LiveServers() const;
  // Copies per shard the job asked for (>= 1).
  uint32_t replication() const { return replication_; }

 private:
  uint64_t epoch_ = 0;
  uint32_t replication_ = 1;
  std::vector<proto::NodeInfo> servers_;
  std::vector<uint32_t> owner_;
  std::vector<std::vector<uint32_t>> backups_;  // empty, or one list per shard
  std::vector<bool> dead_;                      // by rank
};

// The backups of every shard, one list per shard in promotion order (empty:
// the map has no backups). The map stores them flat (ShardMap.backup_counts
// and backup_ranks); a map whose counts do not add up gives the lists they
// describe, cut short (ShardMapView::Create rejects such a map).
using BackupLists = std::vector<std::vector<uint32_t>>;
BackupLists BackupListsOf(const proto::ShardMap& map);
// Replaces the map's backups by `lists` (empty, or one per shard).
void SetBackupLists(proto::ShardMap* map, const BackupLists& lists);

// The initial placement: virtual shard v goes to server v mod num_servers,
// and, with replication r > 1, its backups to the next r - 1 servers
// (v + 1, ..., v + r - 1 mod num_servers). r is capped at the server count.
proto::ShardMap RoundRobinShardMap(uint64_t epoch, uint32_t num_vshards,
                                   std::span<const proto::NodeInfo> servers, uint32_t replication = 1);

// The map after server `rank` is lost: the next epoch; the rank is dead and
// out of every replica list; each shard it was primary of is taken over by
// its first backup. Fails (FailedPrecondition, naming the shards and the
// ranks that held them) when some shard would be left with no copy.
// With `orphans`, a shard left with no copy does not fail: it is given to
// the least-loaded live server as primary (to be restored from a
// checkpoint) and listed in *orphans; only a map with no live server left
// fails.
// `in_sync(v, b)` says whether backup b of shard v has the shard's state (a
// backup recruited by WithBackupsFilled has it only once its state transfer
// is acknowledged); only such a backup is promoted, else the shard counts as
// lost (the default: every backup is in sync).
absl::StatusOr<proto::ShardMap> WithoutServer(
    const proto::ShardMap& map, uint32_t rank, std::vector<uint32_t>* orphans = nullptr,
    const std::function<bool(uint32_t, uint32_t)>& in_sync = nullptr);

// The map with every shard brought back to map.replication() copies where
// live servers allow: each missing backup is the live server that holds the
// fewest shards so far and none of this one (ties: the lowest rank). The
// epoch is not changed. Returns how many backups were added in *added.
proto::ShardMap WithBackupsFilled(const proto::ShardMap& map, uint32_t* added = nullptr);

// The map with a process back at a dead rank (a restarted server): the rank
// is live again, at `server`'s address and node id, and holds nothing until
// WithBackupsFilled recruits it. The epoch is not changed.
absl::StatusOr<proto::ShardMap> WithServerBack(const proto::ShardMap& map, const proto::NodeInfo& server);

// Eight hex digits that name the map's content (assignment, backups,
// servers, epoch): two nodes that log the same epoch with different digests
// were sent two different maps under one epoch. Deterministic across
// processes and runs.
std::string ShardMapDigest(const proto::ShardMap& map);

}  // namespace tessera
