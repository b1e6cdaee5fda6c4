#include "server/push_dedup.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status PushDedup::CheckIncarnation(const PushOrigin& origin, std::span<const uint32_t> vshards) const {
  if (origin.seq == 0) return absl::OkStatus();
  for (uint32_t v : vshards) {
    auto it = windows_.find(KeyOf(v, origin.worker));
    if (it != windows_.end() && origin.incarnation < it->second.incarnation) {
      return absl::FailedPreconditionError(absl::StrCat("push from incarnation ", origin.incarnation,
                                                        " of worker node ", origin.worker, ", which incarnation ",
                                                        it->second.incarnation, " has replaced"));
    }
  }
  return absl::OkStatus();
}

bool PushDedup::IsDuplicate(uint32_t vshard, const PushOrigin& origin) const {
  if (origin.seq == 0) return false;
  auto it = windows_.find(KeyOf(vshard, origin.worker));
  if (it == windows_.end() || it->second.incarnation != origin.incarnation) return false;
  return origin.seq < it->second.floor || it->second.seqs.contains(origin.seq);
}

void PushDedup::RecordApplied(uint32_t vshard, const PushOrigin& origin) {
  if (origin.seq == 0) return;
  Window& w = windows_[KeyOf(vshard, origin.worker)];
  if (origin.incarnation > w.incarnation) w = Window{.incarnation = origin.incarnation};
  if (origin.acked_below > w.floor) {
    w.floor = origin.acked_below;
    absl::erase_if(w.seqs, [&](uint64_t s) { return s < w.floor; });
  }
  if (origin.seq >= w.floor) w.seqs.insert(origin.seq);
}

void PushDedup::Export(const absl::flat_hash_set<uint32_t>& shards, proto::ShardTransfer* t) const {
  std::vector<uint64_t> keys;
  for (const auto& [key, w] : windows_)
    if (shards.contains(static_cast<uint32_t>(key >> 32))) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (uint64_t key : keys) {
    const Window& w = windows_.at(key);
    proto::DedupWindow* d = t->add_dedup();
    d->set_vshard(static_cast<uint32_t>(key >> 32));
    d->set_worker_id(static_cast<uint32_t>(key));
    d->set_incarnation(w.incarnation);
    d->set_floor(w.floor);
    std::vector<uint64_t> seqs(w.seqs.begin(), w.seqs.end());
    std::sort(seqs.begin(), seqs.end());
    for (uint64_t s : seqs) d->add_seqs(s);
  }
}

void PushDedup::Import(const proto::ShardTransfer& t, const std::function<bool(uint32_t)>& keep) {
  for (const proto::DedupWindow& d : t.dedup()) {
    if (!keep(d.vshard())) continue;
    Window& w = windows_[KeyOf(d.vshard(), d.worker_id())];
    w = Window{.incarnation = d.incarnation(), .floor = d.floor()};
    w.seqs.insert(d.seqs().begin(), d.seqs().end());
  }
}

void PushDedup::Forget(const absl::flat_hash_set<uint32_t>& shards) {
  absl::erase_if(windows_, [&](const auto& e) { return shards.contains(static_cast<uint32_t>(e.first >> 32)); });
}

}  // namespace tessera
