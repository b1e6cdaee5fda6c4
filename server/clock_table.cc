#include "server/clock_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tessera {

void ClockTable::Reset(const absl::flat_hash_map<uint32_t, uint32_t>& worker_rank_by_node) {
  ranks_ = worker_rank_by_node;
  clocks_.clear();
  for (const auto& [node, rank] : ranks_) clocks_[node] = 0;
  RecomputeMin();
}

absl::Status ClockTable::Advance(uint32_t worker, uint64_t clock) {
  auto it = clocks_.find(worker);
  if (it == clocks_.end()) {
    return absl::FailedPreconditionError(
        ranks_.contains(worker) ? absl::StrCat("worker ", ranks_.at(worker), " has left the job")
                                : absl::StrCat("node ", worker, " is not a worker of this job"));
  }
  if (clock <= it->second) return absl::OkStatus();
  highest_clock_ = std::max(highest_clock_, clock);
  const bool was_min = it->second == min_clock_;
  it->second = clock;
  if (was_min) RecomputeMin();
  return absl::OkStatus();
}

void ClockTable::Remove(uint32_t worker) {
  if (clocks_.erase(worker) > 0) RecomputeMin();
}

uint64_t ClockTable::Join(uint32_t worker, uint32_t rank, bool test_at_zero) {
  if (ranks_.contains(worker)) {
    auto it = clocks_.find(worker);
    return it == clocks_.end() ? 0 : it->second;
  }
  ranks_[worker] = rank;
  uint64_t start = highest_clock_;  // >= every live clock (Advance keeps it so)
  if (test_at_zero) start = 0;
  clocks_[worker] = start;
  RecomputeMin();
  return start;
}

uint64_t ClockTable::ClockOf(uint32_t worker) const {
  auto it = clocks_.find(worker);
  return it == clocks_.end() ? kNoWorkers : it->second;
}

void ClockTable::RecomputeMin() {
  min_clock_ = kNoWorkers;
  for (const auto& [node, clock] : clocks_) min_clock_ = std::min(min_clock_, clock);
}

std::string ClockTable::DescribeBehind(uint64_t clock) const {
  std::vector<std::pair<uint64_t, uint32_t>> behind;  // (clock, rank)
  for (const auto& [node, c] : clocks_)
    if (c < clock) behind.emplace_back(c, ranks_.at(node));
  std::sort(behind.begin(), behind.end());
  std::string out;
  for (const auto& [c, rank] : behind) absl::StrAppend(&out, out.empty() ? "" : ", ", "worker ", rank, " (at clock ", c, ")");
  return out;
}

}  // namespace tessera
