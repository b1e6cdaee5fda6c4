#pragma once
// CreditWindow: the credit accounting of one reliable connection, both ways.
//
// The receiver of each direction keeps `window + kReservedSlots` receive
// slots posted. A regular SEND (a message, clear-to-send, cancel, refuse,
// hello) and a WRITE_WITH_IMM each consume one receive slot of the peer and
// may be posted only while holding a credit (TryConsume). The receiver reposts
// the slot as soon as it has taken the bytes out and only then counts the
// credit as returnable (OnRegularReceived). Returnable credits ride on the
// next regular SEND (TakeReturnable) or, when at least half the window is
// returnable and nothing else is going out, in an explicit credit update.
// Credit updates consume a slot but no credit: they are what the reserved
// slots are for.
//
// Why no receive queue runs dry: the peer's regular sends in flight or not yet
// reposted never exceed `window` (each held a credit, and a credit returns
// only after its slot was reposted). Every credit update carries at least
// ceil(window / 2) credits that nobody else holds while it is in flight, so at
// most two updates are in flight at once, and kReservedSlots = 2 covers them.
// The receiver reposts an update's slot when it processes it.
//
// Why nobody deadlocks: if the peer holds no credit, all `window` credits are
// in flight toward us, returnable here, or in flight back; once the ones in
// flight toward us are processed, returnable >= window / 2 and an explicit
// update goes out (ShouldSendUpdate).
//
// Thread safety: none (a value type used under its owner's lock).
#include <cstdint>

#include "absl/status/status.h"

namespace tessera::rdma {

class CreditWindow {
 public:
  static constexpr uint32_t kReservedSlots = 2;
  static constexpr uint32_t kMaxWindow = 0x4000;  // fits the 16-bit credits field with room

  // local_window: credits this side grants the peer (its receive slots minus
  // the reserved ones). peer_window: credits the peer granted this side.
  CreditWindow(uint32_t local_window, uint32_t peer_window);

  // --- sending ---
  // Takes a credit for one regular SEND or WRITE_WITH_IMM; false when none is held.
  bool TryConsume();
  uint32_t available() const { return available_; }
  // Credits the peer returned (piggybacked or explicit). More than were
  // taken is a protocol violation: FailedPrecondition, nothing changes.
  absl::Status OnReturned(uint32_t credits);

  // --- receiving ---
  // A regular SEND or WRITE_WITH_IMM from the peer was taken and its slot reposted.
  // Returns FailedPrecondition when the peer cannot have held a credit (every
  // credit was returnable here already): counted, nothing else changes.
  absl::Status OnRegularReceived();
  // The credits to put in the next outgoing header (then zero are returnable).
  uint16_t TakeReturnable();
  uint32_t returnable() const { return returnable_; }
  // Whether an explicit credit update is due (at least half the local window
  // is returnable). The caller sends one only when no regular SEND goes out.
  bool ShouldSendUpdate() const { return returnable_ >= UpdateThreshold(); }
  uint32_t UpdateThreshold() const { return local_window_ / 2 + local_window_ % 2; }

  // Receive slots to keep posted for this connection.
  uint32_t ReceiveSlots() const { return local_window_ + kReservedSlots; }
  uint32_t local_window() const { return local_window_; }
  uint32_t peer_window() const { return peer_window_; }
  // Regular sends that arrived while every credit of the window was already
  // returnable here (the peer cannot have held one): protocol violations.
  uint64_t overruns() const { return overruns_; }

 private:
  const uint32_t local_window_;
  const uint32_t peer_window_;
  // Invariants: available_ <= peer_window_; returnable_ <= local_window_
  // (a peer that overruns its window is counted in overruns_, not here).
  uint32_t available_;
  uint32_t returnable_ = 0;
  uint64_t overruns_ = 0;
};

}  // namespace tessera::rdma
