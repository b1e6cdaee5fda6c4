#pragma once
// Backup plan: after a new shard map, what a primary owes each backup. A
// part of ServerCore (docs/design.md, "Server parts"): UpdateShardMap ends,
// keeps or begins the streams to backups (BackupStreams) and sends state
// transfers as this plan says.
//
// Contract: PlanBackups(old, now, my_rank, streamed) returns, in rank order,
// one entry per rank that is in `streamed` (ranks this server has a stream
// to) or backs up, in `now`, a shard `my_rank` is primary of in `now`:
// - held: the shards `my_rank` is primary of in `now` that the rank backs
//   up in `now`, ascending. Empty: its stream ends (every live copy has
//   what waited on it).
// - fresh: those of `held` the rank must get by state transfer before any
//   forward: all of them when the rank is a new process (another node id
//   than in `old`, or dead in `old`, or not in `old` at all); otherwise
//   those it did not hold in `old`, or whose primary in `old` was not
//   `my_rank` (copies that backed up a deposed primary may each miss a
//   different suffix of its forwards, and a backup recruited under the last
//   primary may never have had its transfer).
// TransferTargets(map, my_rank, vshards): for each backup (ascending rank)
// of the shards of `vshards` my_rank is primary of in `map` (others, and
// shards past the map, are skipped), those shards in the order given: who
// gets a transfer of which shards again (after a restore).
// BackupsOfLed(map, my_rank): the ranks other than my_rank that back up a
// shard my_rank is primary of, ascending, each once.
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/keys.h"

namespace tessera {

struct BackupPlan {
  uint32_t rank = 0;
  std::vector<uint32_t> held;
  std::vector<uint32_t> fresh;
};

std::vector<BackupPlan> PlanBackups(const ShardMapView& old, const ShardMapView& now, uint32_t my_rank,
                                    std::span<const uint32_t> streamed);

std::vector<std::pair<uint32_t, std::vector<uint32_t>>> TransferTargets(const ShardMapView& map, uint32_t my_rank,
                                                                        std::span<const uint32_t> vshards);
std::vector<uint32_t> BackupsOfLed(const ShardMapView& map, uint32_t my_rank);

}  // namespace tessera
