#include "common/keys.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_bytes.h"

namespace tessera {
namespace {

// Each server rank's weight in `map` (ShardMap.server_weights); all 1 when
// the map has none (or not one per server: ShardMapView::Create rejects it).
std::vector<double> WeightsOf(const proto::ShardMap& map) {
  const size_t n = static_cast<size_t>(map.servers_size());
  if (map.server_weights_size() != static_cast<int>(n)) return std::vector<double>(n, 1.0);
  return std::vector<double>(map.server_weights().begin(), map.server_weights().end());
}

// Whether server a, given one more copy, would hold fewer copies per unit of
// weight than server b given one more: (load_a + 1) / w_a < (load_b + 1) / w_b,
// compared without division. With equal weights: load_a < load_b.
bool FewerPerWeight(uint64_t load_a, double w_a, uint64_t load_b, double w_b) {
  return static_cast<double>(load_a + 1) * w_b < static_cast<double>(load_b + 1) * w_a;
}

// One move of the map: its shard, destination and source (moving_from, or
// the shard's primary where the map lists no sources).
struct MoveEntry {
  uint32_t vshard, to, from;
};

std::vector<MoveEntry> MovesOf(const proto::ShardMap& map) {
  std::vector<MoveEntry> moves;
  for (int i = 0; i < map.moving_vshards_size() && i < map.moving_to_size(); ++i) {
    const uint32_t v = map.moving_vshards(i);
    uint32_t from = ShardMapView::kNotMoving;
    if (i < map.moving_from_size()) {
      from = map.moving_from(i);
    } else if (v < static_cast<uint32_t>(map.vshard_server_rank_size())) {
      from = map.vshard_server_rank(static_cast<int>(v));
    }
    moves.push_back({v, map.moving_to(i), from});
  }
  return moves;
}

void SetMoves(proto::ShardMap* map, const std::vector<MoveEntry>& moves) {
  map->clear_moving_vshards();
  map->clear_moving_to();
  map->clear_moving_from();
  for (const MoveEntry& m : moves) {
    map->add_moving_vshards(m.vshard);
    map->add_moving_to(m.to);
    map->add_moving_from(m.from);
  }
}

bool Listed(const google::protobuf::RepeatedField<uint32_t>& ranks, uint32_t rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

void Unlist(google::protobuf::RepeatedField<uint32_t>* ranks, uint32_t rank) {
  ranks->erase(std::remove(ranks->begin(), ranks->end(), rank), ranks->end());
}

}  // namespace

absl::Status ValidateServerWeights(std::span<const float> weights, size_t servers) {
  if (weights.empty()) return absl::OkStatus();
  if (weights.size() != servers) {
    return absl::InvalidArgumentError(absl::StrCat(weights.size(), " server weights for ", servers,
                                                   " servers: give one weight per server rank, or none"));
  }
  for (size_t rank = 0; rank < weights.size(); ++rank) {
    if (!std::isfinite(weights[rank]) || !(weights[rank] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("server weight ", weights[rank], " (server rank ", rank,
                                                     ") must be a positive, finite number"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardMapView> ShardMapView::Create(const proto::ShardMap& map) {
  if (map.servers_size() == 0) return absl::InvalidArgumentError("shard map has no servers");
  if (absl::Status weights = ValidateServerWeights(
          std::span<const float>(map.server_weights().data(), static_cast<size_t>(map.server_weights_size())),
          static_cast<size_t>(map.servers_size()));
      !weights.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map: ", weights.message()));
  }
  if (map.num_vshards() == 0 || map.vshard_server_rank_size() != static_cast<int>(map.num_vshards())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map has ", map.vshard_server_rank_size(),
                                                   " owners for ", map.num_vshards(), " virtual shards"));
  }
  ShardMapView view;
  view.epoch_ = map.epoch();
  view.servers_.assign(map.servers().begin(), map.servers().end());
  view.owner_.reserve(map.num_vshards());
  for (uint32_t rank : map.vshard_server_rank()) {
    if (rank >= view.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map names server rank ", rank, " of ",
                                                     view.servers_.size()));
    }
    view.owner_.push_back(rank);
  }
  view.replication_ = std::max<uint32_t>(1, map.replication());
  view.dead_.assign(view.servers_.size(), false);
  for (uint32_t rank : map.dead_server_ranks()) {
    if (rank >= view.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map names dead server rank ", rank, " of ",
                                                     view.servers_.size()));
    }
    view.dead_[rank] = true;
  }
  if (map.backup_counts_size() != 0 && map.backup_counts_size() != static_cast<int>(map.num_vshards())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map has backup counts for ", map.backup_counts_size(),
                                                   " of ", map.num_vshards(), " virtual shards"));
  }
  uint64_t listed = 0;
  for (uint32_t c : map.backup_counts()) listed += c;
  if (listed != static_cast<uint64_t>(map.backup_ranks_size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map's backup counts add up to ", listed, " but it lists ",
                                                   map.backup_ranks_size(), " backup ranks"));
  }
  // Flat, as in the map: every node builds a view of every map it gets.
  view.backup_ranks_.assign(map.backup_ranks().begin(), map.backup_ranks().end());
  if (map.backup_counts_size() > 0) {
    view.backup_start_.reserve(map.num_vshards() + 1);
    view.backup_start_.push_back(0);
    for (uint32_t c : map.backup_counts()) view.backup_start_.push_back(view.backup_start_.back() + c);
  }
  std::vector<uint32_t> all;
  for (uint32_t v = 0; v + 1 < static_cast<uint32_t>(view.backup_start_.size()); ++v) {
    const std::span<const uint32_t> backups = view.BackupsOf(v);
    all.assign(backups.begin(), backups.end());
    all.push_back(view.owner_[v]);
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] >= view.servers_.size() || view.dead_[all[i]] ||
          std::count(all.begin(), all.end(), all[i]) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("shard map: virtual shard ", v,
                                                       " has a bad replica list (primary ", view.owner_[v],
                                                       ", backups ", absl::StrJoin(backups, ","), ")"));
      }
    }
  }
  if (map.moving_vshards_size() != map.moving_to_size() ||
      (map.moving_from_size() != 0 && map.moving_from_size() != map.moving_vshards_size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard map lists ", map.moving_vshards_size(), " moving shards but ",
                                                   map.moving_to_size(), " destinations and ", map.moving_from_size(),
                                                   " sources"));
  }
  for (int i = 0; i < map.moving_vshards_size(); ++i) {
    const uint32_t v = map.moving_vshards(i), to = map.moving_to(i);
    const bool twice = std::count(map.moving_vshards().begin(), map.moving_vshards().end(), v) != 1;
    if (v >= view.owner_.size() || twice || to >= view.servers_.size() || view.owner_[v] == to ||
        !view.Holds(to, v)) {
      return absl::InvalidArgumentError(absl::StrCat("shard map: bad move of virtual shard ", v, " to server ", to,
                                                     " (a destination must hold the shard as a backup)"));
    }
    const uint32_t from = map.moving_from_size() > 0 ? map.moving_from(i) : view.owner_[v];
    if (from == to || from >= view.servers_.size() || !view.Holds(from, v)) {
      return absl::InvalidArgumentError(absl::StrCat("shard map: bad move of virtual shard ", v, " from server ", from,
                                                     " (a source must hold the shard)"));
    }
    view.moving_.push_back({v, to});
    view.moving_from_.push_back(from);
  }
  for (uint32_t rank : map.draining_server_ranks()) {
    if (rank >= view.servers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map names draining server rank ", rank, " of ",
                                                     view.servers_.size()));
    }
  }
  for (uint32_t v = 0; v < view.owner_.size(); ++v) {
    if (view.dead_[view.owner_[v]]) {
      return absl::InvalidArgumentError(absl::StrCat("shard map: virtual shard ", v, " has dead server ",
                                                     view.owner_[v], " as its primary"));
    }
  }
  return view;
}

bool ShardMapView::Holds(uint32_t rank, uint32_t vshard) const {
  if (owner_[vshard] == rank) return true;
  auto b = BackupsOf(vshard);
  return std::find(b.begin(), b.end(), rank) != b.end();
}

std::vector<uint32_t> ShardMapView::LiveServers() const {
  std::vector<uint32_t> live;
  for (uint32_t r = 0; r < servers_.size(); ++r)
    if (!dead_[r]) live.push_back(r);
  return live;
}

BackupLists BackupListsOf(const proto::ShardMap& map) {
  BackupLists lists(static_cast<size_t>(map.backup_counts_size()));
  int next = 0;
  for (size_t v = 0; v < lists.size(); ++v) {
    const int end = std::min<int>(map.backup_ranks_size(), next + static_cast<int>(map.backup_counts(static_cast<int>(v))));
    lists[v].assign(map.backup_ranks().begin() + next, map.backup_ranks().begin() + end);
    next = end;
  }
  return lists;
}

void SetBackupLists(proto::ShardMap* map, const BackupLists& lists) {
  map->clear_backup_counts();
  map->clear_backup_ranks();
  size_t total = 0;
  for (const auto& l : lists) total += l.size();
  map->mutable_backup_counts()->Reserve(static_cast<int>(lists.size()));
  map->mutable_backup_ranks()->Reserve(static_cast<int>(total));
  for (const auto& l : lists) {
    map->add_backup_counts(static_cast<uint32_t>(l.size()));
    for (uint32_t r : l) map->add_backup_ranks(r);
  }
}

absl::StatusOr<proto::ShardMap> WithoutServer(const proto::ShardMap& map, uint32_t rank,
                                              std::vector<uint32_t>* reassign,
                                              const std::function<bool(uint32_t, uint32_t)>& in_sync) {
  if (rank >= static_cast<uint32_t>(map.servers_size())) {
    return absl::InvalidArgumentError(absl::StrCat("no server rank ", rank, " in the shard map"));
  }
  proto::ShardMap next = map;
  next.set_epoch(map.epoch() + 1);
  if (std::find(map.dead_server_ranks().begin(), map.dead_server_ranks().end(), rank) ==
      map.dead_server_ranks().end()) {
    next.add_dead_server_ranks(rank);
  }
  // Moves from or to the lost server, or of shards it was primary of, end
  // (the destination stays a backup); it drains no more.
  std::vector<MoveEntry> moves = MovesOf(map);
  std::erase_if(moves, [&](const MoveEntry& m) {
    return m.to == rank || m.from == rank ||
           (m.vshard < map.num_vshards() && map.vshard_server_rank(static_cast<int>(m.vshard)) == rank);
  });
  SetMoves(&next, moves);
  Unlist(next.mutable_draining_server_ranks(), rank);
  std::vector<std::string> orphans;
  BackupLists lists = BackupListsOf(next);
  const bool replicated = !lists.empty();
  for (uint32_t v = 0; v < map.num_vshards(); ++v) {
    std::vector<uint32_t>* ranks = replicated ? &lists[v] : nullptr;
    if (ranks != nullptr) ranks->erase(std::remove(ranks->begin(), ranks->end(), rank), ranks->end());
    if (next.vshard_server_rank(v) != rank) continue;
    if (ranks == nullptr) {
      orphans.push_back(absl::StrCat(v));
      continue;
    }
    auto heir = std::find_if(ranks->begin(), ranks->end(),
                             [&](uint32_t b) { return in_sync == nullptr || in_sync(v, b); });
    if (heir == ranks->end()) {
      orphans.push_back(absl::StrCat(v));
      continue;
    }
    next.set_vshard_server_rank(v, *heir);
    ranks->erase(heir);
  }
  if (!orphans.empty() && reassign != nullptr) {
    const uint32_t n = static_cast<uint32_t>(next.servers_size());
    std::vector<bool> dead(n, false);
    for (uint32_t d : next.dead_server_ranks()) dead[d] = true;
    const std::vector<double> weight = WeightsOf(next);
    std::vector<uint32_t> load(n, 0);
    for (uint32_t v = 0; v < next.num_vshards(); ++v) {
      if (next.vshard_server_rank(v) != rank) load[next.vshard_server_rank(v)]++;
      if (replicated)
        for (uint32_t b : lists[v]) load[b]++;
    }
    for (const std::string& o : orphans) {
      const uint32_t v = static_cast<uint32_t>(std::stoul(o));
      uint32_t best = n;
      for (int pass = 0; pass < 2 && best == n; ++pass) {  // a draining server only if no other is left
        for (uint32_t r = 0; r < n; ++r) {
          if (dead[r] || (pass == 0 && Listed(next.draining_server_ranks(), r))) continue;
          if (best == n || FewerPerWeight(load[r], weight[r], load[best], weight[best])) best = r;
        }
      }
      if (best == n) break;
      next.set_vshard_server_rank(v, best);
      if (replicated) {  // (a backup that never got the state may be chosen)
        auto& ranks = lists[v];
        if (auto it = std::find(ranks.begin(), ranks.end(), best); it != ranks.end()) {
          ranks.erase(it);
        } else {
          load[best]++;
        }
      } else {
        load[best]++;
      }
      reassign->push_back(v);
    }
    if (reassign->size() == orphans.size()) {
      SetBackupLists(&next, lists);
      return next;
    }
    reassign->clear();
  }
  if (!orphans.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("server ", rank, " held the last copy of virtual shard",
                                                      orphans.size() > 1 ? "s " : " ", absl::StrJoin(orphans, ", ")));
  }
  SetBackupLists(&next, lists);
  return next;
}

proto::ShardMap WithBackupsFilled(const proto::ShardMap& map, uint32_t* added) {
  proto::ShardMap next = map;
  if (added != nullptr) *added = 0;
  const uint32_t n = static_cast<uint32_t>(map.servers_size());
  const uint32_t r = std::max<uint32_t>(1, map.replication());
  if (r <= 1 || n == 0) return next;
  std::vector<bool> dead(n, false);
  for (uint32_t d : map.dead_server_ranks())
    if (d < n) dead[d] = true;
  BackupLists lists = BackupListsOf(next);
  lists.resize(map.num_vshards());
  const std::vector<double> weight = WeightsOf(next);
  std::vector<uint32_t> load(n, 0);
  for (uint32_t v = 0; v < next.num_vshards(); ++v) {
    load[next.vshard_server_rank(v)]++;
    for (uint32_t b : lists[v]) load[b]++;
  }
  for (uint32_t v = 0; v < next.num_vshards(); ++v) {
    std::vector<uint32_t>& backups = lists[v];
    while (static_cast<uint32_t>(backups.size()) + 1 < r) {
      auto holds = [&](uint32_t rank) {
        return next.vshard_server_rank(v) == rank || std::find(backups.begin(), backups.end(), rank) != backups.end();
      };
      uint32_t best = n;
      for (uint32_t rank = 0; rank < n; ++rank) {
        if (dead[rank] || holds(rank) || Listed(map.draining_server_ranks(), rank)) continue;
        if (best == n || FewerPerWeight(load[rank], weight[rank], load[best], weight[best])) best = rank;
      }
      if (best == n) break;  // fewer live servers than copies
      backups.push_back(best);
      load[best]++;
      if (added != nullptr) ++*added;
    }
  }
  SetBackupLists(&next, lists);
  return next;
}

namespace {

// The backup lists of `map` with one list per shard, checked for a move of `vshard`.
absl::StatusOr<BackupLists> ListsForMove(const proto::ShardMap& map, uint32_t vshard) {
  if (vshard >= map.num_vshards() || map.vshard_server_rank_size() != static_cast<int>(map.num_vshards())) {
    return absl::InvalidArgumentError(
        absl::StrCat("no virtual shard ", vshard, " in a map of ", map.num_vshards(), " shards"));
  }
  BackupLists lists = BackupListsOf(map);
  lists.resize(map.num_vshards());
  return lists;
}

// The map with `lists` as its backups (none stored when every list is
// empty), without the move of `vshard` (if `end_move`), at the next epoch.
proto::ShardMap NextWithBackups(const proto::ShardMap& map, const BackupLists& lists, uint32_t vshard, bool end_move) {
  proto::ShardMap next = map;
  const bool any = std::any_of(lists.begin(), lists.end(), [](const auto& l) { return !l.empty(); });
  if (any) {
    SetBackupLists(&next, lists);
  } else {
    next.clear_backup_counts();
    next.clear_backup_ranks();
  }
  if (end_move) {
    std::vector<MoveEntry> moves = MovesOf(map);
    std::erase_if(moves, [&](const MoveEntry& m) { return m.vshard == vshard; });
    SetMoves(&next, moves);
  }
  next.set_epoch(map.epoch() + 1);
  return next;
}

}  // namespace

uint32_t MovingTo(const proto::ShardMap& map, uint32_t vshard) {
  for (const MoveEntry& m : MovesOf(map))
    if (m.vshard == vshard) return m.to;
  return ShardMapView::kNotMoving;
}

uint32_t MovingFrom(const proto::ShardMap& map, uint32_t vshard) {
  for (const MoveEntry& m : MovesOf(map))
    if (m.vshard == vshard) return m.from;
  return ShardMapView::kNotMoving;
}

absl::StatusOr<proto::ShardMap> WithMoveStarted(const proto::ShardMap& map, uint32_t vshard, uint32_t to,
                                                uint32_t from) {
  absl::StatusOr<BackupLists> lists = ListsForMove(map, vshard);
  if (!lists.ok()) return lists.status();
  if (to >= static_cast<uint32_t>(map.servers_size()) || Listed(map.dead_server_ranks(), to)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot move shard ", vshard, " to server ", to,
                                                      ": no such live server in the map"));
  }
  if (IsDraining(map, to)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot move shard ", vshard, " to server ", to,
                                                      ": it is being drained"));
  }
  const uint32_t primary = map.vshard_server_rank(static_cast<int>(vshard));
  if (primary == to) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", vshard, " is already on server ", to));
  }
  if (const uint32_t already = MovingTo(map, vshard); already != ShardMapView::kNotMoving) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", vshard, " is already moving to server ", already));
  }
  std::vector<uint32_t>& backups = (*lists)[vshard];
  const bool to_holds = std::find(backups.begin(), backups.end(), to) != backups.end();
  if (from == ShardMapView::kNotMoving) from = primary;
  if (from != primary) {
    if (std::find(backups.begin(), backups.end(), from) == backups.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot move shard ", vshard, " away from server ", from, ": it holds no copy"));
    }
    if (to_holds) {
      return absl::FailedPreconditionError(absl::StrCat("cannot move shard ", vshard, "'s copy from server ", from,
                                                        " to server ", to, ": it holds one already"));
    }
  }
  if (!to_holds) backups.push_back(to);
  proto::ShardMap next = NextWithBackups(map, *lists, vshard, false);
  std::vector<MoveEntry> moves = MovesOf(map);
  moves.push_back({vshard, to, from});
  SetMoves(&next, moves);
  return next;
}

namespace {

// The backup lists, destination and source of moving shard `vshard`.
struct MoveUnderWayResult {
  BackupLists lists;
  uint32_t to, from;
};
absl::StatusOr<MoveUnderWayResult> MoveUnderWay(const proto::ShardMap& map, uint32_t vshard) {
  absl::StatusOr<BackupLists> lists = ListsForMove(map, vshard);
  if (!lists.ok()) return lists.status();
  const uint32_t to = MovingTo(map, vshard);
  if (to == ShardMapView::kNotMoving) return absl::FailedPreconditionError(absl::StrCat("shard ", vshard, " is not moving"));
  return MoveUnderWayResult{*std::move(lists), to, MovingFrom(map, vshard)};
}

}  // namespace

absl::StatusOr<proto::ShardMap> WithMoveFinished(const proto::ShardMap& map, uint32_t vshard) {
  absl::StatusOr<MoveUnderWayResult> move = MoveUnderWay(map, vshard);
  if (!move.ok()) return move.status();
  auto& [lists, to, from] = *move;
  const uint32_t primary = map.vshard_server_rank(static_cast<int>(vshard));
  std::vector<uint32_t>& backups = lists[vshard];
  auto it = std::find(backups.begin(), backups.end(), to);
  if (it == backups.end()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", vshard, " moves to server ", to, ", which holds no copy"));
  }
  backups.erase(it);
  if (from != primary) {  // a backup's copy: the destination takes its place
    auto old = std::find(backups.begin(), backups.end(), from);
    if (old == backups.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", vshard, " moves away from server ", from, ", which holds no copy"));
    }
    *old = to;
    return NextWithBackups(map, lists, vshard, true);
  }
  if (backups.size() + 1 < std::max<uint32_t>(1, map.replication())) backups.push_back(primary);
  proto::ShardMap next = NextWithBackups(map, lists, vshard, true);
  next.set_vshard_server_rank(static_cast<int>(vshard), to);
  return next;
}

absl::StatusOr<proto::ShardMap> WithMoveCancelled(const proto::ShardMap& map, uint32_t vshard) {
  absl::StatusOr<MoveUnderWayResult> move = MoveUnderWay(map, vshard);
  if (!move.ok()) return move.status();
  auto& [lists, to, from] = *move;
  std::vector<uint32_t>& backups = lists[vshard];
  if (backups.size() + 1 > std::max<uint32_t>(1, map.replication()))
    backups.erase(std::remove(backups.begin(), backups.end(), to), backups.end());
  return NextWithBackups(map, lists, vshard, true);
}

absl::StatusOr<proto::ShardMap> WithServerAdded(const proto::ShardMap& map, const proto::NodeInfo& server) {
  if (server.rank() != static_cast<uint32_t>(map.servers_size())) {
    return absl::InvalidArgumentError(absl::StrCat("a new server takes rank ", map.servers_size(), ", not ",
                                                   server.rank()));
  }
  proto::ShardMap next = map;
  *next.add_servers() = server;
  if (map.server_weights_size() > 0) {
    double sum = 0;
    for (float w : map.server_weights()) sum += w;
    next.add_server_weights(static_cast<float>(sum / map.server_weights_size()));
  }
  next.set_epoch(map.epoch() + 1);
  return next;
}

bool IsDraining(const proto::ShardMap& map, uint32_t rank) { return Listed(map.draining_server_ranks(), rank); }

uint32_t CopiesHeldBy(const proto::ShardMap& map, uint32_t rank) {
  uint32_t copies = 0;
  for (uint32_t owner : map.vshard_server_rank()) copies += owner == rank;
  for (uint32_t b : map.backup_ranks()) copies += b == rank;
  return copies;
}

absl::StatusOr<proto::ShardMap> WithServerDraining(const proto::ShardMap& map, uint32_t rank) {
  const uint32_t n = static_cast<uint32_t>(map.servers_size());
  if (rank >= n || Listed(map.dead_server_ranks(), rank)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot drain server ", rank, ": no such live server (",
                                                      map.dead_server_ranks_size(), " of ", n, " ranks are dead)"));
  }
  if (IsDraining(map, rank)) return map;
  uint32_t staying = 0;
  for (uint32_t r = 0; r < n; ++r) staying += r != rank && !Listed(map.dead_server_ranks(), r) && !IsDraining(map, r);
  const uint32_t copies = std::max<uint32_t>(1, map.replication());
  if (staying < copies) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot drain server ", rank, ": ", staying, " server", staying == 1 ? "" : "s",
        " would be left (live, not draining) for ", copies, " cop", copies == 1 ? "y" : "ies",
        " of every shard; add a server first"));
  }
  proto::ShardMap next = map;
  next.add_draining_server_ranks(rank);
  next.set_epoch(map.epoch() + 1);
  return next;
}

absl::StatusOr<proto::ShardMap> WithServerBack(const proto::ShardMap& map, const proto::NodeInfo& server) {
  const uint32_t rank = server.rank();
  if (rank >= static_cast<uint32_t>(map.servers_size()) ||
      std::find(map.dead_server_ranks().begin(), map.dead_server_ranks().end(), rank) ==
          map.dead_server_ranks().end()) {
    return absl::FailedPreconditionError(absl::StrCat("server rank ", rank, " is not dead in the shard map"));
  }
  proto::ShardMap next = map;
  *next.mutable_servers(static_cast<int>(rank)) = server;
  auto* ranks = next.mutable_dead_server_ranks();
  ranks->erase(std::remove(ranks->begin(), ranks->end(), rank), ranks->end());
  return next;
}

proto::ShardMap RoundRobinShardMap(uint64_t epoch, uint32_t num_vshards,
                                   std::span<const proto::NodeInfo> servers, uint32_t replication) {
  proto::ShardMap map;
  map.set_epoch(epoch);
  map.set_num_vshards(num_vshards);
  const uint32_t n = static_cast<uint32_t>(servers.size());
  const uint32_t r = std::clamp<uint32_t>(replication, 1, std::max<uint32_t>(1, n));
  map.set_replication(r);
  for (const auto& s : servers) *map.add_servers() = s;
  for (uint32_t v = 0; v < num_vshards; ++v) {
    map.add_vshard_server_rank(n == 0 ? 0 : v % n);
    if (r > 1) {
      map.add_backup_counts(r - 1);
      for (uint32_t i = 1; i < r; ++i) map.add_backup_ranks((v + i) % n);
    }
  }
  return map;
}

absl::StatusOr<proto::ShardMap> WeightedShardMap(uint64_t epoch, uint32_t num_vshards,
                                                 std::span<const proto::NodeInfo> servers, uint32_t replication,
                                                 std::span<const float> weights) {
  if (absl::Status valid = ValidateServerWeights(weights, servers.size()); !valid.ok()) return valid;
  if (weights.empty() || std::all_of(weights.begin(), weights.end(), [&](float w) { return w == weights[0]; })) {
    return RoundRobinShardMap(epoch, num_vshards, servers, replication);
  }
  const uint32_t n = static_cast<uint32_t>(servers.size());  // >= 2: the weights differ
  const uint32_t r = std::clamp<uint32_t>(replication, 1, n);
  proto::ShardMap map;
  map.set_epoch(epoch);
  map.set_num_vshards(num_vshards);
  map.set_replication(r);
  for (const auto& s : servers) *map.add_servers() = s;
  for (float w : weights) map.add_server_weights(w);

  // How many primaries each server gets: the largest-remainder share of
  // num_vshards. In exact arithmetic the floors of the quotas add up to
  // num_vshards - k with 0 <= k < n, and the k largest remainders get one
  // more, so each count is its quota rounded down or up. (The loops also
  // settle a floor that rounding put one off either way.)
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<uint64_t> count(n);
  std::vector<double> remainder(n);
  uint64_t given = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const double quota = static_cast<double>(num_vshards) * weights[i] / total;
    count[i] = static_cast<uint64_t>(std::floor(quota));
    remainder[i] = quota - std::floor(quota);
    given += count[i];
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return remainder[a] > remainder[b]; });
  while (given < num_vshards) {
    for (uint32_t i : order) {
      if (given == num_vshards) break;
      count[i]++, given++;
    }
  }
  while (given > num_vshards) {
    for (auto it = order.rbegin(); it != order.rend() && given > num_vshards; ++it) {
      if (count[*it] > 0) count[*it]--, given--;
    }
  }

  // Interleave: smooth weighted round robin over the counts. Each step every
  // server gains its count in credit and the one with the most (ties: the
  // lowest rank) takes the shard and pays num_vshards. Credits add up to 0
  // before each step and to num_vshards after the gain, so the taker has a
  // positive credit and ends above -num_vshards; after num_vshards steps
  // server i's credit is num_vshards * (count[i] - taken[i]) > -num_vshards,
  // so taken[i] <= count[i], and as both add up to num_vshards, each server
  // takes exactly its count.
  std::vector<int64_t> credit(n, 0);
  std::vector<uint64_t> copies(n, 0);
  for (uint32_t v = 0; v < num_vshards; ++v) {
    uint32_t best = 0;
    for (uint32_t i = 0; i < n; ++i) {
      credit[i] += static_cast<int64_t>(count[i]);
      if (credit[i] > credit[best]) best = i;
    }
    credit[best] -= static_cast<int64_t>(num_vshards);
    map.add_vshard_server_rank(best);
    copies[best]++;
  }

  if (r > 1) {
    BackupLists lists(num_vshards);
    for (uint32_t v = 0; v < num_vshards; ++v) {
      std::vector<uint32_t>& backups = lists[v];
      const uint32_t primary = map.vshard_server_rank(static_cast<int>(v));
      while (backups.size() + 1 < r) {
        uint32_t best = n;
        for (uint32_t i = 0; i < n; ++i) {
          if (i == primary || std::find(backups.begin(), backups.end(), i) != backups.end()) continue;
          if (best == n || FewerPerWeight(copies[i], weights[i], copies[best], weights[best])) best = i;
        }
        backups.push_back(best);  // r <= n: some server is always left
        copies[best]++;
      }
    }
    SetBackupLists(&map, lists);
  }
  return map;
}

std::string ShardMapDigest(const proto::ShardMap& map) {
  const std::string bytes = DeterministicBytes(map);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return absl::StrFormat("%08x", static_cast<uint32_t>(Mix64(h)));
}

}  // namespace tessera
