#pragma once
// Checkpoint restore: restoring shards into a ServerCore from checkpoints
// already read, as pure functions: which checkpoint holds the newest copy
// of each shard, the restore itself, how many push applications those
// copies miss, and the line a server logs. The shell
// (ServerNode::RestoreFromCheckpoints, server/server_node.cc) lists and
// reads the files of a checkpoint directory and calls
// RestoreNewestCopies; the simulator (tests/sim) calls it over the
// checkpoints it keeps in memory, so both run the same choice and restore
// (docs/checkpoints.md, "How the server uses it").
//
// Contract:
// - ChooseNewestCopies(snapshots, sequences, vshards, none): of
//   `snapshots` (sequences[i] is snapshot i's sequence number), the one
//   holding the newest copy of each of `vshards`: by map epoch, then
//   sequence (a shard has one primary per epoch). Returns (snapshot index,
//   its shards ascending) pairs by index; shards that no snapshot holds go
//   to *none (ascending).
// - MissedApplications(snapshot, vshards, last_applied): push applications
//   to `vshards` the snapshot misses: for each, what its primary last
//   reported applied (last_applied) minus what the snapshot recorded, never
//   below 0. A lower bound: pushes applied after that report are not
//   counted.
// - RestoreNewestCopies(core, checkpoints, vshards, with_windows,
//   last_applied, unreadable): each of `vshards` is restored from the
//   checkpoint that holds its newest copy (ChooseNewestCopies), one
//   ServerCore::RestoreShards(with_windows) per checkpoint chosen, in
//   checkpoint order. A checkpoint whose RestoreShards fails (a table that
//   does not fit this core's, windows that do not parse) changes nothing:
//   its shards are left as they are and its error is a problem ("NAME:
//   error"). A shard no checkpoint holds is left as it is (it starts from
//   its initial values) and named. The result holds the shards restored
//   and those no checkpoint holds (ascending), the rows restored, the
//   applications missed (MissedApplications over the shards restored), the
//   problems (`unreadable` first, then the failed restores) and the line:
//     restored R of N shards (ROWS rows) from checkpoints: shards A,B from
//     NAME; shards C from NAME2        (or ": none")
//   then, with windows, "; the checkpoints miss at least M push applications
//   to these shards (...) made, and possibly acknowledged, after them"; then
//   "; no checkpoint holds shards X,Y: they start from their initial
//   values" when some; then "; unreadable: PROBLEM; PROBLEM" when some.
//   R counts the shards restored, N the shards asked for.
// Pure: no I/O, threads or clocks; changes only `core` (through
// RestoreShards). Thread safety: none; the caller serializes access to
// `core` and keeps every checkpoint's snapshot alive for the call.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/server_core.h"
#include "server/shard_snapshot.h"

namespace tessera {

std::vector<std::pair<size_t, std::vector<uint32_t>>> ChooseNewestCopies(std::span<const ShardSnapshot> snapshots,
                                                                         std::span<const uint64_t> sequences,
                                                                         std::span<const uint32_t> vshards,
                                                                         std::vector<uint32_t>* none);
uint64_t MissedApplications(const ShardSnapshot& snapshot, std::span<const uint32_t> vshards,
                            const std::map<uint32_t, uint64_t>& last_applied);

// One checkpoint read for a restore.
struct CheckpointCopy {
  const ShardSnapshot* snapshot = nullptr;  // not owned
  uint64_t sequence = 0;  // its sequence number (the shell: from its file name; per server rank, increasing)
  std::string name;       // how the line names it (the shell: its path)
};

struct CheckpointRestore {
  std::vector<uint32_t> restored;  // shards restored, ascending
  std::vector<uint32_t> none;      // shards no checkpoint holds, ascending
  uint64_t rows = 0;               // rows restored
  uint64_t missed = 0;             // MissedApplications over the shards restored
  std::vector<std::string> problems;
  std::string line;                // for the log
};

CheckpointRestore RestoreNewestCopies(ServerCore& core, std::span<const CheckpointCopy> checkpoints,
                                      std::span<const uint32_t> vshards, bool with_windows,
                                      const std::map<uint32_t, uint64_t>& last_applied,
                                      std::vector<std::string> unreadable = {});

}  // namespace tessera
