#pragma once
// Push rows: the steps a primary's push and a backup's forward share (which
// rows to apply here, recording them as applied) and the rows each backup
// gets, as pure functions. A part of ServerCore (docs/design.md, "Server
// parts"): a push and a forward are checked first (server/request_checks.h),
// then de-duplicated and gathered here, applied to the table by the core,
// recorded here, and (a push) forwarded.
//
// Contract:
// - SelectRowsToApply(dedup, origin, shards, apply_duplicates, keys,
//   values, vshard, row_bytes, take): `shards` are the distinct shards of
//   the rows this server takes, vshard[i] the shard of row i. Returns
//   CheckIncarnation's error if a shard saw a newer incarnation of the
//   worker. Else: `duplicate` holds the shards that applied the push
//   already (PushDedup::IsDuplicate; none with apply_duplicates), and
//   keys / values the rows whose shard take(v) accepts (a null `take`
//   accepts every shard) and is not a duplicate, in request order: the
//   frames themselves when that is every row, else fresh copies
//   (row_bytes of values per row). Changes nothing.
// - RecordApplied(dedup, applied, shards, duplicate, origin): for each of
//   `shards` not in `duplicate`, records the push in its window and adds
//   one to applied[shard].
// - ForwardOf(origin, table_id, clock, piece): the Replicate header of a
//   forward of that push (the primary's table clock; no keys, stream,
//   position or epoch yet).
// - ForwardsOfPush(map, my_rank, keys, values, vshard, shards, header,
//   row_bytes, sender_id): one forward per backup of `shards` (distinct
//   ranks, ascending) with `header` and num_keys set, carrying the rows
//   whose shard my_rank leads and that backup backs up, in request order
//   (the frames themselves when that is every row).
// - RescopeForward(forward, kept, map, tables): a forward not yet
//   acknowledged when a newer map moved shards keeps only the rows whose
//   shard `kept` accepts (a transfer: RescopeTransfer); one of an unknown
//   table, or with no keys, is left as it is. A forward left with no rows
//   still goes (the backup applies nothing).
// Pure: no I/O, threads or clocks. Thread safety: none; the caller
// serializes (dedup and applied are the caller's).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"
#include "common/keys.h"
#include "common/message.h"
#include "proto/tessera.pb.h"
#include "server/optimizer.h"
#include "server/push_dedup.h"
#include "server/state_transfer.h"

namespace tessera {

struct RowsToApply {
  Buffer keys;
  Buffer values;
  absl::flat_hash_set<uint32_t> duplicate;  // shards that applied the push already
};
absl::StatusOr<RowsToApply> SelectRowsToApply(const PushDedup& dedup, const PushOrigin& origin,
                                              std::span<const uint32_t> shards, bool apply_duplicates,
                                              const Buffer& keys, const Buffer& values,
                                              std::span<const uint32_t> vshard, size_t row_bytes,
                                              const std::function<bool(uint32_t)>& take);

void RecordApplied(PushDedup& dedup, absl::flat_hash_map<uint32_t, uint64_t>& applied,
                   std::span<const uint32_t> shards, const absl::flat_hash_set<uint32_t>& duplicate,
                   const PushOrigin& origin);

proto::Replicate ForwardOf(const PushOrigin& origin, uint32_t table_id, uint64_t clock, Columns piece);

struct BackupForward {
  uint32_t rank;
  Message message;
};
std::vector<BackupForward> ForwardsOfPush(const ShardMapView& map, uint32_t my_rank, const Buffer& keys,
                                          const Buffer& values, std::span<const uint32_t> vshard,
                                          std::span<const uint32_t> shards, const proto::Replicate& header,
                                          size_t row_bytes, uint32_t sender_id);

void RescopeForward(Message& forward, const std::function<bool(uint32_t)>& kept, const ShardMapView& map,
                    const TableMap& tables);

}  // namespace tessera
