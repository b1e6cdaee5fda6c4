#pragma once
// Snapshot restore: the checks and row selection of restoring shards from a
// checkpoint (server/checkpoint.h, docs/checkpoints.md), as pure functions.
// A part of ServerCore (docs/design.md, "Server parts"): RestoreShards runs
// both checks before it changes anything, then creates the tables it lacks
// and restores the rows RowsOfShards picks.
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
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/keys.h"
#include "server/checkpoint.h"
#include "server/state_transfer.h"

namespace tessera {

absl::Status CheckHasShards(const ShardSnapshot& snapshot, std::span<const uint32_t> wanted);
absl::Status CheckTablesFit(const ShardSnapshot& snapshot, const TableMap& tables);
void RowsOfShards(const TableSnapshot& t, std::span<const uint32_t> wanted, const ShardMapView& map,
                  std::vector<Key>* keys, std::vector<float>* values);

}  // namespace tessera
