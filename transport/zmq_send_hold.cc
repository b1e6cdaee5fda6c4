#include "transport/zmq_send_hold.h"

#include <thread>

namespace tessera::zmq_internal {

// Runs on a libzmq I/O thread (or on the sending thread when the message is
// dropped before libzmq took it).
void ReleaseSendHold(void* /*data*/, void* hint) {
  auto* hold = static_cast<SendHold*>(hint);
  (void)hold->published.load(std::memory_order_acquire);
  PeerHolds* peer = hold->peer;
  const bool counted = hold->counted;
  const uint64_t bytes = hold->backlog_bytes;
  // The frame's reference goes first: once the count below says it ended,
  // the frame's memory is the caller's again (Forget).
  SendHold::Delete(hold);
  if (peer == nullptr) return;
  if (counted) {
    peer->backlog_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    peer->backlog_messages.fetch_sub(1, std::memory_order_release);
  }
  peer->EndHold();
}

uint64_t PeerHolds::WaitForRelease(std::chrono::milliseconds max_wait) const {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + max_wait;
  // libzmq releases a closed socket's messages within microseconds to
  // milliseconds (its reaper and I/O threads); poll, backing off.
  std::chrono::microseconds pause(20);
  for (;;) {
    const uint64_t held = held_frames();
    const Clock::time_point now = Clock::now();
    if (held == 0 || now >= deadline) return held;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

}  // namespace tessera::zmq_internal
