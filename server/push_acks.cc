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
  std::vector<Waiting> out;
  for (auto& [id, w] : waiting_) out.push_back(std::move(w));
  waiting_.clear();
  return out;
}

std::vector<std::pair<PushAcks::Waiting, uint32_t>> PushAcks::TakeTouching(const std::function<bool(uint32_t)>& moved) {
  std::vector<std::pair<Waiting, uint32_t>> out;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const std::vector<uint32_t>& shards = it->second.shards;
    auto hit = std::find_if(shards.begin(), shards.end(), moved);
    if (hit == shards.end()) {
      ++it;
      continue;
    }
    const uint32_t shard = *hit;
    out.emplace_back(std::move(it->second), shard);
    waiting_.erase(it++);
  }
  return out;
}

}  // namespace tessera
