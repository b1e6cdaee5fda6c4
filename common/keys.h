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

#include "absl/status/status.h"
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
// every shard's replicas (primary, then backups) are distinct live ranks;
// server_weights is empty or one positive, finite weight per server.
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
    if (backup_start_.empty()) return {};
    return std::span<const uint32_t>(backup_ranks_.data() + backup_start_[vshard],
                                     backup_start_[vshard + 1] - backup_start_[vshard]);
  }
  // Whether `rank` holds a copy of the shard (as primary or backup).
  bool Holds(uint32_t rank, uint32_t vshard) const;
  bool IsDead(uint32_t rank) const { return dead_[rank]; }
  // The ranks of the servers that are not dead, ascending.
  std::vector<uint32_t> LiveServers() const;
  // Copies per shard the job asked for (>= 1).
  uint32_t replication() const { return replication_; }
  // The server a moving shard goes to (see "Moving a shard" below), or
  // kNotMoving.
  static constexpr uint32_t kNotMoving = UINT32_MAX;
  uint32_t MovingTo(uint32_t vshard) const {
    for (const auto& [v, to] : moving_)
      if (v == vshard) return to;
    return kNotMoving;
  }
  // The server whose copy a moving shard's move takes away: its primary, or
  // a backup (draining); kNotMoving for a shard that is not moving.
  uint32_t MovingFrom(uint32_t vshard) const {
    for (size_t i = 0; i < moving_.size(); ++i)
      if (moving_[i].first == vshard) return moving_from_[i];
    return kNotMoving;
  }
  // (vshard, destination) of every moving shard.
  const std::vector<std::pair<uint32_t, uint32_t>>& moving() const { return moving_; }

 private:
  uint64_t epoch_ = 0;
  uint32_t replication_ = 1;
  std::vector<proto::NodeInfo> servers_;
  std::vector<uint32_t> owner_;
  // Shard v's backups are backup_ranks_[backup_start_[v], backup_start_[v + 1]);
  // backup_start_ is empty (no backups) or has num_vshards + 1 entries.
  std::vector<uint32_t> backup_start_;
  std::vector<uint32_t> backup_ranks_;
  std::vector<bool> dead_;                      // by rank
  std::vector<std::pair<uint32_t, uint32_t>> moving_;  // (vshard, destination), few
  std::vector<uint32_t> moving_from_;                   // parallel to moving_
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

// OK when `weights` can weigh `servers` servers (ShardMap.server_weights):
// empty, or one positive, finite weight per server rank. Otherwise
// InvalidArgument naming the count or the first bad weight and its rank.
absl::Status ValidateServerWeights(std::span<const float> weights, size_t servers);

// The initial placement weighed by server capacity. With empty or all-equal
// weights: exactly RoundRobinShardMap (no weights stored). Otherwise the map
// stores the weights and
// - server i is primary of n_i shards, |n_i - num_vshards * w_i / sum(w)| < 1
//   (largest remainders), interleaved over the shards (smooth weighted round
//   robin over the n_i), so consecutive shards spread over the servers;
// - each shard's r - 1 backups (r capped at the server count) are distinct
//   servers other than its primary, chosen shard by shard: the server whose
//   copies (primaries and backups so far), with this one, are fewest per
//   unit of weight (ties: the lowest rank). So each server's copies stay in
//   proportion to its weight as far as one copy per server and shard allows.
// Deterministic. Fails (InvalidArgument) where ValidateServerWeights does.
absl::StatusOr<proto::ShardMap> WeightedShardMap(uint64_t epoch, uint32_t num_vshards,
                                                 std::span<const proto::NodeInfo> servers, uint32_t replication,
                                                 std::span<const float> weights);

// The map after server `rank` is lost: the next epoch; the rank is dead and
// out of every replica list; each shard it was primary of is taken over by
// its first backup. Fails (FailedPrecondition, naming the shards and the
// ranks that held them) when some shard would be left with no copy.
// With `orphans`, a shard left with no copy does not fail: it is given to
// the least-loaded live server as primary (to be restored from a
// checkpoint) and listed in *orphans; only a map with no live server left
// fails. Least-loaded: the fewest copies, with this one, per unit of weight
// (ShardMap.server_weights; without weights, the fewest copies); ties: the
// lowest rank.
// `in_sync(v, b)` says whether backup b of shard v has the shard's state (a
// backup recruited by WithBackupsFilled has it only once its state transfer
// is acknowledged); only such a backup is promoted, else the shard counts as
// lost (the default: every backup is in sync).
absl::StatusOr<proto::ShardMap> WithoutServer(
    const proto::ShardMap& map, uint32_t rank, std::vector<uint32_t>* orphans = nullptr,
    const std::function<bool(uint32_t, uint32_t)>& in_sync = nullptr);

// The map with every shard brought back to map.replication() copies where
// live servers allow: each missing backup is the live server that holds
// none of this shard and the fewest copies so far, with this one, per unit
// of weight (ShardMap.server_weights; without weights, simply the fewest
// copies); ties: the lowest rank. The epoch is not changed. Returns how many
// backups were added in *added.
proto::ShardMap WithBackupsFilled(const proto::ShardMap& map, uint32_t* added = nullptr);

// The map with a process back at a dead rank (a restarted server): the rank
// is live again, at `server`'s address and node id, and holds nothing until
// WithBackupsFilled recruits it. The epoch is not changed.
absl::StatusOr<proto::ShardMap> WithServerBack(const proto::ShardMap& map, const proto::NodeInfo& server);

// Moving a shard (live migration; coordinator/rebalancer.h). The map lists
// the moving shards, their destinations and the copy each takes away
// (ShardMap.moving_vshards, moving_to and moving_from), so every node, and a
// restarted coordinator, knows them. The destination is always a backup of
// the shard: one added for the move (the last in the list; its primary
// fills it by a state transfer), or one it had. The primary streams to it
// and tells the coordinator once the destination has everything it had sent
// it when the move began (Heartbeat moves_in_sync); then the move finishes.
// A move from the primary changes who answers: while it runs, the primary
// answers a pull of the shard only with what the destination has
// acknowledged, and at the finish the roles switch. A move from a backup (a
// server being drained) leaves the primary as it is. Each of these returns
// the next epoch's map, or an error that says why the step is not possible
// and changes nothing:
// - WithMoveStarted(v, to, from): `to` (live, not v's primary) becomes v's
//   destination, added as its last backup if it holds no copy. `from` is
//   kNotMoving (the primary) or a backup of v, and then `to` must hold no
//   copy. A shard already moving cannot start another move.
// - WithMoveFinished(v): from the primary: the destination becomes the
//   primary (out of the backups); the old primary stays as the last backup
//   if the shard would otherwise have fewer copies than the replication
//   asks for (a move to a backup: the roles swap), else it lets the shard
//   go. From a backup: the destination takes that backup's place in the
//   promotion order and the backup lets the shard go.
// - WithMoveCancelled(v): the shard is no longer moving; a destination
//   added for the move (one copy more than the replication asks for) is
//   dropped.
// WithoutServer ends the moves from or to the lost server, and those of
// shards whose primary it was.
uint32_t MovingTo(const proto::ShardMap& map, uint32_t vshard);    // or ShardMapView::kNotMoving
uint32_t MovingFrom(const proto::ShardMap& map, uint32_t vshard);  // or ShardMapView::kNotMoving
absl::StatusOr<proto::ShardMap> WithMoveStarted(const proto::ShardMap& map, uint32_t vshard, uint32_t to,
                                                uint32_t from = ShardMapView::kNotMoving);
absl::StatusOr<proto::ShardMap> WithMoveFinished(const proto::ShardMap& map, uint32_t vshard);
absl::StatusOr<proto::ShardMap> WithMoveCancelled(const proto::ShardMap& map, uint32_t vshard);

// Draining a server before its removal (ShardMap.draining_server_ranks).
// A draining server gets no new copy: WithBackupsFilled, WithoutServer's
// orphans (unless only draining servers are left) and the rebalancer pass
// it by; the coordinator moves its copies away one shard at a time and,
// once it holds nothing, removes it with WithoutServer (which also ends
// its draining).
// - IsDraining(map, rank): whether the rank is listed as draining.
// - WithServerDraining(map, rank): the next epoch's map with the rank
//   draining. Fails (FailedPrecondition) for a dead or unknown rank, or
//   when the servers left (live, not draining) are fewer than the copies
//   per shard the job asks for, or none. A rank already draining: the map
//   unchanged (same epoch).
bool IsDraining(const proto::ShardMap& map, uint32_t rank);
absl::StatusOr<proto::ShardMap> WithServerDraining(const proto::ShardMap& map, uint32_t rank);
// Shard copies (primary or backup) server `rank` holds in the map.
uint32_t CopiesHeldBy(const proto::ShardMap& map, uint32_t rank);

// The map with a new server (elastic membership): `server` is appended as
// rank servers_size() (its NodeInfo's rank must say so), holding nothing
// until shards move to it; with weights, it weighs their mean. The next
// epoch.
absl::StatusOr<proto::ShardMap> WithServerAdded(const proto::ShardMap& map, const proto::NodeInfo& server);

// Eight hex digits that name the map's content (assignment, backups,
// servers, epoch): two nodes that log the same epoch with different digests
// were sent two different maps under one epoch. Deterministic across
// processes and runs.
std::string ShardMapDigest(const proto::ShardMap& map);

}  // namespace tessera
