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
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <span>
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

}  // namespace tessera
