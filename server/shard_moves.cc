#include "server/shard_moves.h"

#include <algorithm>

namespace tessera {

void ShardMoves::Note(const ShardMapView& map, uint32_t my_rank, const BackupStreams& streams) {
  absl::erase_if(moving_out_, [&](const auto& e) {
    return map.ServerRankOf(e.first) != my_rank || map.MovingTo(e.first) != e.second.to;
  });
  for (const auto& [v, to] : map.moving()) {
    if (map.ServerRankOf(v) != my_rank || moving_out_.contains(v)) continue;
    const auto sent = streams.SentThrough(to);
    const bool hold_reads = map.MovingFrom(v) == my_rank;
    moving_out_[v] = sent ? MoveOut{to, sent->first, sent->second, hold_reads} : MoveOut{to, 0, 0, hold_reads};
  }
}

std::vector<uint32_t> ShardMoves::InSync(const ShardMapView& map, uint32_t my_rank,
                                         const BackupStreams& streams) const {
  std::vector<uint32_t> out;
  for (const auto& [v, m] : moving_out_)
    if (map.ServerRankOf(v) == my_rank && streams.AckedThrough(m.to, m.stream) >= m.position) out.push_back(v);
  std::sort(out.begin(), out.end());
  return out;
}

ShardMoves::HeldReply ShardMoves::WaitsFor(std::span<const uint32_t> shards, const BackupStreams& streams) const {
  HeldReply held;
  if (moving_out_.empty()) return held;
  for (uint32_t v : shards) {
    auto m = moving_out_.find(v);
    if (m == moving_out_.end() || !m->second.hold_reads ||
        std::find(held.vshards.begin(), held.vshards.end(), v) != held.vshards.end())
      continue;
    const auto sent = streams.SentThrough(m->second.to);  // (stream id, last position)
    if (!sent || streams.AckedThrough(m->second.to, sent->first) >= sent->second) continue;
    held.vshards.push_back(v);
    held.waits.push_back(StreamWait{m->second.to, sent->first, sent->second});
  }
  return held;
}

void ShardMoves::Release(const BackupStreams& streams, std::vector<Outgoing>& out) {
  for (auto it = held_.begin(); it != held_.end();) {
    const bool ready = std::all_of(it->waits.begin(), it->waits.end(), [&](const StreamWait& w) {
      return streams.AckedThrough(w.rank, w.stream) >= w.position;
    });
    if (!ready) {
      ++it;
      continue;
    }
    for (Outgoing& o : it->pieces) out.push_back(std::move(o));
    it = held_.erase(it);
  }
}

std::vector<std::pair<ShardMoves::HeldReply, uint32_t>> ShardMoves::TakeReadersOf(
    const std::function<bool(uint32_t)>& moved) {
  std::vector<std::pair<HeldReply, uint32_t>> out;
  for (auto it = held_.begin(); it != held_.end();) {
    auto hit = std::find_if(it->vshards.begin(), it->vshards.end(), moved);
    if (hit == it->vshards.end()) {
      ++it;
      continue;
    }
    const uint32_t shard = *hit;
    out.emplace_back(std::move(*it), shard);
    it = held_.erase(it);
  }
  return out;
}

}  // namespace tessera
