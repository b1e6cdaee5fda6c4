#pragma once
// Map change: what a newer shard map means for this server's waiting work,
// as pure functions. A part of ServerCore (docs/design.md, "Server parts"):
// UpdateShardMap decides with ReplacesMap whether to take a map, asks
// ShardsLostIn which shards left this live server, and answers what waited
// on them with the errors and answers built here; per backup it plans with
// server/backup_plan.h and cuts the streams down with server/push_rows.h.
//
// Contract:
// - ReplacesMap(current, offered, accept_old_epoch): false for the same
//   epoch, or an older one (unless accept_old_epoch, a test switch);
//   InvalidArgument for a map with fewer servers than `current` (servers
//   join a job; ranks never go); true otherwise.
// - ShardsLostIn(old, now, rank): `moved`, the shards `rank` was primary of
//   in `old` and is not in `now`; `released`, the shards it held a copy of
//   (primary or backup) in `old` and holds none of in `now`.
// - KeptFor(map, my_rank, backup): whether a shard is still one my_rank
//   leads and `backup` backs up in `map` (what a stream to that backup
//   keeps of its forwards).
// - CarriedPushes(stream): the pushes waiting on the stream's
//   unacknowledged forwards (their push ids and those they carry), in
//   stream order: what a transfer to a new process at that rank carries.
// - RemovedError(rank, epoch), MovedBeforeBackupsError(shard, rank, to,
//   epoch), MovedBeforeReadError(shard, rank, epoch): the Aborted errors
//   that send a worker to the servers of the new map.
// - AnswerAborted(waiting, status, epoch, out): the push's reply becomes
//   `status` at `epoch` (the worker sends it again once it has that map)
//   and goes to its sender (none without one).
//   AnswerAborted(held, status, epoch, out): a held pull reply is answered
//   `status` instead, at `epoch`, under the reply's request id.
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/keys.h"
#include "common/message.h"
#include "server/backup_streams.h"
#include "server/push_acks.h"
#include "server/shard_moves.h"

namespace tessera {

absl::StatusOr<bool> ReplacesMap(const ShardMapView& current, const ShardMapView& offered, bool accept_old_epoch);

struct ShardsLost {
  absl::flat_hash_set<uint32_t> moved;     // no longer primary here
  absl::flat_hash_set<uint32_t> released;  // no copy here any more
};
ShardsLost ShardsLostIn(const ShardMapView& old, const ShardMapView& now, uint32_t rank);

std::function<bool(uint32_t)> KeptFor(const ShardMapView& map, uint32_t my_rank, uint32_t backup);
std::vector<uint64_t> CarriedPushes(const BackupStream& stream);

absl::Status RemovedError(uint32_t rank, uint64_t epoch);
absl::Status MovedBeforeBackupsError(uint32_t shard, uint32_t rank, uint32_t to, uint64_t epoch);
absl::Status MovedBeforeReadError(uint32_t shard, uint32_t rank, uint64_t epoch);

void AnswerAborted(PushAcks::Waiting waiting, const absl::Status& status, uint64_t epoch, std::vector<Outgoing>& out);
void AnswerAborted(ShardMoves::HeldReply held, const absl::Status& status, uint64_t epoch,
                   std::vector<Outgoing>& out);

}  // namespace tessera
