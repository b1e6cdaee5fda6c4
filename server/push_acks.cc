#include "server/push_acks.h"

#include <algorithm>

namespace tessera {

void PushAcks::Wait(uint64_t push_id, std::string to, Message reply, uint32_t forwards, std::vector<uint32_t> shards) {
  waiting_.emplace(push_id, Waiting{std::move(to), std::move(reply), forwards, {}, std::move(shards)});
}

std::optional<PushAcks::Waiting> PushAcks::Done(uint64_t push_id, const absl::Status& status) {
  auto it = waiting_.find(push_id);
  if (it == waiting_.end()) return std::nullopt;
  Waiting& w = it->second;
  if (!status.ok() && w.status.ok()) w.status = status;
  if (--w.outstanding > 0) return std::nullopt;
  Waiting done = std::move(w);
  waiting_.erase(it);
  return done;
}

std::vector<PushAcks::Waiting> PushAcks::TakeAll() {
  // In push id order, as TakeTouching.
  std::vector<uint64_t> ids;
  ids.reserve(waiting_.size());
  for (const auto& [id, w] : waiting_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<Waiting> out;
  out.reserve(ids.size());
  for (uint64_t id : ids) out.push_back(std::move(waiting_.at(id)));
  waiting_.clear();
  return out;
}

std::vector<std::pair<PushAcks::Waiting, uint32_t>> PushAcks::TakeTouching(const std::function<bool(uint32_t)>& moved) {
  // In push id order, not the map's (which depends on addresses): the
  // answers go out in it, and a run must be a function of its inputs.
  std::vector<std::pair<uint64_t, uint32_t>> hits;  // push id, first shard moved
  for (const auto& [id, w] : waiting_) {
    auto hit = std::find_if(w.shards.begin(), w.shards.end(), moved);
    if (hit != w.shards.end()) hits.emplace_back(id, *hit);
  }
  std::sort(hits.begin(), hits.end());
  std::vector<std::pair<Waiting, uint32_t>> out;
  out.reserve(hits.size());
  for (const auto& [id, shard] : hits) {
    auto it = waiting_.find(id);
    out.emplace_back(std::move(it->second), shard);
    waiting_.erase(it);
  }
  return out;
}
}  // namespace tessera
