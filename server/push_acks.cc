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

std::vector<uint64_t> PushAcks::IdsInOrder() const {
  // Push id order, never the map's (which depends on addresses): the
  // answers go out in it, and a run must be a function of its inputs.
  std::vector<uint64_t> ids;
  ids.reserve(waiting_.size());
  for (const auto& [id, w] : waiting_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<PushAcks::Waiting> PushAcks::TakeAll() {
  std::vector<Waiting> out;
  out.reserve(waiting_.size());
  for (uint64_t id : IdsInOrder()) out.push_back(std::move(waiting_.at(id)));
  waiting_.clear();
  return out;
}

std::vector<std::pair<PushAcks::Waiting, uint32_t>> PushAcks::TakeTouching(const std::function<bool(uint32_t)>& moved) {
  std::vector<std::pair<Waiting, uint32_t>> out;
  for (uint64_t id : IdsInOrder()) {
    auto it = waiting_.find(id);
    const std::vector<uint32_t>& shards = it->second.shards;
    auto hit = std::find_if(shards.begin(), shards.end(), moved);
    if (hit == shards.end()) continue;
    const uint32_t shard = *hit;
    out.emplace_back(std::move(it->second), shard);
    waiting_.erase(it);
  }
  return out;
}

}  // namespace tessera
