#pragma once
// Request clocks: the clock arithmetic of pushes, pulls and clock advances
// (../shared/DESIGN.md section 5; "Push clocks" in server/server_core.h),
// as pure functions. A part of ServerCore (docs/design.md, "Server parts").
//
// Contract:
// - CheckClockFields(h, max_hold): OK for a message that is not a push,
//   pull or clock advance; otherwise InvalidArgument, naming the field and
//   the limit, if its clock is >= kMaxClock (2^62: arithmetic on it could
//   overflow) or it asks to be held longer than max_hold (whole ms).
// - Staleness(config): BSP 0, SSP its staleness, ASP kUnboundedStaleness.
// - RequiredMinClock(clock, staleness): the slowest live worker's clock a
//   reader at `clock` needs, clock - staleness, saturating at 0 (and 0 for
//   kUnboundedStaleness).
// - PushTableClock(stamp, highest): the clock a push stamped `stamp` gives
//   its table when the highest clock any worker announced here is
//   `highest`: the stamp, but at most highest + kPushClockLead.
// - DistinctShards(vshards, num_vshards, keep): the distinct values of
//   `vshards` (each < num_vshards) for which keep(v) holds, ascending.
// Pure: no I/O, threads or clocks. Thread safety: none needed (no state).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "proto/tessera.pb.h"

namespace tessera {

inline constexpr uint64_t kUnboundedStaleness = std::numeric_limits<uint64_t>::max();

// Clocks count iterations: one at or past 2^62 is no job's, and arithmetic
// on it (a clock plus one, plus a staleness, times a hold) would overflow.
inline constexpr uint64_t kMaxClock = uint64_t{1} << 62;

// How far past the highest clock announced here a push may move its
// table's clock ("Push clocks" in server_core.h): a worker stamps clock c
// only once every server acknowledged its clock c - 1 (BSP, SSP), so one
// is the most a legitimate stamp is ahead of what this server has heard.
inline constexpr uint64_t kPushClockLead = 1;

absl::Status CheckClockFields(const proto::Envelope& h, Nanos max_hold);
uint64_t Staleness(const proto::TableConfig& c);
inline uint64_t RequiredMinClock(uint64_t clock, uint64_t staleness) {
  return staleness == kUnboundedStaleness || clock <= staleness ? 0 : clock - staleness;
}
inline uint64_t PushTableClock(uint64_t stamp, uint64_t highest) {
  return std::min(stamp, highest + kPushClockLead);
}

// One pass and a bitmap instead of a sort (a push of thousands of keys
// touches each of a few hundred shards many times).
template <typename Keep>
std::vector<uint32_t> DistinctShards(std::span<const uint32_t> vshards, uint32_t num_vshards, Keep&& keep) {
  std::vector<uint8_t> seen(num_vshards, 0);
  for (uint32_t v : vshards) seen[v] = 1;
  std::vector<uint32_t> out;
  for (uint32_t v = 0; v < num_vshards; ++v)
    if (seen[v] && keep(v)) out.push_back(v);
  return out;
}

}  // namespace tessera
