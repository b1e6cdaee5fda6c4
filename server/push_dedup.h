#pragma once
// PushDedup: which sequenced pushes each virtual shard has applied, so that a
// push sent again (a worker's resend, a forward sent twice, a resend to a
// promoted backup) is applied once per shard. A part of ServerCore
// (docs/design.md, "Server parts"); primaries and backups keep one each.
//
// Contract:
// - A push is named by its origin: (worker node, incarnation, seq), with
//   acked_below = the lowest push of that worker still in flight. seq 0
//   means "not sequenced": never a duplicate, never recorded, never refused.
// - One window per (vshard, worker): the newest incarnation seen, a floor
//   (every seq below it was acknowledged to the worker and is forgotten:
//   it counts as applied) and the applied seqs at or above the floor.
// - IsDuplicate(v, o): o is sequenced, v's window for o.worker has
//   o.incarnation, and o.seq is below the floor or among its seqs.
// - RecordApplied(v, o): a newer incarnation starts the window afresh; the
//   floor rises to o.acked_below (never falls), dropping seqs below it;
//   o.seq is kept if it is at or above the floor.
// - CheckIncarnation(o, shards): FailedPrecondition, naming both
//   incarnations, if any of the shards has seen a newer incarnation of
//   o.worker (a replaced process's late push); OK otherwise. Changes nothing.
// - Export writes the windows of the given shards to a ShardTransfer (or a
//   checkpoint's copy of one) sorted by (vshard, worker), seqs ascending, so
//   the same state always gives the same bytes; Import replaces the windows
//   it carries for the shards `keep` accepts; Export then Import gives the
//   same windows. Forget drops every window of the given shards.
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <functional>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "proto/tessera.pb.h"

namespace tessera {

// Who made a push, and what that worker says it has had acknowledged.
struct PushOrigin {
  uint32_t worker = 0;  // node id
  uint32_t incarnation = 0;
  uint64_t seq = 0;  // 0: not sequenced
  uint64_t acked_below = 0;
};

class PushDedup {
 public:
  absl::Status CheckIncarnation(const PushOrigin& origin, std::span<const uint32_t> vshards) const;
  bool IsDuplicate(uint32_t vshard, const PushOrigin& origin) const;
  void RecordApplied(uint32_t vshard, const PushOrigin& origin);

  void Export(const absl::flat_hash_set<uint32_t>& shards, proto::ShardTransfer* t) const;
  void Import(const proto::ShardTransfer& t, const std::function<bool(uint32_t)>& keep);
  void Forget(const absl::flat_hash_set<uint32_t>& shards);

  size_t windows() const { return windows_.size(); }

 private:
  struct Window {
    uint32_t incarnation = 0;
    uint64_t floor = 0;                   // every seq below was acknowledged: forgotten
    absl::flat_hash_set<uint64_t> seqs;  // applied seqs >= floor
  };
  static uint64_t KeyOf(uint32_t vshard, uint32_t worker) { return (uint64_t{vshard} << 32) | worker; }
  absl::flat_hash_map<uint64_t, Window> windows_;  // (vshard << 32 | worker node id) -> applied
};

}  // namespace tessera
