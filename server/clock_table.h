#pragma once
// ClockTable: the clock of every live worker as one server knows it. Pure.
//
// A worker's clock is the number of Clock() calls it has announced; every
// push it made before announcing clock c is stamped < c and, because
// messages from one worker to one server arrive in order, has already been
// applied here when the announcement arrives.
//
// Invariants:
// - A worker's clock never decreases (an older announcement is ignored).
// - min_clock() is the minimum over live workers, or kNoWorkers when none is
//   live (nobody left to wait for).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace tessera {

class ClockTable {
 public:
  static constexpr uint64_t kNoWorkers = std::numeric_limits<uint64_t>::max();

  // Starts tracking these workers (node id -> rank, for messages) at clock 0.
  void Reset(const absl::flat_hash_map<uint32_t, uint32_t>& worker_rank_by_node);

  // Records that `worker` announced `clock`. Unknown or removed workers are
  // an error; an older clock than known is ignored (a duplicate).
  absl::Status Advance(uint32_t worker, uint64_t clock);
  // The worker left the job (finished or lost): nobody waits for it again.
  void Remove(uint32_t worker);
  // A worker that joined the running job: tracked from now on, at the
  // highest clock any worker has announced here, live or since left
  // (highest_clock()). Not lower: a worker that announced clock c may have
  // read every push stamped below c - staleness as complete, so the
  // newcomer's pushes must be stamped no lower than that; and min_clock()
  // does not drop. (Not the fastest *live* clock: when every worker has
  // left, that would be 0, and the newcomer's pushes would land below
  // pulls already answered.) A worker known already (live or left) is
  // unchanged. Returns its clock (0 for one that left).
  // (`test_at_zero`: at clock 0 instead, for the simulator's negative control.)
  uint64_t Join(uint32_t worker, uint32_t rank, bool test_at_zero = false);

  // Every worker ever tracked, by node id ascending: (node, clock, live).
  // A worker that left has clock 0.
  template <typename F>
  void ForEach(F&& fn) const {
    std::vector<uint32_t> nodes;
    for (const auto& [node, rank] : ranks_) nodes.push_back(node);
    std::sort(nodes.begin(), nodes.end());
    for (uint32_t node : nodes) {
      auto it = clocks_.find(node);
      fn(node, it == clocks_.end() ? uint64_t{0} : it->second, it != clocks_.end());
    }
  }

  bool IsLive(uint32_t worker) const { return clocks_.contains(worker); }
  bool IsKnown(uint32_t worker) const { return ranks_.contains(worker); }
  // The worker's rank (its node id if unknown).
  uint32_t RankOf(uint32_t worker) const {
    auto it = ranks_.find(worker);
    return it == ranks_.end() ? worker : it->second;
  }
  uint64_t ClockOf(uint32_t worker) const;
  uint64_t min_clock() const { return min_clock_; }
  // The highest clock any worker has announced (or joined at) here; never
  // drops, not even when that worker leaves.
  uint64_t highest_clock() const { return highest_clock_; }
  size_t live_workers() const { return clocks_.size(); }

  // "worker 2 (at clock 3), worker 0 (at clock 4)": live workers whose clock
  // is below `clock`, slowest first.
  std::string DescribeBehind(uint64_t clock) const;

 private:
  void RecomputeMin();

  absl::flat_hash_map<uint32_t, uint32_t> ranks_;   // every worker ever tracked
  absl::flat_hash_map<uint32_t, uint64_t> clocks_;  // live workers only
  uint64_t min_clock_ = kNoWorkers;
  uint64_t highest_clock_ = 0;
};

}  // namespace tessera
