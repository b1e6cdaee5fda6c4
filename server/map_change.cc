#include "server/map_change.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/request_checks.h"

namespace tessera {

absl::StatusOr<bool> ReplacesMap(const ShardMapView& current, const ShardMapView& offered, bool accept_old_epoch) {
  if (offered.epoch() == current.epoch() || (offered.epoch() < current.epoch() && !accept_old_epoch)) return false;
  if (offered.num_servers() < current.num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("shard map of epoch ", offered.epoch(), " has ",
                                                   offered.num_servers(), " servers, fewer than ",
                                                   current.num_servers()));
  }
  return true;
}

ShardsLost ShardsLostIn(const ShardMapView& old, const ShardMapView& now, uint32_t rank) {
  ShardsLost lost;
  for (uint32_t v = 0; v < now.num_vshards(); ++v) {
    if (old.ServerRankOf(v) == rank && now.ServerRankOf(v) != rank) lost.moved.insert(v);
    if (old.Holds(rank, v) && !now.Holds(rank, v)) lost.released.insert(v);
  }
  return lost;
}

std::function<bool(uint32_t)> KeptFor(const ShardMapView& map, uint32_t my_rank, uint32_t backup) {
  return [&map, my_rank, backup](uint32_t v) {
    const auto bs = map.BackupsOf(v);
    return map.ServerRankOf(v) == my_rank && std::find(bs.begin(), bs.end(), backup) != bs.end();
  };
}

std::vector<uint64_t> CarriedPushes(const BackupStream& stream) {
  std::vector<uint64_t> carried;
  for (const Forward& f : stream.unacked) {
    if (f.push_id != 0) carried.push_back(f.push_id);
    carried.insert(carried.end(), f.carried.begin(), f.carried.end());
  }
  return carried;
}

absl::Status RemovedError(uint32_t rank, uint64_t epoch) {
  return absl::AbortedError(absl::StrCat("server ", rank, " was removed from the job at map epoch ", epoch,
                                         " before its backups had the push"));
}

absl::Status MovedBeforeBackupsError(uint32_t shard, uint32_t rank, uint32_t to, uint64_t epoch) {
  return absl::AbortedError(absl::StrCat("shard ", shard, " moved from server ", rank, " to server ", to,
                                         " at map epoch ", epoch, " before its backups had the push"));
}

absl::Status MovedBeforeReadError(uint32_t shard, uint32_t rank, uint64_t epoch) {
  return absl::AbortedError(absl::StrCat("shard ", shard, " moved from server ", rank, " at map epoch ", epoch,
                                         " before its new primary had what this pull read"));
}

void AnswerAborted(PushAcks::Waiting waiting, const absl::Status& status, uint64_t epoch, std::vector<Outgoing>& out) {
  SetError(waiting.reply, status);
  waiting.reply.header.set_epoch(epoch);  // the worker resends once it has this map
  if (!waiting.to.empty()) out.push_back(Outgoing{std::move(waiting.to), std::move(waiting.reply)});
}

void AnswerAborted(ShardMoves::HeldReply held, const absl::Status& status, uint64_t epoch,
                   std::vector<Outgoing>& out) {
  Message reply;
  reply.header = std::move(held.header);
  reply.header.clear_pull_reply();
  reply.header.set_epoch(epoch);
  SetError(reply, status);
  out.push_back(Outgoing{std::move(held.to), std::move(reply)});
}

}  // namespace tessera
