#pragma once
// ForwardInbox: a backup's side of the replication streams. Per primary, it
// puts the forwards (Replicate messages, state transfers among them) back
// in stream order, so that each is applied exactly once and in order. A part
// of ServerCore (docs/design.md, "Server parts"); the core checks the epoch
// and the sender first and applies what this part says to apply.
//
// Contract (per primary node id; primaries are independent):
// - Each forward carries (stream, position); positions of a stream count
//   from 1. A stream id higher than the current one starts afresh: position
//   1 is next, and what was kept early or reported of the old stream is
//   dropped. A forward of a lower stream id is ignored (kIgnore).
// - Receive says, for a forward of the current stream:
//   * kApply: it is the next position; the part now expects the one after
//     (the core applies it, and acknowledges it whatever the outcome).
//   * kAckAgain: an earlier position (a resend of what was applied):
//     acknowledge ack_position (the last position taken) again.
//   * kKept: a later position (one before it is missing): kept, up to
//     kMaxEarlyForwards per primary (past that, dropped: the primary resends
//     in order anyway), for TakeNext. gap_notice is true the first time a
//     given missing position is seen: acknowledge ack_position (the last
//     taken) with ReplicateAck.gap, so that the primary resends the missing
//     one at once.
// - TakeNext(from) returns the kept forward that is next now (and drops
//   kept ones below it), or nothing; the core passes it to Receive again.
// Pure: no I/O, threads or clocks. Thread safety: none; the caller serializes.
#include <cstdint>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "common/message.h"

namespace tessera {

class ForwardInbox {
 public:
  static constexpr size_t kMaxEarlyForwards = 4096;
  enum class Verdict { kApply, kAckAgain, kKept, kIgnore };
  struct Decision {
    Verdict verdict = Verdict::kIgnore;
    uint64_t ack_position = 0;  // kAckAgain, and kKept with gap_notice
    bool gap_notice = false;    // kKept: say the next position is missing
  };
  Decision Receive(uint32_t from, uint64_t stream, uint64_t position, const Message& m);
  std::optional<Message> TakeNext(uint32_t from);
  // Forwards kept early from `from` (for tests and metrics).
  size_t kept(uint32_t from) const;

 private:
  struct FromPrimary {
    uint64_t stream = 0;
    uint64_t expected = 1;                // the next position to apply
    std::map<uint64_t, Message> early;   // position -> forward that came ahead of its turn
    uint64_t gap_reported = 0;            // the missing position last reported
  };
  absl::flat_hash_map<uint32_t, FromPrimary> from_;  // primary node id -> its stream here
};

}  // namespace tessera
