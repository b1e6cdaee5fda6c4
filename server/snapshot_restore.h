#pragma once
// Snapshot restore: taking a snapshot of shards (server/shard_snapshot.h)
// and the checks, row selection and row restore of restoring shards from
// a checkpoint (server/checkpoint.h, docs/checkpoints.md), as pure
// functions. A part of ServerCore (docs/design.md, "Server parts"):
// SnapshotPrimaryShards takes its rows and counts with SnapshotShards (and
// adds the windows); RestoreShards runs both checks before it changes
// anything, then restores the rows (RestoreShardRows) and, inside a
// running job, the windows and counts (RestoreAppliedCounts).
//
// Contract:
// - CheckHasShards(snapshot, wanted): NotFound naming the checkpoint's
//   server, epoch and the first shard of `wanted` it does not hold; OK if
//   it holds them all.
// - CheckTablesFit(snapshot, tables): for each table of the snapshot, its
//   config is valid, the table of that id in `tables` (if any) has the
//   same width, kind, dense rows and stored row floats (else
//   FailedPrecondition), and the snapshot has StoredRowFloats values per
//   row (else DataLoss). The first problem is returned.
// - RowsOfShards(t, wanted, map, keys, values) replaces *keys and *values
//   with the rows of `t` whose shard (map.VShardOfKey) is in `wanted`
//   (ascending), in the snapshot's order, each with its stored floats.
// - SnapshotShards(tables, map, rank, applied): a snapshot of the shards
//   `applied` names ((vshard, pushes applied), vshards ascending): rank,
//   map epoch, those shards and counts, and per table of `tables` (in id
//   order) its rows of those shards (SnapshotTable). core_state is left
//   empty (the windows are the caller's).
// - RestoreShardRows(snapshot, wanted, map, tables, create): for each table
//   of the snapshot in its order, create(config) if `tables` lacks it (its
//   error is returned), then that table's rows of the `wanted` shards
//   (ascending; RowsOfShards) are restored (Table::RestoreRows, dense rows
//   adopted). Returns how many rows it restored. Call it after both checks:
//   it stops at the first error, keeping what it restored before.
// - RestoreAppliedCounts(snapshot, wanted, applied): applied[v] becomes the
//   snapshot's count of each wanted shard v (0 where it has none).
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/status/status.h"
#include "common/keys.h"
#include "server/shard_snapshot.h"
#include "server/state_transfer.h"

namespace tessera {

absl::Status CheckHasShards(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted);
absl::Status CheckTablesFit(const ShardSnapshot& snapshot, const TableMap& tables);
void RowsOfShards(const TableSnapshot& t, std::span<const uint32_t> wanted, const ShardMapView& map,
                  std::vector<Key>* keys, std::vector<float>* values);

ShardSnapshot SnapshotShards(const TableMap& tables, const ShardMapView& map, uint32_t rank,
                             std::span<const std::pair<uint32_t, uint64_t>> applied);
absl::StatusOr<uint64_t> RestoreShardRows(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted,
                                          const ShardMapView& map, const TableMap& tables,
                                          const std::function<absl::Status(const proto::TableConfig&)>& create);
void RestoreAppliedCounts(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted,
                          absl::flat_hash_map<uint32_t, uint64_t>& applied);

}  // namespace tessera
