#include "server/checkpoint_restore.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

namespace {

// ChooseNewestCopies over `n` snapshots, snapshot(i) and sequence(i) giving
// the i-th.
template <typename SnapshotAt, typename SequenceAt>
std::vector<std::pair<size_t, std::vector<uint32_t>>> ChooseNewest(size_t n, SnapshotAt snapshot, SequenceAt sequence,
                                                                   std::span<const uint32_t> vshards,
                                                                   std::vector<uint32_t>* none) {
  std::map<size_t, std::vector<uint32_t>> by_snapshot;
  std::vector<uint32_t> wanted(vshards.begin(), vshards.end());
  std::sort(wanted.begin(), wanted.end());
  for (uint32_t v : wanted) {
    size_t best = n;
    for (size_t i = 0; i < n; ++i) {
      const ShardSnapshot& s = snapshot(i);
      if (!std::binary_search(s.vshards.begin(), s.vshards.end(), v)) continue;
      if (best == n || std::make_pair(s.epoch, sequence(i)) > std::make_pair(snapshot(best).epoch, sequence(best))) {
        best = i;
      }
    }
    if (best == n) {
      if (none != nullptr) none->push_back(v);
    } else {
      by_snapshot[best].push_back(v);
    }
  }
  return {by_snapshot.begin(), by_snapshot.end()};
}

}  // namespace

std::vector<std::pair<size_t, std::vector<uint32_t>>> ChooseNewestCopies(std::span<const ShardSnapshot> snapshots,
                                                                         std::span<const uint64_t> sequences,
                                                                         std::span<const uint32_t> vshards,
                                                                         std::vector<uint32_t>* none) {
  return ChooseNewest(
      snapshots.size(), [&](size_t i) -> const ShardSnapshot& { return snapshots[i]; },
      [&](size_t i) { return sequences[i]; }, vshards, none);
}

uint64_t MissedApplications(const ShardSnapshot& snapshot, std::span<const uint32_t> vshards,
                            const std::map<uint32_t, uint64_t>& last_applied) {
  uint64_t missed = 0;
  for (uint32_t v : vshards) {
    auto had = snapshot.applied_pushes_by_vshard.find(v);
    auto last = last_applied.find(v);
    const uint64_t h = had == snapshot.applied_pushes_by_vshard.end() ? 0 : had->second;
    const uint64_t l = last == last_applied.end() ? 0 : last->second;
    if (l > h) missed += l - h;
  }
  return missed;
}

CheckpointRestore RestoreNewestCopies(ServerCore& core, std::span<const CheckpointCopy> checkpoints,
                                      std::span<const uint32_t> vshards, bool with_windows,
                                      const std::map<uint32_t, uint64_t>& last_applied,
                                      std::vector<std::string> unreadable) {
  CheckpointRestore r;
  r.problems = std::move(unreadable);
  std::string report;
  auto chosen = ChooseNewest(
      checkpoints.size(), [&](size_t i) -> const ShardSnapshot& { return *checkpoints[i].snapshot; },
      [&](size_t i) { return checkpoints[i].sequence; }, vshards, &r.none);
  for (const auto& [i, vs] : chosen) {
    const CheckpointCopy& c = checkpoints[i];
    auto rows = core.RestoreShards(*c.snapshot, vs, with_windows);
    if (!rows.ok()) {
      r.problems.push_back(absl::StrCat(c.name, ": ", rows.status().message()));
      continue;
    }
    r.rows += *rows;
    r.missed += MissedApplications(*c.snapshot, vs, last_applied);
    r.restored.insert(r.restored.end(), vs.begin(), vs.end());
    absl::StrAppend(&report, report.empty() ? "" : "; ", "shards ", absl::StrJoin(vs, ","), " from ", c.name);
  }
  std::sort(r.restored.begin(), r.restored.end());
  r.line = absl::StrCat("restored ", r.restored.size(), " of ", vshards.size(), " shards (", r.rows,
                        " rows) from checkpoints: ", report.empty() ? "none" : report);
  if (with_windows) {
    absl::StrAppend(&r.line, "; the checkpoints miss at least ", r.missed,
                    " push applications to these shards (a push counts once per shard it touched) made, and "
                    "possibly acknowledged, after them");
  }
  if (!r.none.empty()) {
    absl::StrAppend(&r.line, "; no checkpoint holds shards ", absl::StrJoin(r.none, ","),
                    ": they start from their initial values");
  }
  if (!r.problems.empty()) absl::StrAppend(&r.line, "; unreadable: ", absl::StrJoin(r.problems, "; "));
  return r;
}

}  // namespace tessera
