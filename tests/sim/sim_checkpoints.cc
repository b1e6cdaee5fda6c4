// The simulator's in-memory checkpoint store (see sim_checkpoints.h).
#include "tests/sim/sim_checkpoints.h"

#include <algorithm>
#include <utility>

#include "proto/tessera.pb.h"

namespace tessera::sim {

std::string CheckpointStore::Write(ShardSnapshot snapshot, Nanos now) {
  const uint32_t rank = snapshot.server_rank;
  const uint64_t sequence = ++last_sequence_[rank];
  std::vector<Stored>& kept = by_rank_[rank];
  kept.push_back(Stored{sequence, now, std::move(snapshot)});
  if (kept.size() > keep_last_) kept.erase(kept.begin(), kept.end() - keep_last_);
  ++written_;
  return Name(rank, sequence);
}

const CheckpointStore::Stored* CheckpointStore::Newest(uint32_t vshard) const {
  const Stored* best = nullptr;
  for (const auto& [rank, kept] : by_rank_) {
    for (const Stored& c : kept) {
      const std::vector<uint32_t>& vs = c.snapshot.vshards;
      if (!std::binary_search(vs.begin(), vs.end(), vshard)) continue;
      if (best == nullptr ||
          std::make_pair(c.snapshot.epoch, c.sequence) > std::make_pair(best->snapshot.epoch, best->sequence)) {
        best = &c;
      }
    }
  }
  return best;
}

CheckpointRestore CheckpointStore::Restore(ServerCore& core, const std::vector<uint32_t>& vshards, bool with_windows,
                                           const std::map<uint32_t, uint64_t>& last_applied, Nanos now, bool oldest) {
  // What the restore should bring back, from the store as it is now.
  for (uint32_t v : vshards) {
    Restored r{v, now, {}};
    if (const Stored* c = Newest(v); c != nullptr) {
      proto::ShardTransfer state;
      (void)state.ParseFromString(c->snapshot.core_state);  // (a core_state that does not parse holds nothing)
      for (const proto::DedupWindow& d : state.dedup()) {
        if (d.vshard() != v) continue;
        Window& w = r.windows[{d.worker_id(), d.incarnation()}];
        w.floor = d.floor();
        w.seqs.insert(d.seqs().begin(), d.seqs().end());
      }
    }
    restored_.push_back(std::move(r));
  }
  CheckpointRestore r = RestoreNewestCopies(core, Copies(oldest), vshards, with_windows, last_applied);
  shards_lost_ += vshards.size();
  shards_restored_ += r.restored.size();
  missed_reported_ += r.missed;
  return r;
}

std::vector<CheckpointCopy> CheckpointStore::Copies(bool oldest) const {
  std::vector<CheckpointCopy> copies;
  for (const auto& [rank, kept] : by_rank_) {
    for (const Stored& c : kept) {
      copies.push_back(CheckpointCopy{.snapshot = &c.snapshot, .sequence = c.sequence, .name = Name(rank, c.sequence)});
      if (oldest) break;  // the negative controls: the oldest kept of each rank only
    }
  }
  return copies;
}

CheckpointRestore CheckpointStore::RestoreHeld(ServerCore& core, const std::vector<uint32_t>& vshards, bool oldest) {
  CheckpointRestore r = RestoreNewestCopies(core, Copies(oldest), vshards, /*with_windows=*/false, {});
  held_asked_ += vshards.size();
  held_restored_ += r.restored.size();
  return r;
}

void CheckpointStore::NoteSend(const std::string& from, const std::string& to, const Message& m, Nanos now) {
  const proto::Envelope& h = m.header;
  if (h.has_push() && h.push().seq() != 0 && !m.frames.empty()) {
    std::span<const Key> keys = m.frames[0].As<Key>();
    sent_[{from, h.request_id()}] =
        Sent{h.sender_id(), h.push().incarnation(), h.push().seq(), std::vector<Key>(keys.begin(), keys.end())};
    return;
  }
  if (!h.has_ack()) return;
  auto it = sent_.find({to, h.request_id()});
  if (it == sent_.end()) return;
  const Sent& p = it->second;
  // (emplace: the first acknowledgement stays)
  for (Key k : p.keys) first_ack_.emplace(std::make_tuple(p.worker, p.incarnation, p.seq, k), now);
}

bool CheckpointStore::MayHaveLost(uint32_t vshard, Key key, const Push& p) const {
  for (const Restored& r : restored_) {
    if (r.vshard != vshard) continue;
    auto w = r.windows.find({p.worker, p.incarnation});
    for (uint64_t seq = p.first; seq <= p.last; ++seq) {
      auto acked = first_ack_.find({p.worker, p.incarnation, seq, key});
      if (acked == first_ack_.end() || acked->second > r.at) continue;  // did not carry the key, or acked after
      const bool held = w != r.windows.end() && (seq < w->second.floor || w->second.seqs.contains(seq));
      if (!held) return true;
    }
  }
  return false;
}

}  // namespace tessera::sim
