#include "server/push_rows.h"

#include <algorithm>

namespace tessera {

absl::StatusOr<RowsToApply> SelectRowsToApply(const PushDedup& dedup, const PushOrigin& origin,
                                              std::span<const uint32_t> shards, bool apply_duplicates,
                                              const Buffer& keys, const Buffer& values,
                                              std::span<const uint32_t> vshard, size_t row_bytes,
                                              const std::function<bool(uint32_t)>& take) {
  if (auto s = dedup.CheckIncarnation(origin, shards); !s.ok()) return s;
  RowsToApply rows{.keys = keys, .values = values};
  if (!apply_duplicates) {
    for (uint32_t v : shards)
      if (dedup.IsDuplicate(v, origin)) rows.duplicate.insert(v);
  }
  if (!take && rows.duplicate.empty()) return rows;
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < vshard.size(); ++i)
    if ((!take || take(vshard[i])) && !rows.duplicate.contains(vshard[i])) idx.push_back(static_cast<uint32_t>(i));
  GatherRows(keys, values, idx, row_bytes, &rows.keys, &rows.values);
  return rows;
}

void RecordApplied(PushDedup& dedup, absl::flat_hash_map<uint32_t, uint64_t>& applied,
                   std::span<const uint32_t> shards, const absl::flat_hash_set<uint32_t>& duplicate,
                   const PushOrigin& origin) {
  for (uint32_t v : shards) {
    if (duplicate.contains(v)) continue;
    dedup.RecordApplied(v, origin);
    applied[v]++;
  }
}

proto::Replicate ForwardOf(const PushOrigin& origin, uint32_t table_id, uint64_t clock, Columns piece) {
  proto::Replicate forward;
  forward.set_worker_id(origin.worker);
  forward.set_incarnation(origin.incarnation);
  forward.set_seq(origin.seq);
  forward.set_acked_below(origin.acked_below);
  forward.set_table_id(table_id);
  forward.set_clock(clock);
  forward.set_first_column(piece.first);
  forward.set_columns(piece.count);
  return forward;
}

std::vector<BackupForward> ForwardsOfPush(const ShardMapView& map, uint32_t my_rank, const Buffer& keys,
                                          const Buffer& values, std::span<const uint32_t> vshard,
                                          std::span<const uint32_t> shards, const proto::Replicate& header,
                                          size_t row_bytes, uint32_t sender_id) {
  std::vector<uint32_t> backups;
  for (uint32_t v : shards)
    for (uint32_t b : map.BackupsOf(v)) backups.push_back(b);
  std::sort(backups.begin(), backups.end());
  backups.erase(std::unique(backups.begin(), backups.end()), backups.end());
  std::vector<BackupForward> out;
  for (uint32_t b : backups) {
    std::vector<uint32_t> idx;
    for (size_t i = 0; i < vshard.size(); ++i) {
      if (map.ServerRankOf(vshard[i]) != my_rank) continue;
      auto bs = map.BackupsOf(vshard[i]);
      if (std::find(bs.begin(), bs.end(), b) != bs.end()) idx.push_back(static_cast<uint32_t>(i));
    }
    Message f;
    f.header.set_sender_id(sender_id);
    *f.header.mutable_replicate() = header;
    f.header.mutable_replicate()->set_num_keys(idx.size());
    if (idx.size() == vshard.size()) {
      f.frames = {keys, values};
    } else {
      f.frames.resize(2);
      GatherRows(keys, values, idx, row_bytes, &f.frames[0], &f.frames[1]);
    }
    out.push_back(BackupForward{b, std::move(f)});
  }
  return out;
}

void RescopeForward(Message& forward, const std::function<bool(uint32_t)>& kept, const ShardMapView& map,
                    const TableMap& tables) {
  proto::Replicate& r = *forward.header.mutable_replicate();
  if (r.has_transfer()) {
    RescopeTransfer(forward, kept, map);
    return;
  }
  if (r.num_keys() == 0 || forward.frames.size() != 2) return;
  auto table = tables.find(r.table_id());
  if (table == tables.end()) return;
  const size_t row_bytes = size_t{table->second->width()} * sizeof(float);
  const auto keys = forward.frames[0].As<Key>();
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < keys.size(); ++i)
    if (kept(map.VShardOfKey(r.table_id(), keys[i]))) idx.push_back(static_cast<uint32_t>(i));
  if (idx.size() == keys.size()) return;
  Buffer k, values;
  GatherRows(forward.frames[0], forward.frames[1], idx, row_bytes, &k, &values);
  forward.frames = {std::move(k), std::move(values)};
  r.set_num_keys(idx.size());
}

}  // namespace tessera
